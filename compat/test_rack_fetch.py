"""Fetch from the closest replica (KIP-392, librdkafka test 0101's scenario): brokers in racks
r1, r2, r3 with Kafka's RackAwareReplicaSelector; a confluent-kafka consumer with
client.rack=r2 is sent by the leader (broker 1) to the follower in its rack and reads the
data from there. Bytes per broker are counted by the consumer itself (librdkafka's per-broker
rxbytes statistics).
"""
import json
import time

import pytest

from cluster_harness import Cluster
from common import uniq, wait_until
from gregor_fixtures import _failed, _register

ck = pytest.importorskip("confluent_kafka")
from confluent_kafka.admin import NewTopic  # noqa: E402

WAIT = 60
RECORDS = 2000
SELECTOR = "org.apache.kafka.common.replica.RackAwareReplicaSelector"


@pytest.fixture
def cluster(request, zookeeper):
    def racked(b):
        b.overrides["broker.rack"] = f"r{b.broker_id}"
        _register(request, b)

    c = Cluster(zookeeper, 3, overrides={"replica.selector.class": SELECTOR, "auto.leader.rebalance.enable": "false"},
                on_new_broker=racked)
    c.start()
    yield c
    c.cleanup(keep=_failed(request))


def _consume(c, topic, rack):
    """Reads every record with client.rack=rack; returns bytes received per broker id."""
    rx = {}

    def stats(s):
        for b in json.loads(s)["brokers"].values():
            if b.get("nodeid", -1) >= 0:
                rx[b["nodeid"]] = b["rxbytes"]

    cons = ck.Consumer({"bootstrap.servers": c.bootstrap(), "group.id": uniq("g"), "client.rack": rack,
                        "auto.offset.reset": "earliest", "enable.auto.commit": False,
                        "statistics.interval.ms": 100, "stats_cb": stats, "fetch.max.bytes": 1048576,
                        "max.partition.fetch.bytes": 16384})
    try:
        cons.assign([ck.TopicPartition(topic, 0, 0)])
        got, deadline = 0, time.monotonic() + 120
        while got < RECORDS and time.monotonic() < deadline:
            m = cons.poll(1.0)
            if m is not None and not m.error():
                got += 1
        cons.poll(0.5)  # one more statistics round
        assert got == RECORDS
        return dict(rx)
    finally:
        cons.close()


def test_consumer_reads_from_the_follower_in_its_rack(cluster):
    c = cluster
    topic = uniq("rack")
    a = c.admin(1)
    a.create_topics([NewTopic(topic, 1, replica_assignment=[[1, 2, 3]])])[topic].result(WAIT)
    c.wait_topic_online(topic, 1)
    p = ck.Producer({"bootstrap.servers": c.bootstrap(), "acks": "all"})
    for i in range(RECORDS):
        p.produce(topic, value=b"%06d" % i + b"z" * 1000, partition=0)
        p.poll(0)
    assert p.flush(WAIT) == 0
    wait_until(lambda: c.partition_state(topic, 0)["isr"] == [1, 2, 3], WAIT, "every replica in the ISR")
    payload = RECORDS * 1006

    rx = _consume(c, topic, "r2")
    print(f"client.rack=r2: bytes received per broker {rx}")
    assert rx.get(2, 0) > payload, rx
    assert rx.get(1, 0) < payload / 4, rx

    # a consumer in the leader's rack stays with the leader
    rx = _consume(c, topic, "r1")
    print(f"client.rack=r1: bytes received per broker {rx}")
    assert rx.get(1, 0) > payload and rx.get(2, 0) < payload / 4 and rx.get(3, 0) < payload / 4, rx
