"""Client quotas (issue 15): set and described through the Java AdminClient (what
kafka-configs --entity-type clients sends), stored in ZooKeeper in Kafka's layout, announced to
every broker, and enforced: a confluent-kafka producer and consumer with that client id are
held to their byte rates, and told so in throttle_time_ms.
"""
import json
import time

import pytest

import java_client
from cluster_harness import Cluster
from common import uniq
from gregor_fixtures import _failed, _register

ck = pytest.importorskip("confluent_kafka")
from confluent_kafka.admin import NewTopic  # noqa: E402

WAIT = 60
RATE = 300_000  # bytes/s, both directions
RECORDS = 2_000  # of 1 KB: about 2 MB each way


@pytest.fixture
def cluster(request, zookeeper):
    c = Cluster(zookeeper, 2, on_new_broker=lambda b: _register(request, b))
    c.start()
    yield c
    c.cleanup(keep=_failed(request))


def test_byte_rate_quotas_hold_a_client_to_its_rate(cluster):
    c = cluster
    topic, client = uniq("q"), uniq("slowpoke")
    a = c.admin(1)
    a.create_topics([NewTopic(topic, 1, replica_assignment=[[2]])])[topic].result(WAIT)
    c.wait_topic_online(topic, 1)

    # set through broker 1; the leader, broker 2, learns of it from the announcement
    java_client.run(java_client.compile_client()[0], c.brokers[1].bootstrap, c.brokers[1].base_dir / "java-tmp",
                    "client-quotas", client, str(RATE), str(RATE))
    assert c.get_json(f"/config/clients/{client}") == {
        "version": 1, "config": {"producer_byte_rate": str(RATE), "consumer_byte_rate": str(RATE)}}
    notes = [c.get_json(f"/config/changes/{n}") for n in c.kz.get_children("/config/changes")]
    assert {"version": 2, "entity_path": f"clients/{client}"} in notes, notes
    assert not c.exists("/config/users/alice"), "a refused quota reached ZooKeeper"

    throttles = []

    def stats(s):
        for b in json.loads(s)["brokers"].values():
            throttles.append(b["throttle"]["max"])

    p = ck.Producer({"bootstrap.servers": c.bootstrap(), "client.id": client, "acks": "all", "linger.ms": 10,
                     "statistics.interval.ms": 200, "stats_cb": stats})
    t0 = time.monotonic()
    for i in range(RECORDS):
        p.produce(topic, value=b"%08d" % i + b"x" * 1016, partition=0)
        p.poll(0)
    assert p.flush(120) == 0
    took = time.monotonic() - t0
    p.poll(0.5)
    sent = RECORDS * 1024
    print(f"producer: {sent} B in {took:.1f} s = {sent / took / 1000:.0f} KB/s under a {RATE / 1000:.0f} KB/s quota; "
          f"max throttle_time_ms seen {max(throttles, default=0)}")
    # the quota held (an unthrottled local producer sends 2 MB in well under a second), and
    # the broker said so in throttle_time_ms
    assert sent / took < 2 * RATE, (sent, took)
    assert max(throttles, default=0) > 0, "no throttle_time_ms reported to the producer"

    cons = ck.Consumer({"bootstrap.servers": c.bootstrap(), "client.id": client, "group.id": uniq("g"),
                        "auto.offset.reset": "earliest", "enable.auto.commit": False})
    try:
        cons.assign([ck.TopicPartition(topic, 0, 0)])
        got, t0 = 0, time.monotonic()
        deadline = t0 + 120
        while got < RECORDS and time.monotonic() < deadline:
            m = cons.poll(1.0)
            if m is not None and not m.error():
                got += 1
        took = time.monotonic() - t0
    finally:
        cons.close()
    assert got == RECORDS
    print(f"consumer: {sent} B in {took:.1f} s = {sent / took / 1000:.0f} KB/s under a {RATE / 1000:.0f} KB/s quota")
    assert sent / took < 2 * RATE, (sent, took)

    # another client id is not held to it
    other = ck.Producer({"bootstrap.servers": c.bootstrap(), "client.id": uniq("free"), "acks": "all"})
    t0 = time.monotonic()
    for i in range(RECORDS):
        other.produce(topic, value=b"y" * 1024, partition=0)
        other.poll(0)
    assert other.flush(120) == 0
    print(f"unquoted producer: {sent} B in {time.monotonic() - t0:.1f} s")
