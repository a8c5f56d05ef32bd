"""message.timestamp.type=LogAppendTime with confluent-kafka: the broker's clock replaces the
producer's timestamps, for consumers and in the produce acknowledgement; CreateTime topics keep
the producer's."""
import time

import pytest

from common import uniq

ck = pytest.importorskip("confluent_kafka")
from confluent_kafka import (TIMESTAMP_CREATE_TIME, TIMESTAMP_LOG_APPEND_TIME, Consumer,  # noqa: E402
                             KafkaError, Producer, TopicPartition)
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

OLD = 1_000_000_000_000  # 2001: far from the broker's clock


def create(b, name, **cfg):
    a = AdminClient({"bootstrap.servers": b.bootstrap})
    for f in a.create_topics([NewTopic(name, 1, 1, config=cfg)], operation_timeout=30).values():
        f.result(30)


def produce(b, topic, n, codec):
    p = Producer({"bootstrap.servers": b.bootstrap, "compression.type": codec, "linger.ms": 20})
    acks = []
    for i in range(n):
        p.produce(topic, key=b"k%d" % i, value=b"v" * 50, partition=0, timestamp=OLD + i,
                  on_delivery=lambda err, m: acks.append((err, m.timestamp())))
    assert p.flush(30) == 0
    assert all(err is None for err, _ in acks), acks[:3]
    return [ts for _, ts in acks]


def consume(b, topic, n):
    c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": uniq("lat"), "enable.auto.commit": False,
                  "enable.partition.eof": True})
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        out = []
        deadline = time.time() + 30
        while time.time() < deadline:
            m = c.poll(1.0)
            if m is None:
                continue
            if m.error():
                if m.error().code() == KafkaError._PARTITION_EOF and len(out) >= n:
                    return out
                continue
            out.append(m.timestamp())
        raise AssertionError(f"read {len(out)} of {n}")
    finally:
        c.close()


@pytest.mark.parametrize("codec", ["none", "lz4"])
def test_log_append_time_replaces_the_producers_timestamps(broker, codec):
    topic = uniq("lat")
    create(broker, topic, **{"message.timestamp.type": "LogAppendTime"})
    before = int(time.time() * 1000)
    acked = produce(broker, topic, 20, codec)
    after = int(time.time() * 1000)
    # The delivery report carries the Produce response's log_append_time_ms.
    for kind, ts in acked:
        assert kind == TIMESTAMP_LOG_APPEND_TIME and before - 1000 <= ts <= after + 1000, (kind, ts)
    got = consume(broker, topic, 20)
    assert len(got) == 20
    for kind, ts in got:
        assert kind == TIMESTAMP_LOG_APPEND_TIME, kind
        assert before - 1000 <= ts <= after + 1000, (ts, before, after)


def test_create_time_keeps_the_producers_timestamps(broker):
    topic = uniq("ct")
    create(broker, topic)
    produce(broker, topic, 5, "none")
    assert consume(broker, topic, 5) == [(TIMESTAMP_CREATE_TIME, OLD + i) for i in range(5)]


def test_the_broker_default_applies_to_new_topics(broker_factory):
    b = broker_factory(overrides={"log.message.timestamp.type": "LogAppendTime"})
    topic = uniq("lat-default")
    create(b, topic)
    produce(b, topic, 3, "none")
    assert all(kind == TIMESTAMP_LOG_APPEND_TIME and ts > OLD * 1.5 for kind, ts in consume(b, topic, 3))
