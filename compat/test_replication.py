"""Replication under faults: real ZooKeeper, three real gregor processes, real clients.

Brokers are killed with SIGKILL, paused with SIGSTOP/SIGCONT and restarted with SIGTERM
(controlled shutdown).  Every wait polls ZooKeeper (partition state znodes), Metadata or the
replicas' files; nothing sleeps and hopes, and no test asserts on timing.

1. test_fault_script[seed]       idempotent acks=all producer while leaders/controller are killed,
                                 restarted and rolled; every ack is in the log at its offset,
                                 no duplicates, dense offsets, per-key order, replicas byte-equal;
                                 once more with a SASL_SSL (SCRAM-SHA-512) inter-broker listener
2. test_stopped_follower_...     a SIGSTOPped follower leaves the ISR, acks=all continues, SIGCONT rejoins
3. test_not_enough_replicas      |ISR| < min.insync.replicas => NOT_ENOUGH_REPLICAS, nothing written
4. test_replica_logs_agree       segment bytes and leader-epoch-checkpoint identical on every replica
5. test_consumer_offsets_...     committed offsets survive kill -9 of the group coordinator
"""
from __future__ import annotations

import os
import random
import re
import time
import uuid

import pytest

try:
    import kazoo  # noqa: F401
except ImportError as e:  # fail loudly: a skipped suite would look green
    raise ImportError("compat/test_replication.py needs kazoo: .venv/bin/pip install kazoo") from e
ck = pytest.importorskip("confluent_kafka")
from confluent_kafka import Consumer, KafkaError, TopicPartition  # noqa: E402
from confluent_kafka.admin import NewTopic  # noqa: E402

from cluster_harness import Cluster  # noqa: E402
from gregor_fixtures import _failed, _register  # noqa: E402
from gregor_harness import wait_until  # noqa: E402
from inter_broker_security import BROKER_PASSWORD, BROKER_USER, InterBroker, add_scram_user_in_zookeeper  # noqa: E402
from replication_tools import (  # noqa: E402
    SeqProducer, epochs_from_batches, format_epoch_checkpoint, key_of, offsets_partition_for,
    parse_batches, produce_sync, read_epoch_checkpoint, read_partitions, segment_bytes, sigcont,
    sigstop)

WAIT = 90
LAG_MS = 3000  # replica.lag.time.max.ms for every test (Kafka's default 30 s is too slow for tests)


# ---------------------------------------------------------------------------
# fixtures / helpers
# ---------------------------------------------------------------------------

@pytest.fixture
def cluster_factory(request, zookeeper):
    clusters = []

    def make(n: int = 3, overrides=None, setup=None, **kw) -> Cluster:
        """`setup(cluster)` runs before any broker starts (znodes brokers read at start)."""
        o = {"replica.lag.time.max.ms": str(LAG_MS)}
        o.update(overrides or {})
        c = Cluster(zookeeper, n, overrides=o, on_new_broker=lambda b: _register(request, b), **kw)
        clusters.append(c)
        if setup:
            setup(c)
        c.start()
        return c

    yield make
    failed = _failed(request)
    for c in clusters:
        for b in c.brokers.values():
            sigcont(b)  # a paused broker would sit out SIGTERM until the stop timeout
        c.cleanup(keep=failed)


def uniq(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


class Timeline:
    """Timestamped notes, printed (pytest shows them on failure) to relate client results
    to the broker logs."""

    def __init__(self):
        self.t0 = time.monotonic()

    def __call__(self, msg: str) -> None:
        print(f"[{time.monotonic() - self.t0:7.2f}s] {msg}", flush=True)


def create_topic(c: Cluster, name: str, partitions: int, rf: int, config=None) -> None:
    ctl = c.wait_controller()
    # /brokers/ids lists every broker before the controller has seen them all: wait until the
    # controller's own Metadata does, or CreateTopics may count too few live brokers
    want = sorted(c.live_ids())
    wait_until(lambda: sorted(c.metadata(ctl).brokers) == want, WAIT,
               f"the controller's Metadata to list brokers {want}", interval=0.1)
    a = c.admin(ctl)
    fs = a.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=rf, config=config or {})],
                         operation_timeout=30)
    fs[name].result(timeout=WAIT)
    c.wait_topic_online(name, partitions, timeout=WAIT)


def states(c: Cluster, topic: str):
    try:
        return c.partition_states(topic)
    except Exception as e:  # noqa: BLE001
        return f"<unreadable: {e!r}>"


def wait_full_isr(c: Cluster, topic: str, what: str, timeout: float = WAIT):
    """Every partition's state znode lists every assigned replica in its ISR and a live leader."""
    assignment = c.zk_assignment(topic)

    def ok():
        live = set(c.live_ids())
        st = c.partition_states(topic)
        return all(sorted(st[p]["isr"]) == sorted(r) and st[p]["leader"] in live for p, r in assignment.items())

    try:
        wait_until(ok, timeout, f"{topic}: full ISRs ({what})", interval=0.1)
    except TimeoutError as e:
        raise AssertionError(f"{e}\n  assignment {assignment}\n  states {states(c, topic)}") from None


def wait_isr(c: Cluster, topic: str, p: int, want, what: str, timeout: float = WAIT) -> dict:
    def ok():
        s = c.partition_state(topic, p)
        return s if sorted(s["isr"]) == sorted(want) else None

    try:
        return wait_until(ok, timeout, f"{topic}-{p}: ISR == {sorted(want)} ({what})", interval=0.1)
    except TimeoutError as e:
        raise AssertionError(f"{e}\n  state now {states(c, topic)}") from None


def wait_dead_handled(c: Cluster, topic: str, dead, what: str):
    """After brokers died: every partition has a live leader and no dead broker in its ISR."""
    dead = set(dead)

    def ok():
        live = set(c.live_ids())
        st = c.partition_states(topic)
        return all(s["leader"] in live and not (set(s["isr"]) & dead) for s in st.values())

    try:
        wait_until(ok, c.failover_timeout + WAIT, f"{topic}: leaders moved off {sorted(dead)} ({what})",
                   interval=0.1)
    except TimeoutError as e:
        raise AssertionError(f"{e}\n  states {states(c, topic)}") from None


def restart(c: Cluster, broker_id: int) -> None:
    b = c.brokers[broker_id]
    b._fixed_port = True  # clients and the other brokers know it by its port
    b.start()


def local_log_end(broker, topic: str, p: int) -> int:
    """Next offset after the last complete batch in the broker's own files for topic-p."""
    data = segment_bytes(broker, topic, p) or b""
    end = 0
    try:
        for b in parse_batches(data):
            end = b["last_offset"] + 1
    except ValueError:  # a batch being written right now: count the complete ones
        pass
    return end


def wait_caught_up(c: Cluster, topic: str, broker_id: int, what: str):
    """Every partition's log on `broker_id` reaches the high watermark the leaders report now
    (so a restarted broker really has fetched, not merely kept its ISR seat)."""
    probe = Consumer({"bootstrap.servers": c.bootstrap(), "group.id": "unused", "log_level": 2})
    try:
        parts = sorted(c.zk_assignment(topic))
        hw = {p: probe.get_watermark_offsets(TopicPartition(topic, p), timeout=20, cached=False)[1] for p in parts}
    finally:
        probe.close()
    have = {}

    def ok():
        for p in parts:
            have[p] = local_log_end(c.brokers[broker_id], topic, p)
        return all(have[p] >= hw[p] for p in parts)

    try:
        wait_until(ok, WAIT, f"broker {broker_id} to catch up on {topic} ({what})", interval=0.1)
    except TimeoutError as e:
        raise AssertionError(f"{e}\n  high watermarks {hw}\n  broker {broker_id} log ends {have}\n"
                             f"  states {states(c, topic)}") from None


def wait_replicas_identical(c: Cluster, topic: str, partitions, first_only: bool = False,
                            timeout: float = WAIT):
    """Poll until every replica of each partition holds the same, non-empty log bytes; returns
    {p: bytes}."""
    assignment = c.zk_assignment(topic)
    last = {}

    def ok():
        out = {}
        for p in partitions:
            per = {r: segment_bytes(c.brokers[r], topic, p, first_only) for r in assignment[p]}
            last[p] = {r: (None if v is None else len(v)) for r, v in per.items()}
            vals = list(per.values())
            if vals[0] is None or not vals[0] or any(v != vals[0] for v in vals):
                return None
            out[p] = vals[0]
        return out

    try:
        return wait_until(ok, timeout, f"{topic}: every replica's log bytes equal", interval=0.2)
    except TimeoutError as e:
        detail = []
        for p in partitions:
            per = {r: segment_bytes(c.brokers[r], topic, p, first_only) for r in assignment[p]}
            for r, v in per.items():
                try:
                    bs = parse_batches(v or b"")
                    summary = f"{len(v or b'')} bytes, {len(bs)} batches, offsets " \
                              f"{bs[0]['base_offset'] if bs else '-'}..{bs[-1]['last_offset'] if bs else '-'}, " \
                              f"epochs {epochs_from_batches(bs)}"
                except ValueError as pe:
                    summary = f"{len(v or b'')} bytes, unparsable: {pe}"
                detail.append(f"  {topic}-{p} on broker {r}: {summary}")
        raise AssertionError(f"{e}\n" + "\n".join(detail) + f"\n  states {states(c, topic)}") from None


def check_log(name: str, marks, recs, acked, rejected=()):
    """The PASS rules over what was read back.  `acked`: {value: (partition, offset)}."""
    problems = []
    at = {}
    seen_values = {}
    for p, rs in recs.items():
        lo, hi = marks[p]
        if lo != 0:
            problems.append(f"partition {p}: log start offset {lo}, expected 0")
        offsets = [o for o, _, _ in rs]
        if offsets != list(range(lo, hi)):
            missing = sorted(set(range(lo, hi)) - set(offsets))
            dup = sorted({o for o in offsets if offsets.count(o) > 1})
            problems.append(f"partition {p}: offsets not dense {lo}..{hi}: {len(offsets)} read, "
                            f"missing {missing[:10]}, repeated {dup[:10]}")
        last_by_key = {}
        for o, k, v in rs:
            n = int(v.decode())
            at[(p, o)] = n
            if k != key_of(n):
                problems.append(f"partition {p} offset {o}: value {n} has key {k!r}, produced with {key_of(n)!r}")
            if n in seen_values:
                problems.append(f"value {n} appears twice: at {seen_values[n]} and {(p, o)}")
            seen_values[n] = (p, o)
            if k in last_by_key and last_by_key[k][1] >= n:
                problems.append(f"key {k!r} out of order in partition {p}: value {last_by_key[k][1]} at offset "
                                f"{last_by_key[k][0]} before value {n} at offset {o}")
            last_by_key[k] = (o, n)
    lost = []
    for n, (p, o) in sorted(acked.items()):
        if o is None and seen_values.get(n, (None,))[0] == p:
            # librdkafka acknowledges a retried batch the broker already holds as "possibly
            # persisted" without an offset: it must then be in that partition, exactly once
            # (duplicates are caught above).
            continue
        if at.get((p, o)) != n:
            lost.append(f"value {n} acked at {p}/{o}, log has "
                        f"{at.get((p, o), 'nothing')} there" + (f", value is at {seen_values[n]}" if n in seen_values
                                                                 else ", value absent"))
    if lost:
        problems.append(f"{len(lost)} of {len(acked)} acknowledged records are not at their offset: {lost[:10]}")
    for n in rejected:
        if n in seen_values:
            problems.append(f"value {n} was rejected but is in the log at {seen_values[n]}")
    assert not problems, f"{name}: " + "\n  ".join(problems[:40])


# ---------------------------------------------------------------------------
# 1. the scripted fault test
# ---------------------------------------------------------------------------

# GREGOR_FAULT_SEEDS=N runs the scripted fault test over seeds 1..N (the longer run in
# docs/operations.md); every third seed starts by killing the controller itself.
FAULT_SEEDS = int(os.environ.get("GREGOR_FAULT_SEEDS", "3"))


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    from security_certs import Certs
    return Certs(tmp_path_factory.mktemp("certs"))


def secured_cluster(request, cluster_factory, protocol: str, n: int = 3, **kw) -> Cluster:
    """A cluster whose inter-broker listener is `protocol` (SCRAM-SHA-512 for SASL), the
    broker user's credential written to ZooKeeper before the brokers start."""
    inter = InterBroker(request.getfixturevalue("certs"), protocol, **kw)
    return cluster_factory(n, broker_overrides=inter,
                           setup=lambda c: add_scram_user_in_zookeeper(c.kz, BROKER_USER, BROKER_PASSWORD))


@pytest.mark.parametrize("seed,controller_led,inter_broker",
                         [(s, s % 3 == 2, "PLAINTEXT") for s in range(1, FAULT_SEEDS + 1)]
                         + [(1, False, "SASL_SSL"), (2, True, "SASL_SSL")])
def test_fault_script(request, cluster_factory, seed, controller_led, inter_broker):
    """`controller_led`: the first victim leads its partition *and* is the controller, so the
    second kill hits the freshly elected controller; otherwise it is another broker.
    `inter_broker`: the inter-broker listener's protocol (clients always use PLAINTEXT)."""
    rng = random.Random(seed)
    log = Timeline()
    if inter_broker == "PLAINTEXT":
        c = cluster_factory(3)
    else:
        c = secured_cluster(request, cluster_factory, inter_broker)
    topic = uniq(f"faults{seed}")
    parts = 6
    create_topic(c, topic, parts, 3, config={"min.insync.replicas": "2"})
    wait_full_isr(c, topic, "fresh topic")

    prod = SeqProducer(c.bootstrap(), topic)
    prod.start()
    try:
        wait_until(lambda: prod.acked_count() >= 200, WAIT, "the producer's first 200 acks", interval=0.1)
        log(f"producer running: {prod.acked_count()} acked")

        # kill -9 the leader of a seed-chosen partition
        ctl0 = c.wait_controller()
        st0 = c.partition_states(topic)
        p0 = rng.choice(sorted(p for p, s in st0.items() if (s["leader"] == ctl0) == controller_led))
        first = st0[p0]
        a = first["leader"]
        c.brokers[a].kill()
        log(f"kill -9 broker {a} (leader of {topic}-{p0}, epoch {first['leader_epoch']}); "
            f"controller {c.controller()}")

        def new_leader():
            s = c.partition_state(topic, p0)
            return s if s["leader"] in c.live_ids() and s["leader_epoch"] > first["leader_epoch"] else None

        s = wait_until(new_leader, c.failover_timeout + WAIT, f"a new leader for {topic}-{p0}", interval=0.1)
        log(f"{topic}-{p0}: new leader {s['leader']} epoch {s['leader_epoch']} isr {s['isr']}")
        wait_dead_handled(c, topic, [a], f"after killing {a}")
        log(f"all partitions moved off {a}: {states(c, topic)}")

        # kill -9 the controller (a broker other than `a`: `a` is dead)
        ctl = c.wait_controller()
        c.brokers[ctl].kill()
        log(f"kill -9 controller {ctl}; acked so far {prod.acked_count()}")
        survivor = c.wait_controller(timeout=c.failover_timeout + WAIT)
        log(f"new controller {survivor}")
        wait_dead_handled(c, topic, [a, ctl], f"after killing {a} and {ctl}")
        log(f"all partitions on {survivor}: {states(c, topic)}")

        # restart both; wait until they are back in every ISR
        for b in (a, ctl):
            restart(c, b)
            log(f"restarted broker {b}")
        c.wait_registered([1, 2, 3])
        wait_full_isr(c, topic, f"after restarting {a} and {ctl}")
        for b in (a, ctl):
            wait_caught_up(c, topic, b, "restarted after kill -9")
        log(f"full ISRs again: {states(c, topic)}; acked {prod.acked_count()}")

        # rolling restart (SIGTERM = controlled shutdown) in a seed-chosen order
        order = [1, 2, 3]
        rng.shuffle(order)
        for b in order:
            rc = c.brokers[b].stop(timeout=60)
            log(f"SIGTERM broker {b}: exit code {rc}")
            assert rc == 0, f"broker {b} exited with {rc} on SIGTERM\n{c.brokers[b].stderr_tail(40)}"
            wait_until(lambda b=b: all(s["leader"] != b for s in c.partition_states(topic).values()), WAIT,
                       f"no partition of {topic} led by stopped broker {b}", interval=0.1)
            log(f"broker {b} stopped: {states(c, topic)}")
            restart(c, b)
            c.wait_registered([1, 2, 3])
            wait_full_isr(c, topic, f"after the rolling restart of {b}")
            wait_caught_up(c, topic, b, "rolling restart")
            log(f"broker {b} back in every ISR; acked {prod.acked_count()}")

        # the producer keeps making progress on the restored cluster
        base = prod.acked_count()
        wait_until(lambda: prod.acked_count() >= base + 300, WAIT, "300 more acks after the faults", interval=0.1)
    finally:
        prod.stop()
    log(f"producer stopped: sent {prod.sent}, acked {len(prod.acked)}, failed {len(prod.failed)}, "
        f"unflushed {prod.unflushed}, client errors {prod.client_errors[:10]}")

    assert not prod.fatal(), f"fatal producer errors: {prod.fatal()}"
    assert prod.unflushed == 0, f"{prod.unflushed} records never got a delivery report"
    assert not prod.double_acks, f"records acknowledged twice: {prod.double_acks[:10]}"
    failed = {n: (e.name(), e.str()) for n, e in sorted(prod.failed.items())}
    assert not failed, f"{len(failed)} records failed delivery (message.timeout.ms 240 s): " \
                       f"{list(failed.items())[:10]}"

    wait_full_isr(c, topic, "before reading back")
    marks, recs = read_partitions(c.bootstrap(), topic, range(parts))
    log(f"read back: {marks}")
    check_log(f"{topic} (seed {seed})", marks, recs, prod.acked)
    assert sum(hi - lo for lo, hi in marks.values()) >= len(prod.acked)

    # no replica keeps records the others lack, none misses any
    logs = wait_replicas_identical(c, topic, range(parts))
    for p, data in logs.items():
        bs = parse_batches(data)
        last = bs[-1]["last_offset"] + 1 if bs else 0
        assert last == marks[p][1], f"{topic}-{p}: replicas end at {last}, high watermark {marks[p][1]}"

    if inter_broker == "SASL_SSL":
        # The replication above went over the secured listener, as the broker user.
        for b in c.brokers.values():
            assert re.search(r"listener=INTERNAL.*authenticated principal=User:broker mechanism=SCRAM-SHA-512",
                             b.stderr_tail(1000000)), f"broker {b.broker_id} saw no authenticated broker"


# ---------------------------------------------------------------------------
# 2. a paused follower leaves the ISR and comes back
# ---------------------------------------------------------------------------

def pick_follower(c: Cluster, topic: str, p: int) -> int:
    s = c.partition_state(topic, p)
    ctl = c.controller()
    return next(r for r in c.zk_assignment(topic)[p] if r != s["leader"] and r != ctl)


def leader_watermarks(c: Cluster, leader: int, topic: str):
    """The partition's (low, high) watermarks as its leader answers them, for a failure message."""
    probe = Consumer({"bootstrap.servers": c.brokers[leader].bootstrap, "group.id": "unused", "log_level": 2})
    try:
        return probe.get_watermark_offsets(TopicPartition(topic, 0), timeout=10, cached=False)
    except Exception as e:  # noqa: BLE001 - only a diagnostic
        return repr(e)
    finally:
        probe.close()


def test_stopped_follower_leaves_and_rejoins_isr(cluster_factory):
    # a long ZooKeeper session: the paused broker stays registered, so only the leader's
    # replica.lag.time.max.ms rule can take it out of the ISR
    c = cluster_factory(3, session_timeout_ms=30000)
    topic = uniq("pause")
    create_topic(c, topic, 1, 3, config={"min.insync.replicas": "2"})
    wait_full_isr(c, topic, "fresh topic")
    before = c.partition_state(topic, 0)
    leader = before["leader"]
    f = pick_follower(c, topic, 0)

    acked, failed = produce_sync(c.bootstrap(), topic, range(0, 100))
    assert not failed, failed

    sigstop(c.brokers[f])
    # Clients bootstrap from the brokers that answer: a paused one accepts connections and
    # answers nothing, which is the client's trouble, not what this test is about.
    awake = c.bootstrap([i for i in c.live_ids() if i != f])
    try:
        # a write the paused follower cannot fetch: acknowledged once the ISR has shrunk
        lagging, failed = produce_sync(awake, topic, [100], conf={"message.timeout.ms": 60000})
        assert not failed, (failed, c.partition_state(topic, 0), leader_watermarks(c, leader, topic))
        acked.update(lagging)
        s = wait_isr(c, topic, 0, [r for r in before["isr"] if r != f], f"broker {f} paused")
        assert s["leader"] == leader, f"leadership moved while a follower was paused: {s}"
        assert f in c.registered_ids(), "the paused broker lost its ZooKeeper registration (session too short?)"

        more, failed = produce_sync(awake, topic, range(101, 400))
        assert not failed, {v: e.name() for v, e in failed.items()}
        acked.update(more)
        s = c.partition_state(topic, 0)
        assert f not in s["isr"] and s["leader"] == leader, s
    finally:
        sigcont(c.brokers[f])

    wait_isr(c, topic, 0, before["isr"], f"broker {f} resumed")
    assert c.partition_state(topic, 0)["leader"] == leader

    marks, recs = read_partitions(c.bootstrap(), topic, [0])
    check_log(topic, marks, recs, acked)
    assert marks[0][1] == 400
    wait_replicas_identical(c, topic, [0])


# ---------------------------------------------------------------------------
# 3. below min.insync.replicas
# ---------------------------------------------------------------------------

def test_not_enough_replicas(cluster_factory):
    # min.insync.replicas as a broker override this time (test 1 uses the topic config)
    c = cluster_factory(3, session_timeout_ms=30000, overrides={"min.insync.replicas": "2"})
    topic = uniq("minisr")
    create_topic(c, topic, 1, 3)
    wait_full_isr(c, topic, "fresh topic")
    before = c.partition_state(topic, 0)
    leader = before["leader"]
    followers = [r for r in before["isr"] if r != leader]

    acked, failed = produce_sync(c.bootstrap(), topic, range(0, 50))
    assert not failed, failed

    for f in followers:
        sigstop(c.brokers[f])
    awake = c.brokers[leader].bootstrap
    try:
        # acks=1 needs no follower: this write makes both followers lag
        more, failed = produce_sync(awake, topic, [50], conf={"acks": "1"})
        assert not failed, failed
        acked.update(more)
        wait_isr(c, topic, 0, [leader], f"followers {followers} paused")

        probe = Consumer({"bootstrap.servers": c.brokers[leader].bootstrap, "group.id": "unused",
                          "log_level": 2})
        try:
            hw_before = probe.get_watermark_offsets(TopicPartition(topic, 0), timeout=20, cached=False)
            assert hw_before == (0, 51), hw_before
            rejected = list(range(1000, 1005))
            ok, failed = produce_sync(awake, topic, rejected,
                                      conf={"retries": 0, "enable.idempotence": False,
                                            "message.timeout.ms": 60000})
            assert not ok, f"acks=all with ISR [{leader}] < min.insync.replicas 2 was acknowledged: {ok}"
            codes = {v: e.name() for v, e in failed.items()}
            assert set(codes) == set(rejected)
            assert all(e.code() == KafkaError.NOT_ENOUGH_REPLICAS for e in failed.values()), codes
            hw_after = probe.get_watermark_offsets(TopicPartition(topic, 0), timeout=20, cached=False)
            assert hw_after == hw_before, f"a refused write moved the log: {hw_before} -> {hw_after}"
        finally:
            probe.close()
    finally:
        for f in followers:
            sigcont(c.brokers[f])

    wait_isr(c, topic, 0, before["isr"], f"followers {followers} resumed")
    after, failed = produce_sync(c.bootstrap(), topic, range(51, 151))
    assert not failed, {v: e.name() for v, e in failed.items()}
    acked.update(after)

    marks, recs = read_partitions(c.bootstrap(), topic, [0])
    check_log(topic, marks, recs, acked, rejected=rejected)
    assert marks[0] == (0, 151), marks
    wait_replicas_identical(c, topic, [0])


# ---------------------------------------------------------------------------
# 4. replica logs agree, byte for byte, with Kafka's leader-epoch-checkpoint
# ---------------------------------------------------------------------------

def check_epoch_checkpoints(c: Cluster, topic: str, logs):
    """Each replica's leader-epoch-checkpoint is in Kafka's format and lists exactly the epoch
    changes of the (identical) log."""
    assignment = c.zk_assignment(topic)
    for p, data in logs.items():
        want = format_epoch_checkpoint(epochs_from_batches(parse_batches(data)))
        seen = {}

        def ok(p=p):
            for r in assignment[p]:
                seen[r] = read_epoch_checkpoint(c.brokers[r], topic, p)
            return all(v == want for v in seen.values())

        try:
            wait_until(ok, WAIT, f"{topic}-{p}: leader-epoch-checkpoint on every replica", interval=0.2)
        except TimeoutError as e:
            raise AssertionError(f"{e}\n  want {want!r}\n  have {seen}") from None


def test_replica_logs_agree(cluster_factory):
    c = cluster_factory(3)
    topic = uniq("agree")
    parts = 3
    create_topic(c, topic, parts, 3)
    wait_full_isr(c, topic, "fresh topic")

    acked, failed = produce_sync(c.bootstrap(), topic, range(0, 1500))
    assert not failed, failed
    more, failed = produce_sync(c.bootstrap(), topic, range(1500, 3000), conf={"compression.type": "lz4"})
    assert not failed, failed
    acked.update(more)

    logs = wait_replicas_identical(c, topic, range(parts), first_only=True)
    for p, data in logs.items():
        bs = parse_batches(data)
        assert bs[0]["base_offset"] == 0 and all(b["epoch"] == 0 for b in bs), epochs_from_batches(bs)
    check_epoch_checkpoints(c, topic, logs)
    for p in range(parts):
        assert read_epoch_checkpoint(c.brokers[c.zk_assignment(topic)[p][0]], topic, p) == "0\n1\n0 0\n"

    # a controlled shutdown moves leaders (new epoch), writes go on, the broker returns
    victim = c.partition_state(topic, 0)["leader"]
    assert c.brokers[victim].stop(timeout=60) == 0
    wait_until(lambda: all(s["leader"] != victim for s in c.partition_states(topic).values()), WAIT,
               f"leaders moved off broker {victim}", interval=0.1)
    more, failed = produce_sync(c.bootstrap(), topic, range(3000, 4500))
    assert not failed, {v: e.name() for v, e in failed.items()}
    acked.update(more)
    restart(c, victim)
    wait_full_isr(c, topic, f"broker {victim} restarted")
    # a last write in the current epochs, so every replica has seen every epoch in a batch
    more, failed = produce_sync(c.bootstrap(), topic, range(4500, 4800))
    assert not failed, failed
    acked.update(more)

    logs = wait_replicas_identical(c, topic, range(parts), first_only=True)
    epochs0 = epochs_from_batches(parse_batches(logs[0]))
    assert len(epochs0) >= 2 and epochs0[0] == (0, 0), f"{topic}-0 epochs after its leader stopped: {epochs0}"
    check_epoch_checkpoints(c, topic, logs)

    marks, recs = read_partitions(c.bootstrap(), topic, range(parts))
    check_log(topic, marks, recs, acked)
    for p, data in logs.items():
        assert parse_batches(data)[-1]["last_offset"] + 1 == marks[p][1]


# ---------------------------------------------------------------------------
# 5. __consumer_offsets replicates: committed offsets survive the coordinator
# ---------------------------------------------------------------------------

def test_consumer_offsets_survive_coordinator_kill(cluster_factory):
    c = cluster_factory(3, overrides={"offsets.topic.replication.factor": "3"})
    topic = uniq("offs")
    parts = 3
    create_topic(c, topic, parts, 3)
    wait_full_isr(c, topic, "fresh topic")
    group = uniq("grp")
    cp = offsets_partition_for(group)

    first, failed = produce_sync(c.bootstrap(), topic, range(0, 300))
    assert not failed, failed

    conf = {"bootstrap.servers": c.bootstrap(), "group.id": group, "auto.offset.reset": "earliest",
            "enable.auto.commit": False, "session.timeout.ms": 10000, "log_level": 2}
    cons = Consumer(conf)
    got = {}
    try:
        cons.subscribe([topic])

        def drained():
            m = cons.poll(0.5)
            if m is not None and m.error() is None:
                got[int(m.value().decode())] = (m.partition(), m.offset())
            return len(got) == len(first)

        wait_until(drained, WAIT, f"{len(first)} records via the group", interval=0)
        assert got == first
        committed = cons.commit(asynchronous=False)
        assert all(tp.error is None for tp in committed), committed
        want = {tp.partition: tp.offset for tp in committed}
        assert want == {p: 1 + max(o for (pp, o) in first.values() if pp == p)
                        for p in {pp for pp, _ in first.values()}}, want
    finally:
        cons.close()

    # the offsets topic: RF 3 everywhere; the group's partition fully replicated
    assignment = c.zk_assignment("__consumer_offsets")
    assert len(assignment) == 50 and all(len(r) == 3 for r in assignment.values()), assignment
    wait_isr(c, "__consumer_offsets", cp, assignment[cp], "before killing the coordinator")
    coord = c.partition_state("__consumer_offsets", cp)["leader"]
    admin = c.admin(coord)  # keep the handle alive until the future resolves
    d = admin.describe_consumer_groups([group])[group].result(timeout=WAIT)
    assert d.coordinator.id == coord, f"coordinator {d.coordinator.id}, leader of __consumer_offsets-{cp} {coord}"

    second, failed = produce_sync(c.bootstrap(), topic, range(300, 600))
    assert not failed, failed

    before = c.partition_state("__consumer_offsets", cp)
    c.brokers[coord].kill()
    s = wait_until(lambda: (lambda s: s if s["leader"] in c.live_ids() else None)(
        c.partition_state("__consumer_offsets", cp)), c.failover_timeout + WAIT,
        f"a new leader for __consumer_offsets-{cp}", interval=0.1)
    wait_dead_handled(c, topic, [coord], "coordinator killed")
    # the election is a real one: a new epoch, a leader from the old ISR
    assert s["leader_epoch"] > before["leader_epoch"], f"__consumer_offsets-{cp}: {before} -> {s}"
    assert s["leader"] in before["isr"], f"__consumer_offsets-{cp}: leader {s['leader']} not in old ISR {before}"
    # and the group follows it: FindCoordinator (via DescribeGroups) names the new leader
    survivor = c.live_ids()[0]
    admin2 = c.admin(survivor)

    def coordinator():
        try:
            return admin2.describe_consumer_groups([group])[group].result(timeout=10).coordinator.id
        except Exception:  # noqa: BLE001 - COORDINATOR_LOAD_IN_PROGRESS / NOT_COORDINATOR while it moves
            return None

    new_coord = wait_until(lambda: (lambda x: x if x is not None and x != coord else None)(coordinator()),
                           WAIT, f"the coordinator of {group} to move off broker {coord}", interval=0.5)
    assert new_coord == c.partition_state("__consumer_offsets", cp)["leader"], (
        f"coordinator {new_coord}, leader of __consumer_offsets-{cp} {c.partition_state('__consumer_offsets', cp)}")

    cons = Consumer(dict(conf, **{"bootstrap.servers": c.bootstrap()}))
    got = {}
    extra = []
    try:
        tps = [TopicPartition(topic, p) for p in range(parts)]
        # the new coordinator serves the committed offsets
        have = wait_until(lambda: {tp.partition: tp.offset for tp in cons.committed(tps, timeout=10)
                                   if tp.error is None and tp.offset >= 0} or None,
                          WAIT, "committed offsets from the new coordinator", interval=0.5)
        assert have == want, f"committed offsets after failover {have}, committed before {want}"
        cons.subscribe([topic])

        def drained():
            m = cons.poll(0.5)
            if m is not None and m.error() is None:
                v = int(m.value().decode())
                if v in second:
                    got[v] = (m.partition(), m.offset())
                else:
                    extra.append((v, m.partition(), m.offset()))
            return len(got) == len(second)

        wait_until(drained, WAIT, f"{len(second)} new records via the group after failover", interval=0)
    finally:
        cons.close()
    assert not extra, f"re-delivered after failover (already committed): {extra[:10]} ({len(extra)} in all)"
    assert got == second
