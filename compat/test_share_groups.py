"""Share groups (KIP-932) against gregor with confluent-kafka's ShareConsumer (librdkafka 2.16).

A share group's members read the same partitions cooperatively: each record is acquired by
one member at a time under a lock, then accepted, released (delivered again, with a higher
delivery count) or rejected (never delivered again).  Share-partitions start at the latest
offset (`share.auto.offset.reset`'s default) when their leader first sees a ShareFetch for
them, so every test first produces "warm" records one at a time until a member receives
one: from then on every record produced is one the group must deliver.

Consumers that a test kills run as subprocesses (compat/share_tools.py); the others run in
the test.  Every wait polls a condition; [measure] lines are measurements, never assertions.
"""
from __future__ import annotations

import json
import sys
import time
import uuid
from pathlib import Path
from typing import Callable, Dict, List

import pytest

ck = pytest.importorskip("confluent_kafka")
from confluent_kafka import Consumer, Producer  # noqa: E402
from confluent_kafka.admin import (  # noqa: E402
    AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic, ResourceType)

if not hasattr(ck, "ShareConsumer"):
    pytest.skip("confluent-kafka without ShareConsumer", allow_module_level=True)
from confluent_kafka import AcknowledgeType, ShareConsumer  # noqa: E402

from cluster_harness import Cluster  # noqa: E402
from gregor_fixtures import _failed, _register  # noqa: E402
from gregor_harness import wait_until  # noqa: E402
from share_tools import ShareWorker  # noqa: E402

WAIT = 60
SHARE_APIS = (76, 77, 78, 79)
OVERRIDES = {
    "offsets.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "5",
    "group.coordinator.rebalance.protocols": "classic,consumer,share",
    # Short locks, so that a killed member's records come back within seconds.
    "group.share.min.record.lock.duration.ms": "1000",
    "group.share.record.lock.duration.ms": "3000",
}


@pytest.fixture
def workers(request):
    made: List[ShareWorker] = []

    def make(name, bootstrap, group, topic, **opts) -> ShareWorker:
        w = ShareWorker(name, bootstrap, group, topic, **opts)
        made.append(w)
        return w

    yield make
    for w in made:
        w.kill()
    if _failed(request):
        for w in made:
            request.node.add_report_section(
                "call", f"share worker {w.name}",
                "\n".join(json.dumps(e) for e in w.events[-40:]) + "\n--- stderr ---\n" + w.stderr_tail())


@pytest.fixture
def report(capsys):
    def out(msg):
        with capsys.disabled():
            print(f"\n[measure] {msg}", flush=True)
    return out


def uniq(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def create_topic(bootstrap: str, name: str, partitions: int = 1, rf: int = 1) -> None:
    a = AdminClient({"bootstrap.servers": bootstrap})
    a.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=rf)])[name].result(timeout=WAIT)


def producer(bootstrap: str) -> Producer:
    return Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, "log_level": 2})


def produce(p: Producer, topic: str, values: List[str]) -> None:
    errors = []
    for v in values:
        p.produce(topic, value=v.encode(), on_delivery=lambda err, _m: errors.append(err) if err else None)
        p.poll(0)
    assert p.flush(WAIT) == 0
    assert not errors, errors[:5]


def warm_up(p: Producer, topic: str, received: Callable[[], bool], poll: Callable[[], None] = lambda: None) -> None:
    """Produces warm records one at a time until the group has received one."""
    deadline = time.time() + WAIT
    n = 0
    while not received():
        assert time.time() < deadline, "no warm record reached the share group"
        produce(p, topic, [f"warm-{n}"])
        n += 1
        t = time.time() + 1
        while time.time() < t and not received():
            poll()
            time.sleep(0.02)


def share_consumer(bootstrap: str, group: str, explicit: bool = False, **conf) -> ShareConsumer:
    c = {"bootstrap.servers": bootstrap, "group.id": group, "log_level": 3, **conf}
    if explicit:
        c["share.acknowledgement.mode"] = "explicit"
    return ShareConsumer(c)


class InProcess:
    """An explicit-mode ShareConsumer in the test: what each poll returned, by value."""

    def __init__(self, bootstrap: str, group: str, topic: str, **conf):
        self.c = share_consumer(bootstrap, group, explicit=True, **conf)
        self.c.subscribe([topic])
        self.seen: List[tuple] = []  # (value, offset, delivery count)

    def poll(self, decide: Callable[[str], int] = lambda v: AcknowledgeType.ACCEPT) -> None:
        msgs = self.c.poll(0.2)
        good = [m for m in msgs if not m.error()]
        for m in good:
            v = m.value().decode()
            self.seen.append((v, m.offset(), m.delivery_count()))
            self.c.acknowledge(m, decide(v))
        if good:
            self.c.commit_sync(WAIT)

    def values(self) -> List[str]:
        return [v for v, _, _ in self.seen]

    def until(self, cond: Callable[[], bool], what: str, decide=lambda v: AcknowledgeType.ACCEPT) -> None:
        deadline = time.time() + WAIT
        while not cond():
            assert time.time() < deadline, f"timed out waiting for {what}; seen {self.seen[-20:]}"
            self.poll(decide)


def test_share_apis_are_offered_only_when_enabled(broker_factory):
    off = broker_factory(overrides={"offsets.topic.replication.factor": "1"})
    assert not [k for k in SHARE_APIS if k in off.api_versions], off.api_versions
    on = broker_factory(overrides=OVERRIDES)
    assert {k: on.api_versions.get(k) for k in SHARE_APIS} == {k: (1, 1) for k in SHARE_APIS}


def test_three_consumers_on_one_partition_get_distinct_records_and_together_all(broker_factory, workers, report):
    b = broker_factory(overrides=OVERRIDES)
    topic, group = uniq("share"), uniq("sg")
    create_topic(b.bootstrap, topic)
    ws = [workers(f"w{i}", b.bootstrap, group, topic, max_records=5, delay=0.01) for i in range(3)]
    p = producer(b.bootstrap)
    warm_up(p, topic, lambda: any(w.records() for w in ws))
    want = [f"r-{i}" for i in range(600)]
    t0 = time.time()
    for i in range(0, len(want), 50):
        produce(p, topic, want[i:i + 50])

    def got() -> Dict[str, List[str]]:
        out: Dict[str, List[str]] = {}
        for w in ws:
            for r in w.records():
                if r["v"].startswith("r-"):
                    out.setdefault(r["v"], []).append(w.name)
        return out

    wait_until(lambda: set(want) <= set(got()), WAIT, "every record delivered to the group", interval=0.1)
    took = time.time() - t0
    seen = got()
    twice = {v: names for v, names in seen.items() if len(names) > 1}
    assert not twice, f"{len(twice)} records delivered twice, e.g. {list(twice.items())[:5]}"
    per = {w.name: sum(1 for r in w.records() if r["v"].startswith("r-")) for w in ws}
    assert all(n > 0 for n in per.values()), per
    assert all(r["dc"] == 1 for w in ws for r in w.records()), "a record was delivered again"
    for w in ws:
        w.close()
    assert [w.proc.returncode for w in ws] == [0, 0, 0], [w.stderr_tail() for w in ws]
    report(f"share group: 600 records over 3 members {per} in {took:.2f}s")


def test_released_record_comes_back_with_a_higher_count_and_a_rejected_one_never(broker_factory):
    b = broker_factory(overrides=OVERRIDES)
    topic, group = uniq("share"), uniq("sg")
    create_topic(b.bootstrap, topic)
    c = InProcess(b.bootstrap, group, topic)
    p = producer(b.bootstrap)
    try:
        warm_up(p, topic, lambda: bool(c.seen), c.poll)
        produce(p, topic, ["release-me", "reject-me", "accept-me"])

        def decide(v):
            return {"release-me": AcknowledgeType.RELEASE, "reject-me": AcknowledgeType.REJECT}.get(
                v, AcknowledgeType.ACCEPT) if c.values().count(v) <= 1 else AcknowledgeType.ACCEPT

        c.until(lambda: c.values().count("release-me") >= 2, "the released record again", decide)
        again = [dc for v, _, dc in c.seen if v == "release-me"]
        assert again[:2] == [1, 2], c.seen
        produce(p, topic, ["later"])
        c.until(lambda: "later" in c.values(), "a record produced later", decide)
        assert c.values().count("reject-me") == 1, c.seen
        assert c.values().count("accept-me") == 1, c.seen
        assert c.values().count("release-me") == 2, c.seen
    finally:
        c.c.close()


def test_records_past_the_delivery_limit_are_archived(broker_factory):
    b = broker_factory(overrides={**OVERRIDES, "group.share.delivery.count.limit": "2"})
    topic, group = uniq("share"), uniq("sg")
    create_topic(b.bootstrap, topic)
    c = InProcess(b.bootstrap, group, topic)
    p = producer(b.bootstrap)
    try:
        warm_up(p, topic, lambda: bool(c.seen), c.poll)
        produce(p, topic, ["poison"])

        def release_poison(v):
            return AcknowledgeType.RELEASE if v == "poison" else AcknowledgeType.ACCEPT

        c.until(lambda: c.values().count("poison") >= 2, "the second delivery", release_poison)
        # Released a second time, at the limit: archived. A record produced after it is
        # delivered; the poison record, had it been made available, would come first.
        produce(p, topic, ["after"])
        c.until(lambda: "after" in c.values(), "the record after", release_poison)
        for _ in range(10):
            c.poll(release_poison)
        assert [dc for v, _, dc in c.seen if v == "poison"] == [1, 2], c.seen
    finally:
        c.c.close()


def test_records_held_by_a_killed_consumer_go_to_another_after_the_lock(broker_factory, workers, report):
    b = broker_factory(overrides=OVERRIDES)
    topic, group = uniq("share"), uniq("sg")
    create_topic(b.bootstrap, topic)
    p = producer(b.bootstrap)
    first = InProcess(b.bootstrap, group, topic)
    warm_up(p, topic, lambda: bool(first.seen), first.poll)
    first.c.close()
    values = [f"held-{i}" for i in range(10)]
    produce(p, topic, values)
    holder = workers("holder", b.bootstrap, group, topic, hold=True)
    wait_until(lambda: holder.evs("holding"), WAIT, "the holder to receive records", interval=0.1)
    held = {r["v"] for r in holder.records()}
    assert held and held <= set(values), held
    holder.kill()
    killed = time.time()
    other = workers("other", b.bootstrap, group, topic)
    wait_until(lambda: set(values) <= {r["v"] for r in other.records()}, WAIT,
               "the other member to receive every record", interval=0.1)
    took = time.time() - killed
    counts = {r["v"]: r["dc"] for r in other.records() if r["v"] in values}
    assert all(counts[v] >= 2 for v in held), counts
    assert all(counts[v] == 1 for v in set(values) - held), counts
    report(f"share group: {len(held)} records held by a killed member redelivered {took:.2f}s after the kill "
           f"(lock 3 s)")


def test_a_closed_consumer_releases_what_it_holds(broker_factory, report):
    b = broker_factory(overrides={**OVERRIDES, "group.share.record.lock.duration.ms": "60000",
                                  "group.share.max.record.lock.duration.ms": "60000"})
    topic, group = uniq("share"), uniq("sg")
    create_topic(b.bootstrap, topic)
    p = producer(b.bootstrap)
    first = InProcess(b.bootstrap, group, topic)
    warm_up(p, topic, lambda: bool(first.seen), first.poll)
    produce(p, topic, ["x"])
    msgs: list = []
    deadline = time.time() + WAIT
    while not [m for m in msgs if not m.error()]:
        assert time.time() < deadline
        msgs = first.c.poll(0.2)
    # Closed without acknowledging: close accepts nothing in explicit mode, and the final
    # share-session request gives the records back at once, not after the 60 s lock.
    t0 = time.time()
    first.c.close()
    second = InProcess(b.bootstrap, group, topic)
    try:
        second.until(lambda: "x" in second.values(), "x at the second member")
        took = time.time() - t0
        assert [dc for v, _, dc in second.seen if v == "x"] == [2], second.seen
        assert took < 30, took
        report(f"share group: a closed member's record redelivered after {took:.2f}s (lock 60 s)")
    finally:
        second.c.close()


def test_a_classic_group_and_a_share_group_read_the_same_topic_independently(broker_factory, workers):
    b = broker_factory(overrides=OVERRIDES)
    topic, group = uniq("share"), uniq("sg")
    create_topic(b.bootstrap, topic)
    sw = workers("share", b.bootstrap, group, topic)
    p = producer(b.bootstrap)
    warm_up(p, topic, lambda: bool(sw.records()))
    want = [f"r-{i}" for i in range(100)]
    produce(p, topic, want)
    classic = Consumer({"bootstrap.servers": b.bootstrap, "group.id": uniq("classic"),
                        "auto.offset.reset": "earliest", "log_level": 3})
    classic.subscribe([topic])
    got: List[str] = []
    try:
        deadline = time.time() + WAIT
        while not set(want) <= set(got):
            assert time.time() < deadline, f"classic group read {len(got)}"
            m = classic.poll(0.2)
            if m is not None and not m.error():
                got.append(m.value().decode())
    finally:
        classic.close()
    wait_until(lambda: set(want) <= {r["v"] for r in sw.records()}, WAIT, "the share group to read all", interval=0.1)
    assert got.count("r-0") == 1 and [r["v"] for r in sw.records()].count("r-0") == 1


def test_share_partition_state_survives_a_broker_kill(broker_factory, workers, report):
    """Acknowledged records stay acknowledged and delivery counts are kept across kill -9:
    the restarted leader reads the share-partition back from __share_group_state."""
    b = broker_factory(overrides=OVERRIDES)
    topic, group = uniq("share"), uniq("sg")
    create_topic(b.bootstrap, topic)
    p = producer(b.bootstrap)
    first = InProcess(b.bootstrap, group, topic)
    acked = [f"acked-{i}" for i in range(10)]
    try:
        warm_up(p, topic, lambda: bool(first.seen), first.poll)
        produce(p, topic, acked)
        first.until(lambda: set(acked) <= set(first.values()), "the first half, accepted")
    finally:
        first.c.close()
    pending = [f"pending-{i}" for i in range(10)]
    produce(p, topic, pending)
    # Acquired and never acknowledged: the holder keeps the locks until the broker dies.
    holder = workers("holder", b.bootstrap, group, topic, hold=True)
    wait_until(lambda: holder.evs("holding"), WAIT, "the holder to receive records", interval=0.1)
    held = {r["v"] for r in holder.records()}
    assert held and held <= set(pending), held
    b.restart(mode="kill")
    holder.kill()
    restarted = time.time()
    second = InProcess(b.bootstrap, group, topic)
    try:
        second.until(lambda: set(pending) <= set(second.values()), "every unacknowledged record after the restart")
        took = time.time() - restarted
        # A few more polls: nothing acknowledged before the kill comes back.
        for _ in range(5):
            second.poll()
        assert not [v for v in second.values() if not v.startswith("pending-")], second.seen
        counts = {v: dc for v, _, dc in second.seen}
        assert sorted(second.values()) == sorted(pending), second.seen
        assert {v: counts[v] for v in pending} == {v: 2 if v in held else 1 for v in pending}, second.seen
    finally:
        second.c.close()
    topics = AdminClient({"bootstrap.servers": b.bootstrap}).list_topics(timeout=WAIT).topics
    assert "__share_group_state" in topics, sorted(topics)
    report(f"share group: after kill -9 the restarted broker delivered the {len(pending)} unacknowledged "
           f"records ({len(held)} held, delivered again with count 2) in {took:.2f}s, none of the "
           f"{len(acked)} acknowledged")


TXN = {"transaction.state.log.replication.factor": "1", "transaction.state.log.min.isr": "1",
       "transaction.state.log.num.partitions": "1"}


def set_group_configs(bootstrap: str, group: str, configs: Dict[str, str]) -> None:
    """IncrementalAlterConfigs SET on the GROUP config resource (type 32 on the wire)."""
    entries = [ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in configs.items()]
    res = ConfigResource(ResourceType.GROUP, group, incremental_configs=entries)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.incremental_alter_configs([res])[res].result(timeout=WAIT)


def test_read_committed_share_group_receives_only_committed_records(broker_factory):
    """A transactional producer commits some transactions and aborts others. A share group
    set to read_committed receives exactly the committed records, and nothing past an open
    transaction until it ends; one left at read_uncommitted receives every data record. Both
    start at the earliest offset (share.auto.offset.reset), so no warm-up is needed."""
    b = broker_factory(overrides={**OVERRIDES, **TXN})
    topic, rc_group, ru_group = uniq("share"), uniq("sg-rc"), uniq("sg-ru")
    create_topic(b.bootstrap, topic)
    set_group_configs(b.bootstrap, rc_group, {"share.isolation.level": "read_committed",
                                              "share.auto.offset.reset": "earliest"})
    set_group_configs(b.bootstrap, ru_group, {"share.auto.offset.reset": "earliest"})
    tp = Producer({"bootstrap.servers": b.bootstrap, "transactional.id": uniq("tx"), "log_level": 2})
    tp.init_transactions(WAIT)
    committed: List[str] = []
    data: List[str] = []
    for i in range(6):
        values = [f"t{i}-{j}" for j in range(5)]
        tp.begin_transaction()
        for v in values:
            tp.produce(topic, value=v.encode())
        # Written before the abort: an abort drops what the producer has not sent yet.
        assert tp.flush(WAIT) == 0
        if i % 2 == 0:
            tp.commit_transaction(WAIT)
            committed += values
        else:
            tp.abort_transaction(WAIT)
        data += values
    plain = producer(b.bootstrap)
    produce(plain, topic, ["end"])
    rc = InProcess(b.bootstrap, rc_group, topic)
    ru = InProcess(b.bootstrap, ru_group, topic)
    try:
        rc.until(lambda: "end" in rc.values(), "read_committed to reach the plain record")
        ru.until(lambda: "end" in ru.values(), "read_uncommitted to reach the plain record")
        assert sorted(rc.values()) == sorted(committed + ["end"]), rc.seen
        assert sorted(ru.values()) == sorted(data + ["end"]), ru.seen
        assert all(dc == 1 for _, _, dc in rc.seen + ru.seen), (rc.seen, ru.seen)
        # An open transaction holds back what follows it under read_committed.
        tp.begin_transaction()
        for j in range(3):
            tp.produce(topic, value=f"open-{j}".encode())
        tp.flush(WAIT)
        produce(plain, topic, ["after-open"])
        ru.until(lambda: "after-open" in ru.values(), "read_uncommitted to read past the open transaction")
        for _ in range(10):
            rc.poll()
        assert not [v for v in rc.values() if v.startswith("open-") or v == "after-open"], rc.seen
        tp.commit_transaction(WAIT)
        rc.until(lambda: "after-open" in rc.values(), "read_committed after the commit")
        assert sorted(rc.values()) == sorted(committed + ["end", "open-0", "open-1", "open-2", "after-open"]), rc.seen
    finally:
        rc.c.close()
        ru.c.close()


@pytest.fixture
def cluster(request, zookeeper):
    c = Cluster(zookeeper, 3, overrides={**OVERRIDES, "offsets.topic.replication.factor": "3"},
                on_new_broker=lambda b: _register(request, b))
    c.start()
    yield c
    c.cleanup(keep=_failed(request))


def zk_ids(c: Cluster, group: str) -> Dict[str, dict]:
    path = f"/consumers/{group}/ids"
    if not c.exists(path):
        return {}
    out = {}
    for m in c.kz.get_children(path):
        try:
            out[m] = c.get_json(f"{path}/{m}")
        except Exception:  # noqa: BLE001 - vanished between list and get
            pass
    return out


def test_share_group_on_three_brokers_and_its_members_in_zookeeper(cluster, workers):
    c = cluster
    topic, group = uniq("share"), uniq("sg")
    a = c.admin(c.controller())
    a.create_topics([NewTopic(topic, num_partitions=3, replication_factor=3)])[topic].result(timeout=WAIT)
    ws = [workers(f"z{i}", c.bootstrap(), group, topic, max_records=10, delay=0.01) for i in range(2)]
    wait_until(lambda: len(zk_ids(c, group)) == 2, WAIT, "both members under /consumers/<group>/ids", interval=0.2)
    for data in zk_ids(c, group).values():
        assert data["subscription"] == {topic: 1}, data
    p = producer(c.bootstrap())
    # Each partition's leader starts its share-partition at its first ShareFetch: warm
    # records into each partition until one of them is delivered.
    for part in range(3):
        deadline = time.time() + WAIT
        n = 0
        while not any(r["v"].startswith(f"warm-p{part}-") for w in ws for r in w.records()):
            assert time.time() < deadline, f"partition {part} never delivered"
            p.produce(topic, value=f"warm-p{part}-{n}".encode(), partition=part)
            p.flush(WAIT)
            n += 1
            time.sleep(0.3)
    want = [f"r-{i}" for i in range(300)]
    produce(p, topic, want)
    wait_until(lambda: set(want) <= {r["v"] for w in ws for r in w.records()}, WAIT, "all records", interval=0.1)
    seen = [r["v"] for w in ws for r in w.records() if r["v"].startswith("r-")]
    assert len(seen) == len(set(seen)), "a record was delivered twice"
    ws[0].close()
    wait_until(lambda: len(zk_ids(c, group)) == 1, WAIT, "the closed member gone from ZooKeeper", interval=0.2)


def java_hash(s: str) -> int:
    h = 0
    for ch in s.encode("utf-16-be").decode("utf-16-be"):
        h = (31 * h + ord(ch)) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def state_partition(group: str, topic_id: str, partition: int, partitions: int) -> int:
    """Kafka's share coordinator key hashed as a group id over `__share_group_state`."""
    h = java_hash(f"{group}:{topic_id}:{partition}")
    return (0 if h == -(1 << 31) else abs(h)) % partitions


class RemoteState:
    """A one-partition topic (rf 3) on the cluster and a share group whose share coordinator
    (the leader of its `__share_group_state` partition) is broker `coordinator`, chosen by
    `pick(leader, replicas)`, while broker `leader` leads the topic's partition."""

    def __init__(self, c: Cluster, pick):
        self.c, self.topic = c, uniq("share")
        self.admin = c.admin(c.controller())
        self.admin.create_topics([NewTopic(self.topic, num_partitions=1, replication_factor=3)])[self.topic].result(
            timeout=WAIT)
        c.wait_topic_online(self.topic, 1)
        topic_id = c.topic_znode(self.topic)["topic_id"]
        self.p = producer(c.bootstrap())
        # A first share group makes the state topic exist; its leaders then decide the group.
        opener = InProcess(c.bootstrap(), uniq("open"), self.topic)
        try:
            warm_up(self.p, self.topic, lambda: bool(opener.seen), opener.poll)
        finally:
            opener.c.close()
        states = c.wait_topic_online("__share_group_state", 50)
        self.leader = c.partition_state(self.topic, 0)["leader"]
        self.coordinator = pick(self.leader, c.zk_assignment(self.topic)[0])
        self.state_partition = None
        for _ in range(1000):
            g = f"sg-{uuid.uuid4().hex[:8]}"
            sp = state_partition(g, topic_id, 0, 50)
            if states[sp]["leader"] == self.coordinator:
                self.group, self.state_partition = g, sp
                break
        assert self.state_partition is not None

    def consumer(self) -> InProcess:
        return InProcess(self.c.bootstrap(), self.group, self.topic)

    def accept(self, consumer: InProcess, values: List[str], what: str) -> None:
        produce(self.p, self.topic, values)
        consumer.until(lambda: set(values) <= set(consumer.values()), what)


def test_state_kept_by_another_brokers_share_coordinator_survives_the_leaders_kill(cluster, report):
    """The leader of a user partition whose `__share_group_state` partition another broker leads
    writes each acknowledgement there (WriteShareGroupState): killing that leader loses none, and
    the next leader reads the state back (ReadShareGroupState) and delivers only what was not
    acknowledged."""
    c = cluster
    # The coordinator is the replica that neither leads now nor takes over (the next one in
    # the assignment): both the writes and the next leader's read cross brokers.
    rs = RemoteState(c, lambda leader, replicas: [r for r in replicas if r != leader][-1])
    first = rs.consumer()
    acked = [f"acked-{i}" for i in range(10)]
    try:
        warm_up(rs.p, rs.topic, lambda: bool(first.seen), first.poll)
        rs.accept(first, acked, "the acknowledged records")
    finally:
        first.c.close()
    pending = [f"pending-{i}" for i in range(10)]
    produce(rs.p, rs.topic, pending)
    c.brokers[rs.leader].kill()
    killed = time.time()
    wait_until(lambda: c.partition_state(rs.topic, 0)["leader"] not in (rs.leader, -1), WAIT, "a new leader",
               interval=0.1)
    second = rs.consumer()
    try:
        second.until(lambda: set(pending) <= set(second.values()), "the unacknowledged records from the new leader")
        took = time.time() - killed
        for _ in range(5):
            second.poll()
        assert sorted(second.values()) == sorted(pending), second.seen
    finally:
        second.c.close()
    report(f"share group: state on broker {rs.coordinator}'s coordinator, leader {rs.leader} killed: the new "
           f"leader ({c.partition_state(rs.topic, 0)['leader']}) delivered the {len(pending)} unacknowledged "
           f"records in {took:.2f}s, none of the {len(acked)} acknowledged")


def test_share_coordinators_kill_mid_stream_loses_no_acknowledgement(cluster, report):
    """kill -9 of the share coordinator's broker while a member consumes: the state partition's
    next leader takes over from the log, acknowledgements go on, and when the user partition's
    leader dies later its successor redelivers none of the accepted records and loses none."""
    c = cluster
    rs = RemoteState(c, lambda leader, replicas: next(r for r in replicas if r != leader))
    member = rs.consumer()
    acked = [f"acked-{i}" for i in range(10)]
    more = [f"more-{i}" for i in range(10)]
    try:
        warm_up(rs.p, rs.topic, lambda: bool(member.seen), member.poll)
        rs.accept(member, acked, "records before the coordinator's kill")
        dead = c.brokers[rs.coordinator]
        dead.kill()
        killed = time.time()
        moved = wait_until(
            lambda: (lambda s: s if s["leader"] not in (rs.coordinator, -1) else None)(
                c.partition_state("__share_group_state", rs.state_partition)),
            WAIT, "a new share coordinator", interval=0.1)
        rs.accept(member, more, "records after the coordinator moved")
        took = time.time() - killed
        # Back to three brokers (the state topic's min.insync.replicas is 2), then the user
        # partition's leader goes too.
        dead._fixed_port = True
        dead.start()
        c.wait_topic_online("__share_group_state", 50)
        wait_until(lambda: len(c.partition_state(rs.topic, 0)["isr"]) == 3, WAIT, "a full ISR", interval=0.1)
        wait_until(lambda: len(c.partition_state("__share_group_state", rs.state_partition)["isr"]) == 3, WAIT,
                   "the state partition's full ISR", interval=0.1)
    finally:
        member.c.close()
    c.brokers[rs.leader].kill()
    wait_until(lambda: c.partition_state(rs.topic, 0)["leader"] not in (rs.leader, -1), WAIT, "a new leader",
               interval=0.1)
    # Produced before any member fetches from the new leader: only the state read back from
    # the coordinator says where the group stands (without it the share-partition would start
    # at the log end and skip them).
    tail = [f"tail-{i}" for i in range(10)]
    produce(rs.p, rs.topic, tail)
    after = rs.consumer()
    try:
        after.until(lambda: set(tail) <= set(after.values()), "records produced after the leader's kill")
        for _ in range(5):
            after.poll()
        assert sorted(after.values()) == sorted(tail), after.seen
    finally:
        after.c.close()
    report(f"share group: coordinator {rs.coordinator} killed mid-stream, broker {moved['leader']} took over; "
           f"acknowledgements went on within {took:.2f}s; after leader {rs.leader}'s kill none of the "
           f"{len(acked) + len(more)} accepted records came back and all {len(tail)} new ones arrived")


def test_group_configs_live_in_zookeeper_and_reach_every_leader(cluster):
    """A group config written through one broker is a znode every broker follows: with
    share.auto.offset.reset=earliest each partition's leader (three brokers) starts the group
    at the log start, so records produced before the group existed are all delivered."""
    c = cluster
    topic, group = uniq("share"), uniq("sg")
    a = c.admin(c.controller())
    a.create_topics([NewTopic(topic, num_partitions=3, replication_factor=3)])[topic].result(timeout=WAIT)
    c.wait_topic_online(topic, 3)
    p = producer(c.bootstrap())
    want = [f"r-{i}" for i in range(60)]
    for i, v in enumerate(want):
        p.produce(topic, value=v.encode(), partition=i % 3)
    assert p.flush(WAIT) == 0
    writer = c.live()[0].broker_id
    set_group_configs(c.brokers[writer].bootstrap, group, {"share.auto.offset.reset": "earliest"})
    assert c.get_json(f"/config/groups/{group}") == {"version": 1, "config": {"share.auto.offset.reset": "earliest"}}

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "protocol-tests"))
    import kproto as kp

    def seen_by(broker_id: int) -> bool:
        b = c.brokers[broker_id]
        v, body = 4, kp.describe_configs_request(4, [(32, group, ["share.auto.offset.reset"])])
        with kp.Conn(b.host, b.port, timeout=10) as conn:
            [res] = kp.decode_describe_configs(conn.call(kp.DESCRIBE_CONFIGS, v, body), v)["results"]
        return res["configs"][0]["value"] == "earliest"

    for b in c.live_ids():
        wait_until(lambda: seen_by(b), WAIT, f"broker {b} to see the group config", interval=0.2)
    leaders = {c.partition_state(topic, part)["leader"] for part in range(3)}
    consumer = InProcess(c.bootstrap(), group, topic)
    try:
        consumer.until(lambda: set(want) <= set(consumer.values()), f"every record (leaders {sorted(leaders)})")
        assert sorted(consumer.values()) == sorted(want), consumer.seen
    finally:
        consumer.c.close()
