"""Hand-written encoders/decoders for the transaction APIs (Kafka 3.9 JSON message
definitions), every version of the ranges below.  Same style as kproto.py (standard library
only); importing this module registers the APIs' names, first flexible versions and encoder
ranges in kproto.

  AddPartitionsToTxn 0-4 (v4+: the batched form brokers send), AddOffsetsToTxn 0-3, EndTxn 0-3, WriteTxnMarkers 1,
  TxnOffsetCommit 0-3, DescribeTransactions 0, ListTransactions 0-1
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import kproto as kp
from kproto import R, W

ADD_PARTITIONS_TO_TXN, ADD_OFFSETS_TO_TXN, END_TXN, WRITE_TXN_MARKERS, TXN_OFFSET_COMMIT = 24, 25, 26, 27, 28
DESCRIBE_TRANSACTIONS, LIST_TRANSACTIONS = 65, 66

NAMES = {
    ADD_PARTITIONS_TO_TXN: "AddPartitionsToTxn", ADD_OFFSETS_TO_TXN: "AddOffsetsToTxn", END_TXN: "EndTxn",
    WRITE_TXN_MARKERS: "WriteTxnMarkers", TXN_OFFSET_COMMIT: "TxnOffsetCommit",
    DESCRIBE_TRANSACTIONS: "DescribeTransactions", LIST_TRANSACTIONS: "ListTransactions",
}
FLEX = {
    ADD_PARTITIONS_TO_TXN: 3, ADD_OFFSETS_TO_TXN: 3, END_TXN: 3, WRITE_TXN_MARKERS: 1, TXN_OFFSET_COMMIT: 3,
    DESCRIBE_TRANSACTIONS: 0, LIST_TRANSACTIONS: 0,
}
ENCODER_RANGES = {
    ADD_PARTITIONS_TO_TXN: (0, 4), ADD_OFFSETS_TO_TXN: (0, 3), END_TXN: (0, 3), WRITE_TXN_MARKERS: (1, 1),
    TXN_OFFSET_COMMIT: (0, 3), DESCRIBE_TRANSACTIONS: (0, 0), LIST_TRANSACTIONS: (0, 1),
}
kp.API_NAMES.update(NAMES)
kp.FLEX.update(FLEX)
kp.ENCODER_RANGES.update(ENCODER_RANGES)

# error codes
COORDINATOR_LOAD_IN_PROGRESS = 14
COORDINATOR_NOT_AVAILABLE = 15
NOT_COORDINATOR = 16
INVALID_PRODUCER_EPOCH = 47
INVALID_TXN_STATE = 48
INVALID_PRODUCER_ID_MAPPING = 49
INVALID_TRANSACTION_TIMEOUT = 50
CONCURRENT_TRANSACTIONS = 51
PRODUCER_FENCED = 90


def _w(api: int, v: int) -> W:
    return W(kp.is_flexible(api, v))


def _topics(w: W, topics: Dict[str, List[int]]) -> None:
    def topic(w, item):
        w.string(item[0]).array(item[1], lambda w, p: w.i32(p)).tags()
    w.array(sorted(topics.items()), topic)


def _partition_errors(r: R) -> Dict[Tuple[str, int], int]:
    out = {}

    def part(rr):
        p = (rr.i32(), rr.i16())
        rr.tags()
        return p

    def topic(rr):
        name = rr.string()
        for idx, code in rr.array(part) or []:
            out[(name, idx)] = code
        rr.tags()

    r.array(topic)
    return out


def add_partitions_to_txn_request(v: int, txn_id: str, pid: int, epoch: int, topics: Dict[str, List[int]],
                                  verify_only: bool = False) -> bytes:
    """v4+ is the batched form a partition leader sends (one transaction here); verify_only
    asks whether the partitions are already in the transaction instead of adding them."""
    w = _w(ADD_PARTITIONS_TO_TXN, v)
    if v >= 4:
        def txn(w, _):
            w.string(txn_id).i64(pid).i16(epoch).bool(verify_only)
            _topics(w, topics)
            w.tags()
        w.array([txn_id], txn)
        return w.tags().done()
    w.string(txn_id).i64(pid).i16(epoch)
    _topics(w, topics)
    return w.tags().done()


def decode_add_partitions_to_txn(r: R, v: int) -> dict:
    """{"throttle_time_ms", "error_code" (v4+), "errors": {(topic, p): code}, "by_txn" (v4+)}:
    for v4+ "errors" merges every transaction's results."""
    out = {"throttle_time_ms": r.i32(), "error_code": 0}
    if v >= 4:
        out["error_code"] = r.i16()
        out["by_txn"] = {}

        def txn(rr):
            tid = rr.string()
            out["by_txn"][tid] = _partition_errors(rr)
            rr.tags()
        r.array(txn)
        out["errors"] = {k: c for errs in out["by_txn"].values() for k, c in errs.items()}
    else:
        out["errors"] = _partition_errors(r)
    r.tags()
    r.end()
    return out


def add_offsets_to_txn_request(v: int, txn_id: str, pid: int, epoch: int, group: str) -> bytes:
    return _w(ADD_OFFSETS_TO_TXN, v).string(txn_id).i64(pid).i16(epoch).string(group).tags().done()


def end_txn_request(v: int, txn_id: str, pid: int, epoch: int, commit: bool) -> bytes:
    return _w(END_TXN, v).string(txn_id).i64(pid).i16(epoch).bool(commit).tags().done()


def decode_error_only(r: R, v: int) -> dict:
    """AddOffsetsToTxn and EndTxn v0-3 answers: throttle time, error code."""
    out = {"throttle_time_ms": r.i32(), "error_code": r.i16()}
    r.tags()
    r.end()
    return out


def txn_offset_commit_request(v: int, txn_id: str, group: str, pid: int, epoch: int,
                              offsets: Dict[str, Dict[int, int]], generation: int = -1, member_id: str = "") -> bytes:
    w = _w(TXN_OFFSET_COMMIT, v)
    w.string(txn_id).string(group).i64(pid).i16(epoch)
    if v >= 3:
        w.i32(generation).string(member_id).nullable_string(None)

    def part(w, item):
        w.i32(item[0]).i64(item[1])
        if v >= 2:
            w.i32(-1)
        w.nullable_string("")
        w.tags()

    def topic(w, item):
        w.string(item[0]).array(sorted(item[1].items()), part).tags()

    w.array(sorted(offsets.items()), topic)
    return w.tags().done()


def decode_txn_offset_commit(r: R, v: int) -> dict:
    out = {"throttle_time_ms": r.i32(), "errors": _partition_errors(r)}
    r.tags()
    r.end()
    return out


def write_txn_markers_request(v: int, markers: List[Tuple[int, int, bool, Dict[str, List[int]], int]]) -> bytes:
    """markers: (producer id, epoch, commit, {topic: [partition]}, coordinator epoch)."""
    w = _w(WRITE_TXN_MARKERS, v)

    def marker(w, m):
        pid, epoch, commit, topics, coordinator_epoch = m
        w.i64(pid).i16(epoch).bool(commit)
        _topics(w, topics)
        w.i32(coordinator_epoch).tags()

    w.array(markers, marker)
    return w.tags().done()


def decode_write_txn_markers(r: R, v: int) -> dict:
    def marker(rr):
        m = {"producer_id": rr.i64(), "errors": _partition_errors(rr)}
        rr.tags()
        return m

    out = {"markers": r.array(marker)}
    r.tags()
    r.end()
    return out


def describe_transactions_request(v: int, txn_ids: List[str]) -> bytes:
    return _w(DESCRIBE_TRANSACTIONS, v).array(txn_ids, lambda w, t: w.string(t)).tags().done()


def decode_describe_transactions(r: R, v: int) -> dict:
    def topic(rr):
        t = (rr.string(), rr.array(lambda r: r.i32()))
        rr.tags()
        return t

    def state(rr):
        s = {"error_code": rr.i16(), "transactional_id": rr.string(), "state": rr.string(),
             "timeout_ms": rr.i32(), "start_time_ms": rr.i64(), "producer_id": rr.i64(),
             "producer_epoch": rr.i16()}
        s["topics"] = dict(rr.array(topic) or [])
        rr.tags()
        return s

    out = {"throttle_time_ms": r.i32(), "states": r.array(state)}
    r.tags()
    r.end()
    return out


def list_transactions_request(v: int, states: Optional[List[str]] = None, pids: Optional[List[int]] = None,
                              duration_ms: int = -1) -> bytes:
    w = _w(LIST_TRANSACTIONS, v)
    w.array(states or [], lambda w, s: w.string(s)).array(pids or [], lambda w, p: w.i64(p))
    if v >= 1:
        w.i64(duration_ms)
    return w.tags().done()


def decode_list_transactions(r: R, v: int) -> dict:
    def state(rr):
        s = {"transactional_id": rr.string(), "producer_id": rr.i64(), "state": rr.string()}
        rr.tags()
        return s

    out = {"throttle_time_ms": r.i32(), "error_code": r.i16(),
           "unknown_state_filters": r.array(lambda r: r.string()), "states": r.array(state)}
    r.tags()
    r.end()
    return out
