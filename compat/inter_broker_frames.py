"""Raw frames of Kafka's inter-broker (ZooKeeper-mode controller) RPCs, for compat tests.

Written from the Kafka 3.9 message schemas (clients/src/main/resources/common/message/):

  LeaderAndIsr       (key 4)  versions 0-7, flexible from 4
  StopReplica        (key 5)  versions 0-4, flexible from 2
  UpdateMetadata     (key 6)  versions 0-8, flexible from 6
  ControlledShutdown (key 7)  versions 0-3, flexible from 3
  AlterPartition     (key 56) versions 0-3, all flexible

Every version of these five request/response pairs is encoded/decoded here (the tests use the
min and max advertised ones, and the versions gregor itself sends).  Headers: request header
v2 for flexible versions, v1 otherwise, except ControlledShutdown v0, which uses request header
v0 (no client id); responses use header v1 (with a tagged-field section) when flexible, else v0.

Only the standard library: a writer/reader with Kafka's classic and compact encodings, and a
connection with its own correlation ids.  Requests are plain dicts/lists (see each encoder).
"""
from __future__ import annotations

import base64
import socket
import struct
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

LEADER_AND_ISR, STOP_REPLICA, UPDATE_METADATA, CONTROLLED_SHUTDOWN, ALTER_PARTITION = 4, 5, 6, 7, 56
API_VERSIONS = 18

NAMES = {LEADER_AND_ISR: "LeaderAndIsr", STOP_REPLICA: "StopReplica", UPDATE_METADATA: "UpdateMetadata",
         CONTROLLED_SHUTDOWN: "ControlledShutdown", ALTER_PARTITION: "AlterPartition"}

# (min, max) as Kafka 3.9 in ZooKeeper mode advertises them
RANGES = {LEADER_AND_ISR: (0, 7), STOP_REPLICA: (0, 4), UPDATE_METADATA: (0, 8),
          CONTROLLED_SHUTDOWN: (0, 3), ALTER_PARTITION: (0, 3)}
FIRST_FLEXIBLE = {LEADER_AND_ISR: 4, STOP_REPLICA: 2, UPDATE_METADATA: 6, CONTROLLED_SHUTDOWN: 3,
                  ALTER_PARTITION: 0}

# error codes used by the tests
NONE = 0
NOT_LEADER_OR_FOLLOWER = 6
BROKER_NOT_AVAILABLE = 8
STALE_CONTROLLER_EPOCH = 11
NOT_CONTROLLER = 41
FENCED_LEADER_EPOCH = 74
STALE_BROKER_EPOCH = 77
INVALID_UPDATE_VERSION = 95
UNKNOWN_TOPIC_ID = 100
INELIGIBLE_REPLICA = 107


def flexible(api_key: int, version: int) -> bool:
    lo, hi = RANGES[api_key]
    if not lo <= version <= hi:
        raise ValueError(f"{NAMES[api_key]} v{version} is not a Kafka 3.9 version ({lo}-{hi})")
    return version >= FIRST_FLEXIBLE[api_key]


def request_header_version(api_key: int, version: int) -> int:
    if flexible(api_key, version):
        return 2
    if api_key == CONTROLLED_SHUTDOWN and version == 0:
        return 0
    return 1


def response_header_version(api_key: int, version: int) -> int:
    return 1 if flexible(api_key, version) else 0


def topic_id_from_kafka(s: str) -> bytes:
    """Kafka's topic id string (as in /brokers/topics/<t> "topic_id": URL-safe base64, no padding)."""
    raw = base64.urlsafe_b64decode(s + "=" * (-len(s) % 4))
    assert len(raw) == 16, f"topic id {s!r} is {len(raw)} bytes"
    return raw


# ---------------------------------------------------------------------------
# primitives
# ---------------------------------------------------------------------------

def _uvarint(n: int) -> bytes:
    assert 0 <= n < 1 << 32
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


class Writer:
    def __init__(self, flex: bool):
        self.flex = flex
        self.buf = bytearray()

    def i8(self, v: int) -> "Writer":
        self.buf += struct.pack(">b", v)
        return self

    def bool(self, v: bool) -> "Writer":
        self.buf += b"\x01" if v else b"\x00"
        return self

    def i16(self, v: int) -> "Writer":
        self.buf += struct.pack(">h", v)
        return self

    def i32(self, v: int) -> "Writer":
        self.buf += struct.pack(">i", v)
        return self

    def i64(self, v: int) -> "Writer":
        self.buf += struct.pack(">q", v)
        return self

    def uuid(self, v: bytes) -> "Writer":
        assert len(v) == 16
        self.buf += v
        return self

    def uvarint(self, v: int) -> "Writer":
        self.buf += _uvarint(v)
        return self

    def _len(self, n: Optional[int], string: bool) -> None:
        if self.flex:
            self.buf += _uvarint(0 if n is None else n + 1)
        elif string:
            self.buf += struct.pack(">h", -1 if n is None else n)
        else:
            self.buf += struct.pack(">i", -1 if n is None else n)

    def string(self, s: Optional[str]) -> "Writer":
        if s is None:
            self._len(None, True)
        else:
            b = s.encode()
            self._len(len(b), True)
            self.buf += b
        return self

    def array(self, items: Sequence[Any], fn: Callable[["Writer", Any], None]) -> "Writer":
        self._len(len(items), False)
        for it in items:
            fn(self, it)
        return self

    def i32s(self, vs: Sequence[int]) -> "Writer":
        return self.array(list(vs), lambda w, v: w.i32(v))

    def tags(self, fields: Optional[Dict[int, bytes]] = None) -> "Writer":
        """A tagged-field section; only in flexible versions."""
        if self.flex:
            fields = fields or {}
            self.buf += _uvarint(len(fields))
            for tag in sorted(fields):
                self.buf += _uvarint(tag) + _uvarint(len(fields[tag])) + fields[tag]
        return self

    def done(self) -> bytes:
        return bytes(self.buf)


class FrameError(Exception):
    pass


class Reader:
    def __init__(self, data: bytes, flex: bool):
        self.d = data
        self.o = 0
        self.flex = flex

    def take(self, n: int) -> bytes:
        if n < 0 or self.o + n > len(self.d):
            raise FrameError(f"need {n} bytes at offset {self.o} of {len(self.d)}")
        b = self.d[self.o:self.o + n]
        self.o += n
        return b

    def i8(self) -> int:
        return struct.unpack(">b", self.take(1))[0]

    def bool(self) -> bool:
        return self.take(1) != b"\x00"

    def i16(self) -> int:
        return struct.unpack(">h", self.take(2))[0]

    def i32(self) -> int:
        return struct.unpack(">i", self.take(4))[0]

    def i64(self) -> int:
        return struct.unpack(">q", self.take(8))[0]

    def uuid(self) -> bytes:
        return self.take(16)

    def uvarint(self) -> int:
        n = shift = 0
        while True:
            b = self.take(1)[0]
            n |= (b & 0x7F) << shift
            if not b & 0x80:
                return n
            shift += 7
            if shift > 28:
                raise FrameError("uvarint longer than 5 bytes")

    def _len(self, string: bool) -> int:
        if self.flex:
            return self.uvarint() - 1
        return self.i16() if string else self.i32()

    def string(self) -> Optional[str]:
        n = self._len(True)
        return None if n < 0 else self.take(n).decode()

    def array(self, fn: Callable[["Reader"], Any]) -> List[Any]:
        n = self._len(False)
        if n < 0:
            raise FrameError("null array")
        if n > len(self.d) - self.o:
            raise FrameError(f"array of {n} in {len(self.d) - self.o} bytes")
        return [fn(self) for _ in range(n)]

    def i32s(self) -> List[int]:
        return self.array(lambda r: r.i32())

    def tags(self) -> Dict[int, bytes]:
        out: Dict[int, bytes] = {}
        if self.flex:
            for _ in range(self.uvarint()):
                tag = self.uvarint()
                out[tag] = self.take(self.uvarint())
        return out

    def end(self) -> None:
        if self.o != len(self.d):
            raise FrameError(f"{len(self.d) - self.o} trailing bytes after the response body")


# ---------------------------------------------------------------------------
# framing
# ---------------------------------------------------------------------------

def request_header(api_key: int, version: int, corr: int, client_id: Optional[str] = "gregor-controller-test") -> bytes:
    hv = request_header_version(api_key, version)
    w = Writer(False).i16(api_key).i16(version).i32(corr)
    if hv >= 1:
        w.string(client_id)  # a classic nullable string even in header v2
    if hv >= 2:
        w.uvarint(0)
    return w.done()


def encode_request(api_key: int, version: int, corr: int, body: bytes, **kw) -> bytes:
    payload = request_header(api_key, version, corr, **kw) + body
    return struct.pack(">i", len(payload)) + payload


def split_response(api_key: int, version: int, payload: bytes) -> Tuple[int, Reader]:
    flex = flexible(api_key, version)
    r = Reader(payload, flex)
    corr = r.i32()
    if response_header_version(api_key, version) >= 1:
        r.tags()
    return corr, r


def recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError(f"connection closed after {len(buf)} of {n} bytes")
        buf += chunk
    return bytes(buf)


def recv_frame(sock: socket.socket) -> bytes:
    (size,) = struct.unpack(">i", recv_exact(sock, 4))
    if size < 4:
        raise FrameError(f"response frame size {size}")
    return recv_exact(sock, size)


def wait_closed(sock: socket.socket, timeout: float = 15.0) -> Tuple[bool, bytes]:
    """(closed, bytes received before the close) -- closed is False if still open at the deadline."""
    got = bytearray()
    deadline = time.monotonic() + timeout
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return False, bytes(got)
            sock.settimeout(left)
            chunk = sock.recv(65536)
            if not chunk:
                return True, bytes(got)
            got += chunk
    except (ConnectionResetError, BrokenPipeError):
        return True, bytes(got)
    except socket.timeout:
        return False, bytes(got)


class Conn:
    """One connection with its own correlation ids.  `call` returns the body reader."""

    def __init__(self, host: str, port: int, timeout: float = 30.0):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.settimeout(timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.corr = 4000

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> "Conn":
        return self

    def __exit__(self, *a) -> None:
        self.close()

    def send(self, api_key: int, version: int, body: bytes, **kw) -> int:
        self.corr += 1
        self.sock.sendall(encode_request(api_key, version, self.corr, body, **kw))
        return self.corr

    def recv(self, api_key: int, version: int, corr: int) -> Reader:
        got, r = split_response(api_key, version, recv_frame(self.sock))
        if got != corr:
            raise FrameError(f"{NAMES[api_key]} v{version}: correlation id {got} != {corr}")
        return r

    def call(self, api_key: int, version: int, body: bytes, **kw) -> Reader:
        return self.recv(api_key, version, self.send(api_key, version, body, **kw))

    def api_versions(self) -> Dict[int, Tuple[int, int]]:
        """ApiVersions v0 (header v1, response header v0)."""
        self.corr += 1
        payload = Writer(False).i16(API_VERSIONS).i16(0).i32(self.corr).string("gregor-controller-test").done()
        self.sock.sendall(struct.pack(">i", len(payload)) + payload)
        r = Reader(recv_frame(self.sock), False)
        if r.i32() != self.corr:
            raise FrameError("ApiVersions: correlation id mismatch")
        err = r.i16()
        if err:
            raise FrameError(f"ApiVersions error {err}")
        out = {}
        for k, lo, hi in r.array(lambda rr: (rr.i16(), rr.i16(), rr.i16())):
            out[k] = (lo, hi)
        return out


# ---------------------------------------------------------------------------
# LeaderAndIsr (4)
# ---------------------------------------------------------------------------

def partition_state(partition: int, leader: int, leader_epoch: int, isr: Sequence[int], replicas: Sequence[int],
                    partition_epoch: int, controller_epoch: int, is_new: bool = False,
                    adding: Sequence[int] = (), removing: Sequence[int] = (), leader_recovery_state: int = 0) -> dict:
    return {"partition": partition, "controller_epoch": controller_epoch, "leader": leader,
            "leader_epoch": leader_epoch, "isr": list(isr), "partition_epoch": partition_epoch,
            "replicas": list(replicas), "adding": list(adding), "removing": list(removing), "is_new": is_new,
            "leader_recovery_state": leader_recovery_state}


def leader_and_isr_request(version: int, controller_id: int, controller_epoch: int, topics: List[dict],
                           live_leaders: List[Tuple[int, str, int]], broker_epoch: int = -1,
                           request_type: int = 0, is_kraft_controller: bool = False) -> bytes:
    """topics: [{"name", "topic_id" (16 bytes, v5+), "partitions": [partition_state(...)]}];
    live_leaders: [(broker id, host, port)]."""
    flex = flexible(LEADER_AND_ISR, version)
    w = Writer(flex)

    def state(w: Writer, item) -> None:
        name, p = item
        if version <= 1:
            w.string(name)
        w.i32(p["partition"]).i32(p["controller_epoch"]).i32(p["leader"]).i32(p["leader_epoch"])
        w.i32s(p["isr"]).i32(p["partition_epoch"]).i32s(p["replicas"])
        if version >= 3:
            w.i32s(p["adding"]).i32s(p["removing"])
        if version >= 1:
            w.bool(p["is_new"])
        if version >= 6:
            w.i8(p["leader_recovery_state"])
        w.tags()

    def topic(w: Writer, t) -> None:
        w.string(t["name"])
        if version >= 5:
            w.uuid(t.get("topic_id", b"\x00" * 16))
        w.array([(None, p) for p in t["partitions"]], state)
        w.tags()

    w.i32(controller_id)
    if version >= 7:
        w.bool(is_kraft_controller)
    w.i32(controller_epoch)
    if version >= 2:
        w.i64(broker_epoch)
    if version >= 5:
        w.i8(request_type)
    if version <= 1:
        w.array([(t["name"], p) for t in topics for p in t["partitions"]], state)
    else:
        w.array(topics, topic)
    w.array(live_leaders, lambda w, l: w.i32(l[0]).string(l[1]).i32(l[2]).tags())
    return w.tags().done()


def decode_leader_and_isr_response(r: Reader, version: int) -> dict:
    """{"error_code", "partitions": [(topic name (v0-4) or topic id bytes (v5+), partition, error)]}."""
    out = {"error_code": r.i16(), "partitions": []}
    if version <= 4:
        def perr(rr):
            e = (rr.string(), rr.i32(), rr.i16())
            rr.tags()
            return e
        out["partitions"] = r.array(perr)
    else:
        def topic(rr):
            tid = rr.uuid()

            def perr(r3):
                e = (tid, r3.i32(), r3.i16())
                r3.tags()
                return e
            errs = rr.array(perr)
            rr.tags()
            return errs
        out["partitions"] = [e for errs in r.array(topic) for e in errs]
    r.tags()
    r.end()
    return out


# ---------------------------------------------------------------------------
# StopReplica (5)
# ---------------------------------------------------------------------------

def stop_replica_request(version: int, controller_id: int, controller_epoch: int,
                         topics: Dict[str, List[Tuple[int, int, bool]]], broker_epoch: int = -1,
                         delete_partitions: bool = False, is_kraft_controller: bool = False) -> bytes:
    """topics: {name: [(partition, leader_epoch, delete_partition)]}.  v0-2 carry one request-wide
    `delete_partitions` flag (the per-partition flag and leader epoch are v3+)."""
    flex = flexible(STOP_REPLICA, version)
    w = Writer(flex)
    w.i32(controller_id)
    if version >= 4:
        w.bool(is_kraft_controller)
    w.i32(controller_epoch)
    if version >= 1:
        w.i64(broker_epoch)
    if version <= 2:
        w.bool(delete_partitions)
    if version == 0:
        w.array([(n, p[0]) for n, ps in topics.items() for p in ps], lambda w, x: w.string(x[0]).i32(x[1]))
    elif version <= 2:
        w.array(list(topics.items()), lambda w, t: w.string(t[0]).i32s([p[0] for p in t[1]]).tags())
    else:
        def part(w, p):
            w.i32(p[0]).i32(p[1]).bool(p[2]).tags()
        w.array(list(topics.items()), lambda w, t: (w.string(t[0]), w.array(t[1], part), w.tags()))
    return w.tags().done()


def decode_stop_replica_response(r: Reader, version: int) -> dict:
    def perr(rr):
        e = (rr.string(), rr.i32(), rr.i16())
        rr.tags()
        return e
    out = {"error_code": r.i16(), "partitions": r.array(perr)}
    r.tags()
    r.end()
    return out


# ---------------------------------------------------------------------------
# UpdateMetadata (6)
# ---------------------------------------------------------------------------

def um_partition_state(partition: int, leader: int, leader_epoch: int, isr: Sequence[int], replicas: Sequence[int],
                       zk_version: int, controller_epoch: int, offline: Sequence[int] = ()) -> dict:
    return {"partition": partition, "controller_epoch": controller_epoch, "leader": leader,
            "leader_epoch": leader_epoch, "isr": list(isr), "zk_version": zk_version, "replicas": list(replicas),
            "offline": list(offline)}


def um_broker(broker_id: int, host: str, port: int, listener: str = "PLAINTEXT", security_protocol: int = 0,
              rack: Optional[str] = None) -> dict:
    return {"id": broker_id, "endpoints": [(port, host, listener, security_protocol)], "rack": rack}


def update_metadata_request(version: int, controller_id: int, controller_epoch: int, topics: List[dict],
                            live_brokers: List[dict], broker_epoch: int = -1, request_type: int = 0,
                            is_kraft_controller: bool = False) -> bytes:
    """topics: [{"name", "topic_id" (v7+), "partitions": [um_partition_state(...)]}];
    live_brokers: [um_broker(...)] (v0 sends only the first endpoint's host and port)."""
    flex = flexible(UPDATE_METADATA, version)
    w = Writer(flex)

    def state(w: Writer, item) -> None:
        name, p = item
        if version <= 4:
            w.string(name)
        w.i32(p["partition"]).i32(p["controller_epoch"]).i32(p["leader"]).i32(p["leader_epoch"])
        w.i32s(p["isr"]).i32(p["zk_version"]).i32s(p["replicas"])
        if version >= 4:
            w.i32s(p["offline"])
        w.tags()

    def topic(w: Writer, t) -> None:
        w.string(t["name"])
        if version >= 7:
            w.uuid(t.get("topic_id", b"\x00" * 16))
        w.array([(None, p) for p in t["partitions"]], state)
        w.tags()

    def endpoint(w: Writer, e) -> None:
        port, host, listener, proto = e
        w.i32(port).string(host)
        if version >= 3:
            w.string(listener)
        w.i16(proto)
        w.tags()

    def broker(w: Writer, b) -> None:
        w.i32(b["id"])
        if version == 0:
            port, host = b["endpoints"][0][0], b["endpoints"][0][1]
            w.string(host).i32(port)
        else:
            w.array(b["endpoints"], endpoint)
        if version >= 2:
            w.string(b["rack"])
        w.tags()

    w.i32(controller_id)
    if version >= 8:
        w.bool(is_kraft_controller)
    w.i32(controller_epoch)
    if version >= 5:
        w.i64(broker_epoch)
    if version <= 4:
        w.array([(t["name"], p) for t in topics for p in t["partitions"]], state)
    else:
        w.array(topics, topic)
    w.array(live_brokers, broker)
    # v8+: Type is tagged field 0, written only when not the default 0
    w.tags({0: struct.pack(">b", request_type)} if version >= 8 and request_type else None)
    return w.done()


def decode_update_metadata_response(r: Reader, version: int) -> dict:
    out = {"error_code": r.i16()}
    r.tags()
    r.end()
    return out


# ---------------------------------------------------------------------------
# ControlledShutdown (7)
# ---------------------------------------------------------------------------

def controlled_shutdown_request(version: int, broker_id: int, broker_epoch: int = -1) -> bytes:
    w = Writer(flexible(CONTROLLED_SHUTDOWN, version)).i32(broker_id)
    if version >= 2:
        w.i64(broker_epoch)
    return w.tags().done()


def decode_controlled_shutdown_response(r: Reader, version: int) -> dict:
    def rem(rr):
        p = (rr.string(), rr.i32())
        rr.tags()
        return p
    out = {"error_code": r.i16(), "remaining": r.array(rem)}
    r.tags()
    r.end()
    return out


# ---------------------------------------------------------------------------
# AlterPartition (56)
# ---------------------------------------------------------------------------

def ap_partition(partition: int, leader_epoch: int, new_isr: Sequence[Tuple[int, int]], partition_epoch: int,
                 leader_recovery_state: int = 0) -> dict:
    """new_isr: [(broker id, broker epoch)] (v0-2 send only the ids)."""
    return {"partition": partition, "leader_epoch": leader_epoch, "new_isr": list(new_isr),
            "leader_recovery_state": leader_recovery_state, "partition_epoch": partition_epoch}


def alter_partition_request(version: int, broker_id: int, broker_epoch: int, topics: List[dict]) -> bytes:
    """topics: [{"name" (v0-1) / "topic_id" (16 bytes, v2+), "partitions": [ap_partition(...)]}]."""
    w = Writer(flexible(ALTER_PARTITION, version))

    def part(w: Writer, p) -> None:
        w.i32(p["partition"]).i32(p["leader_epoch"])
        if version <= 2:
            w.i32s([b for b, _ in p["new_isr"]])
        else:
            w.array(p["new_isr"], lambda w, b: w.i32(b[0]).i64(b[1]).tags())
        if version >= 1:
            w.i8(p["leader_recovery_state"])
        w.i32(p["partition_epoch"])
        w.tags()

    def topic(w: Writer, t) -> None:
        if version <= 1:
            w.string(t["name"])
        else:
            w.uuid(t["topic_id"])
        w.array(t["partitions"], part)
        w.tags()

    w.i32(broker_id).i64(broker_epoch)
    w.array(topics, topic)
    return w.tags().done()


def decode_alter_partition_response(r: Reader, version: int) -> dict:
    """{"throttle_time_ms", "error_code", "partitions": [{"topic", "partition", "error_code", "leader_id",
    "leader_epoch", "isr", "leader_recovery_state", "partition_epoch"}]} (topic = name v0-1, id bytes v2+)."""
    out = {"throttle_time_ms": r.i32(), "error_code": r.i16(), "partitions": []}

    def topic(rr):
        key = rr.string() if version <= 1 else rr.uuid()

        def part(r3):
            p = {"topic": key, "partition": r3.i32(), "error_code": r3.i16(), "leader_id": r3.i32(),
                 "leader_epoch": r3.i32(), "isr": r3.i32s()}
            p["leader_recovery_state"] = r3.i8() if version >= 1 else 0
            p["partition_epoch"] = r3.i32()
            r3.tags()
            return p
        ps = rr.array(part)
        rr.tags()
        return ps

    out["partitions"] = [p for ps in r.array(topic) for p in ps]
    r.tags()
    r.end()
    return out


DECODERS = {LEADER_AND_ISR: decode_leader_and_isr_response, STOP_REPLICA: decode_stop_replica_response,
            UPDATE_METADATA: decode_update_metadata_response,
            CONTROLLED_SHUTDOWN: decode_controlled_shutdown_response,
            ALTER_PARTITION: decode_alter_partition_response}


def call(host: str, port: int, api_key: int, version: int, body: bytes, timeout: float = 30.0) -> dict:
    """One request on a fresh connection; the decoded response."""
    with Conn(host, port, timeout) as c:
        return DECODERS[api_key](c.call(api_key, version, body), version)
