"""kafka-python against gregor. Consumers: KafkaConsumer(group_id=None) + assign()."""
import time

import pytest

from common import (BASE_TS, CODECS, Got, PacedProducer, check_acked_survived, kill9_during_produce, make_records, uniq,
                    verify_records, wait_until)

kafka = pytest.importorskip("kafka")
from kafka import KafkaConsumer, KafkaProducer, TopicPartition  # noqa: E402
from kafka.admin import KafkaAdminClient, NewTopic  # noqa: E402
from kafka.errors import TopicAlreadyExistsError, UnknownTopicOrPartitionError  # noqa: E402

WAIT = 60


def admin(broker):
    return KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=30000)


def producer(broker, **extra):
    cfg = dict(bootstrap_servers=broker.bootstrap, linger_ms=5)
    cfg.update(extra)
    return KafkaProducer(**cfg)


def consumer(broker):
    return KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=None, enable_auto_commit=False,
                         auto_offset_reset="earliest", consumer_timeout_ms=1000)


def partitions_of(broker, topic):
    c = consumer(broker)
    try:
        parts = wait_until(lambda: c.partitions_for_topic(topic), WAIT, f"partitions of {topic}")
        return sorted(parts)
    finally:
        c.close()


def create_topic(broker, name, partitions):
    a = admin(broker)
    try:
        a.create_topics([NewTopic(name=name, num_partitions=partitions, replication_factor=1)])

        def ready():
            d = a.describe_topics([name])[0]
            return (d["error_code"] == 0 and len(d["partitions"]) == partitions
                    and all(p["leader_id"] >= 0 for p in d["partitions"]))
        wait_until(ready, WAIT, f"topic {name} with {partitions} partitions")
    finally:
        a.close()


def produce_records(p, topic, recs, with_ts=True):
    futs = []
    for r in recs:
        kw = dict(key=r.key, value=r.value, headers=list(r.headers))
        if with_ts:
            kw["timestamp_ms"] = r.ts
        futs.append((r.seq, p.send(topic, **kw)))
    p.flush(timeout=WAIT)
    acked = {}
    for seq, f in futs:
        md = f.get(timeout=WAIT)
        acked[seq] = (md.partition, md.offset)
    p.close(timeout=WAIT)
    return acked


def consume_all(broker, topic, expected):
    c = consumer(broker)
    try:
        parts = [TopicPartition(topic, p) for p in partitions_of(broker, topic)]
        c.assign(parts)
        c.seek_to_beginning(*parts)
        end = c.end_offsets(parts)
        assert sum(end.values()) == expected, f"end offsets {end} sum != {expected}"
        got = []
        deadline = time.monotonic() + WAIT
        while len(got) < expected:
            assert time.monotonic() < deadline, f"consumed {len(got)} of {expected}"
            for tp, msgs in c.poll(timeout_ms=500, max_records=5000).items():
                for m in msgs:
                    assert m.timestamp_type == 0, f"timestamp type {m.timestamp_type}"
                    got.append(Got(m.partition, m.offset, m.key, m.value, list(m.headers or []), m.timestamp))
        got.extend(Got(m.partition, m.offset, m.key, m.value, list(m.headers or []), m.timestamp)
                   for msgs in c.poll(timeout_ms=200).values() for m in msgs)
        return got
    finally:
        c.close()


# ---------------------------------------------------------------------------


def test_metadata_lists_broker_and_topics(broker):
    t = uniq("kp-md")
    create_topic(broker, t, 2)
    a = admin(broker)
    try:
        assert t in a.list_topics()
        dc = a.describe_cluster()
        assert [(b["broker_id"], b["host"], b["port"]) for b in dc["brokers"]] == [(0, broker.host, broker.port)]
        assert dc["controller_id"] == 0
        assert dc["cluster_id"]
    finally:
        a.close()
    c = consumer(broker)
    try:
        assert t in c.topics()
        assert c.partitions_for_topic(t) == {0, 1}
    finally:
        c.close()


def test_create_topic_three_partitions(broker):
    t = uniq("kp-create")
    create_topic(broker, t, 3)
    assert partitions_of(broker, t) == [0, 1, 2]
    a = admin(broker)
    try:
        with pytest.raises(TopicAlreadyExistsError):
            a.create_topics([NewTopic(name=t, num_partitions=3, replication_factor=1)])
    finally:
        a.close()


def test_produce_consume_10k(broker):
    t = uniq("kp-10k")
    create_topic(broker, t, 3)
    recs = make_records(10_000, "kafka-python")
    acked = produce_records(producer(broker), t, recs)
    assert len({p for p, _ in acked.values()}) == 3
    verify_records(recs, consume_all(broker, t, len(recs)), acked=acked)


@pytest.mark.parametrize("codec", CODECS)
def test_codec_roundtrip(broker, codec):
    t = uniq(f"kp-{codec}")
    create_topic(broker, t, 1)
    recs = make_records(2000, "kafka-python", value_size=300)
    p = producer(broker, compression_type=None if codec == "none" else codec, batch_size=65536)
    acked = produce_records(p, t, recs)
    verify_records(recs, consume_all(broker, t, len(recs)), acked=acked)


@pytest.mark.parametrize("acks", [0, 1, "all"])
def test_acks(broker, acks):
    t = uniq(f"kp-acks{acks}")
    create_topic(broker, t, 1)
    recs = make_records(1000, "kafka-python")
    extra = {"acks": acks}
    if acks != "all":
        extra["enable_idempotence"] = False
    acked = produce_records(producer(broker, **extra), t, recs)
    if acks == 0:
        c = consumer(broker)
        tp = TopicPartition(t, 0)
        try:
            wait_until(lambda: c.end_offsets([tp])[tp] == 1000, WAIT, "all acks=0 records to arrive")
        finally:
            c.close()
        verify_records(recs, consume_all(broker, t, len(recs)))
    else:
        verify_records(recs, consume_all(broker, t, len(recs)), acked=acked)


def test_idempotent_producer(broker):
    t = uniq("kp-idem")
    create_topic(broker, t, 3)
    recs = make_records(3000, "kafka-python")
    p = producer(broker, enable_idempotence=True, acks="all", batch_size=4096)
    acked = produce_records(p, t, recs)
    verify_records(recs, consume_all(broker, t, len(recs)), acked=acked)


def test_list_offsets(broker):
    t = uniq("kp-lo")
    create_topic(broker, t, 1)
    recs = make_records(100, "kafka-python")
    produce_records(producer(broker), t, recs)
    tp = TopicPartition(t, 0)
    c = consumer(broker)
    try:
        assert c.beginning_offsets([tp]) == {tp: 0}
        assert c.end_offsets([tp]) == {tp: 100}
        r = c.offsets_for_times({tp: BASE_TS + 425})[tp]
        assert r is not None and r.offset == 43 and r.timestamp == BASE_TS + 430, r
        r = c.offsets_for_times({tp: BASE_TS + 10**6})[tp]
        assert r is None, f"timestamp after the last record -> {r}"
        c.assign([tp])
        c.seek(tp, 90)
        got = []
        wait_until(lambda: got.extend(m for ms in c.poll(timeout_ms=500).values() for m in ms) or len(got) >= 10,
                   WAIT, "10 records from offset 90")
        assert [m.offset for m in got] == list(range(90, 100))
        assert got[0].value == recs[90].value
    finally:
        c.close()


def test_delete_topic(broker):
    t = uniq("kp-del")
    create_topic(broker, t, 2)
    a = admin(broker)
    try:
        a.delete_topics([t])
        wait_until(lambda: t not in a.list_topics(), WAIT, "deleted topic to leave metadata")
        with pytest.raises(UnknownTopicOrPartitionError):
            a.delete_topics([t])
    finally:
        a.close()


def test_auto_create_on_produce(broker):
    t = uniq("kp-auto")
    recs = make_records(100, "kafka-python")
    acked = produce_records(producer(broker), t, recs)
    a = admin(broker)
    try:
        assert t in a.list_topics()
    finally:
        a.close()
    verify_records(recs, consume_all(broker, t, len(recs)), acked=acked)


class BackgroundProducer(PacedProducer):
    """kafka-python: acked[seq] from each future's callback."""

    def __init__(self, p, topic, recs, chunk=20, pause=0.005):
        super().__init__(p, topic, recs, WAIT * 4, chunk, pause)

    def send(self, r):
        f = self.p.send(self.topic, key=r.key, value=r.value, headers=list(r.headers), timestamp_ms=r.ts)
        f.add_callback(lambda md, seq=r.seq: self.acked.__setitem__(seq, (md.partition, md.offset)))
        f.add_errback(lambda e, seq=r.seq: self.errors.append((seq, e)))

    def finish(self):
        self.p.flush(timeout=WAIT * 2)
        self.p.close(timeout=WAIT)


def stored_count(broker, topic):
    c = consumer(broker)
    try:
        parts = [TopicPartition(topic, p) for p in partitions_of(broker, topic)]
        return sum(c.end_offsets(parts).values())
    finally:
        c.close()


def test_kill9_keeps_acked_data(broker):
    """kill -9 while an idempotent acks=all producer is still sending; every record it got an
    acknowledgement for (before or after the kill) is at its acknowledged offset afterwards."""
    t = uniq("kp-kill")
    create_topic(broker, t, 3)
    recs = make_records(100_000, "kafka-python", value_size=50)
    prod = BackgroundProducer(producer(broker, acks="all", enable_idempotence=True, retries=2**31 - 1,
                                       delivery_timeout_ms=120000, request_timeout_ms=30000), t, recs)
    prod.start()
    try:
        at_kill = kill9_during_produce(broker, lambda: len(prod.acked), prod.running, prod.stop)
    finally:
        prod.halt.set()
    assert not prod.errors, f"delivery errors: {prod.errors[:5]}"
    n = stored_count(broker, t)
    print(f"kill -9 with {at_kill} acknowledged; {len(prod.acked)} acknowledged in all; {n} stored")
    check_acked_survived(recs, prod.acked, consume_all(broker, t, n))
