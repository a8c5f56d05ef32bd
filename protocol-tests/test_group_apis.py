"""The group-coordinator APIs and OffsetForLeaderEpoch on a standalone broker, by hand-built
frames (kproto_groups.py), each at its lowest and its highest advertised version.

One consumer-group life: FindCoordinator -> JoinGroup -> SyncGroup -> Heartbeat ->
DescribeGroups / ListGroups -> OffsetCommit -> OffsetFetch -> LeaveGroup -> OffsetDelete ->
DeleteGroups, with the errors a wrong generation, an unknown member or a non-empty group get.
"""
import uuid

import pytest

import kproto as kp
import kproto_groups as kg
from gregor_harness import wait_until
from test_apis import new_topic, sample_records

WAIT = 30


def versions(broker, which):
    """{api: version} for every group API: the lowest or highest the broker advertises."""
    out = {}
    for api in kg.ENCODER_RANGES:
        assert api in broker.api_versions, f"{kg.NAMES[api]} (key {api}) not advertised"
        lo, hi = broker.api_versions[api]
        elo, ehi = kg.ENCODER_RANGES[api]
        assert elo <= lo and hi <= ehi, f"{kg.NAMES[api]} advertised {lo}-{hi}, encoders know {elo}-{ehi}"
        out[api] = lo if which == "min" else hi
    return out


def find_coordinator(c, v, group):
    """Poll until the coordinator is ready (the offsets topic is created on first use)."""
    seen = {}

    def ok():
        r = kg.call(c, kg.FIND_COORDINATOR, v, kg.find_coordinator_request(v, group))
        seen["r"] = r
        co = r["coordinators"]
        return co if len(co) == 1 and co[0]["error_code"] == 0 else None
    try:
        return wait_until(ok, WAIT, f"FindCoordinator v{v} for {group}", interval=0.1)[0]
    except TimeoutError as e:
        raise AssertionError(f"{e}: last answer {seen.get('r')}") from None


def join(c, v, group, topic, member_id=""):
    """JoinGroup as the only member; from v4 the first join is answered MEMBER_ID_REQUIRED with
    the id to join with."""
    sub = kg.consumer_subscription([topic])
    body = kg.join_group_request(v, group, member_id, [("range", sub)], session_timeout_ms=30000)
    r = kg.call(c, kg.JOIN_GROUP, v, body)
    if v >= 4 and member_id == "":
        assert r["error_code"] == kg.MEMBER_ID_REQUIRED, r
        assert r["member_id"], r
        return join(c, v, group, topic, r["member_id"])
    assert r["error_code"] == 0, r
    return r, sub


@pytest.mark.parametrize("which", ["min", "max"])
def test_find_coordinator_names_this_broker(broker, which):
    v = versions(broker, which)[kg.FIND_COORDINATOR]
    group = f"g-{uuid.uuid4().hex[:8]}"
    with kp.Conn(broker.host, broker.port) as c:
        co = find_coordinator(c, v, group)
    assert (co["node_id"], co["host"], co["port"]) == (0, broker.host, broker.port), co
    if v >= 4:
        assert co["key"] == group, co


@pytest.mark.parametrize("which", ["min", "max"])
def test_consumer_group_life(broker, which):
    vs = versions(broker, which)
    group = f"g-{uuid.uuid4().hex[:8]}"
    with kp.Conn(broker.host, broker.port) as c:
        topic = new_topic(c, partitions=2)
        find_coordinator(c, vs[kg.FIND_COORDINATOR], group)

        # join: the only member is the leader and gets every member's subscription
        v = vs[kg.JOIN_GROUP]
        j, sub = join(c, v, group, topic)
        me, gen = j["member_id"], j["generation_id"]
        assert gen >= 1 and j["leader"] == me and j["protocol_name"] == "range", j
        assert [(m["member_id"], m["metadata"]) for m in j["members"]] == [(me, sub)], j
        if v >= 7:
            assert j["protocol_type"] == "consumer", j

        # sync: the leader's assignment comes back to it
        v = vs[kg.SYNC_GROUP]
        asg = kg.consumer_assignment({topic: [0, 1]})
        s = kg.call(c, kg.SYNC_GROUP, v, kg.sync_group_request(v, group, gen, me, [(me, asg)]))
        assert s["error_code"] == 0, s
        assert kg.decode_consumer_assignment(s["assignment"]) == {topic: [0, 1]}, s
        if v >= 5:
            assert (s["protocol_type"], s["protocol_name"]) == ("consumer", "range"), s

        # heartbeat: ok for this generation and member, errors otherwise
        vh = vs[kg.HEARTBEAT]

        def hb(g, m):
            return kg.call(c, kg.HEARTBEAT, vh, kg.heartbeat_request(vh, group, g, m))["error_code"]
        assert hb(gen, me) == 0
        assert hb(gen + 1, me) == kg.ILLEGAL_GENERATION
        assert hb(gen, "nobody-" + me) == kg.UNKNOWN_MEMBER_ID

        # the coordinator's record of the group
        v = vs[kg.DESCRIBE_GROUPS]
        d = kg.call(c, kg.DESCRIBE_GROUPS, v, kg.describe_groups_request(v, [group]))["groups"]
        assert len(d) == 1 and d[0]["error_code"] == 0, d
        d = d[0]
        assert (d["group_id"], d["state"], d["protocol_type"], d["protocol_data"]) == \
            (group, "Stable", "consumer", "range"), d
        assert [(m["member_id"], m["metadata"], m["assignment"]) for m in d["members"]] == [(me, sub, asg)], d
        assert d["members"][0]["client_id"] == "gregor-proto-test", d

        v = vs[kg.LIST_GROUPS]
        lg = kg.call(c, kg.LIST_GROUPS, v, kg.list_groups_request(v))
        assert lg["error_code"] == 0, lg
        mine = [g for g in lg["groups"] if g["group_id"] == group]
        assert [g["protocol_type"] for g in mine] == ["consumer"], lg
        if v >= 4:
            assert mine[0]["state"] == "Stable", mine
            empty = kg.call(c, kg.LIST_GROUPS, v, kg.list_groups_request(v, ["Empty"]))
            assert group not in [g["group_id"] for g in empty["groups"]], empty
        if v >= 5:
            assert mine[0]["type"] == "classic", mine
            for types, listed in ((["Classic"], True), (["consumer"], False), (["consumer", "classic"], True)):
                lt = kg.call(c, kg.LIST_GROUPS, v, kg.list_groups_request(v, types=types))
                assert lt["error_code"] == 0 and (group in [g["group_id"] for g in lt["groups"]]) == listed, \
                    (types, lt)

        # commit as the member; a stale generation is refused (v0 commits bypass the coordinator
        # and keep offsets in ZooKeeper: test_offsets_v0_are_kept_in_the_znode_tree)
        v = max(vs[kg.OFFSET_COMMIT], 1)
        oc = kg.call(c, kg.OFFSET_COMMIT, v, kg.offset_commit_request(v, group, {topic: {0: 5, 1: 7}}, gen, me,
                                                                       metadata="m-0"))
        assert oc["errors"] == {(topic, 0): 0, (topic, 1): 0}, oc
        oc = kg.call(c, kg.OFFSET_COMMIT, v, kg.offset_commit_request(v, group, {topic: {0: 99}}, gen + 1, me))
        assert oc["errors"] == {(topic, 0): kg.ILLEGAL_GENERATION}, oc

        v = max(vs[kg.OFFSET_FETCH], 1)
        of = kg.call(c, kg.OFFSET_FETCH, v, kg.offset_fetch_request(v, group, {topic: [0, 1]}))
        assert of["error_code"] == 0, of
        assert {k: (o, m, e) for k, (o, _ep, m, e) in of["offsets"].items()} == \
            {(topic, 0): (5, "m-0", 0), (topic, 1): (7, "m-0", 0)}, of
        if v >= 2:  # null topics: everything the group committed
            alls = kg.call(c, kg.OFFSET_FETCH, v, kg.offset_fetch_request(v, group, None))
            assert {k: o for k, (o, _ep, _m, _e) in alls["offsets"].items()} == {(topic, 0): 5, (topic, 1): 7}, alls

        # a group with members is neither deleted nor has offsets of its subscribed topic deleted
        v = vs[kg.DELETE_GROUPS]
        dg = kg.call(c, kg.DELETE_GROUPS, v, kg.delete_groups_request(v, [group]))
        assert dg["results"] == {group: kg.NON_EMPTY_GROUP}, dg
        vd = vs[kg.OFFSET_DELETE]
        od = kg.call(c, kg.OFFSET_DELETE, vd, kg.offset_delete_request(vd, group, {topic: [0]}))
        assert od["error_code"] == 0 and od["errors"] == {(topic, 0): kg.GROUP_SUBSCRIBED_TO_TOPIC}, od

        # leave: the group is Empty, its offsets stay
        v = vs[kg.LEAVE_GROUP]
        lv = kg.call(c, kg.LEAVE_GROUP, v, kg.leave_group_request(v, group, [me]))
        assert lv["error_code"] == 0, lv
        if v >= 3:
            assert [(m["member_id"], m["error_code"]) for m in lv["members"]] == [(me, 0)], lv
        v = vs[kg.DESCRIBE_GROUPS]
        d = kg.call(c, kg.DESCRIBE_GROUPS, v, kg.describe_groups_request(v, [group]))["groups"][0]
        assert (d["error_code"], d["state"], d["members"]) == (0, "Empty", []), d
        assert hb(gen, me) in (kg.UNKNOWN_MEMBER_ID, kg.ILLEGAL_GENERATION)

        # OffsetDelete on the Empty group removes exactly the named partition's offset
        od = kg.call(c, kg.OFFSET_DELETE, vd, kg.offset_delete_request(vd, group, {topic: [0]}))
        assert od["error_code"] == 0 and od["errors"] == {(topic, 0): 0}, od
        v = max(vs[kg.OFFSET_FETCH], 1)
        of = kg.call(c, kg.OFFSET_FETCH, v, kg.offset_fetch_request(v, group, {topic: [0, 1]}))
        assert {k: o for k, (o, _ep, _m, _e) in of["offsets"].items()} == {(topic, 0): -1, (topic, 1): 7}, of

        # DeleteGroups: gone, with its offsets; a second delete finds nothing
        v = vs[kg.DELETE_GROUPS]
        dg = kg.call(c, kg.DELETE_GROUPS, v, kg.delete_groups_request(v, [group]))
        assert dg["results"] == {group: 0}, dg
        dg = kg.call(c, kg.DELETE_GROUPS, v, kg.delete_groups_request(v, [group]))
        assert dg["results"] == {group: kg.GROUP_ID_NOT_FOUND}, dg
        v = vs[kg.DESCRIBE_GROUPS]
        d = kg.call(c, kg.DESCRIBE_GROUPS, v, kg.describe_groups_request(v, [group]))["groups"][0]
        assert d["error_code"] == kg.GROUP_ID_NOT_FOUND or (d["error_code"], d["state"]) == (0, "Dead"), d
        v = max(vs[kg.OFFSET_FETCH], 1)
        of = kg.call(c, kg.OFFSET_FETCH, v, kg.offset_fetch_request(v, group, {topic: [0, 1]}))
        assert {k: o for k, (o, _ep, _m, _e) in of["offsets"].items()} == {(topic, 0): -1, (topic, 1): -1}, of
        v = vs[kg.LIST_GROUPS]
        lg = kg.call(c, kg.LIST_GROUPS, v, kg.list_groups_request(v))
        assert group not in [g["group_id"] for g in lg["groups"]], lg


@pytest.mark.parametrize("which", ["min", "max"])
def test_offset_for_leader_epoch(broker, which):
    lo, hi = broker.api_versions[kg.OFFSET_FOR_LEADER_EPOCH]
    v = lo if which == "min" else hi
    with kp.Conn(broker.host, broker.port) as c:
        topic = new_topic(c, partitions=1)
        for chunk in (sample_records(3), sample_records(2, b"s")):
            assert kp.produce(c, topic, 0, kp.build_batch(chunk))["error_code"] == 0
        r = kg.call(c, kg.OFFSET_FOR_LEADER_EPOCH, v,
                    kg.offset_for_leader_epoch_request(v, {topic: {0: (-1, 0)}, "no-such-topic-x": {0: (-1, 0)}}))
    # epoch 0 is the current one: its end offset is the log end (v0 answers no epoch)
    assert r["partitions"][(topic, 0)] == (0, 0 if v >= 1 else -1, 5), r
    assert r["partitions"][("no-such-topic-x", 0)][0] == kp.UNKNOWN_TOPIC_OR_PARTITION, r


def test_offsets_v0_are_kept_in_the_znode_tree(broker):
    """OffsetCommit/OffsetFetch v0 store offsets under /consumers/<group>/offsets/<topic>/<p>
    (Kafka 3.9 writes them to ZooKeeper), apart from the coordinator's: no membership or
    generation check, no metadata kept, invisible to v1+ and vice versa."""
    group = f"g-{uuid.uuid4().hex[:8]}"
    with kp.Conn(broker.host, broker.port) as c:
        topic = new_topic(c, partitions=2)
        oc = kg.call(c, kg.OFFSET_COMMIT, 0, kg.offset_commit_request(0, group, {topic: {0: 5, 1: 9}}, metadata="m"))
        assert oc["errors"] == {(topic, 0): 0, (topic, 1): 0}, oc
        oc = kg.call(c, kg.OFFSET_COMMIT, 0, kg.offset_commit_request(0, group, {topic: {0: 6}, "no-such-t": {0: 1}}))
        assert oc["errors"] == {(topic, 0): 0, ("no-such-t", 0): kp.UNKNOWN_TOPIC_OR_PARTITION}, oc
        oc = kg.call(c, kg.OFFSET_COMMIT, 0, kg.offset_commit_request(0, group, {topic: {1: 1}}, metadata="x" * 4097))
        assert oc["errors"] == {(topic, 1): 12}, oc  # OFFSET_METADATA_TOO_LARGE
        of = kg.call(c, kg.OFFSET_FETCH, 0, kg.offset_fetch_request(0, group, {topic: [0, 1], "no-such-t": [0]}))
        assert of["offsets"] == {(topic, 0): (6, -1, "", 0), (topic, 1): (9, -1, "", 0),
                                 ("no-such-t", 0): (-1, -1, "", 0)}, of
        find_coordinator(c, 0, group)  # the coordinator's offsets, for comparison
        of1 = kg.call(c, kg.OFFSET_FETCH, 1, kg.offset_fetch_request(1, group, {topic: [0]}))
        assert of1["offsets"][(topic, 0)][0] == -1, of1
        v2 = kg.call(c, kg.OFFSET_COMMIT, 2, kg.offset_commit_request(2, group, {topic: {0: 77}}))
        assert v2["errors"] == {(topic, 0): 0}, v2
        of = kg.call(c, kg.OFFSET_FETCH, 0, kg.offset_fetch_request(0, group, {topic: [0]}))
        assert of["offsets"][(topic, 0)][0] == 6, of
        bad = kg.call(c, kg.OFFSET_COMMIT, 0, kg.offset_commit_request(0, "a/b", {topic: {0: 1}}))
        assert bad["errors"] == {(topic, 0): 24}, bad  # INVALID_GROUP_ID: would name another znode


INVALID_REGULAR_EXPRESSION = 128
FENCED_INSTANCE_ID, UNRELEASED_INSTANCE_ID = 82, 111


@pytest.mark.parametrize("which", ["min", "max"])
def test_consumer_group_heartbeat_and_describe(broker, which):
    """KIP-848 on the wire: a member joins with epoch 0 and is given every partition of its
    topic by the coordinator, ConsumerGroupDescribe shows it, a wrong epoch is fenced, an
    unknown member is refused, and leaving with epoch -1 ends the membership."""
    vs = versions(broker, which)
    vh, vd = vs[kg.CONSUMER_GROUP_HEARTBEAT], vs[kg.CONSUMER_GROUP_DESCRIBE]
    group = f"cg-{uuid.uuid4().hex[:8]}"
    # v1 members name themselves (KIP-1082); v0 members are named by the coordinator.
    me = uuid.uuid4().hex if vh >= 1 else ""
    with kp.Conn(broker.host, broker.port) as c:
        topic = new_topic(c, partitions=3)
        find_coordinator(c, vs[kg.FIND_COORDINATOR], group)

        def hb(member, epoch, topics=None, owned=None):
            body = kg.consumer_group_heartbeat_request(vh, group, member, epoch, topics, owned,
                                                       rebalance_timeout_ms=30000 if epoch == 0 else -1)
            return kg.call(c, kg.CONSUMER_GROUP_HEARTBEAT, vh, body)

        joined = wait_until(lambda: (lambda r: r if r["error_code"] not in (kg.COORDINATOR_LOAD_IN_PROGRESS,
                                                                            kg.COORDINATOR_NOT_AVAILABLE) else None)(
            hb(me, 0, [topic], owned=[])), WAIT, "the first heartbeat", interval=0.1)
        assert joined["error_code"] == 0, joined
        member, epoch = joined["member_id"], joined["member_epoch"]
        assert member and (vh == 0 or member == me), joined
        assert epoch >= 1 and joined["heartbeat_interval_ms"] == 5000, joined
        assigned = {p for _, parts in (joined["assignment"] or []) for p in parts}
        assert assigned == {0, 1, 2}, joined

        d = kg.call(c, kg.CONSUMER_GROUP_DESCRIBE, vd, kg.consumer_group_describe_request(vd, [group]))["groups"]
        assert len(d) == 1 and d[0]["error_code"] == 0 and d[0]["group_id"] == group, d
        assert [(m["member_id"], m["member_epoch"]) for m in d[0]["members"]] == [(member, epoch)], d
        assert d[0]["group_epoch"] == epoch and d[0]["assignor"] == "uniform", d
        assert sorted(p for t in d[0]["members"][0]["assignment"] for p in t["partitions"]) == [0, 1, 2], d

        assert hb(member, epoch + 5)["error_code"] == kg.FENCED_MEMBER_EPOCH
        assert hb(uuid.uuid4().hex, 1)["error_code"] == kg.UNKNOWN_MEMBER_ID
        left = hb(member, -1)
        assert (left["error_code"], left["member_epoch"]) == (0, -1), left
        d = kg.call(c, kg.CONSUMER_GROUP_DESCRIBE, vd, kg.consumer_group_describe_request(vd, [group]))["groups"]
        assert d[0]["members"] == [], d
        if vh >= 1:
            # v1 carries a pattern: a bad one is refused, a good one is resolved by the coordinator.
            def by_regex(pattern):
                body = kg.consumer_group_heartbeat_request(vh, group, uuid.uuid4().hex, 0, [], [],
                                                           rebalance_timeout_ms=30000, regex=pattern)
                return kg.call(c, kg.CONSUMER_GROUP_HEARTBEAT, vh, body)
            assert by_regex("(unclosed")["error_code"] == INVALID_REGULAR_EXPRESSION
            r = by_regex(topic[:-2] + ".*")
            assert r["error_code"] == 0 and {p for _, ps in r["assignment"] for p in ps} == {0, 1, 2}, r


@pytest.mark.parametrize("which", ["min", "max"])
def test_consumer_group_static_members(broker, which):
    """KIP-848 static membership on the wire: a member with an instance id that leaves with
    epoch -2 stays in the group with its partitions; its instance id cannot be taken while it
    is held (UNRELEASED_INSTANCE_ID), is taken over after such a leave at the same group epoch,
    and the replaced member id is then FENCED_INSTANCE_ID; an unknown instance id is
    UNKNOWN_MEMBER_ID."""
    vs = versions(broker, which)
    vh, vd = vs[kg.CONSUMER_GROUP_HEARTBEAT], vs[kg.CONSUMER_GROUP_DESCRIBE]
    group = f"cg-{uuid.uuid4().hex[:8]}"
    name = (lambda: uuid.uuid4().hex) if vh >= 1 else (lambda: "")
    with kp.Conn(broker.host, broker.port) as c:
        topic = new_topic(c, partitions=3)
        find_coordinator(c, vs[kg.FIND_COORDINATOR], group)

        def hb(member, epoch, instance, topics=None, owned=None):
            body = kg.consumer_group_heartbeat_request(vh, group, member, epoch, topics, owned,
                                                       rebalance_timeout_ms=30000 if epoch == 0 else -1,
                                                       instance_id=instance)
            return kg.call(c, kg.CONSUMER_GROUP_HEARTBEAT, vh, body)

        def describe():
            d = kg.call(c, kg.CONSUMER_GROUP_DESCRIBE, vd, kg.consumer_group_describe_request(vd, [group]))["groups"]
            assert d[0]["error_code"] == 0, d
            return d[0]

        joined = wait_until(lambda: (lambda r: r if r["error_code"] not in (kg.COORDINATOR_LOAD_IN_PROGRESS,
                                                                            kg.COORDINATOR_NOT_AVAILABLE) else None)(
            hb(name(), 0, "inst", [topic], owned=[])), WAIT, "the first heartbeat", interval=0.1)
        assert joined["error_code"] == 0, joined
        member, epoch = joined["member_id"], joined["member_epoch"]
        assert {p for _, ps in joined["assignment"] for p in ps} == {0, 1, 2}, joined

        assert hb(name(), 0, "inst", [topic], owned=[])["error_code"] == UNRELEASED_INSTANCE_ID
        assert hb(member, epoch, "other")["error_code"] == kg.UNKNOWN_MEMBER_ID
        left = hb(member, -2, "inst")
        assert (left["error_code"], left["member_epoch"]) == (0, -2), left
        d = describe()
        assert [(m["member_id"], m["member_epoch"], m["instance_id"]) for m in d["members"]] == [(member, -2, "inst")], d
        assert sorted(p for t in d["members"][0]["assignment"] for p in t["partitions"]) == [0, 1, 2], d

        back = hb(name(), 0, "inst", [topic], owned=[])
        assert back["error_code"] == 0 and back["member_id"] != member, back
        assert back["member_epoch"] == epoch == describe()["group_epoch"], (back, epoch)
        assert {p for _, ps in back["assignment"] for p in ps} == {0, 1, 2}, back
        assert hb(member, epoch, "inst")["error_code"] == FENCED_INSTANCE_ID
        assert [m["member_id"] for m in describe()["members"]] == [back["member_id"]]
