"""The consumer group protocol (KIP-848) against gregor with real clients.

confluent-kafka (librdkafka) with `group.protocol=consumer`: the broker assigns partitions
itself (uniform assignor) and moves them one member at a time, revocation first, without a
stop-the-world rebalance.  Consumers run as subprocesses (compat/groups_tools.py) that commit
synchronously after every batch and report assignments, records and commits as events.

One broker (standalone store), `__consumer_offsets` with replication factor 1, and a short
heartbeat interval so that a move takes about a second rather than Kafka's 5 s.  Every wait
polls a condition; the times printed as [measure] are measurements, never assertions.
"""
from __future__ import annotations

import json
import tempfile
import threading
import time
import uuid
from typing import List

import pytest

ck = pytest.importorskip("confluent_kafka")
from confluent_kafka import Consumer, Producer  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

from gregor_fixtures import _failed  # noqa: E402
from gregor_harness import wait_until  # noqa: E402
from groups_tools import Worker  # noqa: E402

WAIT = 60
PARTS = 6
CONSUMER_GROUP_HEARTBEAT, CONSUMER_GROUP_DESCRIBE = 68, 69
OVERRIDES = {
    "offsets.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "5",
    "group.consumer.heartbeat.interval.ms": "1000",
    "group.consumer.min.heartbeat.interval.ms": "1000",
    "group.consumer.session.timeout.ms": "10000",
    "group.consumer.min.session.timeout.ms": "6000",
}
NEW_PROTOCOL = {"group.protocol": "consumer", "topic.metadata.refresh.interval.ms": 1000}


@pytest.fixture
def workers(request):
    made: List[Worker] = []
    log_dir = tempfile.mkdtemp(prefix="gregor-cgp-")

    def make(name, bootstrap, group, topic, extra=None, classic=False) -> Worker:
        protocol = {} if classic else NEW_PROTOCOL
        w = Worker(name, bootstrap, group, topic, log_dir=log_dir, extra=dict(protocol, **(extra or {})))
        made.append(w)
        return w.start()

    yield make
    for w in made:
        w.kill()
    if _failed(request):
        for w in made:
            evs = [e for e in w.events if e["ev"] not in ("recs", "commit")]
            request.node.add_report_section(
                "call", f"worker {w.name}",
                "\n".join(json.dumps(e) for e in evs[-40:]) + "\n--- stderr ---\n" + w.stderr_tail())


@pytest.fixture
def report(capsys):
    def out(msg):
        with capsys.disabled():
            print(f"\n[measure] {msg}", flush=True)
    return out


def uniq(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def create_topic(bootstrap: str, name: str, partitions: int = PARTS) -> None:
    a = AdminClient({"bootstrap.servers": bootstrap})
    a.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])[name].result(timeout=WAIT)


def produce(bootstrap: str, topic: str, per_partition: int, tag: str) -> set:
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, "log_level": 2})
    acked, errors = set(), []

    def cb(err, msg):
        if err is not None:
            errors.append(err)
        else:
            acked.add((msg.partition(), msg.offset()))

    for n in range(per_partition):
        for part in range(PARTS):
            p.produce(topic, value=f"{tag}-{part}-{n}".encode(), partition=part, on_delivery=cb)
        p.poll(0)
    assert p.flush(WAIT) == 0
    assert not errors, errors[:5]
    return acked


def wait_split(ws: List[Worker], sizes: List[int], what: str) -> dict:
    """Until the workers' assignments are disjoint, cover every partition, and have `sizes`."""
    def ok():
        a = {w.name: w.assignment() for w in ws}
        flat = sorted(p for s in a.values() for p in s)
        return a if flat == list(range(PARTS)) and sorted(map(len, a.values())) == sorted(sizes) else None

    try:
        return wait_until(ok, WAIT, what, interval=0.1)
    except TimeoutError as e:
        raise AssertionError(f"{e}; now {({w.name: sorted(w.assignment()) for w in ws})}") from None


def consumed(ws: List[Worker]) -> dict:
    out: dict = {}
    for w in ws:
        for p, o, _ in w.consumed():
            out.setdefault((p, o), []).append(w.name)
    return out


def wait_consumed(ws: List[Worker], want: set) -> None:
    try:
        wait_until(lambda: want <= set(consumed(ws)), WAIT, f"{len(want)} records consumed", interval=0.2)
    except TimeoutError as e:
        missing = sorted(want - set(consumed(ws)))
        raise AssertionError(f"{e}: {len(missing)} missing, e.g. {missing[:10]}") from None


def never_owned_twice(ws: List[Worker]) -> None:
    """From the events: no partition was in two members' assignments at one time (each
    worker's events are in its own order; the callbacks run before the next heartbeat)."""
    timeline = sorted(((e["t"], w.name, e["ev"], e["parts"]) for w in ws for e in w.evs()
                       if e["ev"] in ("assign", "revoke", "lost")), key=lambda x: x[0])
    owner: dict = {}
    for t, name, ev, parts in timeline:
        for p in parts:
            if ev == "assign":
                assert owner.get(p) in (None, name), f"partition {p} assigned to {name} at {t} while {owner[p]} owns it"
                owner[p] = name
            elif owner.get(p) == name:
                del owner[p]


def test_api_versions_offer_the_new_protocol_and_group_version(broker_factory):
    b = broker_factory(overrides=OVERRIDES)
    assert b.api_versions.get(CONSUMER_GROUP_HEARTBEAT) == (0, 1)
    assert b.api_versions.get(CONSUMER_GROUP_DESCRIBE) == (0, 1)


def test_members_join_and_leave_and_partitions_move_one_at_a_time(broker_factory, workers, report):
    b = broker_factory(overrides=OVERRIDES)
    topic, group = uniq("cgp"), uniq("g")
    create_topic(b.bootstrap, topic)
    acked = produce(b.bootstrap, topic, 50, "a")
    w0 = workers("m0", b.bootstrap, group, topic)
    w1 = workers("m1", b.bootstrap, group, topic)
    wait_split([w0, w1], [3, 3], "two members with three partitions each")
    # A third member: each of the others gives up one partition, then it takes them.
    acked |= produce(b.bootstrap, topic, 20, "b")
    t0 = time.time()
    w2 = workers("m2", b.bootstrap, group, topic)
    wait_split([w0, w1, w2], [2, 2, 2], "three members with two partitions each")
    joined = time.time() - t0
    first_assign = min((e["t"] for e in w2.evs("assign") if e["parts"]), default=None)
    # The members that stayed never lost their other partitions: only revocations, no
    # "lost" and no revoke of everything (which is what an eager rebalance does).
    for w in (w0, w1):
        revoked = [p for e in w.evs("revoke") if e["t"] >= t0 for p in e["parts"]]
        assert len(revoked) == 1, f"{w.name} revoked {revoked}"
        assert not w.evs("lost")
    acked |= produce(b.bootstrap, topic, 20, "c")
    # One leaves: the others take its partitions.
    t1 = time.time()
    w0.close()
    wait_split([w1, w2], [3, 3], "the two remaining members with three partitions each")
    left = time.time() - t1
    acked |= produce(b.bootstrap, topic, 20, "d")
    wait_consumed([w0, w1, w2], acked)
    never_owned_twice([w0, w1, w2])
    seen = consumed([w0, w1, w2])
    twice = sum(1 for names in seen.values() if len(names) > 1)
    errors = [e for w in (w0, w1, w2) for e in w.errors()]
    assert not [e for e in errors if e.get("fatal")], errors[:5]
    report(f"KIP-848: third member started -> 2/2/2 split in {joined:.2f}s "
           f"(its first partitions after {first_assign - t0 if first_assign else float('nan'):.2f}s); "
           f"member closed -> 3/3 split in {left:.2f}s; {len(acked)} records, {twice} consumed twice, "
           f"{len(errors)} client errors")


def test_committed_offsets_resume_after_everything_restarts(broker_factory, workers):
    b = broker_factory(overrides=OVERRIDES)
    topic, group = uniq("cgp"), uniq("g")
    create_topic(b.bootstrap, topic)
    first = produce(b.bootstrap, topic, 30, "a")
    ws = [workers(f"r{i}", b.bootstrap, group, topic) for i in range(2)]
    wait_consumed(ws, first)
    wait_until(lambda: all(sum(1 for p in range(PARTS) if p in w.committed()) == len(w.assignment())
                           for w in ws), WAIT, "commits of every owned partition")
    committed = {}
    for w in ws:
        for p, o in w.committed().items():
            committed[p] = max(committed.get(p, -1), o)
    # The broker dies mid-session: its group (members, epochs, assignments) is in the log.
    b.restart(mode="kill")
    second = produce(b.bootstrap, topic, 10, "b")
    wait_consumed(ws, first | second)
    for w in ws:
        w.close()
    third = produce(b.bootstrap, topic, 10, "c")
    later = [workers(f"s{i}", b.bootstrap, group, topic) for i in range(2)]
    wait_consumed(later, third)
    replayed = {k for k in consumed(later) if k in first}
    assert not replayed, f"committed records consumed again after restart, e.g. {sorted(replayed)[:5]}"
    for p, o in committed.items():
        starts = [off for w in later for part, off, _ in w.consumed() if part == p]
        assert min(starts) >= o, f"partition {p} resumed at {min(starts)}, committed {o}"


def test_groups_are_listed_and_described_as_consumer_groups(broker_factory, workers):
    b = broker_factory(overrides=OVERRIDES)
    topic, group = uniq("cgp"), uniq("g")
    create_topic(b.bootstrap, topic)
    ws = [workers(f"d{i}", b.bootstrap, group, topic) for i in range(2)]
    wait_split(ws, [3, 3], "two members")
    a = AdminClient({"bootstrap.servers": b.bootstrap})
    listed = a.list_consumer_groups().result(timeout=WAIT)
    mine = [g for g in listed.valid if g.group_id == group]
    assert mine, listed.valid
    assert str(mine[0].type).upper().endswith("CONSUMER"), mine[0].type
    d = a.describe_consumer_groups([group])[group].result(timeout=WAIT)
    assert len(d.members) == 2
    assert sorted(tp.partition for m in d.members for tp in m.assignment.topic_partitions) == list(range(PARTS))
    assert str(d.state).upper().endswith("STABLE"), d.state


def test_turned_off_the_api_is_absent_and_classic_groups_work(broker_factory):
    b = broker_factory(overrides=dict(OVERRIDES, **{"group.coordinator.rebalance.protocols": "classic"}))
    assert CONSUMER_GROUP_HEARTBEAT not in b.api_versions
    assert CONSUMER_GROUP_DESCRIBE not in b.api_versions
    topic, group = uniq("cgp"), uniq("g")
    create_topic(b.bootstrap, topic)
    acked = produce(b.bootstrap, topic, 5, "a")
    c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": group, "group.protocol": "classic",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False, "session.timeout.ms": 6000})
    c.subscribe([topic])
    got = set()
    deadline = time.time() + WAIT
    while time.time() < deadline and not acked <= got:
        m = c.poll(0.5)
        if m is not None and m.error() is None:
            got.add((m.partition(), m.offset()))
    c.close()
    assert acked <= got


# ---------------------------------------------------------------------------
# three brokers and ZooKeeper: the seed's view of the group, and a coordinator kill -9
# ---------------------------------------------------------------------------

def check_zk_mirror(c, group: str, topic: str, ws: List[Worker], timeout: float = WAIT) -> None:
    """/consumers/<group>/ids names the live members and owners/<topic>/<p> the owner of p; a
    member id's '/' (librdkafka's ids are standard base64) is '_' there."""
    import test_groups as tg
    name = lambda w: w.member_id().replace("/", "_")  # noqa: E731
    want_ids = {name(w) for w in ws}
    want_owner = {p: name(w) for w in ws for p in w.assignment()}
    seen = {}

    def ok():
        ids, owners = tg.zk_ids(c, group), tg.zk_owners(c, group, topic)
        seen.update(ids=sorted(ids), owners=owners)
        return set(ids) == want_ids and owners == want_owner

    try:
        wait_until(ok, timeout, f"ZooKeeper view of group {group}", interval=0.2)
    except TimeoutError as e:
        raise AssertionError(f"{e}: want {sorted(want_ids)} {want_owner}, seen {seen}") from None


@pytest.fixture
def cluster(request, zookeeper):
    from cluster_harness import Cluster
    from gregor_fixtures import _register
    overrides = dict(OVERRIDES, **{"offsets.topic.replication.factor": "3", "offsets.topic.num.partitions": "50"})
    c = Cluster(zookeeper, 3, overrides=overrides, on_new_broker=lambda b: _register(request, b))
    c.start()
    yield c
    c.cleanup(keep=_failed(request))


def test_coordinator_kill_keeps_the_group_and_the_zookeeper_view_follows(cluster, workers, report):
    import test_groups as tg  # its cluster helpers: topic, produce, ZooKeeper mirror, coordinator
    c = cluster
    topic, group = uniq("cgk"), uniq("g")
    tg.create_topic(c, topic)
    acked = tg.produce(c, topic, 30)
    ws = [workers(f"k{i}", c.bootstrap(), group, topic) for i in range(2)]
    wait_split(ws, [3, 3], "two members")
    check_zk_mirror(c, group, topic, ws)
    wait_consumed(ws, acked)
    coord, part = tg.group_coordinator(c, group)
    wait_until(lambda: sorted(c.partition_state("__consumer_offsets", part)["isr"]) == [1, 2, 3], WAIT,
               f"__consumer_offsets-{part} ISR [1,2,3]", interval=0.2)
    members = {w.name: w.member_id() for w in ws}
    t0 = time.time()
    c.brokers[coord].kill()
    # The killed broker also led partitions of the topic (maybe the controller too): records
    # are acknowledged once their new leaders are elected, which the failover timeout bounds.
    p = Producer({"bootstrap.servers": c.bootstrap(), "acks": "all", "linger.ms": 5, "log_level": 2,
                  "message.timeout.ms": int((c.failover_timeout + WAIT) * 1000)})
    after, errors = set(), []
    for n in range(20):
        for part in range(PARTS):
            p.produce(topic, value=f"after-{part}-{n}".encode(), partition=part,
                      on_delivery=lambda err, m: errors.append(err) if err else after.add((m.partition(), m.offset())))
    assert p.flush(c.failover_timeout + WAIT) == 0
    assert not errors, errors[:5]
    acked |= after
    wait_until(lambda: acked <= set(consumed(ws)), c.failover_timeout + WAIT, "records after the kill consumed",
               interval=0.2)
    resumed = time.time() - t0
    # The new coordinator loaded the group: the members kept their ids and were not fenced
    # (a fenced member loses its partitions and rejoins under a new epoch).
    assert {w.name: w.member_id() for w in ws} == members
    for w in ws:
        assert not w.evs("lost"), f"{w.name} lost its partitions: {w.evs('lost')}"
    check_zk_mirror(c, group, topic, ws, timeout=c.failover_timeout + WAIT)
    report(f"KIP-848: coordinator kill -9 -> every record produced after it consumed in {resumed:.2f}s, "
           f"no member fenced")


def test_a_regex_subscription_picks_up_a_new_topic(broker_factory):
    """librdkafka sends a `^` subscription as SubscribedTopicRegex; the coordinator resolves it,
    and a topic created later that matches is assigned and read without a new subscribe."""
    b = broker_factory(overrides=OVERRIDES)
    prefix = uniq("rx")
    first, later, other = f"{prefix}-a", f"{prefix}-b", uniq("other")
    for t in (first, other):
        create_topic(b.bootstrap, t)
    c = Consumer(dict(NEW_PROTOCOL, **{"bootstrap.servers": b.bootstrap, "group.id": uniq("g"),
                                       "auto.offset.reset": "earliest", "log_level": 2}))
    try:
        c.subscribe([f"^{prefix}-.*"])
        want = {first: produce(b.bootstrap, first, 2, "a"), other: produce(b.bootstrap, other, 2, "o")}
        seen: dict = {}

        def read(topic):
            m = c.poll(0.2)
            if m is not None and m.error() is None:
                seen.setdefault(m.topic(), set()).add((m.partition(), m.offset()))
            return seen.get(topic, set()) >= want[topic]
        wait_until(lambda: read(first), WAIT, f"the records of {first}", interval=0)
        create_topic(b.bootstrap, later)
        want[later] = produce(b.bootstrap, later, 2, "b")
        wait_until(lambda: read(later), WAIT, f"the records of {later}, created after subscribing", interval=0)
        assert other not in seen, "a topic the pattern does not match is not assigned"
        assert {tp.topic for tp in c.assignment()} == {first, later}
    finally:
        c.close()


def test_a_static_member_restarting_gets_its_partitions_back_and_nobody_else_moves(broker_factory, workers):
    """KIP-848 static membership: a member with group.instance.id that closes leaves with epoch
    -2 and keeps its partitions for the session timeout; a new consumer with the same instance
    id gets exactly those, and the other member never revokes or gains anything."""
    b = broker_factory(overrides=OVERRIDES)
    topic, group = uniq("cgp"), uniq("g")
    create_topic(b.bootstrap, topic)
    s0 = workers("s0", b.bootstrap, group, topic, {"group.instance.id": "inst-0"})
    s1 = workers("s1", b.bootstrap, group, topic, {"group.instance.id": "inst-1"})
    split = wait_split([s0, s1], [3, 3], "two static members with three partitions each")
    t0 = time.time()
    s0.close()
    # Closed, it is still a member (epoch -2) holding its partitions; a dynamic one would be gone.
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    d = admin.describe_consumer_groups([group])[group].result(timeout=WAIT)
    held = {m.member_id: {tp.partition for tp in m.assignment.topic_partitions} for m in d.members}
    assert held.get(s0.member_id()) == split["s0"], held
    s0b = workers("s0b", b.bootstrap, group, topic, {"group.instance.id": "inst-0"})
    wait_until(lambda: s0b.assignment() == split["s0"], WAIT, "the restarted instance to own its old partitions",
               interval=0.1)
    assert s1.assignment() == split["s1"]
    assert not [e for e in s1.evs() if e["t"] >= t0 and e["ev"] in ("assign", "revoke", "lost") and e["parts"]], \
        s1.evs()
    assert s0b.member_id() != s0.member_id()
    # The instance id is taken: a second consumer with it gets UNRELEASED_INSTANCE_ID and never
    # owns anything, while the group keeps its split.
    dup = workers("dup", b.bootstrap, group, topic, {"group.instance.id": "inst-0"})
    wait_until(lambda: dup.errors(), WAIT, "the duplicate instance to be refused")
    assert not dup.assignment()
    assert (s0b.assignment(), s1.assignment()) == (split["s0"], split["s1"])


def group_type(bootstrap: str, group: str) -> str:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    listed = admin.list_consumer_groups().result(timeout=WAIT)
    mine = [g for g in listed.valid if g.group_id == group]
    return str(mine[0].type).split(".")[-1].upper() if mine else "ABSENT"


class BackgroundProducer:
    """Produces to every partition until stopped; remembers what was acknowledged."""

    def __init__(self, bootstrap: str, topic: str):
        self.p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, "log_level": 2})
        self.topic, self.acked, self.errors = topic, set(), []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _cb(self, err, msg):
        if err is not None:
            self.errors.append(err)
        else:
            self.acked.add((msg.partition(), msg.offset()))

    def _run(self):
        n = 0
        while not self.stop.is_set():
            for part in range(PARTS):
                self.p.produce(self.topic, value=f"bg-{part}-{n}".encode(), partition=part, on_delivery=self._cb)
            n += 1
            self.p.poll(0.02)
        self.p.flush(WAIT)

    def finish(self) -> set:
        self.stop.set()
        self.thread.join(WAIT)
        assert not self.errors, self.errors[:5]
        return self.acked


def commits_never_go_backwards(ws: List[Worker]) -> None:
    """Every successful commit, in time order across the members, per partition."""
    commits = sorted((e["t"], w.name, int(p), o) for w in ws for e in w.evs("commit")
                     for p, o in e["offsets"].items())
    last: dict = {}
    for t, name, p, o in commits:
        assert o >= last.get(p, (-1, ""))[0], f"partition {p}: {name} committed {o} at {t} after {last[p]}"
        last[p] = (o, name)


def test_a_classic_group_upgraded_and_downgraded_online(broker_factory, workers, report):
    """group.consumer.migration.policy=bidirectional (Kafka's default): two classic consumers
    share a topic; a consumer-protocol member joins and the group becomes a consumer group
    with the classic members in it; it leaves and the group is classic again. Nothing is lost,
    no partition has two owners at once, committed offsets only move forward."""
    b = broker_factory(overrides=OVERRIDES)
    topic, group = uniq("mig"), uniq("g")
    create_topic(b.bootstrap, topic)
    producer = BackgroundProducer(b.bootstrap, topic)
    c0 = workers("c0", b.bootstrap, group, topic, classic=True)
    c1 = workers("c1", b.bootstrap, group, topic, classic=True)
    wait_split([c0, c1], [3, 3], "two classic members with three partitions each")
    assert group_type(b.bootstrap, group) == "CLASSIC"
    t0 = time.time()
    n = workers("n", b.bootstrap, group, topic)
    wait_split([c0, c1, n], [2, 2, 2], "the converted group: two partitions for each member")
    upgraded = time.time() - t0
    assert group_type(b.bootstrap, group) == "CONSUMER"
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    d = admin.describe_consumer_groups([group])[group].result(timeout=WAIT)
    assert len(d.members) == 3, d.members
    assert sorted(tp.partition for m in d.members for tp in m.assignment.topic_partitions) == list(range(PARTS))
    t1 = time.time()
    n.close()
    wait_split([c0, c1], [3, 3], "the classic members own every partition again")
    wait_until(lambda: group_type(b.bootstrap, group) == "CLASSIC", WAIT, "the group to be classic again")
    downgraded = time.time() - t1
    acked = producer.finish()
    wait_consumed([c0, c1, n], acked)
    never_owned_twice([c0, c1, n])
    commits_never_go_backwards([c0, c1, n])
    errors = [e for w in (c0, c1, n) for e in w.errors()]
    assert not [e for e in errors if e.get("fatal")], errors[:5]
    twice = sum(1 for names in consumed([c0, c1, n]).values() if len(names) > 1)
    report(f"migration: consumer-protocol member joined -> 2/2/2 in {upgraded:.2f}s; it left -> classic 3/3 in "
           f"{downgraded:.2f}s; {len(acked)} records produced meanwhile, none lost, {twice} consumed twice, "
           f"{len(errors)} client errors")


def test_with_migration_disabled_a_classic_group_keeps_its_id(broker_factory, workers):
    b = broker_factory(overrides=dict(OVERRIDES, **{"group.consumer.migration.policy": "disabled"}))
    topic, group = uniq("mig"), uniq("g")
    create_topic(b.bootstrap, topic)
    c0 = workers("c0", b.bootstrap, group, topic, classic=True)
    wait_until(lambda: c0.assignment() == set(range(PARTS)), WAIT, "the classic member to own the topic")
    n = workers("n", b.bootstrap, group, topic)
    # GROUP_ID_NOT_FOUND, as Kafka answers when the upgrade is off.
    wait_until(lambda: n.errors(), WAIT, "the consumer-protocol member to be refused")
    assert not n.assignment()
    assert c0.assignment() == set(range(PARTS))
    assert group_type(b.bootstrap, group) == "CLASSIC"
