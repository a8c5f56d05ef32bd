"""The internal topics `__consumer_offsets` and `__transaction_state` are never created by
accident in the wrong shape, and groups work over whatever offsets topic exists.

Kafka 3.9's rules (AutoTopicCreationManager, ZkAdminManager, GroupMetadataManager):
* Metadata auto-creation of `__consumer_offsets` uses offsets.topic.num.partitions,
  offsets.topic.replication.factor and the coordinator's topic configs (compact, segment.bytes,
  compression.type=producer), exactly as FindCoordinator does; `__transaction_state` likewise
  with the transaction.state.log.* keys.
* With fewer brokers alive than the replication factor, creation fails: Metadata answers
  INVALID_REPLICATION_FACTOR for the topic and FindCoordinator COORDINATOR_NOT_AVAILABLE, until
  enough brokers are up. (Standalone gregor caps the factor at 1: there is no other broker.)
* CreateTopics of an internal name from a client is *accepted* by a ZooKeeper-mode Kafka 3.9
  (only KRaft's `__cluster_metadata` is refused), so a client may pre-create the offsets topic
  with any partition count; the coordinator then hashes groups over the partitions the topic
  really has, as it does for a topic left by an earlier offsets.topic.num.partitions.

Real clients (confluent-kafka, kafka-python) drive the groups; the exact error codes of the
refusals are read with raw frames (protocol-tests/kproto.py).
"""
from __future__ import annotations

import sys
import time
import uuid
from pathlib import Path

import pytest

ck = pytest.importorskip("confluent_kafka")
from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic  # noqa: E402

from gregor_fixtures import _failed, _register  # noqa: E402
from gregor_harness import wait_until  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "protocol-tests"))
import kproto  # noqa: E402
import kproto_groups  # noqa: E402

WAIT = 60
OFFSETS = "__consumer_offsets"
TXN = "__transaction_state"
INVALID_REPLICATION_FACTOR = 38
COORDINATOR_NOT_AVAILABLE = 15


def uniq(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def java_hash(s: str) -> int:
    h = 0
    for unit in s.encode("utf-16-be").hex(" ", 2).split():
        h = (31 * h + int(unit, 16)) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def offsets_partition(group: str, partitions: int) -> int:
    h = java_hash(group)
    return (0 if h == -(1 << 31) else abs(h)) % partitions


def groups_on_distinct_partitions(partitions: int, want: int):
    """Group ids hashing to `want` different partitions of an offsets topic of that size, so a
    coordinator that hashed over another count would miss at least one of them."""
    seen = {}
    while len(seen) < want:
        g = uniq("g")
        seen.setdefault(offsets_partition(g, partitions), g)
    return list(seen.values())


def describe_topic_configs(bootstrap: str, topic: str) -> dict:
    a = AdminClient({"bootstrap.servers": bootstrap})
    res = ConfigResource(ConfigResource.Type.TOPIC, topic)
    entries = a.describe_configs([res])[res].result(timeout=WAIT)
    return {k: v.value for k, v in entries.items()}


def metadata_asks_for(bootstrap: str, topic: str):
    """A librdkafka Metadata request for `topic` alone, allowing auto-creation (as a consumer
    with allow.auto.create.topics=true sends it)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": uniq("md"), "allow.auto.create.topics": True})
    try:
        return c.list_topics(topic, timeout=WAIT).topics[topic]
    finally:
        c.close()


def wait_partitions(bootstrap: str, topic: str, n: int):
    def ok():
        t = metadata_asks_for(bootstrap, topic)
        return t.error is None and len(t.partitions) == n and all(p.leader >= 0 for p in t.partitions.values())

    wait_until(ok, WAIT, f"{topic} with {n} led partitions", interval=0.2)


def produce(bootstrap: str, topic: str, n: int):
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for i in range(n):
        p.produce(topic, key=b"k%d" % i, value=b"v%d" % i)
    assert p.flush(WAIT) == 0


def consume_and_commit(bootstrap: str, group: str, topic: str, n: int) -> int:
    """A confluent-kafka group member reads `n` records, commits synchronously; returns the
    committed offset read back through OffsetFetch."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                  "enable.auto.commit": False, "session.timeout.ms": 6000})
    try:
        c.subscribe([topic])
        got = 0
        deadline = time.monotonic() + WAIT
        while got < n:
            assert time.monotonic() < deadline, f"group {group}: {got}/{n} records"
            m = c.poll(1.0)
            if m is not None and not m.error():
                got += 1
        c.commit(asynchronous=False)
        committed = c.committed([TopicPartition(topic, 0)], timeout=WAIT)
        return committed[0].offset
    finally:
        c.close()


def kafka_python_commit(bootstrap: str, group: str, topic: str, offset: int) -> int:
    kafka = pytest.importorskip("kafka")
    from kafka.structs import OffsetAndMetadata, TopicPartition as KTP

    c = kafka.KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    try:
        tp = KTP(topic, 0)
        c.assign([tp])
        c.commit({tp: OffsetAndMetadata(offset, "", -1)})
        return c.committed(tp)
    finally:
        c.close()


# ---------------------------------------------------------------------------
# standalone
# ---------------------------------------------------------------------------

def test_metadata_first_creates_the_offsets_topic_groups_need(broker):
    """Metadata naming __consumer_offsets before any group exists creates it with the group
    coordinator's shape; groups then commit and fetch offsets (before the fix it was created
    with num.partitions=1 and every OffsetCommit failed with NOT_COORDINATOR)."""
    t = metadata_asks_for(broker.bootstrap, OFFSETS)
    assert t.error is None or t.error.code() in (ck.KafkaError.LEADER_NOT_AVAILABLE,), t.error
    wait_partitions(broker.bootstrap, OFFSETS, 50)
    cfg = describe_topic_configs(broker.bootstrap, OFFSETS)
    assert cfg["cleanup.policy"] == "compact"
    assert cfg["segment.bytes"] == "104857600"
    assert cfg["compression.type"] == "producer"

    topic = uniq("t")
    produce(broker.bootstrap, topic, 10)
    for group in groups_on_distinct_partitions(50, 3):
        assert consume_and_commit(broker.bootstrap, group, topic, 10) == 10
        assert kafka_python_commit(broker.bootstrap, uniq("kp"), topic, 7) == 7


def test_metadata_creates_transaction_state_with_its_shape(broker_factory):
    b = broker_factory(overrides={"transaction.state.log.num.partitions": "7"})
    metadata_asks_for(b.bootstrap, TXN)
    wait_partitions(b.bootstrap, TXN, 7)
    cfg = describe_topic_configs(b.bootstrap, TXN)
    assert cfg["cleanup.policy"] == "compact"
    assert cfg["compression.type"] == "uncompressed"
    assert cfg["min.insync.replicas"] == "2"
    assert cfg["unclean.leader.election.enable"] == "false"
    assert cfg["segment.bytes"] == "104857600"
    md = kproto_metadata(b, [TXN])
    assert md["topics"][0]["is_internal"] is True


def kproto_metadata(b, topics, version=9, allow_auto=False):
    with kproto.Conn(b.host, b.port, timeout=15) as c:
        return kproto.metadata(c, topics, version=version, allow_auto=allow_auto)


def test_offsets_topic_of_another_size_keeps_working(broker_factory):
    """A one-partition __consumer_offsets made while offsets.topic.num.partitions was 1 keeps
    serving groups (and keeps their offsets) after a restart with 50."""
    b = broker_factory(overrides={"offsets.topic.num.partitions": "1"})
    topic = uniq("t")
    produce(b.bootstrap, topic, 5)
    first = uniq("g")
    assert consume_and_commit(b.bootstrap, first, topic, 5) == 5
    b.stop()
    b.overrides["offsets.topic.num.partitions"] = "50"
    b.start()
    wait_partitions(b.bootstrap, OFFSETS, 1)
    produce(b.bootstrap, topic, 5)
    # the old group resumes from its commit; groups that would hash elsewhere over 50 still work
    assert consume_and_commit(b.bootstrap, first, topic, 5) == 10
    for group in groups_on_distinct_partitions(50, 3):
        assert kafka_python_commit(b.bootstrap, group, topic, 3) == 3


def test_create_topics_of_an_internal_name_is_accepted_as_kafka_does(broker):
    """Kafka 3.9 (ZooKeeper mode) creates __consumer_offsets as a client asks; groups then
    spread over its 3 partitions."""
    a = AdminClient({"bootstrap.servers": broker.bootstrap})
    fut = a.create_topics([NewTopic(OFFSETS, 3, 1, config={"cleanup.policy": "compact"})])[OFFSETS]
    fut.result(timeout=WAIT)
    wait_partitions(broker.bootstrap, OFFSETS, 3)
    topic = uniq("t")
    produce(broker.bootstrap, topic, 4)
    for group in groups_on_distinct_partitions(3, 3):
        assert consume_and_commit(broker.bootstrap, group, topic, 4) == 4


def test_metadata_without_auto_create_leaves_internal_topics_alone(broker_factory):
    b = broker_factory(overrides={"auto.create.topics.enable": "false"})
    md = kproto_metadata(b, [OFFSETS], allow_auto=True)
    assert md["topics"][0]["error_code"] == 3  # UNKNOWN_TOPIC_OR_PARTITION
    assert md["topics"][0]["is_internal"] is True
    # FindCoordinator still creates it (Kafka's FindCoordinator ignores auto.create.topics.enable)
    topic = uniq("t")
    a = AdminClient({"bootstrap.servers": b.bootstrap})
    a.create_topics([NewTopic(topic, 1, 1)])[topic].result(timeout=WAIT)
    produce(b.bootstrap, topic, 2)
    assert consume_and_commit(b.bootstrap, uniq("g"), topic, 2) == 2
    wait_partitions(b.bootstrap, OFFSETS, 50)


# ---------------------------------------------------------------------------
# ZooKeeper cluster
# ---------------------------------------------------------------------------

@pytest.fixture
def cluster_factory(request, zookeeper):
    from cluster_harness import Cluster

    made = []

    def make(n, **overrides):
        o = {"group.initial.rebalance.delay.ms": "0"}
        o.update(overrides)
        c = Cluster(zookeeper, n, overrides=o, on_new_broker=lambda b: _register(request, b))
        made.append(c)
        return c.start()

    yield make
    for c in made:
        c.cleanup(keep=_failed(request))


def find_coordinator_error(b, group: str) -> int:
    with kproto.Conn(b.host, b.port, timeout=15) as c:
        r = kproto_groups.call(c, kproto_groups.FIND_COORDINATOR, 1,
                               kproto_groups.find_coordinator_request(1, group))
        return r["coordinators"][0]["error_code"]


def test_cluster_offsets_topic_waits_for_enough_brokers(cluster_factory):
    """offsets.topic.replication.factor=3 with two brokers alive: Metadata answers
    INVALID_REPLICATION_FACTOR, FindCoordinator COORDINATOR_NOT_AVAILABLE, nothing is created;
    once the third broker is up, a Metadata request from a non-controller creates it in the
    coordinator's shape and groups commit."""
    c = cluster_factory(2, **{"offsets.topic.replication.factor": "3", "offsets.topic.num.partitions": "6"})
    for i in c.live_ids():
        md = kproto_metadata(c.brokers[i], [OFFSETS], allow_auto=True)
        assert md["topics"][0]["error_code"] == INVALID_REPLICATION_FACTOR, md
        assert find_coordinator_error(c.brokers[i], "g1") == COORDINATOR_NOT_AVAILABLE
    assert not c.exists(f"/brokers/topics/{OFFSETS}")

    c.brokers[3] = c.new_broker(3)
    c.brokers[3].start()
    c.wait_registered([1, 2, 3])
    c.wait_metadata_converged()
    other = next(i for i in c.live_ids() if i != c.controller())
    metadata_asks_for(c.brokers[other].bootstrap, OFFSETS)
    c.wait_topic_online(OFFSETS, 6)
    assert all(len(r) == 3 for r in c.zk_assignment(OFFSETS).values())
    assert c.get_json(f"/config/topics/{OFFSETS}")["config"]["cleanup.policy"] == "compact"

    topic = uniq("t")
    a = AdminClient({"bootstrap.servers": c.bootstrap()})
    a.create_topics([NewTopic(topic, 1, 3)])[topic].result(timeout=WAIT)
    c.wait_topic_online(topic, 1)
    produce(c.bootstrap(), topic, 6)
    for group in groups_on_distinct_partitions(6, 3):
        assert consume_and_commit(c.bootstrap(), group, topic, 6) == 6


def test_cluster_offsets_topic_of_another_size(cluster_factory):
    """A client-created three-partition __consumer_offsets serves groups on every broker."""
    c = cluster_factory(3, **{"offsets.topic.replication.factor": "3"})
    a = AdminClient({"bootstrap.servers": c.bootstrap()})
    a.create_topics([NewTopic(OFFSETS, 3, 3, config={"cleanup.policy": "compact"})])[OFFSETS].result(timeout=WAIT)
    c.wait_topic_online(OFFSETS, 3)
    topic = uniq("t")
    a.create_topics([NewTopic(topic, 1, 3)])[topic].result(timeout=WAIT)
    c.wait_topic_online(topic, 1)
    produce(c.bootstrap(), topic, 3)
    for group in groups_on_distinct_partitions(3, 3):
        assert consume_and_commit(c.bootstrap(), group, topic, 3) == 3
