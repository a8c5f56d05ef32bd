"""Consumer groups (classic protocol) on a 3-broker gregor cluster with a real ZooKeeper.

Real clients only: confluent-kafka (librdkafka), kafka-python, kcat.  Group consumers run as
subprocesses (compat/groups_tools.py) so they can be closed or kill -9'ed; they commit
synchronously after every batch and report assignments, records and commits as JSON events.

Cluster: brokers 1..3, offsets.topic.replication.factor=3, group.initial.rebalance.delay.ms=300,
own ZooKeeper chroot per test.  Clients use session.timeout.ms=6000 (the broker minimum) so a
killed member expires quickly.  Every wait polls a condition; no test asserts on timing.  Two
measurements (rebalance latency, commit throughput) are printed, not asserted.
"""
from __future__ import annotations

import json
import logging
import os
import random
import subprocess
import tempfile
import threading
import time
import uuid
from typing import Dict, List, Set

import pytest

try:
    import kazoo  # noqa: F401
except ImportError as e:  # a skipped group suite would look green
    raise ImportError("compat/test_groups.py needs kazoo: .venv/bin/pip install kazoo") from e
ck = pytest.importorskip("confluent_kafka")
kafka = pytest.importorskip("kafka")
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import NewTopic  # noqa: E402
from kafka.admin import KafkaAdminClient  # noqa: E402

from cluster_harness import Cluster  # noqa: E402
from gregor_fixtures import _failed, _register  # noqa: E402
from gregor_harness import wait_until  # noqa: E402
from groups_tools import Worker, offsets_partition  # noqa: E402

WAIT = 60
SESSION_MS = 6000
TOPIC_PARTS = 6
OVERRIDES = {
    "offsets.topic.replication.factor": "3",
    "group.initial.rebalance.delay.ms": "300",
}


# ---------------------------------------------------------------------------
# fixtures
# ---------------------------------------------------------------------------

@pytest.fixture
def cluster(request, zookeeper):
    c = Cluster(zookeeper, 3, overrides=OVERRIDES, on_new_broker=lambda b: _register(request, b))
    c.start()
    yield c
    c.cleanup(keep=_failed(request))


@pytest.fixture
def workers(request):
    """Factory for group-consumer subprocesses; all are killed at teardown.  On failure the
    event log of each worker is attached to the report."""
    made: List[Worker] = []
    log_dir = tempfile.mkdtemp(prefix="gregor-groups-")

    def make(name, bootstrap, group, topic, **kw) -> Worker:
        w = Worker(name, bootstrap, group, topic, log_dir=log_dir, **kw)
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
    """Print a measurement straight to the terminal (not captured)."""
    def out(msg):
        with capsys.disabled():
            print(f"\n[measure] {msg}", flush=True)
    return out


def uniq(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------

def create_topic(c: Cluster, name: str, partitions: int = TOPIC_PARTS, rf: int = 3) -> None:
    a = c.admin(c.controller())
    fs = a.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=rf)], operation_timeout=30)
    fs[name].result(timeout=WAIT)
    c.wait_topic_online(name, partitions)


def produce(c: Cluster, topic: str, per_partition: int, partitions: int = TOPIC_PARTS, tag: str = "a") -> Set:
    """Produce with acks=all; returns the set of acknowledged (partition, offset)."""
    p = Producer({"bootstrap.servers": c.bootstrap(), "acks": "all", "linger.ms": 5, "log_level": 2})
    acked, errors = set(), []

    def cb(err, msg):
        if err is not None:
            errors.append(err)
        else:
            acked.add((msg.partition(), msg.offset()))

    for n in range(per_partition):
        for part in range(partitions):
            p.produce(topic, value=f"{tag}-{part}-{n}".encode(), partition=part, on_delivery=cb)
        p.poll(0)
    assert p.flush(WAIT) == 0, "producer did not flush"
    assert not errors, errors[:5]
    assert len(acked) == per_partition * partitions
    return acked


class BackgroundProducer:
    """Produces round-robin over all partitions until stopped; keeps the acknowledged set."""

    def __init__(self, c: Cluster, topic: str, partitions: int = TOPIC_PARTS):
        self.p = Producer({"bootstrap.servers": c.bootstrap(), "acks": "all", "linger.ms": 5, "log_level": 2})
        self.topic, self.partitions = topic, partitions
        self.acked: Set = set()
        self.errors: List = []
        self.stop_flag = threading.Event()
        self.t = threading.Thread(target=self.run, daemon=True)

    def cb(self, err, msg):
        if err is not None:
            self.errors.append(err)
        else:
            self.acked.add((msg.partition(), msg.offset()))

    def run(self):
        n = 0
        while not self.stop_flag.is_set():
            self.p.produce(self.topic, value=f"bg-{n}".encode(), partition=n % self.partitions, on_delivery=self.cb)
            n += 1
            self.p.poll(0.005)
        self.p.flush(WAIT)

    def start(self):
        self.t.start()
        return self

    def stop(self) -> Set:
        self.stop_flag.set()
        self.t.join(WAIT + 10)
        assert not self.errors, self.errors[:5]
        return self.acked


def wait_stable(ws: List[Worker], sizes: List[int], partitions: int = TOPIC_PARTS, timeout: float = WAIT) -> Dict:
    """Until the workers' current assignments are disjoint, cover every partition and have the
    given sizes (sorted); returns {worker name: set}."""
    def ok():
        a = {w.name: w.assignment() for w in ws}
        flat = [p for s in a.values() for p in s]
        if sorted(len(s) for s in a.values()) != sorted(sizes):
            return None
        if sorted(flat) != list(range(partitions)):
            return None
        return a

    try:
        return wait_until(ok, timeout, f"assignment sizes {sorted(sizes)} covering {partitions} partitions",
                          interval=0.1)
    except TimeoutError as e:
        dead = {w.name: w.stderr_tail(8) for w in ws if not w.alive()}
        raise AssertionError(f"{e}; now {({w.name: sorted(w.assignment()) for w in ws})}"
                             + (f"; exited workers: {dead}" if dead else "")) from None


def consumed_by(ws: List[Worker]) -> Dict:
    """(partition, offset) -> list of (worker, time) that consumed it."""
    out: Dict = {}
    for w in ws:
        for p, o, t in w.consumed():
            out.setdefault((p, o), []).append((w, t))
    return out


def wait_consumed(ws: List[Worker], want: Set, timeout: float = WAIT) -> Dict:
    def ok():
        got = consumed_by(ws)
        return got if want <= set(got) else None

    try:
        return wait_until(ok, timeout, f"{len(want)} records consumed", interval=0.2)
    except TimeoutError as e:
        got = set(consumed_by(ws))
        missing = sorted(want - got)
        raise AssertionError(f"{e}: {len(missing)} missing, e.g. {missing[:10]}") from None


def assert_exactly_once(got: Dict, want: Set) -> None:
    assert set(got) == want, f"unexpected records {sorted(set(got) - want)[:10]}"
    dups = {k: [w.name for w, _ in v] for k, v in got.items() if len(v) > 1}
    assert not dups, f"{len(dups)} records consumed more than once: {dict(list(dups.items())[:10])}"


def wait_commits_cover(ws: List[Worker], want: Set, timeout: float = WAIT) -> None:
    """Until, per partition, some worker committed past the last wanted offset."""
    last: Dict[int, int] = {}
    for p, o in want:
        last[p] = max(last.get(p, -1), o)

    def ok():
        best: Dict[int, int] = {}
        for w in ws:
            for p, o in w.committed().items():
                best[p] = max(best.get(p, -1), o)
        return all(best.get(p, -1) > o for p, o in last.items())

    wait_until(ok, timeout, "commits covering every consumed record", interval=0.1)


# -- ZooKeeper mirror ---------------------------------------------------------

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


def zk_owners(c: Cluster, group: str, topic: str) -> Dict[int, str]:
    path = f"/consumers/{group}/owners/{topic}"
    if not c.exists(path):
        return {}
    out = {}
    for p in c.kz.get_children(path):
        try:
            out[int(p)] = c.get_text(f"{path}/{p}")
        except Exception:  # noqa: BLE001
            pass
    return out


def check_zk_mirror(c: Cluster, group: str, topic: str, ws: List[Worker], timeout: float = WAIT) -> None:
    """/consumers/<group>/ids lists exactly the live workers' member ids (ephemeral, Kafka's JSON),
    and /consumers/<group>/owners/<topic>/<p> names the member that owns p."""
    want_ids = {w.member_id(): w for w in ws}
    want_owner = {p: w.member_id() for w in ws for p in w.assignment()}
    seen = {}

    def ok():
        ids, owners = zk_ids(c, group), zk_owners(c, group, topic)
        seen.update(ids=sorted(ids), owners=owners)
        return set(ids) == set(want_ids) and owners == want_owner

    try:
        wait_until(ok, timeout, f"ZooKeeper mirror of group {group}", interval=0.2)
    except TimeoutError as e:
        raise AssertionError(f"{e}\n want ids {sorted(want_ids)}\n want owners {want_owner}\n"
                             f" seen {seen}") from None
    for mid, w in want_ids.items():
        path = f"/consumers/{group}/ids/{mid}"
        data = c.get_json(path)
        assert data["version"] == 1 and data["pattern"] == "static", data
        assert data["subscription"] == {topic: 1}, data
        assert isinstance(data["timestamp"], str) and data["timestamp"].isdigit(), data
        assert data.get("client_id") == w.name, data
        assert c.kz.exists(path).ephemeralOwner != 0, f"{path} is not ephemeral"
    for p in want_owner:
        assert c.kz.exists(f"/consumers/{group}/owners/{topic}/{p}").ephemeralOwner != 0


def check_broker_view(c: Cluster, group: str, ws: List[Worker], timeout: float = WAIT) -> None:
    """The coordinator's own record of the group (DescribeGroups) agrees with what the members
    were told: Stable, exactly these members, each with the partitions its worker consumes."""
    want = {w.member_id(): w.assignment() for w in ws}
    seen = {}
    admin = c.admin(c.live_ids()[0])  # held until the futures resolve: they die with their AdminClient

    def ok():
        d = admin.describe_consumer_groups([group])[group].result(timeout=10)
        got = {m.member_id: {tp.partition for tp in m.assignment.topic_partitions} for m in d.members}
        seen.update(state=str(d.state), members=got)
        return d.state == ck.ConsumerGroupState.STABLE and got == want

    try:
        wait_until(ok, timeout, f"DescribeGroups({group}) to match the members' assignments", interval=0.5)
    except TimeoutError as e:
        raise AssertionError(f"{e}\n members think {want}\n broker says {seen}") from None


# -- admin --------------------------------------------------------------------

def kp_admin(c: Cluster) -> KafkaAdminClient:
    return KafkaAdminClient(bootstrap_servers=c.bootstrap(), request_timeout_ms=30000)


def kp_list_groups(a: KafkaAdminClient, **kw) -> List[dict]:
    """kafka-python 3.x: list_groups() -> [{'group_id', 'protocol_type', 'group_state', ...}]
    (2.x: list_consumer_groups() -> [(group_id, protocol_type)])."""
    if hasattr(a, "list_groups"):
        return [dict(g) for g in a.list_groups(**kw)]
    return [{"group_id": g, "protocol_type": t} for g, t in a.list_consumer_groups()]


def kp_describe(a: KafkaAdminClient, group: str) -> dict:
    if hasattr(a, "describe_groups"):
        return a.describe_groups([group])[group]
    d = a.describe_consumer_groups([group])[0]  # 2.x
    return d._asdict()


def member_partitions(m: dict) -> Set[int]:
    """Partitions of a described member (kafka-python decodes the ConsumerProtocol assignment)."""
    asg = m.get("member_assignment")
    if asg is None:
        return set()
    if hasattr(asg, "assignment"):
        asg = asg.assignment
    elif isinstance(asg, dict):
        asg = asg.get("assigned_partitions") or asg.get("assignment") or []
    out = set()
    for t in asg:
        if hasattr(t, "partitions"):
            out |= set(t.partitions)
        elif isinstance(t, dict):
            out |= set(t.get("partitions", []))
        else:  # (topic, [partitions])
            out |= set(t[1])
    return out


def group_coordinator(c: Cluster, group: str) -> int:
    """Leader of the group's __consumer_offsets partition, read from ZooKeeper."""
    p = offsets_partition(group)
    return c.partition_state("__consumer_offsets", p)["leader"], p


# ---------------------------------------------------------------------------
# 1. three members split six partitions and read every record once
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("clients", [("confluent",) * 3, ("kafka-python",) * 3,
                                     ("confluent", "kafka-python", "confluent")],
                         ids=["confluent", "kafka-python", "mixed"])
def test_three_members_split_partitions(cluster, workers, clients):
    c = cluster
    topic, group = uniq("split"), uniq("g")
    create_topic(c, topic)
    want = produce(c, topic, 50)
    ws = [workers(f"m{i}", c.bootstrap(), group, topic, client=cl) for i, cl in enumerate(clients)]
    wait_stable(ws, [2, 2, 2])
    got = wait_consumed(ws, want)
    wait_commits_cover(ws, want)
    assert_exactly_once(consumed_by(ws), want)
    check_broker_view(c, group, ws)
    check_zk_mirror(c, group, topic, ws)
    for w in ws:
        assert not w.errors(), f"{w.name}: {w.errors()[:3]}"


# ---------------------------------------------------------------------------
# 2. a member stops (close / kill -9): the others take over from the committed offsets
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("client", ["confluent", "kafka-python"])
@pytest.mark.parametrize("how", ["close", "kill"])
def test_member_stops_others_take_over(cluster, workers, report, client, how):
    c = cluster
    topic, group = uniq(f"stop-{how}"), uniq("g")
    create_topic(c, topic)
    first = produce(c, topic, 40, tag="first")
    ws = [workers(f"m{i}", c.bootstrap(), group, topic, client=client) for i in range(3)]
    wait_stable(ws, [2, 2, 2])
    wait_consumed(ws, first)
    wait_commits_cover(ws, first)
    check_zk_mirror(c, group, topic, ws)

    victim, survivors = ws[1], [ws[0], ws[2]]
    victim_parts = victim.assignment()
    bg = BackgroundProducer(c, topic).start()
    wait_until(lambda: len(bg.acked) >= 60, WAIT, "background producer running")
    if how == "close":
        t0 = time.time()
        victim.close()
    else:
        t0 = victim.kill()
    wait_stable(survivors, [3, 3], timeout=SESSION_MS / 1000 + WAIT)
    t_all = max(e["t"] for w in survivors for e in w.evs("assign"))
    report(f"rebalance latency ({client}, {how}): {t_all - t0:.2f} s from {how} until the 2 survivors "
           f"owned all {TOPIC_PARTS} partitions (victim had {sorted(victim_parts)})")
    # keep producing a little after the takeover, then drain
    n = len(bg.acked)
    wait_until(lambda: len(bg.acked) >= n + 60, WAIT, "records produced after the takeover")
    rest = bg.stop()
    want = first | rest
    got = wait_consumed(ws, want)
    assert set(got) == want, f"unexpected records {sorted(set(got) - want)[:10]}"

    # duplicates are allowed only for records whose first reader never committed past them
    committed = {w.name: w.committed() for w in ws}
    bad = {}
    for (p, o), readers in got.items():
        if len(readers) < 2:
            continue
        first_reader = min(readers, key=lambda r: r[1])[0]
        if committed[first_reader.name].get(p, -1) > o:
            bad[(p, o)] = [w.name for w, _ in readers]
    assert not bad, f"{len(bad)} committed records were consumed again: {dict(list(bad.items())[:10])}"
    dups = sum(1 for r in got.values() if len(r) > 1)
    vc = victim.committed()
    if how == "close":
        # a closing member has committed (synchronously) everything it read before it leaves
        unc = [(p, o) for p, o, _t in victim.consumed() if vc.get(p, -1) <= o]
        assert not unc, f"the closed member left records uncommitted: {unc[:10]}"
    # the survivors resumed the victim's partitions at its committed offsets
    for p in victim_parts:
        # only what they read after the victim left: under load one of them may have held
        # the partition briefly during the very first join, before all three members joined
        took = [o for w in survivors for (pp, o, t) in w.consumed() if pp == p and t >= t0]
        assert took, f"nobody consumed partition {p} after the takeover"
        if how == "close":
            assert min(took) == vc[p], f"partition {p}: survivors started at {min(took)}, committed {vc[p]}"
        else:  # a kill can land between a successful commit and its report
            assert min(took) >= vc.get(p, 0), f"partition {p}: survivors started at {min(took)}, committed {vc.get(p)}"
    check_zk_mirror(c, group, topic, survivors)
    report(f"duplicates after {how} ({client}): {dups} (all of uncommitted records)")


# ---------------------------------------------------------------------------
# 3. a fourth member joins: 2,2,1,1
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("client", ["confluent"])
def test_fourth_member_spreads_partitions(cluster, workers, client):
    c = cluster
    topic, group = uniq("four"), uniq("g")
    create_topic(c, topic)
    first = produce(c, topic, 20)
    ws = [workers(f"m{i}", c.bootstrap(), group, topic, client=client) for i in range(3)]
    wait_stable(ws, [2, 2, 2])
    wait_consumed(ws, first)
    wait_commits_cover(ws, first)
    ws.append(workers("m3", c.bootstrap(), group, topic, client=client))
    wait_stable(ws, [2, 2, 1, 1])
    check_broker_view(c, group, ws)
    second = produce(c, topic, 20, tag="second")
    got = wait_consumed(ws, first | second)
    assert_exactly_once(got, first | second)
    check_zk_mirror(c, group, topic, ws)


# ---------------------------------------------------------------------------
# 4. two groups on one topic both read everything
# ---------------------------------------------------------------------------

def test_two_groups_broadcast(cluster, workers):
    c = cluster
    topic = uniq("bcast")
    ga, gb = uniq("ga"), uniq("gb")
    create_topic(c, topic)
    want = produce(c, topic, 30)
    wa = [workers(f"a{i}", c.bootstrap(), ga, topic, client="confluent") for i in range(2)]
    wb = [workers(f"b{i}", c.bootstrap(), gb, topic, client="kafka-python") for i in range(3)]
    wait_stable(wa, [3, 3])
    wait_stable(wb, [2, 2, 2])
    assert_exactly_once(wait_consumed(wa, want), want)
    assert_exactly_once(wait_consumed(wb, want), want)
    check_zk_mirror(c, ga, topic, wa)
    check_zk_mirror(c, gb, topic, wb)


# ---------------------------------------------------------------------------
# 5. committed offsets survive restarting every broker; and a coordinator kill -9
# ---------------------------------------------------------------------------

def _commit_half(c: Cluster, group: str, topic: str, upto: int) -> None:
    """A group member (confluent, in-process) reads everything and commits offset `upto` on
    every partition, then leaves."""
    cons = Consumer({"bootstrap.servers": c.bootstrap(), "group.id": group, "enable.auto.commit": False,
                     "auto.offset.reset": "earliest", "session.timeout.ms": SESSION_MS, "log_level": 2})
    try:
        assigned = []
        cons.subscribe([topic], on_assign=lambda _c, ps: assigned.extend(ps))
        seen = set()

        def read():
            m = cons.poll(0.2)
            if m is not None and m.error() is None:
                seen.add((m.partition(), m.offset()))
            return len(assigned) == TOPIC_PARTS and len(seen) >= TOPIC_PARTS * upto

        wait_until(read, WAIT, "first reader to get all partitions", interval=0)
        res = cons.commit(offsets=[TopicPartition(topic, p, upto) for p in range(TOPIC_PARTS)],
                          asynchronous=False)
        assert all(tp.error is None for tp in res), res
    finally:
        cons.close()


def _committed_via_kafka_python(c: Cluster, group: str, topic: str) -> Dict[int, int]:
    a = kp_admin(c)
    try:
        from kafka import TopicPartition as KTP
        offs = a.list_group_offsets({group: [KTP(topic, p) for p in range(TOPIC_PARTS)]})
        offs = offs.get(group, offs)
        return {tp.partition: om.offset for tp, om in offs.items()}
    finally:
        a.close()


def _resume_reads(c: Cluster, group: str, topic: str, want: Set) -> None:
    """A new member of `group` reads exactly `want` (the records after the committed offsets)."""
    w = Worker("resume", c.bootstrap(), group, topic, client="confluent", log_dir=tempfile.mkdtemp())
    w.start()
    try:
        got = wait_consumed([w], want, timeout=WAIT + 30)
        assert_exactly_once(got, want)
    finally:
        w.kill()


def test_offsets_survive_restart_of_every_broker(cluster):
    c = cluster
    topic, group = uniq("restart"), uniq("g")
    create_topic(c, topic)
    produce(c, topic, 100)
    _commit_half(c, group, topic, 60)
    before = wait_until(lambda: _committed_via_kafka_python(c, group, topic), WAIT, "committed offsets")
    assert before == {p: 60 for p in range(TOPIC_PARTS)}, before

    for b in c.brokers.values():  # SIGTERM all ...
        assert b.stop() == 0
    for b in c.brokers.values():  # ... start all
        b._fixed_port = True
        b.start()
    c.wait_registered([1, 2, 3])
    c.wait_controller()
    c.wait_topic_online(topic, TOPIC_PARTS)

    after = wait_until(lambda: _committed_via_kafka_python(c, group, topic), WAIT, "committed offsets after restart")
    assert after == before, f"committed offsets changed across a full restart: {before} -> {after}"
    _resume_reads(c, group, topic, {(p, o) for p in range(TOPIC_PARTS) for o in range(60, 100)})


def test_coordinator_kill_keeps_committed_offsets(cluster):
    c = cluster
    topic, group = uniq("cokill"), uniq("g")
    create_topic(c, topic)
    produce(c, topic, 50)
    _commit_half(c, group, topic, 30)
    coord, part = group_coordinator(c, group)
    # wait until the offsets partition is fully replicated before killing its leader
    wait_until(lambda: sorted(c.partition_state("__consumer_offsets", part)["isr"]) == [1, 2, 3], WAIT,
               f"__consumer_offsets-{part} ISR [1,2,3]", interval=0.2)
    c.brokers[coord].kill()
    want = {p: 30 for p in range(TOPIC_PARTS)}
    # ask continuously from the kill on: while the new coordinator loads __consumer_offsets it must
    # answer COORDINATOR_LOAD_IN_PROGRESS / NOT_COORDINATOR (the client retries), never "no offset"
    answers: List = []
    good = [0]

    def settled():
        try:
            got = _committed_via_kafka_python(c, group, topic)
        except Exception as e:  # noqa: BLE001 - errors are fine, clients retry them
            answers.append(("error", repr(e)[:120]))
            return False
        answers.append(("ok", got))
        good[0] = good[0] + 1 if got == want else 0
        return good[0] >= 3

    wait_until(settled, c.failover_timeout + WAIT, "the new coordinator to serve the committed offsets",
               interval=0.05)
    wrong = [a for a in answers if a[0] == "ok" and a[1] != want]
    assert not wrong, (f"OffsetFetch answered without error but with other offsets than committed "
                       f"({want}) after the coordinator (broker {coord}) was killed: {wrong[:3]}; "
                       f"new leader {c.partition_state('__consumer_offsets', part)}")
    _resume_reads(c, group, topic, {(p, o) for p in range(TOPIC_PARTS) for o in range(30, 50)})


# ---------------------------------------------------------------------------
# 6. static membership: restart within the session timeout causes no rebalance
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("how", ["close", "kill"])
def test_static_member_restart_no_rebalance(cluster, workers, how):
    c = cluster
    topic, group = uniq("static"), uniq("g")
    create_topic(c, topic)
    first = produce(c, topic, 20)
    # a long session so the restart is comfortably inside it on a loaded machine
    kw = dict(client="confluent", session_timeout_ms=30000)
    ws = [workers(f"s{i}", c.bootstrap(), group, topic, instance_id=f"inst-{i}", **kw) for i in range(3)]
    wait_stable(ws, [2, 2, 2])
    wait_consumed(ws, first)
    wait_commits_cover(ws, first)
    a = kp_admin(c)
    try:
        d0 = kp_describe(a, group)
        assert d0["group_state"] == "Stable", d0
        ids0 = {m["group_instance_id"]: m["member_id"] for m in d0["members"]}
        assert set(ids0) == {"inst-0", "inst-1", "inst-2"}, d0["members"]

        old = ws[1]
        old_parts, old_id = old.assignment(), old.member_id()
        t0 = time.time()
        if how == "close":
            old.close()  # librdkafka: a static member does not send LeaveGroup on close
        else:
            old.kill()
        new = workers("s1b", c.bootstrap(), group, topic, instance_id="inst-1", **kw)
        wait_until(lambda: new.assignment(), WAIT, "restarted static member to get its partitions")
        assert new.assignment() == old_parts, f"restarted static member got {new.assignment()}, had {old_parts}"
        assert new.member_id() != old_id
        second = produce(c, topic, 20, tag="second")
        got = wait_consumed([ws[0], ws[2], new], second)
        assert_exactly_once({k: v for k, v in got.items() if k in second}, second)
        for w in (ws[0], ws[2]):
            ev = w.rebalance_events_after(t0)
            assert not ev, f"{w.name} saw a rebalance after the static restart: {ev}"

        d1 = kp_describe(a, group)
        assert d1["group_state"] == "Stable", d1
        ids1 = {m["group_instance_id"]: m["member_id"] for m in d1["members"]}
        assert ids1["inst-0"] == ids0["inst-0"] and ids1["inst-2"] == ids0["inst-2"], (ids0, ids1)
        assert ids1["inst-1"] == new.member_id() != ids0["inst-1"], (ids0, ids1)
        for m in d1["members"]:
            want = {"inst-0": ws[0], "inst-1": new, "inst-2": ws[2]}[m["group_instance_id"]].assignment()
            assert member_partitions(m) == want, (m, want)
    finally:
        a.close()
    check_zk_mirror(c, group, topic, [ws[0], new, ws[2]])


# ---------------------------------------------------------------------------
# 7. cooperative-sticky: partitions that do not move are never revoked
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("client", ["confluent", "kafka-python"])
def test_cooperative_sticky_join_keeps_unmoved_partitions(cluster, workers, client):
    c = cluster
    topic, group = uniq("coop"), uniq("g")
    create_topic(c, topic)
    first = produce(c, topic, 20)
    kw = dict(client=client, strategy="cooperative-sticky")
    ws = [workers(f"c{i}", c.bootstrap(), group, topic, **kw) for i in range(2)]
    before = wait_stable(ws, [3, 3])
    wait_consumed(ws, first)
    t0 = time.time()
    ws.append(workers("c2", c.bootstrap(), group, topic, **kw))
    after = wait_stable(ws, [2, 2, 2])
    for w in ws[:2]:
        kept = before[w.name] & after[w.name]
        moved = before[w.name] - after[w.name]
        assert after[w.name] <= before[w.name], f"{w.name}: sticky assignment gained {after[w.name] - before[w.name]}"
        revoked = set()
        for e in w.rebalance_events_after(t0):
            if e["ev"] in ("revoke", "lost"):
                revoked |= set(e["parts"])
        assert not (revoked & kept), f"{w.name}: partitions {sorted(revoked & kept)} were revoked though they stayed"
        assert revoked == moved, f"{w.name}: revoked {sorted(revoked)}, moved {sorted(moved)}"
    second = produce(c, topic, 20, tag="second")
    assert_exactly_once({k: v for k, v in wait_consumed(ws, second).items() if k in second}, second)


# ---------------------------------------------------------------------------
# 7b. subscriptions changing every few hundred ms, then settling
# ---------------------------------------------------------------------------

class Churner(threading.Thread):
    """One confluent consumer in its own thread: changes its subscription every 50-300 ms until
    `churn_over`, then subscribes to both topics for good and keeps polling. librdkafka drops the
    JoinGroup answer (MEMBER_ID_REQUIRED and its member id) when its subscription changes
    mid-join, so the coordinator is left with pending member ids nobody will use."""

    def __init__(self, c: Cluster, group: str, topics: List[str], strategy: str, idx: int,
                 churn_over: threading.Event, done: threading.Event):
        super().__init__(daemon=True)
        self.conf = {"bootstrap.servers": c.bootstrap(), "group.id": group, "client.id": f"churn{idx}",
                     "enable.auto.commit": False, "session.timeout.ms": SESSION_MS,
                     "heartbeat.interval.ms": 500, "partition.assignment.strategy": strategy,
                     "topic.metadata.refresh.interval.ms": 2000, "log_level": 2}
        a, b = topics
        self.topics = topics
        self.plan = [[a], [a, b], [b], [b, a]]
        self.idx, self.churn_over, self.done = idx, churn_over, done
        self.lock = threading.Lock()
        self.assigned: Set = set()
        self.changes = 0
        self.failure = None

    def run(self):
        try:
            cons = Consumer(self.conf)
        except Exception as e:  # noqa: BLE001 - reported by the test
            self.failure = repr(e)
            return
        rng = random.Random(self.idx)
        next_change, final = 0.0, False
        try:
            while not self.done.is_set():
                if not self.churn_over.is_set():
                    if time.monotonic() >= next_change:
                        cons.subscribe(self.plan[(self.idx + self.changes) % len(self.plan)])
                        self.changes += 1
                        next_change = time.monotonic() + rng.uniform(0.05, 0.3)
                elif not final:
                    cons.subscribe(self.topics)
                    final = True
                cons.poll(0.05)
                now = {(tp.topic, tp.partition) for tp in cons.assignment()}
                with self.lock:
                    self.assigned = now
        except Exception as e:  # noqa: BLE001 - reported by the test
            self.failure = repr(e)
        finally:
            cons.close()

    def assignment(self) -> Set:
        with self.lock:
            return set(self.assigned)


def drop_member_id_answer(c: Cluster, group: str, topics: List[str], strategy: str) -> None:
    """What librdkafka does when its subscription changes while its first JoinGroup is in
    flight: it never uses the member id that JoinGroup was answered with. That window is a
    round trip wide, too narrow to hit on purpose, so a raw JoinGroup v5 plays the client."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "protocol-tests"))
    import kproto
    import kproto_groups as kg

    coordinator = c.brokers[group_coordinator(c, group)[0]]
    body = kg.join_group_request(5, group, "", [(strategy, kg.consumer_subscription(topics))],
                                 session_timeout_ms=SESSION_MS, rebalance_timeout_ms=300000)
    with kproto.Conn(coordinator.host, coordinator.port, timeout=10) as conn:
        r = kg.call(conn, kg.JOIN_GROUP, 5, body)
    assert r["error_code"] == kg.MEMBER_ID_REQUIRED, r


@pytest.mark.parametrize("strategy", ["roundrobin", "cooperative-sticky"])
def test_subscription_churn_settles_with_every_member_assigned(cluster, report, strategy):
    c = cluster
    topics, group = [uniq("churn-a"), uniq("churn-b")], uniq("g")
    for t in topics:
        create_topic(c, t)
    every = {(t, p) for t in topics for p in range(TOPIC_PARTS)}
    churn_over, done = threading.Event(), threading.Event()
    members = [Churner(c, group, topics, strategy, i, churn_over, done) for i in range(8)]
    for m in members:
        m.start()
    try:
        # Long enough for many joins to cross subscription changes.
        wait_until(lambda: min(m.changes for m in members) >= 60, WAIT, "60 subscription changes per member",
                   interval=0.2)
        drop_member_id_answer(c, group, topics, strategy)
        churn_over.set()
        t0 = time.monotonic()

        def settled():
            a = [m.assignment() for m in members]
            flat = [tp for s in a for tp in s]
            return all(a) and len(flat) == len(set(flat)) and set(flat) == every

        try:
            # Each join phase waits for the dropped member id until its session timeout (6 s)
            # lapses, not for the consumers' rebalance timeout (max.poll.interval.ms, 300 s).
            wait_until(settled, WAIT, "every member to hold partitions, together all of them", interval=0.2)
        except TimeoutError as e:
            raise AssertionError(f"{e}; assignment sizes now {[len(m.assignment()) for m in members]}; "
                                 f"consumer failures {[m.failure for m in members if m.failure]}") from None
        report(f"subscription churn ({strategy}, 8 members): settled {time.monotonic() - t0:.1f}s after it stopped")
    finally:
        done.set()
        for m in members:
            m.join(30)


# ---------------------------------------------------------------------------
# 8. ZooKeeper mirror through join, leave and expiry
# ---------------------------------------------------------------------------

def test_zookeeper_mirror_follows_membership(cluster, workers):
    c = cluster
    topic, group = uniq("zk"), uniq("g")
    create_topic(c, topic)
    ws = [workers(f"z{i}", c.bootstrap(), group, topic, client=cl)
          for i, cl in enumerate(["confluent", "kafka-python", "confluent"])]
    wait_stable(ws, [2, 2, 2])
    check_zk_mirror(c, group, topic, ws)
    gone = ws[0].member_id()
    ws[0].close()  # LeaveGroup
    wait_stable(ws[1:], [3, 3])
    check_zk_mirror(c, group, topic, ws[1:])
    assert gone not in zk_ids(c, group)
    ws[1].kill()  # expiry after session.timeout.ms
    wait_stable(ws[2:], [6], timeout=SESSION_MS / 1000 + WAIT)
    check_zk_mirror(c, group, topic, ws[2:])
    ws[2].close()
    wait_until(lambda: not zk_ids(c, group), WAIT, f"/consumers/{group}/ids to be empty", interval=0.2)
    wait_until(lambda: not zk_owners(c, group, topic), WAIT, f"/consumers/{group}/owners/{topic} to be empty",
               interval=0.2)


# ---------------------------------------------------------------------------
# 9. kcat's balanced consumer
# ---------------------------------------------------------------------------

def test_kcat_balanced_consumer(cluster):
    c = cluster
    topic, group = uniq("kcat"), uniq("g")
    create_topic(c, topic)
    want = produce(c, topic, 50)
    # kcat 1.7: with -G, -e exits once every assigned partition reached its end
    cmd = ["kcat", "-b", c.bootstrap(), "-G", group, "-X", "auto.offset.reset=earliest", "-e", "-q",
           "-f", "%p %o\\n", topic]
    r = subprocess.run(cmd, capture_output=True, timeout=WAIT + 30)
    assert r.returncode == 0, r.stderr.decode(errors="replace")[-2000:]
    lines = [tuple(map(int, ln.split())) for ln in r.stdout.decode().splitlines() if ln.strip()]
    assert len(lines) == len(set(lines)), "kcat read some records twice"
    assert set(lines) == want, f"missing {sorted(want - set(lines))[:10]}"
    # kcat committed what it read (auto commit on close): a second run reads nothing new
    more = produce(c, topic, 5, tag="more")
    r = subprocess.run(cmd, capture_output=True, timeout=WAIT + 30)
    assert r.returncode == 0, r.stderr.decode(errors="replace")[-2000:]
    lines = {tuple(map(int, ln.split())) for ln in r.stdout.decode().splitlines() if ln.strip()}
    assert lines == more, f"second kcat run read {sorted(lines)[:10]}..., expected only the {len(more)} new ones"


# ---------------------------------------------------------------------------
# 10. admin: list and describe groups
# ---------------------------------------------------------------------------

def test_admin_lists_and_describes_groups(cluster, workers):
    c = cluster
    topic, group, idle = uniq("adm"), uniq("g"), uniq("idle")
    create_topic(c, topic)
    ws = [workers(f"d{i}", c.bootstrap(), group, topic, client=cl)
          for i, cl in enumerate(["confluent", "kafka-python", "confluent"])]
    wait_stable(ws, [2, 2, 2])
    _commit_half(c, idle, topic, 0)  # an Empty group with committed offsets
    a = kp_admin(c)
    try:
        def listed():
            gs = {g["group_id"]: g for g in kp_list_groups(a)}
            return gs if group in gs and idle in gs else None
        gs = wait_until(listed, WAIT, "kafka-python list to show both groups", interval=0.5)
        assert gs[group]["protocol_type"] == "consumer", gs[group]
        # ListGroups v4+ carries the state; kafka-python 3.x asks for it
        assert gs[group].get("group_state") == "Stable" and gs[idle].get("group_state") == "Empty", gs
        stable = {g["group_id"] for g in kp_list_groups(a, states_filter=["Stable"])}
        assert group in stable and idle not in stable, stable

        def described():
            d = kp_describe(a, group)
            return d if d["group_state"] == "Stable" and len(d["members"]) == 3 else None
        d = wait_until(described, WAIT, "describe to show a Stable group with 3 members", interval=0.5)
        assert d["protocol_type"] == "consumer" and d.get("protocol_data", d.get("protocol")) == "range", d
        by_id = {w.member_id(): w for w in ws}
        assert {m["member_id"] for m in d["members"]} == set(by_id)
        for m in d["members"]:
            w = by_id[m["member_id"]]
            assert m["client_id"] == w.name, m
            assert member_partitions(m) == w.assignment(), (m, w.assignment())
        idle_d = kp_describe(a, idle)
        assert idle_d["group_state"] == "Empty" and not idle_d["members"], idle_d
    finally:
        a.close()

    # confluent AdminClient sees the same
    ca = c.admin(1)
    res = ca.list_consumer_groups().result(timeout=WAIT)
    assert {group, idle} <= {g.group_id for g in res.valid}, res.valid
    desc = ca.describe_consumer_groups([group])[group].result(timeout=WAIT)
    assert desc.state == ck.ConsumerGroupState.STABLE, desc.state
    assert desc.partition_assignor == "range"
    got = {m.member_id: {tp.partition for tp in m.assignment.topic_partitions} for m in desc.members}
    assert got == {w.member_id(): w.assignment() for w in ws}, got


# ---------------------------------------------------------------------------
# KIP-848 turned off (group.coordinator.rebalance.protocols=classic): a group.protocol=consumer
# client must not silently join (compat/test_consumer_group_protocol.py tests it turned on)
# ---------------------------------------------------------------------------

@pytest.fixture
def classic_only_cluster(request, zookeeper):
    overrides = dict(OVERRIDES, **{"group.coordinator.rebalance.protocols": "classic"})
    c = Cluster(zookeeper, 3, overrides=overrides, on_new_broker=lambda b: _register(request, b))
    c.start()
    yield c
    c.cleanup(keep=_failed(request))


def test_consumer_group_protocol_is_refused(classic_only_cluster):
    c = classic_only_cluster
    topic = uniq("k848")
    create_topic(c, topic)
    for b in c.brokers.values():
        assert 68 not in b.api_versions, f"broker {b.broker_id} advertises ConsumerGroupHeartbeat"
    records: List[str] = []

    class H(logging.Handler):
        def emit(self, rec):
            records.append(rec.getMessage())

    log = logging.getLogger(uniq("rdkafka"))
    log.addHandler(H())
    log.setLevel(logging.DEBUG)
    errors: List = []
    cons = Consumer({"bootstrap.servers": c.bootstrap(), "group.id": uniq("g"), "group.protocol": "consumer",
                     "debug": "cgrp", "error_cb": errors.append}, logger=log)
    try:
        cons.subscribe([topic])
        assigned = []

        def refused():
            cons.poll(0.2)
            assigned.extend(cons.assignment())
            return any("ConsumerGroupHeartbeat" in r and "not supported by broker" in r for r in records)

        # librdkafka 2.x does not raise here (as against Apache Kafka 3.x in ZooKeeper mode): it logs
        # "ConsumerGroupHeartbeatRequest not supported by broker" and never joins
        wait_until(refused, WAIT, "librdkafka to report ConsumerGroupHeartbeat as unsupported", interval=0)
        assert not assigned, assigned
    finally:
        cons.close()


# ---------------------------------------------------------------------------
# measurement: synchronous commit throughput
# ---------------------------------------------------------------------------

def test_measure_commit_throughput(cluster, report):
    c = cluster
    topic = uniq("commits")
    create_topic(c, topic)
    produce(c, topic, 1)

    def member(group):
        cons = Consumer({"bootstrap.servers": c.bootstrap(), "group.id": group, "enable.auto.commit": False,
                         "auto.offset.reset": "earliest", "session.timeout.ms": SESSION_MS, "log_level": 2})
        got = []
        cons.subscribe([topic], on_assign=lambda _c, ps: got.extend(ps))
        wait_until(lambda: (cons.poll(0.1), got)[1], WAIT, "assignment", interval=0)
        return cons, [tp.partition for tp in got]

    # one consumer committing in a loop
    cons, parts = member(uniq("one"))
    try:
        n, t0 = 0, time.time()
        while time.time() - t0 < 3:
            cons.commit(offsets=[TopicPartition(topic, parts[0], n + 1)], asynchronous=False)
            n += 1
        report(f"commit throughput, 1 consumer: {n / (time.time() - t0):.0f} sync commits/s")
    finally:
        cons.close()

    # 20 consumers (own groups, threads) committing concurrently
    k = 20
    members = [member(uniq(f"many{i}")) for i in range(k)]
    counts = [0] * k
    errs: List = []
    stop = time.time() + 3

    def loop(i):
        cc, ps = members[i]
        try:
            while time.time() < stop:
                cc.commit(offsets=[TopicPartition(topic, ps[0], counts[i] + 1)], asynchronous=False)
                counts[i] += 1
        except KafkaException as e:
            errs.append(e)

    t0 = time.time()
    ts = [threading.Thread(target=loop, args=(i,)) for i in range(k)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    el = time.time() - t0
    for cc, _ in members:
        cc.close()
    report(f"commit throughput, {k} consumers in parallel: {sum(counts) / el:.0f} sync commits/s total "
           f"(errors: {len(errs)})")
    assert not errs, errs[:3]
