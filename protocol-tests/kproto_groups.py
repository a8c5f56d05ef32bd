"""Hand-written encoders/decoders for the group-coordinator APIs and OffsetForLeaderEpoch
(Kafka 3.9 JSON message definitions), every version of the ranges below.  Same style as
kproto.py (standard library only); importing this module registers the APIs' names and
first flexible versions in kproto, so kproto.Conn frames them right.

  OffsetCommit 2-9, OffsetFetch 1-9, FindCoordinator 0-4, JoinGroup 0-9, Heartbeat 0-4,
  LeaveGroup 0-5, SyncGroup 0-5, DescribeGroups 0-5, ListGroups 0-4,
  OffsetForLeaderEpoch 2-4, DeleteGroups 0-2, OffsetDelete 0
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import kproto as kp
from kproto import R, W

OFFSET_COMMIT, OFFSET_FETCH, FIND_COORDINATOR, JOIN_GROUP, HEARTBEAT = 8, 9, 10, 11, 12
LEAVE_GROUP, SYNC_GROUP, DESCRIBE_GROUPS, LIST_GROUPS = 13, 14, 15, 16
OFFSET_FOR_LEADER_EPOCH, DELETE_GROUPS, OFFSET_DELETE = 23, 42, 47
# The consumer group protocol (KIP-848, Kafka 4.x's JSON definitions): flexible from v0.
CONSUMER_GROUP_HEARTBEAT, CONSUMER_GROUP_DESCRIBE = 68, 69

NAMES = {
    OFFSET_COMMIT: "OffsetCommit", OFFSET_FETCH: "OffsetFetch", FIND_COORDINATOR: "FindCoordinator",
    JOIN_GROUP: "JoinGroup", HEARTBEAT: "Heartbeat", LEAVE_GROUP: "LeaveGroup", SYNC_GROUP: "SyncGroup",
    DESCRIBE_GROUPS: "DescribeGroups", LIST_GROUPS: "ListGroups",
    OFFSET_FOR_LEADER_EPOCH: "OffsetForLeaderEpoch", DELETE_GROUPS: "DeleteGroups", OFFSET_DELETE: "OffsetDelete",
    CONSUMER_GROUP_HEARTBEAT: "ConsumerGroupHeartbeat", CONSUMER_GROUP_DESCRIBE: "ConsumerGroupDescribe",
}
FLEX = {
    OFFSET_COMMIT: 8, OFFSET_FETCH: 6, FIND_COORDINATOR: 3, JOIN_GROUP: 6, HEARTBEAT: 4, LEAVE_GROUP: 4,
    SYNC_GROUP: 4, DESCRIBE_GROUPS: 5, LIST_GROUPS: 3, OFFSET_FOR_LEADER_EPOCH: 4, DELETE_GROUPS: 2,
    OFFSET_DELETE: 99,  # never flexible
    CONSUMER_GROUP_HEARTBEAT: 0, CONSUMER_GROUP_DESCRIBE: 0,
}
ENCODER_RANGES = {
    OFFSET_COMMIT: (0, 9), OFFSET_FETCH: (0, 9), FIND_COORDINATOR: (0, 4), JOIN_GROUP: (0, 9), HEARTBEAT: (0, 4),
    LEAVE_GROUP: (0, 5), SYNC_GROUP: (0, 5), DESCRIBE_GROUPS: (0, 5), LIST_GROUPS: (0, 5),
    OFFSET_FOR_LEADER_EPOCH: (0, 4), DELETE_GROUPS: (0, 2), OFFSET_DELETE: (0, 0),
    CONSUMER_GROUP_HEARTBEAT: (0, 1), CONSUMER_GROUP_DESCRIBE: (0, 1),
}
kp.API_NAMES.update(NAMES)
kp.FLEX.update(FLEX)

# error codes
COORDINATOR_NOT_AVAILABLE = 15
NOT_COORDINATOR = 16
COORDINATOR_LOAD_IN_PROGRESS = 14
ILLEGAL_GENERATION = 22
INCONSISTENT_GROUP_PROTOCOL = 23
UNKNOWN_MEMBER_ID = 25
REBALANCE_IN_PROGRESS = 27
GROUP_ID_NOT_FOUND = 69
NON_EMPTY_GROUP = 68
MEMBER_ID_REQUIRED = 79
GROUP_SUBSCRIBED_TO_TOPIC = 86
FENCED_MEMBER_EPOCH = 110


def _w(api: int, v: int) -> W:
    return W(kp.is_flexible(api, v))


def _flex(api: int, v: int) -> bool:
    return kp.is_flexible(api, v)


# ---------------------------------------------------------------------------
# consumer protocol (the bytes inside JoinGroup metadata / SyncGroup assignments)
# ---------------------------------------------------------------------------

def consumer_subscription(topics: List[str]) -> bytes:
    """ConsumerProtocolSubscription v0: version, topics, user_data (null)."""
    w = W(False).i16(0).array(topics, lambda w, t: w.string(t)).bytes_(None)
    return w.done()


def consumer_assignment(assign: Dict[str, List[int]]) -> bytes:
    """ConsumerProtocolAssignment v0: version, [topic, [partition]], user_data (null)."""
    def tp(w, item):
        t, parts = item
        w.string(t).array(parts, lambda w, p: w.i32(p))
    return W(False).i16(0).array(sorted(assign.items()), tp).bytes_(None).done()


def decode_consumer_assignment(b: bytes) -> Dict[str, List[int]]:
    r = R(b, False)
    r.i16()
    out = {}
    for t, parts in r.array(lambda r: (r.string(), r.array(lambda r: r.i32()))) or []:
        out[t] = parts
    return out


# ---------------------------------------------------------------------------
# FindCoordinator
# ---------------------------------------------------------------------------

def find_coordinator_request(v: int, key: str, key_type: int = 0) -> bytes:
    w = _w(FIND_COORDINATOR, v)
    if v <= 3:
        w.string(key)
    if v >= 1:
        w.i8(key_type)
    if v >= 4:
        w.array([key], lambda w, k: w.string(k))
    return w.tags().done()


def decode_find_coordinator(r: R, v: int) -> dict:
    """Returns {"throttle_time_ms", "coordinators": [{key, node_id, host, port, error_code, error_message}]}
    (v0-3 answers have one coordinator, key None)."""
    out = {"throttle_time_ms": r.i32() if v >= 1 else 0}
    if v <= 3:
        c = {"key": None, "error_code": r.i16()}
        c["error_message"] = r.nullable_string() if v >= 1 else None
        c["node_id"], c["host"], c["port"] = r.i32(), r.string(), r.i32()
        out["coordinators"] = [c]
    else:
        def coord(r):
            c = {"key": r.string(), "node_id": r.i32(), "host": r.string(), "port": r.i32(),
                 "error_code": r.i16(), "error_message": r.nullable_string()}
            r.tags()
            return c
        out["coordinators"] = r.array(coord)
    r.tags()
    r.end()
    return out


# ---------------------------------------------------------------------------
# JoinGroup / SyncGroup / Heartbeat / LeaveGroup
# ---------------------------------------------------------------------------

def join_group_request(v: int, group: str, member_id: str, protocols: List[Tuple[str, bytes]],
                       session_timeout_ms: int = 30000, rebalance_timeout_ms: int = 30000,
                       protocol_type: str = "consumer", group_instance_id: Optional[str] = None,
                       reason: Optional[str] = None) -> bytes:
    w = _w(JOIN_GROUP, v)
    w.string(group).i32(session_timeout_ms)
    if v >= 1:
        w.i32(rebalance_timeout_ms)
    w.string(member_id)
    if v >= 5:
        w.nullable_string(group_instance_id)
    w.string(protocol_type)

    def proto(w, item):
        name, meta = item
        w.string(name).bytes_(meta).tags()
    w.array(protocols, proto)
    if v >= 8:
        w.nullable_string(reason)
    return w.tags().done()


def decode_join_group(r: R, v: int) -> dict:
    out = {"throttle_time_ms": r.i32() if v >= 2 else 0}
    out["error_code"] = r.i16()
    out["generation_id"] = r.i32()
    out["protocol_type"] = r.nullable_string() if v >= 7 else None
    out["protocol_name"] = r.nullable_string()
    out["leader"] = r.string()
    out["skip_assignment"] = r.bool() if v >= 9 else False
    out["member_id"] = r.string()

    def member(r):
        m = {"member_id": r.string()}
        m["group_instance_id"] = r.nullable_string() if v >= 5 else None
        m["metadata"] = r.bytes_()
        r.tags()
        return m
    out["members"] = r.array(member)
    r.tags()
    r.end()
    return out


def sync_group_request(v: int, group: str, generation: int, member_id: str,
                       assignments: List[Tuple[str, bytes]], protocol_type: Optional[str] = "consumer",
                       protocol_name: Optional[str] = "range", group_instance_id: Optional[str] = None) -> bytes:
    w = _w(SYNC_GROUP, v)
    w.string(group).i32(generation).string(member_id)
    if v >= 3:
        w.nullable_string(group_instance_id)
    if v >= 5:
        w.nullable_string(protocol_type).nullable_string(protocol_name)

    def asg(w, item):
        mid, b = item
        w.string(mid).bytes_(b).tags()
    w.array(assignments, asg)
    return w.tags().done()


def decode_sync_group(r: R, v: int) -> dict:
    out = {"throttle_time_ms": r.i32() if v >= 1 else 0}
    out["error_code"] = r.i16()
    if v >= 5:
        out["protocol_type"] = r.nullable_string()
        out["protocol_name"] = r.nullable_string()
    out["assignment"] = r.bytes_()
    r.tags()
    r.end()
    return out


def heartbeat_request(v: int, group: str, generation: int, member_id: str,
                      group_instance_id: Optional[str] = None) -> bytes:
    w = _w(HEARTBEAT, v)
    w.string(group).i32(generation).string(member_id)
    if v >= 3:
        w.nullable_string(group_instance_id)
    return w.tags().done()


def decode_heartbeat(r: R, v: int) -> dict:
    out = {"throttle_time_ms": r.i32() if v >= 1 else 0, "error_code": r.i16()}
    r.tags()
    r.end()
    return out


def leave_group_request(v: int, group: str, member_ids: List[str], reason: Optional[str] = None) -> bytes:
    w = _w(LEAVE_GROUP, v)
    w.string(group)
    if v <= 2:
        assert len(member_ids) == 1, "LeaveGroup v0-2 carries one member"
        w.string(member_ids[0])
    else:
        def member(w, mid):
            w.string(mid).nullable_string(None)
            if v >= 5:
                w.nullable_string(reason)
            w.tags()
        w.array(member_ids, member)
    return w.tags().done()


def decode_leave_group(r: R, v: int) -> dict:
    out = {"throttle_time_ms": r.i32() if v >= 1 else 0, "error_code": r.i16(), "members": []}
    if v >= 3:
        def member(r):
            m = {"member_id": r.string(), "group_instance_id": r.nullable_string(), "error_code": r.i16()}
            r.tags()
            return m
        out["members"] = r.array(member)
    r.tags()
    r.end()
    return out


# ---------------------------------------------------------------------------
# OffsetCommit / OffsetFetch / OffsetDelete
# ---------------------------------------------------------------------------

def offset_commit_request(v: int, group: str, offsets: Dict[str, Dict[int, int]], generation: int = -1,
                          member_id: str = "", metadata: Optional[str] = "",
                          leader_epoch: int = -1) -> bytes:
    w = _w(OFFSET_COMMIT, v)
    w.string(group)
    if v >= 1:
        w.i32(generation).string(member_id)
    if v >= 7:
        w.nullable_string(None)  # group_instance_id
    if 2 <= v <= 4:
        w.i64(-1)  # retention_time_ms: broker default

    def part(w, item):
        p, off = item
        w.i32(p).i64(off)
        if v == 1:
            w.i64(-1)  # commit_timestamp: the broker's time
        if v >= 6:
            w.i32(leader_epoch)
        w.nullable_string(metadata).tags()

    def topic(w, item):
        t, parts = item
        w.string(t).array(sorted(parts.items()), part).tags()
    w.array(sorted(offsets.items()), topic)
    return w.tags().done()


def decode_offset_commit(r: R, v: int) -> dict:
    """{"throttle_time_ms", "errors": {(topic, partition): error_code}}"""
    out = {"throttle_time_ms": r.i32() if v >= 3 else 0, "errors": {}}

    def part(r):
        p, e = r.i32(), r.i16()
        r.tags()
        return p, e

    def topic(r):
        t = r.string()
        ps = r.array(part)
        r.tags()
        return t, ps
    for t, ps in r.array(topic):
        for p, e in ps:
            out["errors"][(t, p)] = e
    r.tags()
    r.end()
    return out


def offset_fetch_request(v: int, group: str, topics: Optional[Dict[str, List[int]]],
                         require_stable: bool = False) -> bytes:
    """topics None = all the group's committed offsets (v2+)."""
    w = _w(OFFSET_FETCH, v)

    def topic(w, item):
        t, parts = item
        w.string(t).array(parts, lambda w, p: w.i32(p)).tags()
    tlist = None if topics is None else sorted(topics.items())
    if v <= 7:
        w.string(group).array(tlist, topic)
    else:
        def grp(w, g):
            w.string(g)
            if v >= 9:
                w.nullable_string(None).i32(-1)  # member_id, member_epoch: not a KIP-848 member
            w.array(tlist, topic).tags()
        w.array([group], grp)
    if v >= 7:
        w.bool(require_stable)
    return w.tags().done()


def decode_offset_fetch(r: R, v: int) -> dict:
    """{"throttle_time_ms", "error_code", "offsets": {(topic, p): (offset, leader_epoch, metadata, error_code)}}"""
    out = {"throttle_time_ms": r.i32() if v >= 3 else 0, "error_code": 0, "offsets": {}}

    def part(r):
        p, off = r.i32(), r.i64()
        epoch = r.i32() if v >= 5 else -1
        meta, err = r.nullable_string(), r.i16()
        r.tags()
        return p, (off, epoch, meta, err)

    def topic(r):
        t = r.string()
        ps = r.array(part)
        r.tags()
        return t, ps

    def add(topics):
        for t, ps in topics:
            for p, val in ps:
                out["offsets"][(t, p)] = val

    if v <= 7:
        add(r.array(topic))
        if v >= 2:
            out["error_code"] = r.i16()
    else:
        def grp(r):
            g = r.string()
            ts = r.array(topic)
            e = r.i16()
            r.tags()
            return g, ts, e
        groups = r.array(grp)
        assert len(groups) == 1, groups
        add(groups[0][1])
        out["error_code"] = groups[0][2]
        out["group_id"] = groups[0][0]
    r.tags()
    r.end()
    return out


def offset_delete_request(v: int, group: str, topics: Dict[str, List[int]]) -> bytes:
    w = W(False).string(group)

    def topic(w, item):
        t, parts = item
        w.string(t).array(parts, lambda w, p: w.i32(p))
    w.array(sorted(topics.items()), topic)
    return w.done()


def decode_offset_delete(r: R, v: int) -> dict:
    out = {"error_code": r.i16(), "throttle_time_ms": r.i32(), "errors": {}}
    for t, ps in r.array(lambda r: (r.string(), r.array(lambda r: (r.i32(), r.i16())))):
        for p, e in ps:
            out["errors"][(t, p)] = e
    r.end()
    return out


# ---------------------------------------------------------------------------
# DescribeGroups / ListGroups / DeleteGroups
# ---------------------------------------------------------------------------

def describe_groups_request(v: int, groups: List[str], include_ops: bool = False) -> bytes:
    w = _w(DESCRIBE_GROUPS, v)
    w.array(groups, lambda w, g: w.string(g))
    if v >= 3:
        w.bool(include_ops)
    return w.tags().done()


def decode_describe_groups(r: R, v: int) -> dict:
    out = {"throttle_time_ms": r.i32() if v >= 1 else 0}

    def member(r):
        m = {"member_id": r.string()}
        m["group_instance_id"] = r.nullable_string() if v >= 4 else None
        m["client_id"], m["client_host"] = r.string(), r.string()
        m["metadata"], m["assignment"] = r.bytes_(), r.bytes_()
        r.tags()
        return m

    def group(r):
        g = {"error_code": r.i16(), "group_id": r.string(), "state": r.string(), "protocol_type": r.string(),
             "protocol_data": r.string()}
        g["members"] = r.array(member)
        g["authorized_operations"] = r.i32() if v >= 3 else None
        r.tags()
        return g
    out["groups"] = r.array(group)
    r.tags()
    r.end()
    return out


def list_groups_request(v: int, states: Optional[List[str]] = None, types: Optional[List[str]] = None) -> bytes:
    w = _w(LIST_GROUPS, v)
    if v >= 4:
        w.array(states or [], lambda w, s: w.string(s))
    if v >= 5:
        w.array(types or [], lambda w, s: w.string(s))
    return w.tags().done()


def decode_list_groups(r: R, v: int) -> dict:
    out = {"throttle_time_ms": r.i32() if v >= 1 else 0, "error_code": r.i16()}

    def group(r):
        g = {"group_id": r.string(), "protocol_type": r.string()}
        g["state"] = r.string() if v >= 4 else None
        g["type"] = r.string() if v >= 5 else None
        r.tags()
        return g
    out["groups"] = r.array(group)
    r.tags()
    r.end()
    return out


def delete_groups_request(v: int, groups: List[str]) -> bytes:
    return _w(DELETE_GROUPS, v).array(groups, lambda w, g: w.string(g)).tags().done()


def decode_delete_groups(r: R, v: int) -> dict:
    out = {"throttle_time_ms": r.i32(), "results": {}}

    def res(r):
        g, e = r.string(), r.i16()
        r.tags()
        return g, e
    out["results"] = dict(r.array(res))
    r.tags()
    r.end()
    return out


# ---------------------------------------------------------------------------
# OffsetForLeaderEpoch
# ---------------------------------------------------------------------------

def offset_for_leader_epoch_request(v: int, topics: Dict[str, Dict[int, Tuple[int, int]]],
                                    replica_id: int = -1) -> bytes:
    """topics: {topic: {partition: (current_leader_epoch, leader_epoch)}}"""
    w = _w(OFFSET_FOR_LEADER_EPOCH, v)
    if v >= 3:
        w.i32(replica_id)

    def part(w, item):
        p, (cur, ep) = item
        w.i32(p)
        if v >= 2:
            w.i32(cur)
        w.i32(ep).tags()

    def topic(w, item):
        t, parts = item
        w.string(t).array(sorted(parts.items()), part).tags()
    w.array(sorted(topics.items()), topic)
    return w.tags().done()


def decode_offset_for_leader_epoch(r: R, v: int) -> dict:
    """{"throttle_time_ms", "partitions": {(topic, p): (error_code, leader_epoch, end_offset)}}"""
    out = {"throttle_time_ms": r.i32() if v >= 2 else 0, "partitions": {}}

    def part(r):
        e, p = r.i16(), r.i32()
        ep = r.i32() if v >= 1 else -1
        end = r.i64()
        r.tags()
        return p, (e, ep, end)

    def topic(r):
        t = r.string()
        ps = r.array(part)
        r.tags()
        return t, ps
    for t, ps in r.array(topic):
        for p, val in ps:
            out["partitions"][(t, p)] = val
    r.tags()
    r.end()
    return out


# ---------------------------------------------------------------------------
# calls on a kproto.Conn
# ---------------------------------------------------------------------------

_DECODERS = {
    FIND_COORDINATOR: decode_find_coordinator, JOIN_GROUP: decode_join_group, SYNC_GROUP: decode_sync_group,
    HEARTBEAT: decode_heartbeat, LEAVE_GROUP: decode_leave_group, OFFSET_COMMIT: decode_offset_commit,
    OFFSET_FETCH: decode_offset_fetch, OFFSET_DELETE: decode_offset_delete,
    DESCRIBE_GROUPS: decode_describe_groups, LIST_GROUPS: decode_list_groups, DELETE_GROUPS: decode_delete_groups,
    OFFSET_FOR_LEADER_EPOCH: decode_offset_for_leader_epoch,
}


# ConsumerGroupHeartbeat / ConsumerGroupDescribe (KIP-848) ------------------------

def consumer_group_heartbeat_request(v: int, group: str, member_id: str, member_epoch: int,
                                     topics: Optional[List[str]] = None, owned: Optional[list] = None,
                                     rebalance_timeout_ms: int = -1, assignor: Optional[str] = None,
                                     regex: Optional[str] = None, instance_id: Optional[str] = None) -> bytes:
    """`topics`/`owned` None: unchanged since the last heartbeat (Kafka's null fields);
    `owned`: [(topic id, [partitions])]."""
    w = _w(CONSUMER_GROUP_HEARTBEAT, v)
    w.string(group).string(member_id).i32(member_epoch)
    w.nullable_string(instance_id).nullable_string(None)  # instance id, rack id
    w.i32(rebalance_timeout_ms)
    w.array(topics, lambda w, t: w.string(t))
    if v >= 1:
        w.nullable_string(regex)  # subscribed topic regex
    w.nullable_string(assignor)

    def tp(w, item):
        w.uuid(item[0])
        w.array(item[1], lambda w, p: w.i32(p))
        w.tags()
    w.array(owned, tp)
    return w.tags().done()


def _cg_topic_partitions(r: R) -> list:
    def tp(r):
        t = (r.uuid(), r.array(lambda r: r.i32()))
        r.tags()
        return t
    return r.array(tp)


def decode_consumer_group_heartbeat(r: R, v: int) -> dict:
    out = {"throttle_time_ms": r.i32(), "error_code": r.i16(), "error_message": r.string(),
           "member_id": r.string(), "member_epoch": r.i32(), "heartbeat_interval_ms": r.i32()}
    out["assignment"] = None
    if r.i8() >= 0:
        out["assignment"] = _cg_topic_partitions(r)
        r.tags()
    r.tags()
    r.end()
    return out


def consumer_group_describe_request(v: int, groups: List[str], authorized_operations: bool = False) -> bytes:
    w = _w(CONSUMER_GROUP_DESCRIBE, v)
    w.array(groups, lambda w, g: w.string(g))
    w.bool(authorized_operations)
    return w.tags().done()


def decode_consumer_group_describe(r: R, v: int) -> dict:
    def assignment(r):
        def tp(r):
            t = {"topic_id": r.uuid(), "topic": r.string(), "partitions": r.array(lambda r: r.i32())}
            r.tags()
            return t
        a = r.array(tp)
        r.tags()
        return a

    def member(r):
        m = {"member_id": r.string(), "instance_id": r.string(), "rack_id": r.string(),
             "member_epoch": r.i32(), "client_id": r.string(), "client_host": r.string(),
             "subscribed_topic_names": r.array(lambda r: r.string()), "subscribed_topic_regex": r.string(),
             "assignment": assignment(r), "target_assignment": assignment(r)}
        m["member_type"] = r.i8() if v >= 1 else None
        r.tags()
        return m

    def group(r):
        g = {"error_code": r.i16(), "error_message": r.string(), "group_id": r.string(), "state": r.string(),
             "group_epoch": r.i32(), "assignment_epoch": r.i32(), "assignor": r.string(),
             "members": r.array(member), "authorized_operations": r.i32()}
        r.tags()
        return g
    out = {"throttle_time_ms": r.i32(), "groups": r.array(group)}
    r.tags()
    r.end()
    return out


_DECODERS.update({CONSUMER_GROUP_HEARTBEAT: decode_consumer_group_heartbeat,
                  CONSUMER_GROUP_DESCRIBE: decode_consumer_group_describe})


def call(c: kp.Conn, api: int, v: int, body: bytes) -> dict:
    return _DECODERS[api](c.call(api, v, body), v)


def send(c: kp.Conn, api: int, v: int, body: bytes) -> int:
    return c.send(api, v, body)


def recv(c: kp.Conn, api: int, v: int, corr: int) -> dict:
    return _DECODERS[api](c.recv(api, v, corr), v)

