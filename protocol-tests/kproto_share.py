"""Hand-written encoders/decoders for the share-group APIs (KIP-932, Kafka 4.1+'s JSON message
definitions), flexible in every version.  Same style as kproto.py (standard library only);
importing this module registers the APIs' names and first flexible versions in kproto.

  ShareGroupHeartbeat 1, ShareGroupDescribe 1, ShareFetch 1, ShareAcknowledge 1
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import kproto as kp
from kproto import R, W

SHARE_GROUP_HEARTBEAT, SHARE_GROUP_DESCRIBE, SHARE_FETCH, SHARE_ACKNOWLEDGE = 76, 77, 78, 79

# The share coordinator's, between brokers.
READ_SHARE_GROUP_STATE, WRITE_SHARE_GROUP_STATE = 84, 85

NAMES = {SHARE_GROUP_HEARTBEAT: "ShareGroupHeartbeat", SHARE_GROUP_DESCRIBE: "ShareGroupDescribe",
         SHARE_FETCH: "ShareFetch", SHARE_ACKNOWLEDGE: "ShareAcknowledge",
         READ_SHARE_GROUP_STATE: "ReadShareGroupState", WRITE_SHARE_GROUP_STATE: "WriteShareGroupState"}
FLEX = {k: 0 for k in NAMES}
ENCODER_RANGES = {k: (1, 1) for k in NAMES}
ENCODER_RANGES.update({READ_SHARE_GROUP_STATE: (0, 0), WRITE_SHARE_GROUP_STATE: (0, 0)})
kp.API_NAMES.update(NAMES)
kp.FLEX.update(FLEX)

# error codes
INVALID_REQUEST = 42
UNKNOWN_MEMBER_ID = 25
FENCED_MEMBER_EPOCH = 110
NOT_COORDINATOR = 16
FENCED_LEADER_EPOCH = 74
INVALID_RECORD_STATE = 121
SHARE_SESSION_NOT_FOUND = 122
INVALID_SHARE_SESSION_EPOCH = 123

ACCEPT, RELEASE, REJECT = 1, 2, 3


def _w() -> W:
    return W(True)


def share_group_heartbeat_request(group: str, member_id: str, member_epoch: int,
                                  topics: Optional[List[str]] = None) -> bytes:
    w = _w().string(group).string(member_id).i32(member_epoch)
    w.nullable_string(None)  # rack id
    w.array(topics, lambda w, t: w.string(t))
    return w.tags().done()


def decode_share_group_heartbeat(r: R) -> dict:
    out = {"throttle_time_ms": r.i32(), "error_code": r.i16(), "error_message": r.string(),
           "member_id": r.string(), "member_epoch": r.i32(), "heartbeat_interval_ms": r.i32(), "assignment": None}
    if r.i8() >= 0:
        def tp(r):
            t = (r.uuid(), r.array(lambda r: r.i32()))
            r.tags()
            return t
        out["assignment"] = r.array(tp)
        r.tags()
    r.tags()
    r.end()
    return out


def share_group_describe_request(groups: List[str]) -> bytes:
    return _w().array(groups, lambda w, g: w.string(g)).bool(False).tags().done()


def decode_share_group_describe(r: R) -> dict:
    def member(r):
        m = {"member_id": r.string(), "rack_id": r.string(), "member_epoch": r.i32(), "client_id": r.string(),
             "client_host": r.string(), "subscribed_topic_names": r.array(lambda r: r.string())}

        def tp(r):
            t = {"topic_id": r.uuid(), "topic": r.string(), "partitions": r.array(lambda r: r.i32())}
            r.tags()
            return t
        m["assignment"] = r.array(tp)
        r.tags()
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


# acknowledgements: {(topic id, partition): [(first, last, [types])]}
Acks = Dict[Tuple[bytes, int], List[Tuple[int, int, List[int]]]]


def _ack_batch(w: W, b) -> None:
    w.i64(b[0]).i64(b[1]).array(b[2], lambda w, t: w.i8(t))
    w.tags()


def _by_topic(parts: List[Tuple[bytes, int]]) -> Dict[bytes, List[int]]:
    out: Dict[bytes, List[int]] = {}
    for t, p in parts:
        out.setdefault(t, []).append(p)
    return out


def share_fetch_request(group: Optional[str], member: Optional[str], epoch: int, partitions: List[Tuple[bytes, int]],
                        acks: Optional[Acks] = None, max_wait_ms: int = 0, max_records: int = 500,
                        forgotten: Optional[List[Tuple[bytes, int]]] = None, min_bytes: int = 1) -> bytes:
    acks = acks or {}
    w = _w().nullable_string(group).nullable_string(member).i32(epoch)
    w.i32(max_wait_ms).i32(min_bytes).i32(1 << 20).i32(max_records).i32(max_records)

    def part(topic):
        def f(w, p):
            w.i32(p).array(acks.get((topic, p), []), _ack_batch)
            w.tags()
        return f

    def topic(w, item):
        t, ps = item
        w.uuid(t).array(ps, part(t))
        w.tags()

    keys = list(dict.fromkeys(list(partitions) + list(acks)))
    w.array(list(_by_topic(keys).items()), topic)

    def forgot(w, item):
        w.uuid(item[0]).array(item[1], lambda w, p: w.i32(p))
        w.tags()
    w.array(list(_by_topic(forgotten or []).items()), forgot)
    return w.tags().done()


def _leader(r: R) -> tuple:
    t = (r.i32(), r.i32())
    r.tags()
    return t


def _endpoints(r: R) -> list:
    def ep(r):
        e = (r.i32(), r.string(), r.i32(), r.string())
        r.tags()
        return e
    return r.array(ep)


def decode_share_fetch(r: R) -> dict:
    def acquired(r):
        a = (r.i64(), r.i64(), r.i16())
        r.tags()
        return a

    def part(r):
        p = {"partition": r.i32(), "error_code": r.i16(), "error_message": r.string(),
             "acknowledge_error_code": r.i16(), "acknowledge_error_message": r.string(),
             "current_leader": _leader(r), "records": r.bytes_(), "acquired": r.array(acquired)}
        r.tags()
        return p

    def topic(r):
        t = {"topic_id": r.uuid(), "partitions": r.array(part)}
        r.tags()
        return t
    out = {"throttle_time_ms": r.i32(), "error_code": r.i16(), "error_message": r.string(),
           "acquisition_lock_timeout_ms": r.i32(), "responses": r.array(topic), "node_endpoints": _endpoints(r)}
    r.tags()
    r.end()
    return out


def share_acknowledge_request(group: Optional[str], member: Optional[str], epoch: int, acks: Acks) -> bytes:
    w = _w().nullable_string(group).nullable_string(member).i32(epoch)

    def topic(w, item):
        t, ps = item

        def part(w, p):
            w.i32(p).array(acks[(t, p)], _ack_batch)
            w.tags()
        w.uuid(t).array(ps, part)
        w.tags()
    w.array(list(_by_topic(list(acks)).items()), topic)
    return w.tags().done()


def decode_share_acknowledge(r: R) -> dict:
    def part(r):
        p = {"partition": r.i32(), "error_code": r.i16(), "error_message": r.string(), "current_leader": _leader(r)}
        r.tags()
        return p

    def topic(r):
        t = {"topic_id": r.uuid(), "partitions": r.array(part)}
        r.tags()
        return t
    out = {"throttle_time_ms": r.i32(), "error_code": r.i16(), "error_message": r.string(),
           "responses": r.array(topic), "node_endpoints": _endpoints(r)}
    r.tags()
    r.end()
    return out


def read_share_group_state_request(group: str, parts: List[Tuple[bytes, int, int]]) -> bytes:
    """parts: (topic id, partition, leader epoch)."""
    by_topic: Dict[bytes, list] = {}
    for t, p, e in parts:
        by_topic.setdefault(t, []).append((p, e))

    def topic(w, item):
        w.uuid(item[0]).array(item[1], lambda w, pe: w.i32(pe[0]).i32(pe[1]).tags())
        w.tags()
    return _w().string(group).array(list(by_topic.items()), topic).tags().done()


def _state_batches(r: R) -> list:
    def batch(r):
        b = (r.i64(), r.i64(), r.i8(), r.i16())
        r.tags()
        return b
    return r.array(batch)


def _state_results(r: R, part_fields) -> dict:
    """Both state responses: results by topic id, each partition's fields read by part_fields."""
    def part(r):
        p = {"partition": r.i32(), "error_code": r.i16(), "error_message": r.string(), **part_fields(r)}
        r.tags()
        return p

    def topic(r):
        t = {"topic_id": r.uuid(), "partitions": r.array(part)}
        r.tags()
        return t
    out = {"results": r.array(topic)}
    r.tags()
    r.end()
    return out


def decode_read_share_group_state(r: R) -> dict:
    return _state_results(r, lambda r: {"state_epoch": r.i32(), "start_offset": r.i64(),
                                        "state_batches": _state_batches(r)})


def write_share_group_state_request(group: str, parts: list) -> bytes:
    """parts: (topic id, partition, state epoch, leader epoch, start offset,
    [(first, last, delivery state, delivery count)])."""
    by_topic: Dict[bytes, list] = {}
    for t, *rest in parts:
        by_topic.setdefault(t, []).append(rest)

    def part(w, x):
        w.i32(x[0]).i32(x[1]).i32(x[2]).i64(x[3])
        w.array(x[4], lambda w, b: w.i64(b[0]).i64(b[1]).i8(b[2]).i16(b[3]).tags())
        w.tags()

    def topic(w, item):
        w.uuid(item[0]).array(item[1], part)
        w.tags()
    return _w().string(group).array(list(by_topic.items()), topic).tags().done()


def decode_write_share_group_state(r: R) -> dict:
    return _state_results(r, lambda r: {})


_DECODERS = {SHARE_GROUP_HEARTBEAT: decode_share_group_heartbeat, SHARE_GROUP_DESCRIBE: decode_share_group_describe,
             SHARE_FETCH: decode_share_fetch, SHARE_ACKNOWLEDGE: decode_share_acknowledge,
             READ_SHARE_GROUP_STATE: decode_read_share_group_state,
             WRITE_SHARE_GROUP_STATE: decode_write_share_group_state}


def call(c: kp.Conn, api: int, body: bytes) -> dict:
    return _DECODERS[api](c.call(api, ENCODER_RANGES[api][1], body))


def partition_of(resp: dict) -> dict:
    """The one partition of a one-partition answer."""
    assert len(resp["responses"]) == 1 and len(resp["responses"][0]["partitions"]) == 1, resp
    return resp["responses"][0]["partitions"][0]
