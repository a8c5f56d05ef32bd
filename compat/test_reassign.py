"""Partition reassignment as an operator runs it (issue 15): kafka-python's
alter_partition_reassignments / list_partition_reassignments (what kafka-reassign-partitions
--execute / --list / --cancel send), with the replication throttles kafka-reassign-partitions
sets, on a 4-broker cluster under an acks=all producer; and the legacy
/admin/reassign_partitions znode.
"""
import sys
import threading
import time
from pathlib import Path

import pytest

from cluster_harness import Cluster
from common import uniq, wait_until
from gregor_fixtures import _failed, _register

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "protocol-tests"))
import kproto  # noqa: E402

ck = pytest.importorskip("confluent_kafka")
kafka = pytest.importorskip("kafka")
from confluent_kafka.admin import NewTopic  # noqa: E402
from kafka import TopicPartition as KTP  # noqa: E402
from kafka.admin import KafkaAdminClient  # noqa: E402

WAIT = 90
RATE = 300_000  # bytes/s, leader and follower throttle
PRELOAD = 3_000  # records of 1 KB copied to the new replica under the throttle


@pytest.fixture
def cluster(request, zookeeper):
    c = Cluster(zookeeper, 4, overrides={"auto.leader.rebalance.enable": "false"},
                on_new_broker=lambda b: _register(request, b))
    c.start()
    yield c
    c.cleanup(keep=_failed(request))


def _kp(c):
    return KafkaAdminClient(bootstrap_servers=c.bootstrap(), request_timeout_ms=30000)


def _applied(b, rtype, name, configs):
    """Whether broker `b` answers DescribeConfigs with `configs` (what it has applied: each
    broker learns of a change through /config/changes, in its own time)."""
    with kproto.Conn(b.host, b.port, timeout=10) as conn:
        r = kproto.decode_describe_configs(
            conn.call(kproto.DESCRIBE_CONFIGS, 1, kproto.describe_configs_request(1, [(rtype, name, list(configs))])), 1)
    got = {e["name"]: e["value"] for e in r["results"][0]["configs"]}
    return all(got.get(k) == v for k, v in configs.items())


def _set_broker(c, i, configs):
    res = ck.admin.ConfigResource(ck.admin.ResourceType.BROKER, str(i), incremental_configs=[
        ck.admin.ConfigEntry(k, v, incremental_operation=ck.admin.AlterConfigOpType.SET) for k, v in configs.items()])
    a = c.admin(i)
    a.incremental_alter_configs([res])[res].result(WAIT)
    b = c.brokers[i]
    wait_until(lambda: _applied(b, kproto.RESOURCE_BROKER, str(i), configs), WAIT, f"broker {i} to apply {configs}")


def _set_topic(c, topic, configs):
    res = ck.admin.ConfigResource(ck.admin.ResourceType.TOPIC, topic, incremental_configs=[
        ck.admin.ConfigEntry(k, v, incremental_operation=ck.admin.AlterConfigOpType.SET) for k, v in configs.items()])
    a = c.admin(1)
    a.incremental_alter_configs([res])[res].result(WAIT)
    # a move started before every broker has the throttle would copy unthrottled
    for b in c.live():
        wait_until(lambda b=b: _applied(b, kproto.RESOURCE_TOPIC, topic, configs), WAIT,
                   f"broker {b.broker_id} to apply {configs}")


def _log_bytes(b, topic):
    d = b.data_dir / f"{topic}-0"
    return sum(f.stat().st_size for f in d.glob("*.log")) if d.exists() else None


def _read_all(c, topic, at_least):
    """Everything up to the high watermark, once it has reached `at_least` (a leader elected a
    moment ago answers OFFSET_NOT_AVAILABLE until its followers have fetched again)."""
    cons = ck.Consumer({"bootstrap.servers": c.bootstrap(), "group.id": uniq("v"), "enable.auto.commit": False,
                        "auto.offset.reset": "earliest", "isolation.level": "read_uncommitted"})

    def watermarks():
        lo, hi = cons.get_watermark_offsets(ck.TopicPartition(topic, 0), timeout=10)
        return (lo, hi) if hi >= at_least else None

    try:
        lo, hi = wait_until(watermarks, WAIT, f"the high watermark to reach {at_least}")
        cons.assign([ck.TopicPartition(topic, 0, lo)])
        got = []
        deadline = time.monotonic() + WAIT
        while len(got) < hi - lo and time.monotonic() < deadline:
            m = cons.poll(1.0)
            if m is not None and not m.error():
                got.append(m.value())
        return got, hi
    finally:
        cons.close()


class Load:
    """An acks=all producer at ~50 KB/s, recording what was acknowledged."""

    def __init__(self, c, topic):
        self.p = ck.Producer({"bootstrap.servers": c.bootstrap(), "acks": "all", "enable.idempotence": True,
                              "linger.ms": 5, "log_level": 2})
        self.topic, self.acked, self.failed = topic, [], []
        self.stop = threading.Event()
        self.t = threading.Thread(target=self.run, daemon=True)

    def cb(self, err, msg):
        (self.failed if err else self.acked).append(err or msg.value())

    def run(self):
        i = 0
        while not self.stop.is_set():
            for _ in range(5):
                self.p.produce(self.topic, value=b"load-%08d-" % i + b"x" * 1000, partition=0, on_delivery=self.cb)
                i += 1
            self.p.poll(0)
            self.stop.wait(0.1)

    def __enter__(self):
        self.t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.t.join(10)
        assert self.p.flush(WAIT) == 0


def test_reassign_under_load_with_throttle_then_cancel(cluster):
    c = cluster
    topic = uniq("move")
    a = c.admin(1)
    a.create_topics([NewTopic(topic, 1, replica_assignment=[[1, 2, 3]],
                              config={"min.insync.replicas": "2"})])[topic].result(WAIT)
    c.wait_topic_online(topic, 1)
    p = ck.Producer({"bootstrap.servers": c.bootstrap(), "acks": "all", "linger.ms": 20})
    for i in range(PRELOAD):
        p.produce(topic, value=b"pre-%08d-" % i + b"x" * 1000, partition=0)
        if i % 500 == 0:
            p.poll(0)
    assert p.flush(WAIT) == 0
    preload_bytes = _log_bytes(c.brokers[1], topic)
    assert preload_bytes > 2_500_000, preload_bytes

    # what kafka-reassign-partitions --execute --throttle sets: the rates on every broker, the
    # leader throttle on the current replicas and the follower throttle on the new one
    for i in (1, 2, 3, 4):
        _set_broker(c, i, {"leader.replication.throttled.rate": str(RATE),
                           "follower.replication.throttled.rate": str(RATE)})
    _set_topic(c, topic, {"leader.replication.throttled.replicas": "0:1,0:2,0:3",
                          "follower.replication.throttled.replicas": "0:4"})
    assert c.get_json("/config/brokers/4")["config"]["follower.replication.throttled.rate"] == str(RATE)

    ka = _kp(c)
    tp = KTP(topic, 0)
    try:
        with Load(c, topic) as load:
            wait_until(lambda: len(load.acked) > 50, WAIT, "the load to be acknowledged")
            t0 = time.monotonic()
            assert ka.alter_partition_reassignments({tp: [2, 3, 4]}) == {tp: None}
            # --list while in flight: the union, who joins and who leaves; ZooKeeper agrees
            listed = ka.list_partition_reassignments()
            assert listed == {tp: {"replicas": [2, 3, 4, 1], "adding_replicas": [4], "removing_replicas": [1]}}, listed
            znode = c.topic_znode(topic)
            assert (znode["partitions"]["0"], znode["adding_replicas"], znode["removing_replicas"]) == \
                ([2, 3, 4, 1], {"0": [4]}, {"0": [1]}), znode
            # the new replica copies under the throttle; the load keeps being acknowledged
            wait_until(lambda: c.zk_assignment(topic) == {0: [2, 3, 4]}, 4 * WAIT, "the reassignment to complete",
                       interval=0.2)
            took = time.monotonic() - t0
            acked_during = len(load.acked)
        assert ka.list_partition_reassignments() == {}
        znode = c.topic_znode(topic)
        assert (znode["adding_replicas"], znode["removing_replicas"]) == ({}, {}), znode
        st = c.partition_state(topic, 0)
        assert st["leader"] in (2, 3, 4) and set(st["isr"]) <= {2, 3, 4}, st
        wait_until(lambda: set(c.partition_state(topic, 0)["isr"]) == {2, 3, 4}, WAIT, "ISR 2,3,4")
        # the throttle held: copying the preload took at least half as long as the rate allows
        # (unthrottled, a few MB between local processes copy in well under a second)
        copied_rate = preload_bytes / took
        print(f"reassignment copied {preload_bytes} B in {took:.1f} s: {copied_rate / 1000:.0f} KB/s "
              f"(throttle {RATE / 1000:.0f} KB/s); {acked_during} records acknowledged meanwhile")
        assert copied_rate < 2 * RATE, (preload_bytes, took)
        assert not load.failed, load.failed[:5]
        # the old replica is deleted from broker 1
        wait_until(lambda: _log_bytes(c.brokers[1], topic) is None, WAIT, "broker 1 to delete its replica")
        # nothing acknowledged is lost
        got, hi = _read_all(c, topic, PRELOAD + len(load.acked))
        assert len(got) == hi and hi >= PRELOAD + len(load.acked), (len(got), hi)
        missing = set(load.acked) - set(got)
        assert not missing, f"{len(missing)} acknowledged records lost"

        # cancelling: a move back to 1,2,3, throttled so that it is still copying, is
        # cancelled; 1 is dropped again
        _set_topic(c, topic, {"leader.replication.throttled.replicas": "0:2,0:3,0:4",
                              "follower.replication.throttled.replicas": "0:1"})
        assert ka.alter_partition_reassignments({tp: [1, 2, 3]}) == {tp: None}
        assert ka.list_partition_reassignments({topic: [0]}) == {
            tp: {"replicas": [1, 2, 3, 4], "adding_replicas": [1], "removing_replicas": [4]}}
        assert ka.alter_partition_reassignments({tp: None}) == {tp: None}
        assert ka.list_partition_reassignments() == {}
        assert c.zk_assignment(topic) == {0: [2, 3, 4]}
        wait_until(lambda: _log_bytes(c.brokers[1], topic) is None, WAIT, "broker 1 to delete the cancelled replica")
        # what Kafka refuses
        errs = ka.alter_partition_reassignments({tp: None, KTP(topic, 7): [1, 2]})
        assert errs[tp] is kafka.errors.NoReassignmentInProgressError, errs
        assert errs[KTP(topic, 7)] is kafka.errors.UnknownTopicOrPartitionError, errs
        for bad in ([2, 2], [2, 9], [-1, 2]):
            errs = ka.alter_partition_reassignments({tp: bad})
            assert errs[tp] is kafka.errors.InvalidReplicationAssignmentError, (bad, errs)
    finally:
        ka.close()


def test_legacy_reassign_partitions_znode(cluster):
    c = cluster
    topic = uniq("legacy")
    a = c.admin(1)
    a.create_topics([NewTopic(topic, 2, replica_assignment=[[1, 2], [2, 3]])])[topic].result(WAIT)
    c.wait_topic_online(topic, 2)
    p = ck.Producer({"bootstrap.servers": c.bootstrap(), "acks": "all"})
    for i in range(200):
        p.produce(topic, value=b"v%d" % i, partition=i % 2)
    assert p.flush(WAIT) == 0
    # what the pre-2.4 tool writes
    c.kz.create("/admin/reassign_partitions", (
        '{"version":1,"partitions":[{"topic":"%s","partition":0,"replicas":[3,4]},'
        '{"topic":"%s","partition":1,"replicas":[2,3]}]}' % (topic, topic)).encode(), makepath=True)
    wait_until(lambda: c.zk_assignment(topic) == {0: [3, 4], 1: [2, 3]}, WAIT, "the move to complete")
    wait_until(lambda: not c.exists("/admin/reassign_partitions"), WAIT, "the controller to remove the znode")
    wait_until(lambda: set(c.partition_state(topic, 0)["isr"]) == {3, 4}, WAIT, "ISR 3,4")
    for b in (1, 2):
        wait_until(lambda b=b: not (c.brokers[b].data_dir / f"{topic}-0").exists(), WAIT,
                   f"broker {b} to delete its replica")
    lows_highs = ck.Consumer({"bootstrap.servers": c.bootstrap(), "group.id": uniq("w")}).get_watermark_offsets(
        ck.TopicPartition(topic, 0), timeout=WAIT)
    assert lows_highs == (0, 100), lows_highs
