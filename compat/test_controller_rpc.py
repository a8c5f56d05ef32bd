"""Inter-broker (ZooKeeper-mode controller) RPCs against real gregor brokers: fencing.

One real ZooKeeper, one 3-broker cluster for the whole module (cluster_harness.Cluster), and
hand-built LeaderAndIsr / StopReplica / UpdateMetadata / ControlledShutdown / AlterPartition
frames (inter_broker_frames.py) sent as a stale or impostor controller/broker would.  Each test
checks the answer and then that nothing changed: ZooKeeper's partition state (read with kazoo),
Metadata from the broker concerned, a produce + fetch round trip on the partition, its log dir.
Waits poll a condition with a deadline (gregor_harness.wait_until); nothing sleeps and hopes.

Produce/Fetch/Metadata frames come from protocol-tests/kproto.py (standard library only).
"""
from __future__ import annotations

import json
import struct
import sys
import uuid
from pathlib import Path

import pytest

try:
    import kazoo  # noqa: F401
except ImportError as e:  # fail loudly: a skipped suite would look green
    raise ImportError("compat/test_controller_rpc.py needs kazoo: .venv/bin/pip install kazoo") from e
from confluent_kafka.admin import NewTopic  # noqa: E402

import inter_broker_frames as ib  # noqa: E402
from cluster_harness import Cluster  # noqa: E402
from gregor_fixtures import _register  # noqa: E402
from gregor_harness import api_versions_probe, wait_until  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "protocol-tests"))
import kproto  # noqa: E402

SESSION_MS = 6000
WAIT = 60
INTER_BROKER_KEYS = {4: (0, 7), 5: (0, 4), 6: (0, 8), 7: (0, 3), 56: (0, 3)}


# ---------------------------------------------------------------------------
# fixtures: one cluster and one topic (3 partitions, replication factor 3) per module
# ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cluster(zookeeper, request):
    c = Cluster(zookeeper, 3, session_timeout_ms=SESSION_MS)
    try:
        c.start()
        yield c
    finally:
        c.cleanup(keep=request.session.testsfailed > 0)


@pytest.fixture(autouse=True)
def _attach_cluster_logs(request):
    """Attach the module cluster's broker logs to a failed test's report (gregor_fixtures hook)."""
    if "cluster" in request.fixturenames:
        for b in request.getfixturevalue("cluster").brokers.values():
            _register(request, b)
    yield


def create_topic(c: Cluster, name: str, partitions: int = 3, rf: int = 3) -> None:
    a = c.admin(1)
    a.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=rf)])[name].result(timeout=WAIT)
    c.wait_topic_online(name, partitions, timeout=WAIT)
    wait_until(lambda: all(sorted(s["isr"]) == [1, 2, 3] for s in c.partition_states(name).values()), WAIT,
               f"every partition of {name} with ISR [1, 2, 3]", interval=0.1)
    # every broker has been told (its Metadata shows the leaders ZooKeeper has), so each has taken a
    # controller request of the current controller epoch
    want = {p: s["leader"] for p, s in c.partition_states(name).items()}
    for i in (1, 2, 3):
        wait_until(lambda i=i: {p: v[0] for p, v in metadata(c, i, name)["partitions"].items()} == want, WAIT,
                   f"broker {i}'s Metadata to show the leaders {want} of {name}", interval=0.1)
    # A broker's Metadata can name it leader a moment before it has taken the LeaderAndIsr that
    # makes it one (NOT_LEADER_OR_FOLLOWER meanwhile): wait until each leader takes an acks=all
    # produce, which also means every ISR member replicates.
    for p, leader in want.items():
        wait_until(lambda p=p, leader=leader: produce_fetch(c, leader, name, p, b"ready", produce_timeout_ms=3000) >= 0,
                   45, f"{name}-{p}: its leader {leader} to take an acks=all produce", interval=0.2)


@pytest.fixture(scope="module")
def topic(cluster):
    name = f"ctlrpc-{uuid.uuid4().hex[:8]}"
    create_topic(cluster, name)
    return name


# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------

def addr(c: Cluster, i: int):
    return c.brokers[i].host, c.brokers[i].port


def state(c: Cluster, topic: str, p: int):
    """(state znode json, its version = the partition epoch)."""
    data, stat = c.kz.get(f"/brokers/topics/{topic}/partitions/{p}/state")
    return json.loads(data.decode()), stat.version


def czxid(c: Cluster, i: int) -> int:
    return c.kz.exists(f"/brokers/ids/{i}").czxid


def topic_id(c: Cluster, topic: str) -> bytes:
    return ib.topic_id_from_kafka(c.topic_znode(topic)["topic_id"])


def metadata(c: Cluster, i: int, topic: str) -> dict:
    """Metadata v9 from broker i: brokers {id: (host, port)}, controller id, partitions
    {p: (leader, leader_epoch, replicas, isr)} of `topic`."""
    with kproto.Conn(*addr(c, i), timeout=10) as conn:
        md = kproto.decode_metadata(conn.call(kproto.METADATA, 9, kproto.metadata_request(9, [topic])), 9)
    t = next(t for t in md["topics"] if t["name"] == topic)
    assert t["error_code"] == 0, f"Metadata from broker {i}: {topic} error {t['error_code']}"
    return {"brokers": {b["node_id"]: (b["host"], b["port"]) for b in md["brokers"]},
            "controller": md["controller_id"],
            "partitions": {p["partition_index"]: (p["leader_id"], p["leader_epoch"], p["replica_nodes"],
                                                  sorted(p["isr_nodes"])) for p in t["partitions"]}}


def produce_fetch(c: Cluster, i: int, topic: str, p: int, value: bytes, produce_timeout_ms: int = 10000) -> int:
    """Produce one record to broker i (acks=all) and fetch it back from broker i; its offset."""
    with kproto.Conn(*addr(c, i), timeout=produce_timeout_ms / 1000 + 10) as conn:
        batch = kproto.build_batch([kproto.Record(value=value)])
        req = kproto.produce_request(8, {topic: {p: batch}}, acks=-1, timeout_ms=produce_timeout_ms)
        r = kproto.decode_produce(conn.call(kproto.PRODUCE, 8, req), 8)
    pr = r["responses"][0]["partitions"][0]
    assert pr["error_code"] == 0, f"produce to broker {i} {topic}-{p}: error {pr['error_code']}"
    off = pr["base_offset"]
    # acks=all: the record is below the high watermark when the answer comes; poll anyway, briefly
    wait_until(lambda: fetch_values(c, i, topic, p, off)[:1] == [value], 10,
               f"broker {i} {topic}-{p}@{off} to return {value!r} (last {fetch_values(c, i, topic, p, off)[:3]})")
    return off


def fetch_values(c: Cluster, i: int, topic: str, p: int, offset: int = 0) -> list:
    with kproto.Conn(*addr(c, i), timeout=15) as conn:
        f = kproto.decode_fetch(conn.call(kproto.FETCH, 11, kproto.fetch_request(11, {topic: {p: offset}})), 11)
    fp = f["responses"][0]["partitions"][0]
    assert fp["error_code"] == 0, f"fetch from broker {i} {topic}-{p}@{offset}: error {fp['error_code']}"
    return [rec.value for b in kproto.decode_batches(fp["records"]) for rec in b.records]


def snapshot(c: Cluster, topic: str) -> dict:
    """What must not change: ZooKeeper's state of every partition (with version), the
    registrations (with their broker epochs) and the controller."""
    return {"states": {p: state(c, topic, p) for p in c.zk_assignment(topic)},
            "registered": {i: czxid(c, i) for i in c.registered_ids()},
            "controller": (c.controller(), c.controller_epoch())}


def assert_unchanged(c: Cluster, topic: str, before: dict, what: str) -> None:
    after = snapshot(c, topic)
    assert after == before, f"{what} changed cluster state:\n  before {before}\n  after  {after}"
    for i in (1, 2, 3):
        md = metadata(c, i, topic)
        assert sorted(md["brokers"]) == [1, 2, 3], f"{what}: broker {i}'s Metadata lists {md['brokers']}"
        for bid, hp in md["brokers"].items():
            assert hp == addr(c, bid), f"{what}: broker {i}'s Metadata has broker {bid} at {hp}"
        for p, (s, _) in before["states"].items():
            leader, epoch, _, isr = md["partitions"][p]
            assert (leader, epoch, isr) == (s["leader"], s["leader_epoch"], sorted(s["isr"])), (
                f"{what}: broker {i}'s Metadata for {topic}-{p} is leader {leader} epoch {epoch} isr {isr}, "
                f"ZooKeeper says {s}")


def other_replica(s: dict) -> int:
    return next(r for r in sorted(s["isr"]) if r != s["leader"])


def call(c: Cluster, i: int, api_key: int, version: int, body: bytes) -> dict:
    return ib.call(*addr(c, i), api_key, version, body)


# ---------------------------------------------------------------------------
# 0. the encoders themselves, against the Rust codec's golden frames
# ---------------------------------------------------------------------------

def test_frames_match_golden_bytes():
    body = ib.leader_and_isr_request(0, 1, 2, [{"name": "t", "partitions": [ib.partition_state(0, 1, 5, [1], [1], 7, 2)]}],
                                     [(1, "h", 9092)])
    assert body == bytes([0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 1, 0, 1, ord("t"), 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 1,
                          0, 0, 0, 5, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 7, 0, 0, 0, 1, 0, 0, 0, 1,
                          0, 0, 0, 1, 0, 0, 0, 1, 0, 1, ord("h"), 0, 0, 0x23, 0x84])
    assert ib.request_header(4, 3, 0x01020304, "ab") == bytes([0, 4, 0, 3, 1, 2, 3, 4, 0, 2, ord("a"), ord("b")])
    assert ib.request_header(56, 3, 7, None) == bytes([0, 56, 0, 3, 0, 0, 0, 7, 0xFF, 0xFF, 0])
    assert ib.request_header(7, 0, -2) == bytes([0, 7, 0, 0, 0xFF, 0xFF, 0xFF, 0xFE])  # header v0
    assert [ib.request_header_version(7, v) for v in range(4)] == [0, 1, 1, 2]
    assert [ib.request_header_version(4, v) for v in range(8)] == [1, 1, 1, 1, 2, 2, 2, 2]
    assert [ib.request_header_version(5, v) for v in range(5)] == [1, 1, 2, 2, 2]
    assert [ib.request_header_version(6, v) for v in range(9)] == [1] * 6 + [2] * 3
    # UpdateMetadata v8's Type is tagged field 0, written only when not 0
    um = ib.update_metadata_request(8, 1, 2, [], [], request_type=2)
    assert um.endswith(bytes([1, 0, 1, 2])) and ib.update_metadata_request(8, 1, 2, [], []).endswith(b"\x01\x01\x00")


# ---------------------------------------------------------------------------
# 1. ApiVersions
# ---------------------------------------------------------------------------

def test_api_versions_cluster_lists_inter_broker_keys_standalone_none(cluster, broker):
    for i in (1, 2, 3):
        got = api_versions_probe(*addr(cluster, i))
        assert {k: got.get(k) for k in INTER_BROKER_KEYS} == INTER_BROKER_KEYS, f"cluster broker {i}: {got}"
        with kproto.Conn(*addr(cluster, i)) as conn:  # ApiVersions v3 (flexible) agrees
            v3 = conn.api_versions(3)["api_keys"]
        assert {k: v3.get(k) for k in INTER_BROKER_KEYS} == INTER_BROKER_KEYS, f"cluster broker {i} (v3): {v3}"
    standalone = api_versions_probe(broker.host, broker.port)
    assert 3 in standalone and 18 in standalone, standalone
    assert not set(standalone) & set(INTER_BROKER_KEYS), f"standalone broker advertises {sorted(standalone)}"
    # ... and closes the connection on them instead of answering
    for key, version, body in [
        (4, 0, ib.leader_and_isr_request(0, 1, 5, [], [])),
        (6, 8, ib.update_metadata_request(8, 1, 5, [], [])),
        (56, 3, ib.alter_partition_request(3, 1, 5, [])),
    ]:
        with ib.Conn(broker.host, broker.port, timeout=15) as conn:
            conn.send(key, version, body)
            closed, got = ib.wait_closed(conn.sock, 15)
        assert closed and not got, f"standalone broker, key {key} v{version}: closed={closed}, answered {got!r}"
    assert api_versions_probe(broker.host, broker.port)


# ---------------------------------------------------------------------------
# 1b. every replica of a new topic is opened and follows (what the controller's LeaderAndIsr does)
# ---------------------------------------------------------------------------

def test_new_topics_every_replica_opens_and_follows(cluster):
    """Several fresh topics: every replica must take its LeaderAndIsr (no broker logs `cannot open
    partition`), the leader of each partition must take an acks=all produce within a few seconds
    while the ISR stays [1, 2, 3] (so every follower fetched it), and every replica's log dir exists."""
    c = cluster
    problems = []
    for n in range(4):
        t = f"ctlrpc-new{n}-{uuid.uuid4().hex[:6]}"
        a = c.admin(1)
        a.create_topics([NewTopic(t, num_partitions=3, replication_factor=3)])[t].result(timeout=WAIT)
        states = c.wait_topic_online(t, 3, timeout=WAIT)
        for p, s in states.items():
            try:
                wait_until(lambda: produce_fetch(c, s["leader"], t, p, b"x", produce_timeout_ms=2000) >= 0, 15,
                           f"{t}-{p}: leader {s['leader']} to take an acks=all produce", interval=0.2)
            except (TimeoutError, AssertionError) as e:
                problems.append(f"{t}-{p} (leader {s['leader']}, ZooKeeper state {state(c, t, p)}): {e}")
                continue
            now, _ = state(c, t, p)
            if sorted(now["isr"]) != [1, 2, 3]:
                problems.append(f"{t}-{p}: ISR shrank to {now['isr']} right after creation")
            for i in (1, 2, 3):
                if not (Path(c.brokers[i].data_dir) / f"{t}-{p}").is_dir():
                    problems.append(f"{t}-{p}: no log dir on replica {i}")
    for i in (1, 2, 3):
        for n, line in enumerate(c.brokers[i].log_path.read_text(errors="replace").splitlines(), 1):
            if "cannot open partition" in line:
                problems.append(f"broker {i} log line {n}: {line.strip()}")
    assert not problems, "replicas of new topics not serving:\n  " + "\n  ".join(problems)


# ---------------------------------------------------------------------------
# 2-3. LeaderAndIsr
# ---------------------------------------------------------------------------

def impostor_leader_and_isr(c: Cluster, topic: str, p: int, version: int, controller_epoch: int, broker_epoch: int):
    """A LeaderAndIsr naming partition p with another leader, a higher leader epoch and a shrunk ISR."""
    s, ver = state(c, topic, p)
    other = other_replica(s)
    replicas = c.zk_assignment(topic)[p]
    ps = ib.partition_state(p, leader=other, leader_epoch=s["leader_epoch"] + 10, isr=[other], replicas=replicas,
                            partition_epoch=ver + 10, controller_epoch=controller_epoch)
    host, port = addr(c, other)
    body = ib.leader_and_isr_request(version, c.controller(), controller_epoch,
                                     [{"name": topic, "topic_id": topic_id(c, topic), "partitions": [ps]}],
                                     [(other, host, port)], broker_epoch=broker_epoch,
                                     request_type=2 if version >= 5 else 0)
    return s["leader"], body


def expected_partition_key(c: Cluster, topic: str, version: int):
    return topic if version <= 4 else topic_id(c, topic)


@pytest.mark.parametrize("version", [0, 6, 7])
def test_leader_and_isr_stale_controller_epoch(cluster, topic, version):
    c = cluster
    epoch = c.controller_epoch()
    assert epoch >= 1
    before = snapshot(c, topic)
    for p in sorted(before["states"]):  # each broker leads one partition, the controller included
        leader, body = impostor_leader_and_isr(c, topic, p, version, epoch - 1, czxid(c, state(c, topic, p)[0]["leader"]))
        r = call(c, leader, ib.LEADER_AND_ISR, version, body)
        assert r["error_code"] == ib.STALE_CONTROLLER_EPOCH, f"v{version} to broker {leader}: {r}"
        assert r["partitions"] == [(expected_partition_key(c, topic, version), p, ib.STALE_CONTROLLER_EPOCH)], (
            f"v{version} to broker {leader}: {r}")
        produce_fetch(c, leader, topic, p, f"after-stale-lai-v{version}-p{p}".encode())
    assert_unchanged(c, topic, before, f"stale-epoch LeaderAndIsr v{version}")


@pytest.mark.parametrize("version", [6, 7])
def test_leader_and_isr_stale_broker_epoch(cluster, topic, version):
    c = cluster
    epoch = c.controller_epoch()
    before = snapshot(c, topic)
    for p in sorted(before["states"]):
        leader = before["states"][p][0]["leader"]
        _, body = impostor_leader_and_isr(c, topic, p, version, epoch, czxid(c, leader) - 1)
        r = call(c, leader, ib.LEADER_AND_ISR, version, body)
        assert r["error_code"] == ib.STALE_BROKER_EPOCH, f"v{version} to broker {leader}: {r}"
        assert all(e == ib.STALE_BROKER_EPOCH for _, _, e in r["partitions"]), f"v{version} to broker {leader}: {r}"
        produce_fetch(c, leader, topic, p, f"after-stale-broker-epoch-v{version}-p{p}".encode())
    assert_unchanged(c, topic, before, f"stale-broker-epoch LeaderAndIsr v{version}")


# ---------------------------------------------------------------------------
# 4. UpdateMetadata
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("version", [0, 7, 8])
def test_update_metadata_stale_controller_epoch(cluster, topic, version):
    c = cluster
    epoch = c.controller_epoch()
    before = snapshot(c, topic)
    # claims: broker 1 is the only live broker, on a bogus port, and leads every partition
    parts = [ib.um_partition_state(p, 1, s["leader_epoch"] + 10, [1], c.zk_assignment(topic)[p], ver + 10, epoch - 1)
             for p, (s, ver) in before["states"].items()]
    for i in (1, 2, 3):
        # the target's real broker epoch (v5+), so that only the controller epoch is stale
        body = ib.update_metadata_request(version, c.controller(), epoch - 1,
                                          [{"name": topic, "topic_id": topic_id(c, topic), "partitions": parts}],
                                          [ib.um_broker(1, "10.255.255.1", 1)], broker_epoch=czxid(c, i),
                                          request_type=2 if version >= 8 else 0)
        r = call(c, i, ib.UPDATE_METADATA, version, body)
        assert r["error_code"] == ib.STALE_CONTROLLER_EPOCH, f"v{version} to broker {i}: {r}"
    assert_unchanged(c, topic, before, f"stale-epoch UpdateMetadata v{version}")


# ---------------------------------------------------------------------------
# 5. StopReplica
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("version", [0, 3, 4])
def test_stop_replica_delete_stale_controller_epoch(cluster, topic, version):
    c = cluster
    epoch = c.controller_epoch()
    before = snapshot(c, topic)
    marks = {p: produce_fetch(c, s["leader"], topic, p, f"before-stop-v{version}-p{p}".encode())
             for p, (s, _) in before["states"].items()}
    for i in (1, 2, 3):  # every replica of every partition is asked to stop and delete
        body = ib.stop_replica_request(version, c.controller(), epoch - 1,
                                       {topic: [(p, s["leader_epoch"] + 10, True) for p, (s, _) in before["states"].items()]},
                                       broker_epoch=czxid(c, i), delete_partitions=True)
        r = call(c, i, ib.STOP_REPLICA, version, body)
        assert r["error_code"] == ib.STALE_CONTROLLER_EPOCH, f"v{version} to broker {i}: {r}"
        assert sorted(r["partitions"]) == [(topic, p, ib.STALE_CONTROLLER_EPOCH) for p in sorted(before["states"])], (
            f"v{version} to broker {i}: {r}")
    for i in (1, 2, 3):
        for p in before["states"]:
            d = Path(c.brokers[i].data_dir) / f"{topic}-{p}"
            assert d.is_dir(), f"broker {i}: {d} is gone after a stale StopReplica v{version}"
    for p, (s, _) in before["states"].items():
        vals = fetch_values(c, s["leader"], topic, p, marks[p])
        assert vals[:1] == [f"before-stop-v{version}-p{p}".encode()], f"{topic}-{p}@{marks[p]}: {vals[:3]}"
        produce_fetch(c, s["leader"], topic, p, f"after-stop-v{version}-p{p}".encode())
    assert_unchanged(c, topic, before, f"stale-epoch StopReplica v{version}")


# ---------------------------------------------------------------------------
# 6. ControlledShutdown
# ---------------------------------------------------------------------------

def test_controlled_shutdown_fencing(cluster, topic):
    c = cluster
    before = snapshot(c, topic)
    ctl = c.controller()
    others = [i for i in (1, 2, 3) if i != ctl]
    for i in others:  # to a non-controller, for itself or for another broker
        for version in (0, 3):
            for who in (i, ctl):
                r = call(c, i, ib.CONTROLLED_SHUTDOWN, version, ib.controlled_shutdown_request(version, who, czxid(c, who)))
                assert r == {"error_code": ib.NOT_CONTROLLER, "remaining": []}, (
                    f"v{version} to non-controller {i} for broker {who}: {r}")
    for who in others:  # to the controller, with a wrong broker epoch either side of the real one
        for wrong in (czxid(c, who) - 1, czxid(c, who) + 1):
            r = call(c, ctl, ib.CONTROLLED_SHUTDOWN, 3, ib.controlled_shutdown_request(3, who, wrong))
            assert r == {"error_code": ib.STALE_BROKER_EPOCH, "remaining": []}, (
                f"v3 to controller {ctl} for broker {who} epoch {wrong} (registered {czxid(c, who)}): {r}")
    r = call(c, ctl, ib.CONTROLLED_SHUTDOWN, 3, ib.controlled_shutdown_request(3, 99, 12345))
    assert r == {"error_code": ib.BROKER_NOT_AVAILABLE, "remaining": []}, f"v3 to controller for broker 99: {r}"
    assert c.registered_ids() == [1, 2, 3]
    assert_unchanged(c, topic, before, "refused ControlledShutdown")
    # the refused brokers are still eligible leaders: a new topic is led by its first replicas
    t2 = f"ctlrpc-after-cs-{uuid.uuid4().hex[:6]}"
    create_topic(c, t2)
    assert {p: s["leader"] for p, s in c.partition_states(t2).items()} == {
        p: r[0] for p, r in c.zk_assignment(t2).items()}


# ---------------------------------------------------------------------------
# 7. AlterPartition
# ---------------------------------------------------------------------------

def ap_topic(c: Cluster, topic: str, version: int, parts: list) -> dict:
    return {"name": topic, "topic_id": topic_id(c, topic), "partitions": parts}


def full_isr(c: Cluster, topic: str, isr) -> list:
    return [(b, czxid(c, b)) for b in isr]


@pytest.mark.parametrize("version", [0, 2, 3])
def test_alter_partition_fencing(cluster, topic, version):
    c = cluster
    ctl = c.controller()
    before = snapshot(c, topic)
    p = next(p for p, (s, _) in before["states"].items() if s["leader"] != ctl)  # led by a non-controller
    s, ver = before["states"][p]
    leader = s["leader"]
    follower = other_replica(s)
    shrink = [b for b in s["isr"] if b != follower]

    def req(broker_id, broker_epoch, leader_epoch, partition_epoch, isr, topic_key=None):
        t = ap_topic(c, topic, version, [ib.ap_partition(p, leader_epoch, full_isr(c, topic, isr), partition_epoch)])
        if topic_key is not None:
            t["topic_id"] = topic_key
        return ib.alter_partition_request(version, broker_id, broker_epoch, [t])

    # to a non-controller (the leader itself): NOT_CONTROLLER, nothing else
    for i in (1, 2, 3):
        if i == ctl:
            continue
        r = call(c, i, ib.ALTER_PARTITION, version, req(leader, czxid(c, leader), s["leader_epoch"], ver, shrink))
        assert (r["error_code"], r["partitions"]) == (ib.NOT_CONTROLLER, []), f"v{version} to non-controller {i}: {r}"
    # to the controller with a stale broker epoch
    r = call(c, ctl, ib.ALTER_PARTITION, version, req(leader, czxid(c, leader) - 1, s["leader_epoch"], ver, shrink))
    assert (r["error_code"], r["partitions"]) == (ib.STALE_BROKER_EPOCH, []), f"v{version} stale broker epoch: {r}"
    # unknown broker
    r = call(c, ctl, ib.ALTER_PARTITION, version, req(99, 5, s["leader_epoch"], ver, shrink))
    assert (r["error_code"], r["partitions"]) == (ib.BROKER_NOT_AVAILABLE, []), f"v{version} broker 99: {r}"

    def one(r):
        assert r["error_code"] == 0 and len(r["partitions"]) == 1, f"v{version}: {r}"
        return r["partitions"][0]

    cases = [
        ("not the leader", req(follower, czxid(c, follower), s["leader_epoch"], ver, [follower, leader]),
         ib.NOT_LEADER_OR_FOLLOWER),
        ("wrong leader epoch", req(leader, czxid(c, leader), s["leader_epoch"] + 1, ver, shrink), ib.FENCED_LEADER_EPOCH),
        ("older leader epoch", req(leader, czxid(c, leader), s["leader_epoch"] - 1, ver, shrink), ib.FENCED_LEADER_EPOCH),
        ("wrong partition epoch", req(leader, czxid(c, leader), s["leader_epoch"], ver + 1, shrink),
         ib.INVALID_UPDATE_VERSION),
        ("older partition epoch", req(leader, czxid(c, leader), s["leader_epoch"], ver - 1, shrink),
         ib.INVALID_UPDATE_VERSION),
    ]
    if version <= 2:  # v0-2 name only broker ids; an unregistered one may not join
        cases.append(("unregistered broker joins", ib.alter_partition_request(version, leader, czxid(c, leader), [
            ap_topic(c, topic, version, [ib.ap_partition(p, s["leader_epoch"], [(b, -1) for b in s["isr"]] + [(99, -1)],
                                                         ver)])]), ib.INELIGIBLE_REPLICA))
    else:
        cases.append(("unregistered broker joins", ib.alter_partition_request(version, leader, czxid(c, leader), [
            ap_topic(c, topic, version, [ib.ap_partition(p, s["leader_epoch"], full_isr(c, topic, s["isr"]) + [(99, 7)],
                                                         ver)])]), ib.INELIGIBLE_REPLICA))
    if version >= 2:
        cases.append(("unknown topic id", req(leader, czxid(c, leader), s["leader_epoch"], ver, shrink,
                                              topic_key=uuid.uuid4().bytes), ib.UNKNOWN_TOPIC_ID))
    for what, body, want in cases:
        got = one(call(c, ctl, ib.ALTER_PARTITION, version, body))
        assert (got["partition"], got["error_code"]) == (p, want), f"v{version} {what}: {got}"
    assert_unchanged(c, topic, before, f"refused AlterPartition v{version}")


@pytest.mark.parametrize("version", [0, 2, 3])
def test_alter_partition_valid_shrink_then_follower_rejoins(cluster, version):
    c = cluster
    t = f"ctlrpc-ap{version}-{uuid.uuid4().hex[:6]}"
    create_topic(c, t, partitions=1)
    produce_fetch(c, state(c, t, 0)[0]["leader"], t, 0, b"before-shrink")
    s, ver = state(c, t, 0)
    leader = s["leader"]
    follower = max(b for b in s["isr"] if b != leader)
    shrink = [b for b in s["isr"] if b != follower]
    body = ib.alter_partition_request(version, leader, czxid(c, leader), [
        ap_topic(c, t, version, [ib.ap_partition(0, s["leader_epoch"], full_isr(c, t, shrink), ver)])])
    r = call(c, c.controller(), ib.ALTER_PARTITION, version, body)
    assert r["error_code"] == 0 and len(r["partitions"]) == 1, f"v{version}: {r}"
    got = r["partitions"][0]
    assert (got["error_code"], got["leader_id"], got["leader_epoch"], got["isr"], got["partition_epoch"]) == (
        0, leader, s["leader_epoch"], shrink, ver + 1), f"v{version} shrink {s['isr']} -> {shrink}: {got}"
    s2, ver2 = state(c, t, 0)
    # the write is in ZooKeeper at once (the follower may already have been added back since)
    assert ver2 >= ver + 1 and (s2["leader"], s2["leader_epoch"]) == (leader, s["leader_epoch"]), (s, ver, s2, ver2)
    if ver2 == ver + 1:
        assert s2["isr"] == shrink, f"state znode v{ver2}: {s2}"
    # the follower is caught up, so its leader adds it back by itself
    wait_until(lambda: sorted(state(c, t, 0)[0]["isr"]) == [1, 2, 3], WAIT,
               f"{t}-0: follower {follower} back in the ISR", interval=0.1)
    s3, ver3 = state(c, t, 0)
    assert ver3 >= ver + 2 and (s3["leader"], s3["leader_epoch"]) == (leader, s["leader_epoch"]), (s3, ver3)
    produce_fetch(c, leader, t, 0, b"after-rejoin")


# ---------------------------------------------------------------------------
# 8. malformed frames
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("version", [0, 7])
def test_truncated_leader_and_isr_closes_only_that_connection(cluster, topic, version):
    c = cluster
    before = snapshot(c, topic)
    for i in (1, 2, 3):
        _, body = impostor_leader_and_isr(c, topic, 0, version, c.controller_epoch() - 1, czxid(c, i))
        with ib.Conn(*addr(c, i), timeout=15) as bystander, ib.Conn(*addr(c, i), timeout=15) as conn:
            assert bystander.api_versions()
            full = ib.encode_request(ib.LEADER_AND_ISR, version, 77, body)
            cut = full[4:-(len(body) // 2)]  # header intact, body cut in half; the size prefix agrees
            conn.sock.sendall(struct.pack(">i", len(cut)) + cut)
            closed, got = ib.wait_closed(conn.sock, 15)
            assert closed and not got, (f"broker {i}, LeaderAndIsr v{version} cut to {len(cut)} bytes "
                                        f"({cut.hex()}): closed={closed}, answered {got.hex()}")
            # the broker keeps serving: the open connection and a new one
            assert bystander.api_versions().get(4) == (0, 7), f"broker {i}: bystander connection"
        with ib.Conn(*addr(c, i), timeout=15) as fresh:
            assert fresh.api_versions().get(4) == (0, 7), f"broker {i}: new connection"
        assert c.brokers[i].alive()
    assert_unchanged(c, topic, before, f"truncated LeaderAndIsr v{version}")


# ---------------------------------------------------------------------------
# follower fetch sessions (KIP-227), leader side
# ---------------------------------------------------------------------------

def follower_fetch(c: Cluster, i: int, session_id: int, epoch: int, parts: dict, forgotten: dict = None,
                   replica: int = 99) -> dict:
    """Fetch v12 as a follower sends it (replica id, session id and epoch), min_bytes 0 and no
    wait, so the answer says at once what the leader has for it."""
    w = kproto.W(True)
    w.i32(replica).i32(0).i32(0).i32(50 << 20).i8(0).i32(session_id).i32(epoch)

    def part(w, item):
        idx, off = item
        w.i32(idx).i32(-1).i64(off).i32(-1).i64(-1).i32(1 << 20)
        w.tags()

    def topic(w, item):
        name, ps = item
        w.string(name)
        w.array(sorted(ps.items()), part)
        w.tags()

    def gone(w, item):
        name, ps = item
        w.string(name)
        w.array(ps, lambda w, x: w.i32(x))
        w.tags()

    w.array(list(parts.items()), topic)
    w.array(list((forgotten or {}).items()), gone)
    w.string("")
    body = w.tags().done()
    with kproto.Conn(*addr(c, i), timeout=15) as conn:
        return kproto.decode_fetch(conn.call(kproto.FETCH, 12, body), 12)


def fetched(resp: dict) -> dict:
    """{(topic, partition): [values]} of every partition in a Fetch answer."""
    return {(t["topic"], p["partition_index"]): [rec.value for b in kproto.decode_batches(p["records"] or b"")
                                                  for rec in b.records]
            for t in resp["responses"] for p in t["partitions"]}


def test_follower_fetch_session(cluster, topic):
    c = cluster
    s, _ = state(c, topic, 0)
    leader = s["leader"]
    end = produce_fetch(c, leader, topic, 0, b"before-session") + 1

    full = follower_fetch(c, leader, 0, 0, {topic: {0: end}})
    assert full["error_code"] == 0 and full["session_id"] > 0, full
    sid = full["session_id"]
    assert fetched(full) == {(topic, 0): []}, "a full answer names every partition asked for"

    idle = follower_fetch(c, leader, sid, 1, {})
    assert idle["error_code"] == 0 and idle["session_id"] == sid, idle
    assert fetched(idle) == {}, f"nothing new, yet the incremental answer has {fetched(idle)}"

    produce_fetch(c, leader, topic, 0, b"in-session")
    news = follower_fetch(c, leader, sid, 2, {})
    assert fetched(news) == {(topic, 0): [b"in-session"]}, "the session remembers where the follower is"

    assert follower_fetch(c, leader, sid, 2, {})["error_code"] == 71, "a repeated epoch is refused"
    assert follower_fetch(c, leader, sid, 3, {})["error_code"] == 0
    assert follower_fetch(c, leader, sid + 1000, 1, {})["error_code"] == 70, "an unknown session"
    # Consumers have sessions of their own (KIP-227), but not the use of a follower's; the
    # refused attempt leaves the session's epoch where it was (the follower goes on with 4).
    assert follower_fetch(c, leader, sid, 4, {}, replica=-1)["error_code"] == 71, "a consumer in a follower's session"

    # The follower moves on (a partition it names need not be in the answer if nothing is
    # new), then forgets the partition: the session then holds nothing.
    assert fetched(follower_fetch(c, leader, sid, 4, {topic: {0: end + 1}})) == {}
    produce_fetch(c, leader, topic, 0, b"after-move")
    assert fetched(follower_fetch(c, leader, sid, 5, {})) == {(topic, 0): [b"after-move"]}
    assert fetched(follower_fetch(c, leader, sid, 6, {}, forgotten={topic: [0]})) == {}
    produce_fetch(c, leader, topic, 0, b"after-forget")
    assert fetched(follower_fetch(c, leader, sid, 7, {})) == {}, "a forgotten partition stays out"

    closed = follower_fetch(c, leader, sid, -1, {topic: {0: end}})
    assert closed["error_code"] == 0 and closed["session_id"] == 0
    assert fetched(closed)[(topic, 0)][:1] == [b"in-session"], "closing the session is a sessionless fetch"
    assert follower_fetch(c, leader, sid, 8, {})["error_code"] == 70, "a closed session is gone"
