"""Compaction and committed offsets in a cluster: the cleaner never cleans above the high
watermark (a follower that becomes leader may not have those records), and a group's offsets
survive retention, restarts and coordinator moves, expiring only offsets.retention.minutes
after the group became Empty, also when another broker took over in between.

Real ZooKeeper, real gregor processes (ids 1..n), confluent-kafka clients. Every wait polls a
condition: ZooKeeper's partition state, a client's answer, or a file the broker writes.
"""
from __future__ import annotations

import time
from pathlib import Path

import pytest

try:
    import kazoo  # noqa: F401
except ImportError as e:  # fail loudly: a skipped cluster suite would look green
    raise ImportError("compat/test_compaction_cluster.py needs kazoo: .venv/bin/pip install kazoo") from e
ck = pytest.importorskip("confluent_kafka")
from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import NewTopic  # noqa: E402

from cluster_harness import Cluster  # noqa: E402
from common import uniq  # noqa: E402
from gregor_fixtures import _failed, _register  # noqa: E402
from gregor_harness import wait_until  # noqa: E402
from replication_tools import sigcont, sigstop  # noqa: E402

WAIT = 90
OFFSETS = "__consumer_offsets"


@pytest.fixture
def cluster_factory(request, zookeeper):
    clusters = []

    def make(n: int, overrides, **kw) -> Cluster:
        c = Cluster(zookeeper, n, overrides=overrides, on_new_broker=lambda b: _register(request, b), **kw)
        clusters.append(c)
        c.start()
        return c

    yield make
    failed = _failed(request)
    for c in clusters:
        for b in c.brokers.values():
            sigcont(b)  # a paused broker would sit out SIGTERM until the stop timeout
        c.cleanup(keep=failed)


def produce(bootstrap, topic, prefix, versions, keys, acks, key_major=False):
    """`versions` rounds over `keys` keys (key_major: all versions of a key, then the next)."""
    p = Producer({"bootstrap.servers": bootstrap, "acks": acks, "linger.ms": 5, "batch.size": 8192, "log_level": 2})
    errors = []
    order = [(v, k) for k in range(keys) for v in range(versions)] if key_major else \
        [(v, k) for v in range(versions) for k in range(keys)]
    for v, k in order:
        p.produce(topic, key=f"k{k:02d}", value=f"{prefix}-{v:02d}-" + "x" * 100, partition=0,
                  on_delivery=lambda err, _m: errors.append(err) if err else None)
        p.poll(0)
    assert p.flush(60) == 0
    assert not errors, errors[:3]


def watermarks(bootstrap, topic):
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": uniq("wm"), "log_level": 2})
    try:
        return c.get_watermark_offsets(TopicPartition(topic, 0), timeout=20, cached=False)
    finally:
        c.close()


def latest_per_key(bootstrap, topic):
    """Reads the partition from the beginning to its high watermark: key -> last value."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": uniq("reader"), "enable.auto.commit": False,
                  "auto.offset.reset": "earliest", "log_level": 2})
    try:
        _, high = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=20, cached=False)
        c.assign([TopicPartition(topic, 0, 0)])
        view, last = {}, -1
        deadline = time.time() + 60
        while last + 1 < high:
            assert time.time() < deadline, f"read up to {last}, high watermark {high}"
            m = c.poll(0.5)
            if m is None:
                continue
            assert m.error() is None, m.error()
            view[m.key().decode()] = m.value().decode()
            last = m.offset()
        return view
    finally:
        c.close()


def cleaner_checkpoint(broker, topic):
    f = Path(broker.data_dir) / "cleaner-offset-checkpoint"
    if not f.exists():
        return None
    for line in f.read_text().splitlines()[2:]:
        t, p, o = line.split()
        if t == topic and p == "0":
            return int(o)
    return None


def leader_known_to(c, broker_id, topic):
    """The leader of partition 0 in the Metadata broker `broker_id` answers (the znode changes
    first; a client asking the broker a moment later may not find the partition yet)."""
    return c.metadata(broker_id, topic).topics[topic].partitions[0].leader


def segment_bases(broker, topic):
    return sorted(int(f.name[:-4]) for f in (Path(broker.data_dir) / f"{topic}-0").glob("*.log"))


def test_the_cleaner_leaves_records_above_the_high_watermark_alone(cluster_factory):
    """Broker 1 leads, broker 2 follows and is paused: the high watermark stays where broker 2
    stopped while broker 1 takes newer versions of every key with acks=1. Broker 1's cleaner
    must stop at the high watermark: when broker 2 then becomes leader and broker 1 truncates
    to it, broker 1 still has the latest value of every key that broker 2 has (cleaning with
    the newer versions would have removed the older ones that broker 2 kept)."""
    # Broker 2 stays in the ISR while paused: the leader's lag limit and its ZooKeeper session
    # both outlast the pause.
    c = cluster_factory(2, {"replica.lag.time.max.ms": "600000", "log.cleaner.backoff.ms": "100",
                            "auto.leader.rebalance.enable": "false", "replica.fetch.max.bytes": "1"},
                        session_timeout_ms=30000)
    topic = uniq("compact-hw")
    cfg = {"cleanup.policy": "compact", "segment.bytes": "16384", "min.cleanable.dirty.ratio": "0.01"}
    a = c.admin(1)  # kept: a collected client would abandon its requests
    for f in a.create_topics([NewTopic(topic, 1, replica_assignment=[[1, 2]], config=cfg)],
                             operation_timeout=30).values():
        f.result(30)
    c.wait_topic_online(topic, 1)
    b1, b2 = c.brokers[1], c.brokers[2]
    produce(b1.bootstrap, topic, "first", 20, 50, acks="all")
    _, hw = watermarks(b1.bootstrap, topic)
    assert hw == 1000

    sigstop(b2)
    # Key by key: the one batch that may still reach broker 2 (below) holds few keys.
    produce(b1.bootstrap, topic, "second", 20, 50, acks="1", key_major=True)
    low, high = watermarks(b1.bootstrap, topic)
    assert high == hw, "the paused follower holds the high watermark back"
    # The dirty section ends at the base of the segment holding the high watermark.
    bound = max(b for b in segment_bases(b1, topic) if b <= hw)
    assert len([b for b in segment_bases(b1, topic) if b > bound]) >= 3, "segments above the bound to tempt it"
    wait_until(lambda: cleaner_checkpoint(b1, topic) == bound, WAIT,
               f"broker 1's cleaner to clean up to {bound} (checkpoint {cleaner_checkpoint(b1, topic)})")

    # Broker 2 takes over with the first 1000 records; broker 1 comes back as its follower and
    # truncates its second round away.
    b1.kill()
    sigcont(b2)
    wait_until(lambda: c.partition_state(topic, 0)["leader"] == 2, WAIT, "broker 2 to lead")
    wait_until(lambda: leader_known_to(c, 2, topic) == 2, WAIT, "broker 2's metadata to name it leader")
    # Broker 2 may also have the first batch of the second round: the answer to the fetch it
    # had parked (one batch: replica.fetch.max.bytes) was in its socket when it was paused.
    want = latest_per_key(b2.bootstrap, topic)
    assert sorted(want) == [f"k{k:02d}" for k in range(50)]
    first = [k for k, v in want.items() if v == "first-19-" + "x" * 100]
    assert len(first) >= 25, f"broker 2 has mostly the first round: {len(first)} keys"
    b1.start()
    wait_until(lambda: sorted(c.partition_state(topic, 0)["isr"]) == [1, 2], WAIT, "broker 1 back in the ISR")
    # Broker 1 leads again with what it kept: every key's latest value must be there.
    b2.stop()
    wait_until(lambda: c.partition_state(topic, 0)["leader"] == 1, WAIT, "broker 1 to lead")
    wait_until(lambda: leader_known_to(c, 1, topic) == 1, WAIT, "broker 1's metadata to name it leader")
    assert latest_per_key(b1.bootstrap, topic) == want


def offsets_cluster(cluster_factory, **extra):
    o = {"offsets.topic.num.partitions": "1", "offsets.topic.replication.factor": "3",
         "replica.lag.time.max.ms": "10000", "auto.leader.rebalance.enable": "false",
         "log.cleaner.backoff.ms": "100"}
    o.update(extra)
    c = cluster_factory(3, o)
    topic = uniq("offsets-src")
    a = c.admin(1)  # kept: a collected client would abandon its requests
    for f in a.create_topics([NewTopic(topic, 1, 3)], operation_timeout=30).values():
        f.result(30)
    c.wait_topic_online(topic, 1)
    return c, topic


def coordinator(c):
    return c.partition_state(OFFSETS, 0)["leader"]


def committed(c, group, topic):
    """The group's committed offset, asked of whichever broker coordinates it now."""
    cons = Consumer({"bootstrap.servers": c.bootstrap(), "group.id": group, "enable.auto.commit": False,
                     "log_level": 2})
    try:
        return cons.committed([TopicPartition(topic, 0)], timeout=30)[0].offset
    finally:
        cons.close()


def move_coordinator(c):
    """kill -9 the coordinator's broker; returns (old, new) once another one leads."""
    old = coordinator(c)
    c.brokers[old].kill()
    new = wait_until(lambda: (lambda l: l if l not in (old, -1) else None)(coordinator(c)), WAIT,
                     "another broker to lead __consumer_offsets")
    return old, new


def test_committed_offsets_survive_retention_restart_and_coordinator_moves(cluster_factory):
    c, topic = offsets_cluster(cluster_factory, **{"log.retention.ms": "1000",
                                                  "log.retention.check.interval.ms": "200",
                                                  "offsets.topic.segment.bytes": "2048"})
    once = uniq("commits-once")
    cons = Consumer({"bootstrap.servers": c.bootstrap(), "group.id": once, "enable.auto.commit": False})
    cons.commit(offsets=[TopicPartition(topic, 0, 42)], asynchronous=False)
    cons.close()
    busy = Consumer({"bootstrap.servers": c.bootstrap(), "group.id": uniq("commits-often"),
                     "enable.auto.commit": False})
    for n in range(1, 301):  # some 15 segments of 2 KiB
        busy.commit(offsets=[TopicPartition(topic, 0, n)], asynchronous=False)
    busy.close()
    lead = c.brokers[coordinator(c)]
    # Some 14 commits a segment: the active one starts far past the first commit's (the
    # cleaner merges the rolled ones as it goes).
    assert segment_bases(lead, OFFSETS)[-1] > 200, "many segments rolled"
    # The commit sits in a segment far older than log.retention.ms: wait for the coordinator's
    # cleaner to have been over it, well past the segment retention would have taken first.
    wait_until(lambda: (cleaner_checkpoint(lead, OFFSETS) or 0) > 100, WAIT, "the cleaner to pass the commit")

    old, new = move_coordinator(c)
    assert committed(c, once, topic) == 42, f"after the move from {old} to {new}"
    c.brokers[old].start()
    wait_until(lambda: sorted(c.partition_state(OFFSETS, 0)["isr"]) == [1, 2, 3], WAIT, f"{old} back in the ISR")
    old2, new2 = move_coordinator(c)
    assert committed(c, once, topic) == 42, f"after the restart of {old} and the move from {old2} to {new2}"


def test_an_empty_groups_offsets_expire_from_when_it_became_empty_across_a_move(cluster_factory):
    """The group commits, then stays a member for longer than offsets.retention.minutes, then
    leaves. The coordinator that takes over must count from the leave (stored in the group's
    metadata record), not from the commit, which is already older than the retention."""
    c, topic = offsets_cluster(cluster_factory, **{"offsets.retention.minutes": "1",
                                                  "offsets.retention.check.interval.ms": "500"})
    group = uniq("empties")
    member = Consumer({"bootstrap.servers": c.bootstrap(), "group.id": group, "enable.auto.commit": False,
                       "session.timeout.ms": "10000", "log_level": 2})
    member.subscribe([topic])
    wait_until(lambda: member.poll(0.2) is None and member.assignment(), WAIT, "an assignment")
    member.commit(offsets=[TopicPartition(topic, 0, 5)], asynchronous=False)
    committed_at = time.time()
    while time.time() - committed_at < 65:  # a live member: its group's offsets never expire
        member.poll(0.5)
    assert committed(c, group, topic) == 5, "a Stable group's offsets stay"
    member.close()  # LeaveGroup: the group is Empty from here
    empty_at = time.time()

    old, new = move_coordinator(c)
    # The commit is 65 s old; without the Empty time the new coordinator would drop it at its
    # first check (every 500 ms). Three checks must pass with the offset still there.
    first = wait_until(lambda: committed(c, group, topic) == 5 and time.time(), WAIT,
                       f"broker {new} to serve the offset")
    while time.time() - first < 1.5:
        assert committed(c, group, topic) == 5, f"broker {new} expired the offset early"
    wait_until(lambda: committed(c, group, topic) < 0, 120, "the offset to expire")
    assert time.time() - empty_at > 55, "not before offsets.retention.minutes after the leave"
    # The tombstones hold at the next coordinator too.
    c.brokers[old].start()
    wait_until(lambda: sorted(c.partition_state(OFFSETS, 0)["isr"]) == [1, 2, 3], WAIT, f"{old} back in the ISR")
    move_coordinator(c)
    assert committed(c, group, topic) < 0
