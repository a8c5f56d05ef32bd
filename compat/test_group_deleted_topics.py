"""Committed offsets of a deleted topic leave the groups (Kafka's onPartitionsDeleted).

A 3-broker cluster with a real ZooKeeper, and a standalone broker. Two groups commit offsets (simple commits, as tools
and manually assigned consumers make them): one for a topic that is then deleted and one that
stays, the other for the deleted topic only. After the deletion OffsetFetch (all partitions, and
the deleted ones named) must not return the deleted topic's offsets, the group that had nothing
else is gone from ListGroups, DescribeGroups answers; and the same after every broker restarts
(the coordinator wrote tombstones to __consumer_offsets, so reloading does not bring them back).
`kafka-consumer-groups --describe --all-groups` failed with UnknownTopicOrPartitionException
while such offsets remained.
"""
from __future__ import annotations

import uuid
from typing import Dict, Tuple

import pytest

pytest.importorskip("kazoo")
ck = pytest.importorskip("confluent_kafka")
from confluent_kafka import OFFSET_BEGINNING, Consumer, ConsumerGroupTopicPartitions, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

from cluster_harness import Cluster  # noqa: E402
from gregor_fixtures import _failed, _register  # noqa: E402
from gregor_harness import wait_until  # noqa: E402
from groups_tools import offsets_partition  # noqa: E402

WAIT = 60
PARTS = 3


@pytest.fixture
def cluster(request, zookeeper):
    # The ZooKeeper offsets mirror copies every 200 ms, so the test sees what it wrote.
    c = Cluster(zookeeper, 3, overrides={"offsets.topic.replication.factor": "3",
                                         "gregor.offsets.zookeeper.mirror.interval.ms": "200"},
                on_new_broker=lambda b: _register(request, b))
    c.start()
    yield c
    c.cleanup(keep=_failed(request))


def uniq(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def admin(bs: str) -> AdminClient:
    # Kept referenced by the caller until its futures are done: a destroyed client fails them.
    return AdminClient({"bootstrap.servers": bs, "log_level": 2})


def create_topic(bs: str, name: str, rf: int) -> None:
    a = admin(bs)
    a.create_topics([NewTopic(name, num_partitions=PARTS, replication_factor=rf)])[name].result(timeout=WAIT)

    def online():
        t = a.list_topics(name, timeout=10).topics[name]
        return t.error is None and len(t.partitions) == PARTS and all(p.leader >= 0 for p in t.partitions.values())
    wait_until(online, WAIT, f"{name} online")


def delete_topic(bs: str, name: str) -> None:
    a = admin(bs)
    a.delete_topics([name], operation_timeout=30)[name].result(timeout=WAIT)
    wait_until(lambda: name not in a.list_topics(timeout=10).topics, WAIT, f"{name} gone from metadata")


def commit(bs: str, group: str, offsets: Dict[Tuple[str, int], int]) -> None:
    """A simple (memberless) commit, as a manually assigned consumer or a tool makes it;
    retried while __consumer_offsets leaders settle after the cluster started (librdkafka
    hands NOT_COORDINATOR of a synchronous commit back to the caller)."""
    cons = Consumer({"bootstrap.servers": bs, "group.id": group, "enable.auto.commit": False, "log_level": 2})
    try:
        tps = [TopicPartition(t, p, o) for (t, p), o in offsets.items()]

        def committed():
            res = cons.commit(offsets=tps, asynchronous=False)
            return all(tp.error is None for tp in res)
        wait_until(committed, WAIT, f"{group}'s commit", interval=0.2)
    finally:
        cons.close()


def fetch(bs: str, group: str, named=None) -> Dict[Tuple[str, int], int]:
    """OffsetFetch through the AdminClient: every committed offset (or those of `named`);
    partitions without one are left out."""
    req = ConsumerGroupTopicPartitions(group, [TopicPartition(t, p) for t, p in named] if named else None)
    a = admin(bs)
    # A short timeout, so that a request lost while the cluster restarts is retried by the
    # caller's wait instead of using up all of it.
    res = a.list_consumer_group_offsets([req], request_timeout=10)[group].result(timeout=15)
    return {(tp.topic, tp.partition): tp.offset for tp in res.topic_partitions if tp.offset >= 0}


def group_ids(bs: str) -> set:
    a = admin(bs)
    res = a.list_consumer_groups(request_timeout=WAIT).result(timeout=WAIT)
    assert not res.errors, res.errors
    return {g.group_id for g in res.valid}


def check_gone(bs: str, mixed: str, only: str, gone: str, kept: str) -> None:
    want = {(kept, p): 10 + p for p in range(PARTS)}
    # OffsetFetch for all partitions is the condition the deletion must reach (clients retry
    # while a coordinator loads); the other views are then checked once.
    last = {}

    def only_kept():
        last["got"] = fetch(bs, mixed)
        return last["got"] == want
    try:
        wait_until(only_kept, WAIT, f"{mixed}'s offsets to be only {kept}'s", interval=0.2)
    except TimeoutError as e:
        raise AssertionError(f"{e}; last answer {last.get('got')}") from None
    named = [(gone, p) for p in range(PARTS)] + [(kept, 0)]
    assert fetch(bs, mixed, named) == {(kept, 0): 10}
    assert fetch(bs, only) == {}
    ids = group_ids(bs)
    assert only not in ids, f"{only} had offsets for {gone} only and should be gone"
    assert mixed in ids
    a = admin(bs)
    for f in a.describe_consumer_groups([mixed, only]).values():
        f.result(timeout=WAIT)  # answers (a group that is gone is described as Dead)


def replicated_tombstones(bs: str, group: str, topic: str) -> int:
    """Tombstones for `group`'s offsets of `topic` below the high watermark of its
    __consumer_offsets partition, i.e. on every in-sync replica: a restart right after the
    deletion cannot lose them then (the coordinator does not wait for them, as in Kafka)."""
    cons = Consumer({"bootstrap.servers": bs, "group.id": uniq("reader"), "enable.auto.commit": False,
                     "log_level": 2})
    try:
        p = offsets_partition(group)
        _, high = cons.get_watermark_offsets(TopicPartition("__consumer_offsets", p), timeout=10)
        cons.assign([TopicPartition("__consumer_offsets", p, OFFSET_BEGINNING)])
        found, pos = 0, 0
        while pos < high:
            m = cons.poll(5)
            if m is None:
                raise TimeoutError("no records below the high watermark")
            if m.error() is not None:
                continue
            pos = m.offset() + 1
            key = m.key() or b""
            if m.value() is None and group.encode() in key and topic.encode() in key:
                found += 1
        return found
    finally:
        cons.close()


def commit_delete_check(bs: str, rf: int, restart, mirror=None) -> None:
    """`mirror(group, topic)`: the partitions of `topic` the ZooKeeper offsets mirror holds for
    `group` (None: no mirror)."""
    gone, kept = uniq("gone"), uniq("kept")
    mixed, only = uniq("mixed"), uniq("only")
    create_topic(bs, gone, rf)
    create_topic(bs, kept, rf)
    commit(bs, mixed, {**{(gone, p): 5 + p for p in range(PARTS)}, **{(kept, p): 10 + p for p in range(PARTS)}})
    commit(bs, only, {(gone, p): 7 for p in range(PARTS)})
    assert len(wait_until(lambda: fetch(bs, mixed), WAIT, "committed offsets")) == 2 * PARTS
    assert {only, mixed} <= group_ids(bs)
    if mirror:
        wait_until(lambda: len(mirror(mixed, gone)) == PARTS, WAIT, "offsets mirrored to ZooKeeper")

    delete_topic(bs, gone)
    check_gone(bs, mixed, only, gone, kept)
    for g in (mixed, only):
        wait_until(lambda g=g: replicated_tombstones(bs, g, gone) == PARTS, WAIT,
                   f"{g}'s tombstones for {gone} replicated", interval=0.2)
    if mirror:
        wait_until(lambda: not mirror(mixed, gone) and not mirror(only, gone), WAIT,
                   f"the ZooKeeper mirror to drop {gone}'s offsets")
    bs = restart()
    check_gone(bs, mixed, only, gone, kept)
    if mirror:
        wait_until(lambda: len(mirror(mixed, kept)) == PARTS, WAIT, f"{kept}'s offsets mirrored")
        assert not mirror(mixed, gone) and not mirror(only, gone)


def test_deleted_topic_offsets_leave_groups_on_a_cluster(cluster):
    c = cluster

    def restart_all() -> str:
        for b in c.brokers.values():
            assert b.stop() == 0
        for b in c.brokers.values():
            b._fixed_port = True
            b.start()
        c.wait_registered([1, 2, 3])
        c.wait_controller()
        c.wait_topic_online("__consumer_offsets", 50, timeout=WAIT)
        return c.bootstrap()

    def mirror(group: str, topic: str) -> list:
        path = f"/consumers/{group}/offsets/{topic}"
        return c.kz.get_children(path) if c.exists(path) else []

    commit_delete_check(c.bootstrap(), 3, restart_all, mirror)


def test_deleted_topic_offsets_leave_groups_standalone(broker):
    def restart() -> str:
        assert broker.restart() == 0
        return broker.bootstrap

    commit_delete_check(broker.bootstrap, 1, restart)
