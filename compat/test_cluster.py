"""Multi-broker gregor in ZooKeeper mode: real ZooKeeper, real broker processes, real clients.

Every test gets its own ZooKeeper chroot and its own brokers (ids 1..3, free ports,
temp dirs, zookeeper.session.timeout.ms=6000).  ZooKeeper is read and written with
kazoo, as Kafka's own tools would.  Waits poll ZooKeeper or Metadata; nothing sleeps
and hopes, and no test asserts on timing.

Data is not replicated yet, so nothing here reads data after a leader change.
"""
from __future__ import annotations

import json
import re
import tempfile
import shutil
import uuid

import pytest

try:
    import kazoo  # noqa: F401
except ImportError as e:  # fail loudly: a skipped cluster suite would look green
    raise ImportError("compat/test_cluster.py needs kazoo: .venv/bin/pip install kazoo") from e
ck = pytest.importorskip("confluent_kafka")
from confluent_kafka import Consumer, KafkaException, Producer, TopicCollection, TopicPartition  # noqa: E402
from confluent_kafka.admin import NewTopic  # noqa: E402

from cluster_harness import (  # noqa: E402
    Cluster, kcat_list, predicted_assignment, run_broker_expect_failure, strip_ansi)
from gregor_fixtures import _failed, _register  # noqa: E402
from gregor_harness import wait_until  # noqa: E402

WAIT = 60


# ---------------------------------------------------------------------------
# fixtures
# ---------------------------------------------------------------------------

@pytest.fixture
def cluster_factory(request, zookeeper):
    clusters = []

    def make(n: int = 3, **kw) -> Cluster:
        c = Cluster(zookeeper, n, on_new_broker=lambda b: _register(request, b), **kw)
        clusters.append(c)
        c.start()
        return c

    yield make
    failed = _failed(request)
    for c in clusters:
        c.cleanup(keep=failed)


@pytest.fixture
def cluster(cluster_factory) -> Cluster:
    return cluster_factory(3)


def uniq(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------

def create_topic(c: Cluster, via: int, name: str, partitions: int, rf: int, **kw) -> None:
    a = c.admin(via)  # keep the handle alive until the future resolves
    fs = a.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=rf, **kw)],
                         operation_timeout=30)
    fs[name].result(timeout=WAIT)


def md_view(md, topic: str):
    """{partition: (leader, replicas, isr)} of one topic in a confluent ClusterMetadata."""
    t = md.topics.get(topic)
    if t is None or t.error is not None:
        return None
    return {p: (pm.leader, list(pm.replicas), list(pm.isrs)) for p, pm in t.partitions.items()}


def wait_metadata(c: Cluster, broker_id: int, topic: str, want, what: str, timeout: float = WAIT):
    """Poll Metadata (bootstrapped at `broker_id`) until md_view(topic) == want."""
    seen = {}

    def ok():
        v = md_view(c.metadata(broker_id, topic), topic)
        seen["last"] = v
        return v == want

    try:
        wait_until(ok, timeout, what, interval=0.2)
    except TimeoutError as e:
        raise AssertionError(f"{e}\n  want {want}\n  last {seen.get('last')}") from None


def expected_view(assignment, leaders=None, isrs=None):
    leaders = leaders or {}
    isrs = isrs or {}
    return {p: (leaders.get(p, r[0]), list(r), list(isrs.get(p, r))) for p, r in assignment.items()}


def assert_fresh_states(c: Cluster, topic: str, partitions: int):
    """A new topic on a full cluster: leader = first replica, ISR = replicas, leader epoch 0."""
    states = c.wait_topic_online(topic, partitions)
    for p, r in c.zk_assignment(topic).items():
        s = states[p]
        assert (s["leader"], s["isr"], s["leader_epoch"]) == (r[0], r, 0), f"{topic}-{p}: {s}, replicas {r}"


def elect(replicas, isr, live):
    """Kafka's offline-partition rule: first replica in assignment order that is live and in the ISR."""
    for r in replicas:
        if r in live and r in isr:
            return r
    return -1


# ---------------------------------------------------------------------------
# 1. registration
# ---------------------------------------------------------------------------

V5_KEYS = {"features", "listener_security_protocol_map", "endpoints", "jmx_port", "port", "host",
           "version", "timestamp"}


def test_registration_znodes(cluster: Cluster):
    c = cluster
    assert c.registered_ids() == [1, 2, 3]
    for i in (1, 2, 3):
        b = c.brokers[i]
        reg = c.get_json(f"/brokers/ids/{i}")
        assert set(reg) == V5_KEYS, f"broker {i}: keys {sorted(reg)}"
        assert reg["version"] == 5 and type(reg["version"]) is int
        assert reg["host"] == "127.0.0.1"
        assert reg["port"] == b.port and type(reg["port"]) is int
        assert reg["endpoints"] == [f"PLAINTEXT://127.0.0.1:{b.port}"]
        assert reg["listener_security_protocol_map"] == {"PLAINTEXT": "PLAINTEXT"}
        assert reg["jmx_port"] == -1 and type(reg["jmx_port"]) is int
        assert reg["features"] == {}
        assert isinstance(reg["timestamp"], str) and re.fullmatch(r"[0-9]+", reg["timestamp"]), reg["timestamp"]
        stat = c.kz.exists(f"/brokers/ids/{i}")
        assert stat.ephemeralOwner != 0, f"/brokers/ids/{i} is not ephemeral"

    cid = c.get_json("/cluster/id")
    assert cid["version"] == "1"
    assert re.fullmatch(r"[A-Za-z0-9_-]{22}", cid["id"]), cid

    ctl = c.get_json("/controller")
    assert set(ctl) == {"version", "brokerid", "timestamp", "kraftControllerEpoch"}, ctl
    assert ctl["version"] == 2 and ctl["kraftControllerEpoch"] == -1
    assert ctl["brokerid"] in (1, 2, 3)
    assert isinstance(ctl["timestamp"], str) and ctl["timestamp"].isdigit()
    assert c.kz.exists("/controller").ephemeralOwner != 0, "/controller is not ephemeral"
    assert c.controller_epoch() >= 1

    # every broker reports the same cluster: 3 brokers, the controller from ZooKeeper, the cluster id
    for i in (1, 2, 3):
        def agrees(i=i):
            md = c.metadata(i)
            return (sorted(md.brokers) == [1, 2, 3] and md.controller_id == ctl["brokerid"]
                    and md.cluster_id == cid["id"])
        wait_until(agrees, WAIT, f"Metadata from broker {i} to show brokers [1,2,3], controller, cluster id",
                   interval=0.2)
        md = c.metadata(i)
        for bid, bm in md.brokers.items():
            assert (bm.host, bm.port) == ("127.0.0.1", c.brokers[bid].port)


# Kafka's KafkaZkClient.createTopLevelPaths: every broker creates these at startup
PERSISTENT_PATHS = ["/consumers", "/brokers/ids", "/brokers/topics", "/config/changes", "/admin/delete_topics",
                    "/brokers/seqid", "/isr_change_notification", "/latest_producer_id_block",
                    "/log_dir_event_notification", "/config/topics", "/config/clients", "/config/users",
                    "/config/brokers", "/config/ips"]


def test_persistent_paths_created_at_startup(cluster: Cluster):
    missing = [p for p in PERSISTENT_PATHS if not cluster.exists(p)]
    assert not missing, f"persistent znodes Kafka creates at startup are missing: {missing}"


# ---------------------------------------------------------------------------
# 2. CreateTopics through each broker (routed to the controller)
# ---------------------------------------------------------------------------

def test_create_topics_through_each_broker(cluster: Cluster):
    c = cluster
    names = {}
    for i in (1, 2, 3):
        names[i] = uniq(f"via{i}")
        create_topic(c, i, names[i], 4, 2)
    for i, name in names.items():
        a = c.zk_assignment(name)
        assert a == predicted_assignment([1, 2, 3], 4, 2), f"{name}: {a}"
        c.wait_topic_online(name, 4)

    def kcat_agrees(i):
        md = kcat_list(c.brokers[i].bootstrap)
        brokers = sorted(b["id"] for b in md["brokers"])
        topics = {t["topic"]: t for t in md["topics"]}
        if brokers != [1, 2, 3] or not set(names.values()) <= set(topics):
            return None
        for n in names.values():
            parts = topics[n]["partitions"]
            if len(parts) != 4 or any(p["leader"] < 1 for p in parts):
                return None
        return md

    for i in (1, 2, 3):
        md = wait_until(lambda i=i: kcat_agrees(i), WAIT, f"kcat -L at broker {i} to list 3 brokers and the topics",
                        interval=0.2)
        assert md["originating_broker"]["id"] == i


# ---------------------------------------------------------------------------
# 3. assignment formula
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("partitions,rf", [(13, 2), (13, 3), (19, 2), (19, 3)])
def test_assignment_formula(cluster: Cluster, partitions, rf):
    c = cluster
    name = uniq(f"assign-{partitions}-{rf}")
    create_topic(c, c.controller(), name, partitions, rf)
    want = predicted_assignment([1, 2, 3], partitions, rf)

    znode = c.topic_znode(name)
    assert znode["version"] == 3
    assert znode["adding_replicas"] == {} and znode["removing_replicas"] == {}
    assert re.fullmatch(r"[A-Za-z0-9_-]{22}", znode["topic_id"]), znode
    assert {int(p): r for p, r in znode["partitions"].items()} == want

    states = c.wait_topic_online(name, partitions)
    for p, r in want.items():
        s = states[p]
        assert (s["leader"], s["isr"]) == (r[0], r), f"partition {p}: state {s}, replicas {r}"
        assert s["version"] == 1 and s["leader_epoch"] == 0
        assert s["controller_epoch"] == c.controller_epoch()

    expected = expected_view(want)
    for i in (1, 2, 3):
        wait_metadata(c, i, name, expected, f"Metadata from broker {i} for {name}")


def test_replication_factor_above_live_brokers(cluster: Cluster):
    c = cluster
    name = uniq("rf4")
    a = c.admin(1)
    fs = a.create_topics([NewTopic(name, num_partitions=1, replication_factor=4)], operation_timeout=30)
    with pytest.raises(KafkaException) as ei:
        fs[name].result(timeout=WAIT)
    assert ei.value.args[0].code() == ck.KafkaError.INVALID_REPLICATION_FACTOR
    assert not c.exists(f"/brokers/topics/{name}")


def test_manual_assignment_is_honoured(cluster: Cluster):
    c = cluster
    name = uniq("manual")
    a = c.admin(2)
    # confluent-kafka wants num_partitions = len(replica_assignment) (its "default" is 1);
    # Kafka requires the same number of replicas for every partition
    fs = a.create_topics([NewTopic(name, num_partitions=3, replica_assignment=[[3, 1], [2, 3], [1, 2]])],
                         operation_timeout=30)
    fs[name].result(timeout=WAIT)
    want = {0: [3, 1], 1: [2, 3], 2: [1, 2]}
    assert c.zk_assignment(name) == want
    c.wait_topic_online(name, 3)
    for i in (1, 2, 3):
        wait_metadata(c, i, name, expected_view(want), f"Metadata from broker {i} for {name}")


# ---------------------------------------------------------------------------
# 4./5. broker failure
# ---------------------------------------------------------------------------

def test_kill_controller_elects_new_controller_and_leaders(cluster: Cluster):
    c = cluster
    t3, t2 = uniq("fo3"), uniq("fo2")
    create_topic(c, c.controller(), t3, 6, 3)
    create_topic(c, c.controller(), t2, 6, 2)
    for t in (t3, t2):
        assert_fresh_states(c, t, 6)
    old_ctl, old_epoch = c.controller(), c.controller_epoch()
    survivors = [i for i in (1, 2, 3) if i != old_ctl]

    c.brokers[old_ctl].kill()
    new_ctl = c.wait_controller(among=survivors)
    assert new_ctl != old_ctl
    wait_until(lambda: c.controller_epoch() > old_epoch, c.failover_timeout, "/controller_epoch to increase",
               interval=0.1)
    for t in (t3, t2):
        _failover_dead(c, old_ctl, t)
    for i in survivors:
        wait_until(lambda i=i: c.metadata(i).controller_id == new_ctl, WAIT,
                   f"Metadata from broker {i} to name controller {new_ctl}", interval=0.2)

    # restart the old controller: it rejoins and every broker lists 3 brokers again
    b = c.brokers[old_ctl]
    b._fixed_port = True
    b.start()
    c.wait_registered([1, 2, 3])
    assert c.controller() == new_ctl, "a restarted broker must not take /controller from a live controller"
    for i in (1, 2, 3):
        def three(i=i):
            md = kcat_list(c.brokers[i].bootstrap)
            return sorted(x["id"] for x in md["brokers"]) == [1, 2, 3] and md["controllerid"] == new_ctl
        wait_until(three, WAIT, f"kcat -L at broker {i} to list 3 brokers and controller {new_ctl}", interval=0.2)


def _failover_dead(c: Cluster, victim: int, topic: str):
    """After `victim` died: wait until every partition of `topic` dropped it from its ISR and the
    partitions it led have the leader Kafka's rule picks (first live replica in assignment order
    that is in the ISR), with a bumped leader epoch; then until every survivor's Metadata agrees.
    Before the kill every ISR was the full replica list (assert_fresh_states)."""
    assignment = c.zk_assignment(topic)
    survivors = [i for i in sorted(c.brokers) if i != victim]

    def converged():
        st = c.partition_states(topic)
        for p, r in assignment.items():
            s = st[p]
            want_isr = [x for x in r if x != victim]
            want_leader = elect(r, want_isr, survivors)
            if s["leader"] != want_leader or sorted(s["isr"]) != sorted(want_isr):
                return None
            if victim in r and s["leader_epoch"] < 1:
                return None
        return st

    try:
        after = wait_until(converged, c.failover_timeout,
                           f"partitions of {topic} to drop broker {victim} from ISRs and re-elect leaders",
                           interval=0.1)
    except TimeoutError as e:
        raise AssertionError(f"{e}\n  assignment: {assignment}\n  now: {c.partition_states(topic)}") from None
    c.wait_registered(survivors)
    want = {p: (after[p]["leader"], assignment[p], sorted(after[p]["isr"])) for p in assignment}
    for i in survivors:
        def agrees(i=i):
            v = md_view(c.metadata(i, topic), topic)
            return v is not None and {p: (l, r, sorted(isr)) for p, (l, r, isr) in v.items()} == want
        try:
            wait_until(agrees, WAIT, f"Metadata from broker {i} for {topic} to match ZooKeeper", interval=0.2)
        except TimeoutError as e:
            raise AssertionError(f"{e}\n  want {want}\n  got  {md_view(c.metadata(i, topic), topic)}") from None
    return after


def test_kill_non_controller_moves_its_leaders(cluster: Cluster):
    c = cluster
    ctl, epoch = c.controller(), c.controller_epoch()
    victim = next(i for i in (3, 2, 1) if i != ctl)
    t3, t2 = uniq("nc3"), uniq("nc2")
    create_topic(c, ctl, t3, 6, 3)
    create_topic(c, ctl, t2, 7, 2)
    assert_fresh_states(c, t3, 6)
    assert_fresh_states(c, t2, 7)
    c.brokers[victim].kill()
    for t in (t3, t2):
        _failover_dead(c, victim, t)
    assert c.controller() == ctl and c.controller_epoch() == epoch, "losing a non-controller moved /controller"


# ---------------------------------------------------------------------------
# 6. topic written into ZooKeeper by hand
# ---------------------------------------------------------------------------

def test_topic_written_to_zookeeper_by_hand(cluster: Cluster):
    c = cluster
    name = uniq("handmade")
    assignment = {0: [1, 2], 1: [2, 3], 2: [3, 1], 3: [2]}
    # makepath: /brokers/topics itself is covered by test_persistent_paths_created_at_startup
    c.kz.create(f"/brokers/topics/{name}",
                json.dumps({"version": 1, "partitions": {str(p): r for p, r in assignment.items()}}).encode(),
                makepath=True)
    states = c.wait_topic_online(name, 4)
    for p, r in assignment.items():
        assert (states[p]["leader"], states[p]["isr"]) == (r[0], r), (p, states[p])
    ids = set()
    for i in (1, 2, 3):
        wait_metadata(c, i, name, expected_view(assignment), f"Metadata from broker {i} for hand-made {name}")
        a = c.admin(i)
        d = a.describe_topics(TopicCollection([name]))[name].result(timeout=WAIT)
        ids.add(str(d.topic_id))
        assert d.topic_id is not None and str(d.topic_id) != "AAAAAAAAAAAAAAAAAAAAAA", \
            f"broker {i}: topic id {d.topic_id}"
    assert len(ids) == 1, f"brokers disagree on the topic id of {name}: {ids}"


# ---------------------------------------------------------------------------
# 7. DeleteTopics
# ---------------------------------------------------------------------------

def _wait_topic_gone(c: Cluster, name: str):
    wait_until(lambda: not c.exists(f"/brokers/topics/{name}"), WAIT, f"/brokers/topics/{name} to go",
               interval=0.1)
    wait_until(lambda: not c.exists(f"/config/topics/{name}"), WAIT, f"/config/topics/{name} to go",
               interval=0.1)
    wait_until(lambda: not c.exists(f"/admin/delete_topics/{name}"), WAIT, f"/admin/delete_topics/{name} to go",
               interval=0.1)
    for i in (1, 2, 3):
        # list all topics: a Metadata request naming the topic could auto-create it again
        wait_until(lambda i=i: name not in c.metadata(i).topics, WAIT,
                   f"Metadata from broker {i} to stop listing {name}", interval=0.2)


def test_delete_topics_through_admin_client(cluster: Cluster):
    c = cluster
    non_ctl = next(i for i in (1, 2, 3) if i != c.controller())
    name = uniq("del")
    create_topic(c, non_ctl, name, 5, 2, config={"retention.ms": "3600000"})
    c.wait_topic_online(name, 5)
    assert c.get_json(f"/config/topics/{name}") == {"version": 1, "config": {"retention.ms": "3600000"}}
    for i in (1, 2, 3):
        wait_until(lambda i=i: name in c.metadata(i).topics, WAIT, f"broker {i} to list {name}", interval=0.2)

    a = c.admin(non_ctl)
    fs = a.delete_topics([name], operation_timeout=30)
    fs[name].result(timeout=WAIT)
    _wait_topic_gone(c, name)


def test_delete_topic_by_admin_znode(cluster: Cluster):
    c = cluster
    name = uniq("zkdel")
    create_topic(c, c.controller(), name, 3, 3)
    c.wait_topic_online(name, 3)
    c.kz.ensure_path("/admin/delete_topics")
    c.kz.create(f"/admin/delete_topics/{name}", b"")
    _wait_topic_gone(c, name)


# ---------------------------------------------------------------------------
# 8. duplicate broker id
# ---------------------------------------------------------------------------

def test_duplicate_broker_id_fails_to_start(cluster: Cluster):
    c = cluster
    reg_before = c.kz.get("/brokers/ids/1")
    work = tempfile.mkdtemp(prefix="gregor-dup-")
    try:
        r = run_broker_expect_failure(1, c.zookeeper_connect, c.session_timeout_ms, work,
                                      timeout=c.session_timeout_ms / 1000 + 60)
        out = strip_ansi((r.stdout + r.stderr).decode(errors="replace"))
        assert r.returncode != 0, f"second broker.id=1 exited 0:\n{out[-3000:]}"
        assert "node already exists" in out.lower(), out[-3000:]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    # the live broker 1 is untouched
    assert c.brokers[1].alive()
    data, stat = c.kz.get("/brokers/ids/1")
    assert data == reg_before[0] and stat.czxid == reg_before[1].czxid
    assert c.registered_ids() == [1, 2, 3]


# ---------------------------------------------------------------------------
# 9. produce/consume through a non-leader bootstrap
# ---------------------------------------------------------------------------

def _produce_everywhere(c: Cluster, via: int, topic: str, partitions: int, per_partition: int):
    p = Producer({"bootstrap.servers": c.brokers[via].bootstrap, "linger.ms": 5, "acks": "all"})
    errors, acked = [], []

    def cb(err, msg):
        (errors if err is not None else acked).append(err or (msg.partition(), msg.key(), msg.value()))

    sent = set()
    for part in range(partitions):
        for n in range(per_partition):
            k, v = f"k{part}-{n}".encode(), f"v{part}-{n}".encode()
            p.produce(topic, key=k, value=v, partition=part, on_delivery=cb)
            sent.add((part, k, v))
            p.poll(0)
    assert p.flush(WAIT) == 0
    assert not errors, errors[:5]
    assert set(acked) == sent
    return sent


def test_produce_consume_through_non_leader(cluster: Cluster):
    c = cluster
    name = uniq("spread")
    create_topic(c, c.controller(), name, 6, 1)
    want = predicted_assignment([1, 2, 3], 6, 1)
    assert c.zk_assignment(name) == want
    c.wait_topic_online(name, 6)
    for i in (1, 2, 3):
        wait_metadata(c, i, name, expected_view(want), f"Metadata from broker {i} for {name}")

    sent = _produce_everywhere(c, 2, name, 6, 25)

    # assign() from a client bootstrapped at broker 3 only
    cons = Consumer({"bootstrap.servers": c.brokers[3].bootstrap, "group.id": uniq("assign"),
                     "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    got = set()
    try:
        cons.assign([TopicPartition(name, p, ck.OFFSET_BEGINNING) for p in range(6)])

        def drained():
            m = cons.poll(0.5)
            if m is not None and m.error() is None:
                got.add((m.partition(), m.key(), m.value()))
            return got == sent

        wait_until(drained, WAIT, f"{len(sent)} records back via assign()", interval=0)
    finally:
        cons.close()
    assert got == sent


def test_consumer_group_across_brokers(cluster: Cluster):
    c = cluster
    name = uniq("grp")
    create_topic(c, c.controller(), name, 6, 1)
    c.wait_topic_online(name, 6)
    for i in (1, 2, 3):
        wait_metadata(c, i, name, expected_view(predicted_assignment([1, 2, 3], 6, 1)),
                      f"Metadata from broker {i} for {name}")
    sent = _produce_everywhere(c, 1, name, 6, 20)

    group = uniq("g")
    cons = Consumer({"bootstrap.servers": c.brokers[2].bootstrap, "group.id": group,
                     "auto.offset.reset": "earliest", "session.timeout.ms": 10000})
    got = set()
    try:
        cons.subscribe([name])

        def drained():
            m = cons.poll(0.5)
            if m is not None and m.error() is None:
                got.add((m.partition(), m.key(), m.value()))
            return got == sent

        wait_until(drained, WAIT, f"{len(sent)} records back via subscribe()", interval=0)
        # while it is a member, the group shows up under /consumers/<group>/ids
        wait_until(lambda: c.exists(f"/consumers/{group}/ids") and c.kz.get_children(f"/consumers/{group}/ids"),
                   WAIT, f"/consumers/{group}/ids to list the member", interval=0.2)
        committed = cons.commit(asynchronous=False)
    finally:
        cons.close()
    assert got == sent
    assert all(tp.error is None for tp in committed), committed
    assert {tp.partition: tp.offset for tp in committed} == {p: 20 for p in range(6)}, committed
    # the coordinator kept them: a new member of the group, on another broker, reads them back
    fresh = Consumer({"bootstrap.servers": c.brokers[3].bootstrap, "group.id": group})
    try:
        back = fresh.committed([TopicPartition(name, p) for p in range(6)], timeout=WAIT)
    finally:
        fresh.close()
    assert all(tp.error is None for tp in back), back
    assert {tp.partition: tp.offset for tp in back} == {p: 20 for p in range(6)}, back


# -- a new topic is answered whole or not at all --------------------------------

def test_new_topic_never_answered_with_some_of_its_partitions(cluster):
    """While topics are created on the controller, every broker's Metadata answers each one
    either with an error (not yet known) or with all its partitions, never with error 0 and
    fewer: librdkafka takes such an answer as the partition count and fails messages for the
    missing partitions with _UNKNOWN_PARTITION. Two controller propagations (the CreateTopics
    request's and a watch pass's) that queued their UpdateMetadata in the opposite order from
    the one they diffed in used to hand non-controllers one partition of a new topic first."""
    import sys
    import threading
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "protocol-tests"))
    import kproto

    parts, rounds = 6, 12
    partial, errors = [], []

    def hammer(b, topic, stop):
        try:
            with kproto.Conn(b.host, b.port, timeout=10) as conn:
                while not stop.is_set():
                    t = kproto.metadata(conn, [topic], version=9)["topics"][0]
                    if t["error_code"] == 0 and len(t["partitions"]) != parts:
                        partial.append((topic, b.broker_id, sorted(p["partition_index"] for p in t["partitions"])))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    admin = cluster.admin(cluster.controller())
    for _ in range(rounds):
        topic = f"whole-{uuid.uuid4().hex[:8]}"
        stop = threading.Event()
        threads = [threading.Thread(target=hammer, args=(b, topic, stop), daemon=True) for b in cluster.live()]
        for t in threads:
            t.start()
        try:
            fs = admin.create_topics([NewTopic(topic, num_partitions=parts, replication_factor=3)],
                                     operation_timeout=30)
            fs[topic].result(timeout=60)

            def whole_everywhere():
                for b in cluster.live():
                    with kproto.Conn(b.host, b.port, timeout=10) as conn:
                        t = kproto.metadata(conn, [topic], version=9)["topics"][0]
                        if t["error_code"] != 0 or len(t["partitions"]) != parts:
                            return False
                return True

            wait_until(whole_everywhere, 30, f"every broker to answer all {parts} partitions of {topic}",
                       interval=0.05)
        finally:
            stop.set()
            for t in threads:
                t.join(timeout=20)
        assert not errors, errors[:3]
        assert not partial, partial[:5]
