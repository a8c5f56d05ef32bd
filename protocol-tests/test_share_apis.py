"""The share-group APIs (KIP-932) on a standalone broker with share groups on, by hand-built
frames (kproto_share.py): ShareGroupHeartbeat and ShareGroupDescribe on the coordinator,
ShareFetch and ShareAcknowledge on the leader, with the errors for a fenced epoch, an unknown
member, a share session out of step and malformed or foreign acknowledgements.
"""
import threading
import uuid

import kproto as kp
import kproto_groups as kg
import kproto_share as ks
from gregor_harness import wait_until
from test_apis import new_topic, sample_records
from test_group_apis import find_coordinator

WAIT = 30
SHARE_ON = {"offsets.topic.replication.factor": "1", "offsets.topic.num.partitions": "3",
            "group.coordinator.rebalance.protocols": "classic,consumer,share"}


def test_share_group_heartbeat_and_describe(broker_factory):
    b = broker_factory(overrides=SHARE_ON)
    assert {k: b.api_versions.get(k) for k in ks.NAMES} == ks.ENCODER_RANGES
    group, me, other = f"sg-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex, uuid.uuid4().hex
    with kp.Conn(b.host, b.port) as c:
        topic = new_topic(c, partitions=2)
        tid = kp.topic_id(c, topic)
        find_coordinator(c, 4, group)

        def hb(member, epoch, topics=None):
            return ks.call(c, ks.SHARE_GROUP_HEARTBEAT, ks.share_group_heartbeat_request(group, member, epoch, topics))

        joined = wait_until(lambda: (lambda r: r if r["error_code"] != kg.COORDINATOR_LOAD_IN_PROGRESS else None)(
            hb(me, 0, [topic])), WAIT, "the first heartbeat", interval=0.1)
        assert joined["error_code"] == 0 and joined["member_id"] == me, joined
        assert joined["member_epoch"] == 1 and joined["heartbeat_interval_ms"] == 5000, joined
        assert joined["assignment"] == [(tid, [0, 1])], joined
        # A second member shares both partitions; the first learns the new epoch, and an
        # unchanged assignment is not sent again.
        second = hb(other, 0, [topic])
        assert (second["error_code"], second["member_epoch"], second["assignment"]) == (0, 2, [(tid, [0, 1])])
        again = hb(me, 1)
        assert (again["error_code"], again["member_epoch"]) == (0, 2), again
        assert hb(me, 2)["assignment"] is None
        assert hb(me, 7)["error_code"] == ks.FENCED_MEMBER_EPOCH
        assert hb(uuid.uuid4().hex, 3)["error_code"] == ks.UNKNOWN_MEMBER_ID
        assert hb("", 0, [topic])["error_code"] == ks.INVALID_REQUEST
        assert hb(uuid.uuid4().hex, 0)["error_code"] == ks.INVALID_REQUEST, "a first heartbeat names its topics"

        d = ks.call(c, ks.SHARE_GROUP_DESCRIBE, ks.share_group_describe_request([group, "no-such-group"]))["groups"]
        assert [g["error_code"] for g in d] == [0, kg.GROUP_ID_NOT_FOUND], d
        assert d[0]["state"] == "Stable" and d[0]["group_epoch"] == 2 and d[0]["assignor"] == "simple", d
        assert sorted(m["member_id"] for m in d[0]["members"]) == sorted([me, other]), d
        assert all(m["assignment"] == [{"topic_id": tid, "topic": topic, "partitions": [0, 1]}]
                   for m in d[0]["members"]), d

        left = hb(other, -1)
        assert (left["error_code"], left["member_epoch"]) == (0, -1), left
        d = ks.call(c, ks.SHARE_GROUP_DESCRIBE, ks.share_group_describe_request([group]))["groups"]
        assert [m["member_id"] for m in d[0]["members"]] == [me], d


def test_share_fetch_and_acknowledge(broker_factory):
    b = broker_factory(overrides=SHARE_ON)
    group, a, other = f"sg-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex, uuid.uuid4().hex
    with kp.Conn(b.host, b.port) as c:
        topic = new_topic(c)
        tid = kp.topic_id(c, topic)
        tp = (tid, 0)

        def fetch(member, epoch, acks=None, parts=(tp,), wait=0):
            return ks.call(c, ks.SHARE_FETCH,
                           ks.share_fetch_request(group, member, epoch, list(parts), acks, max_wait_ms=wait))

        def ack(member, epoch, acks):
            return ks.call(c, ks.SHARE_ACKNOWLEDGE, ks.share_acknowledge_request(group, member, epoch, acks))

        # The first fetch starts the share-partition at the log end (latest): nothing yet.
        first = fetch(a, 0)
        assert first["error_code"] == 0 and first["acquisition_lock_timeout_ms"] == 30000, first
        assert ks.partition_of(first)["acquired"] == [], first
        assert kp.produce(c, topic, 0, kp.build_batch(sample_records(4)))["error_code"] == 0
        # A waiting fetch returns the 4 records, acquired once.
        got = fetch(a, 1, wait=5000)
        p = ks.partition_of(got)
        assert (p["error_code"], p["acquired"]) == (0, [(0, 3, 1)]), got
        assert [r.offset for bt in kp.decode_batches(p["records"]) for r in bt.records] == [0, 1, 2, 3]
        # Another member finds nothing to acquire; its foreign acknowledgement changes nothing.
        assert ks.partition_of(fetch(other, 0))["acquired"] == []
        bad = ack(other, 1, {tp: [(0, 0, [ks.ACCEPT])]})
        assert bad["responses"][0]["partitions"][0]["error_code"] == ks.INVALID_RECORD_STATE, bad
        # Out of step with the session, and malformed: refused as a whole.
        assert fetch(a, 7)["error_code"] == ks.INVALID_SHARE_SESSION_EPOCH
        assert ack(uuid.uuid4().hex, 1, {tp: [(0, 0, [1])]})["error_code"] == ks.SHARE_SESSION_NOT_FOUND
        assert fetch(a, 0, acks={tp: [(0, 0, [1])]})["error_code"] == ks.INVALID_REQUEST
        # (the malformed ShareFetch just above left the session as it was: epoch 2 is next)
        overlap = ack(a, 2, {tp: [(0, 1, [1]), (1, 2, [1])]})
        assert overlap["responses"][0]["partitions"][0]["error_code"] == ks.INVALID_REQUEST, overlap
        # Accept 0, release 1, reject 2, accept 3 piggybacked on the next fetch: 1 comes back
        # with delivery count 2, 2 never does.
        r = fetch(a, 3, acks={tp: [(0, 3, [ks.ACCEPT, ks.RELEASE, ks.REJECT, ks.ACCEPT])]})
        p = ks.partition_of(r)
        assert p["acknowledge_error_code"] == 0 and p["acquired"] == [(1, 1, 2)], r
        assert ack(a, 4, {tp: [(1, 1, [ks.ACCEPT])]})["responses"][0]["partitions"][0]["error_code"] == 0
        assert ks.partition_of(fetch(a, 5))["acquired"] == []
        # The final request closes the session; a next one must start again at epoch 0.
        assert fetch(a, -1)["error_code"] == 0
        assert fetch(a, 6)["error_code"] == ks.SHARE_SESSION_NOT_FOUND


def test_share_coordinator_reads_and_writes_state(broker_factory):
    """ReadShareGroupState / WriteShareGroupState, as another broker's share-partition leader
    sends them to this one, the leader of the share-partition's `__share_group_state` partition."""
    b = broker_factory(overrides={**SHARE_ON, "share.coordinator.state.topic.replication.factor": "1",
                                  "share.coordinator.state.topic.min.isr": "1",
                                  "share.coordinator.state.topic.num.partitions": "1"})
    group = f"sg-{uuid.uuid4().hex[:8]}"
    with kp.Conn(b.host, b.port) as c:
        topic = new_topic(c)
        tid = kp.topic_id(c, topic)

        def read(epoch=0):
            r = ks.call(c, ks.READ_SHARE_GROUP_STATE, ks.read_share_group_state_request(group, [(tid, 0, epoch)]))
            return r["results"][0]["partitions"][0]

        def write(epoch, start, batches):
            r = ks.call(c, ks.WRITE_SHARE_GROUP_STATE,
                        ks.write_share_group_state_request(group, [(tid, 0, 0, epoch, start, batches)]))
            return r["results"][0]["partitions"][0]

        # No state topic yet: this broker coordinates nothing.
        assert read()["error_code"] == ks.NOT_COORDINATOR
        # Another group's share fetch makes the state topic exist.
        ks.call(c, ks.SHARE_FETCH, ks.share_fetch_request("other-" + group, uuid.uuid4().hex, 0, [(tid, 0)]))
        fresh = wait_until(lambda: (lambda p: p if p["error_code"] == 0 else None)(read()), WAIT,
                           "the coordinator to answer", interval=0.1)
        assert (fresh["start_offset"], fresh["state_batches"]) == (-1, []), fresh
        assert write(5, 10, [(10, 19, 0, 1)])["error_code"] == 0
        assert write(5, 12, [(12, 13, 2, 1), (15, 15, 4, 3)])["error_code"] == 0
        back = read()
        assert back["error_code"] == 0 and back["start_offset"] == 12, back
        assert back["state_batches"] == [(12, 13, 2, 1), (14, 14, 0, 1), (15, 15, 4, 3), (16, 19, 0, 1)], back
        # An older leader's write is fenced and changes nothing.
        assert write(4, 19, [])["error_code"] == ks.FENCED_LEADER_EPOCH
        assert read() == back


RESOURCE_GROUP = 32
INVALID_CONFIG = 40
SET, DELETE, APPEND = 0, 1, 2


def _describe_group(c, group, keys=None):
    v = 4
    r = c.call(kp.DESCRIBE_CONFIGS, v, kp.describe_configs_request(v, [(RESOURCE_GROUP, group, keys)], True))
    [res] = kp.decode_describe_configs(r, v)["results"]
    return res


def _alter_group(c, group, ops, validate_only=False):
    v = 1
    body = kp.incremental_alter_configs_request(v, [(RESOURCE_GROUP, group, ops)], validate_only)
    [res] = kp.decode_incremental_alter_configs(c.call(kp.INCREMENTAL_ALTER_CONFIGS, v, body), v)["responses"]
    return res["error_code"]


def test_group_configs_are_described_altered_and_checked(broker_factory):
    b = broker_factory(overrides=SHARE_ON)
    group = f"sg-{uuid.uuid4().hex[:8]}"
    with kp.Conn(b.host, b.port) as c:
        res = _describe_group(c, group)
        assert res["error_code"] == 0, res
        assert {e["name"]: (e["value"], e["config_source"]) for e in res["configs"]} == {
            "share.auto.offset.reset": ("latest", 5), "share.isolation.level": ("read_uncommitted", 5),
            "share.record.lock.duration.ms": ("30000", 5), "share.session.timeout.ms": ("45000", 5),
            "share.heartbeat.interval.ms": ("5000", 5)}, res
        ok = [("share.record.lock.duration.ms", SET, "20000"), ("share.isolation.level", SET, "read_committed"),
              ("share.auto.offset.reset", SET, "by_duration:PT1H")]
        assert _alter_group(c, group, ok, validate_only=True) == 0
        assert _describe_group(c, group, ["share.isolation.level"])["configs"][0]["value"] == "read_uncommitted"
        assert _alter_group(c, group, ok) == 0
        lock = _describe_group(c, group, ["share.record.lock.duration.ms"])["configs"][0]
        assert (lock["value"], lock["config_source"]) == ("20000", 8), lock
        assert [(s["name"], s["source"]) for s in lock["synonyms"]] == [
            ("share.record.lock.duration.ms", 8), ("group.share.record.lock.duration.ms", 5)], lock
        # Refused as Kafka refuses them, and nothing changes.
        for bad in ([("share.unknown", SET, "1")],
                    [("share.record.lock.duration.ms", SET, "1000")],
                    [("share.session.timeout.ms", SET, "soon")],
                    [("share.heartbeat.interval.ms", SET, "16000")],
                    [("share.isolation.level", SET, "committed")],
                    [("share.auto.offset.reset", SET, "by_duration:-PT1H")],
                    [("share.isolation.level", APPEND, "read_committed")]):
            assert _alter_group(c, group, bad) == INVALID_CONFIG, bad
        assert _alter_group(c, "", ok) == kp.INVALID_REQUEST
        assert _describe_group(c, "")["error_code"] == kp.INVALID_REQUEST
        now = {e["name"]: e["value"] for e in _describe_group(c, group)["configs"]}
        assert (now["share.record.lock.duration.ms"], now["share.isolation.level"]) == ("20000", "read_committed")
        assert _alter_group(c, group, [("share.isolation.level", DELETE, None)]) == 0
        assert _describe_group(c, group, ["share.isolation.level"])["configs"][0]["config_source"] == 5


def test_group_configs_reach_heartbeats_fetches_and_the_reset_point(broker_factory):
    b = broker_factory(overrides=SHARE_ON)
    group, me = f"sg-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    with kp.Conn(b.host, b.port) as c:
        topic = new_topic(c)
        tid = kp.topic_id(c, topic)
        assert kp.produce(c, topic, 0, kp.build_batch(sample_records(3)))["error_code"] == 0
        assert _alter_group(c, group, [("share.heartbeat.interval.ms", SET, "6000"),
                                       ("share.record.lock.duration.ms", SET, "16000"),
                                       ("share.auto.offset.reset", SET, "earliest")]) == 0
        find_coordinator(c, 4, group)
        joined = wait_until(lambda: (lambda r: r if r["error_code"] != kg.COORDINATOR_LOAD_IN_PROGRESS else None)(
            ks.call(c, ks.SHARE_GROUP_HEARTBEAT, ks.share_group_heartbeat_request(group, me, 0, [topic]))),
            WAIT, "the first heartbeat", interval=0.1)
        assert (joined["error_code"], joined["heartbeat_interval_ms"]) == (0, 6000), joined
        # earliest: records produced before the share-partition existed are delivered.
        epoch = [0]

        def fetch():
            r = ks.call(c, ks.SHARE_FETCH, ks.share_fetch_request(group, me, epoch[0], [(tid, 0)], None,
                                                                  max_wait_ms=500))
            epoch[0] += 1
            assert r["error_code"] == 0 and r["acquisition_lock_timeout_ms"] == 16000, r
            return r if ks.partition_of(r)["acquired"] else None

        r = wait_until(fetch, WAIT, "the first records", interval=0.1)
        assert ks.partition_of(r)["acquired"] == [(0, 2, 1)], r

        def ack(acks):
            r = ks.call(c, ks.SHARE_ACKNOWLEDGE, ks.share_acknowledge_request(group, me, epoch[0], acks))
            epoch[0] += 1
            assert r["error_code"] == 0, r
            return r["responses"][0]["partitions"][0]["error_code"]

        # A range past what was handed out, or overlapping another, refuses the whole request:
        # offset 0, accepted in the same request, is still held (accepting it again works).
        tp = (tid, 0)
        assert ack({tp: [(0, 0, [ks.ACCEPT]), (10, 10, [ks.ACCEPT])]}) == ks.INVALID_RECORD_STATE
        assert ack({tp: [(0, 1, [ks.ACCEPT]), (1, 2, [ks.ACCEPT])]}) == ks.INVALID_REQUEST
        assert ack({tp: [(0, 2, [ks.ACCEPT])]}) == 0
        assert ack({tp: [(0, 0, [ks.ACCEPT])]}) == ks.INVALID_RECORD_STATE, "accepted twice"


def test_share_fetch_waits_for_min_bytes(broker_factory):
    """A ShareFetch with MinBytes answers once that much could be handed out (or MaxWaitMs runs
    out), acquiring nothing meanwhile: batches produced one at a time while it waits all come
    back in its one answer."""
    b = broker_factory(overrides=SHARE_ON)
    group, me = f"sg-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    with kp.Conn(b.host, b.port) as c, kp.Conn(b.host, b.port) as fetcher:
        topic = new_topic(c)
        tid = kp.topic_id(c, topic)
        assert _alter_group(c, group, [("share.auto.offset.reset", SET, "earliest")]) == 0
        opened = ks.call(fetcher, ks.SHARE_FETCH, ks.share_fetch_request(group, me, 0, [(tid, 0)]))
        assert opened["error_code"] == 0, opened
        batch = kp.build_batch([kp.Record(value=b"x" * 1000, key=b"k")])
        want = 4 * len(batch)
        answer = {}

        def fetch():
            body = ks.share_fetch_request(group, me, 1, [(tid, 0)], max_wait_ms=30000, min_bytes=want)
            answer["r"] = ks.call(fetcher, ks.SHARE_FETCH, body)

        waiting = threading.Thread(target=fetch)
        waiting.start()
        produced = 0
        while waiting.is_alive() and produced < 20:
            assert kp.produce(c, topic, 0, batch)["error_code"] == 0
            produced += 1
            waiting.join(0.2)
        waiting.join(WAIT)
        p = ks.partition_of(answer["r"])
        assert len(p["records"]) >= want, (produced, p["acquired"])
        assert p["acquired"][0][0] == 0 and p["acquired"][-1][1] >= 3, p["acquired"]


def test_share_fetch_answers_only_what_it_acquired(broker_factory):
    """MaxRecords 1 over three one-record batches: one acquired, and only its batch is sent
    (the read behind it may hold up to MaxBytes)."""
    b = broker_factory(overrides=SHARE_ON)
    group, me = f"sg-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    with kp.Conn(b.host, b.port) as c:
        topic = new_topic(c)
        tid = kp.topic_id(c, topic)
        assert _alter_group(c, group, [("share.auto.offset.reset", SET, "earliest")]) == 0
        batches = [kp.build_batch([kp.Record(value=b"v%d" % i * 100, key=b"k")]) for i in range(3)]
        for batch in batches:
            assert kp.produce(c, topic, 0, batch)["error_code"] == 0
        epoch = [0]

        def fetch():
            body = ks.share_fetch_request(group, me, epoch[0], [(tid, 0)], max_wait_ms=500, max_records=1)
            r = ks.call(c, ks.SHARE_FETCH, body)
            epoch[0] += 1
            return r if ks.partition_of(r)["acquired"] else None

        p = ks.partition_of(wait_until(fetch, WAIT, "the first record", interval=0.1))
        assert p["acquired"] == [(0, 0, 1)], p
        assert len(p["records"]) == len(batches[0]), (len(p["records"]), [len(x) for x in batches])
