"""Hand-written Kafka wire-protocol encoders/decoders for the raw-socket tests.

Only `struct` and the standard library: no Kafka client library.  Covers the
request/response schemas (Kafka 3.7 JSON message definitions) of the APIs
gregor serves, for every version in the listed ranges:

  ApiVersions 0-4, Metadata 0-12, Produce 3-10, Fetch 4-12, ListOffsets 1-8,
  CreateTopics 2-7, DeleteTopics 1-6, CreatePartitions 0-3, DescribeConfigs 1-4,
  IncrementalAlterConfigs 0-1, DescribeCluster 0-1, InitProducerId 0-4,
  DeleteRecords 0-2
"""
from __future__ import annotations

import gzip
import socket
import struct
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

# ---------------------------------------------------------------------------
# API keys, flexible versions, known ranges
# ---------------------------------------------------------------------------

PRODUCE, FETCH, LIST_OFFSETS, METADATA = 0, 1, 2, 3
API_VERSIONS, CREATE_TOPICS, DELETE_TOPICS, DELETE_RECORDS, INIT_PRODUCER_ID = 18, 19, 20, 21, 22
DESCRIBE_CONFIGS, CREATE_PARTITIONS, INCREMENTAL_ALTER_CONFIGS, DESCRIBE_CLUSTER = 32, 37, 44, 60

API_NAMES = {
    PRODUCE: "Produce", FETCH: "Fetch", LIST_OFFSETS: "ListOffsets", METADATA: "Metadata",
    API_VERSIONS: "ApiVersions", CREATE_TOPICS: "CreateTopics", DELETE_TOPICS: "DeleteTopics",
    DELETE_RECORDS: "DeleteRecords", INIT_PRODUCER_ID: "InitProducerId",
    DESCRIBE_CONFIGS: "DescribeConfigs", CREATE_PARTITIONS: "CreatePartitions",
    INCREMENTAL_ALTER_CONFIGS: "IncrementalAlterConfigs", DESCRIBE_CLUSTER: "DescribeCluster",
}

# first flexible version of each API
FLEX = {
    PRODUCE: 9, FETCH: 12, LIST_OFFSETS: 6, METADATA: 9, API_VERSIONS: 3, CREATE_TOPICS: 5,
    DELETE_TOPICS: 4, DELETE_RECORDS: 2, INIT_PRODUCER_ID: 2, DESCRIBE_CONFIGS: 4,
    CREATE_PARTITIONS: 2, INCREMENTAL_ALTER_CONFIGS: 1, DESCRIBE_CLUSTER: 0,
}

# versions the broker is expected to serve (from the gregor issue)
EXPECTED_RANGES = {
    API_VERSIONS: (0, 4), METADATA: (0, 12), PRODUCE: (0, 10), FETCH: (0, 12),
    LIST_OFFSETS: (0, 8), CREATE_TOPICS: (0, 7), DELETE_TOPICS: (0, 6), CREATE_PARTITIONS: (0, 3),
    DESCRIBE_CONFIGS: (0, 4), INCREMENTAL_ALTER_CONFIGS: (0, 1), DESCRIBE_CLUSTER: (0, 1),
    INIT_PRODUCER_ID: (0, 4), DELETE_RECORDS: (0, 2),
}

# versions these encoders know (a superset of the expected ranges)
ENCODER_RANGES = {
    API_VERSIONS: (0, 4), METADATA: (0, 12), PRODUCE: (0, 11), FETCH: (0, 17),
    LIST_OFFSETS: (0, 8), CREATE_TOPICS: (0, 7), DELETE_TOPICS: (0, 6), CREATE_PARTITIONS: (0, 3),
    DESCRIBE_CONFIGS: (0, 4), INCREMENTAL_ALTER_CONFIGS: (0, 1), DESCRIBE_CLUSTER: (0, 1),
    INIT_PRODUCER_ID: (0, 4), DELETE_RECORDS: (0, 2),
}

# error codes
NONE = 0
OFFSET_OUT_OF_RANGE = 1
CORRUPT_MESSAGE = 2
UNKNOWN_TOPIC_OR_PARTITION = 3
UNKNOWN_TOPIC_ID = 100
INVALID_TOPIC_EXCEPTION = 17
UNSUPPORTED_VERSION = 35
TOPIC_ALREADY_EXISTS = 36
INVALID_REQUEST = 42

# ---------------------------------------------------------------------------
# CRC-32C (Castagnoli), table-driven, reflected polynomial 0x82F63B78
# ---------------------------------------------------------------------------


def _make_crc32c_table() -> List[int]:
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_CRC32C_TABLE = _make_crc32c_table()


def crc32c(data: bytes, crc: int = 0) -> int:
    crc ^= 0xFFFFFFFF
    t = _CRC32C_TABLE
    for b in data:
        crc = t[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


# ---------------------------------------------------------------------------
# primitive writer / reader
# ---------------------------------------------------------------------------


def uvarint(n: int) -> bytes:
    assert n >= 0
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def zigzag(n: int) -> int:
    return (n << 1) ^ (n >> 63)


def varint(n: int) -> bytes:
    """Signed (zigzag) varint/varlong as used inside records."""
    return uvarint(zigzag(n) & 0xFFFFFFFFFFFFFFFF)


class W:
    """Writer with flexible (compact) awareness."""

    def __init__(self, flexible: bool = False):
        self.flex = flexible
        self.buf = bytearray()

    def raw(self, b: bytes) -> "W":
        self.buf += b
        return self

    def i8(self, v): self.buf += struct.pack(">b", v); return self
    def i16(self, v): self.buf += struct.pack(">h", v); return self
    def i32(self, v): self.buf += struct.pack(">i", v); return self
    def i64(self, v): self.buf += struct.pack(">q", v); return self
    def u32(self, v): self.buf += struct.pack(">I", v); return self
    def bool(self, v): self.buf += b"\x01" if v else b"\x00"; return self
    def uvarint(self, v): self.buf += uvarint(v); return self
    def uuid(self, v: bytes = b"\x00" * 16): assert len(v) == 16; self.buf += v; return self

    def string(self, s: Optional[str]) -> "W":
        if s is None:
            return self.nullable_string(None)
        b = s.encode() if isinstance(s, str) else s
        if self.flex:
            self.buf += uvarint(len(b) + 1) + b
        else:
            self.buf += struct.pack(">h", len(b)) + b
        return self

    def nullable_string(self, s: Optional[str]) -> "W":
        if s is None:
            self.buf += uvarint(0) if self.flex else struct.pack(">h", -1)
            return self
        return self.string(s)

    def bytes_(self, b: Optional[bytes]) -> "W":
        if b is None:
            self.buf += uvarint(0) if self.flex else struct.pack(">i", -1)
        elif self.flex:
            self.buf += uvarint(len(b) + 1) + b
        else:
            self.buf += struct.pack(">i", len(b)) + b
        return self

    def array(self, items, fn: Callable[["W", Any], None]) -> "W":
        if items is None:
            self.buf += uvarint(0) if self.flex else struct.pack(">i", -1)
            return self
        items = list(items)
        if self.flex:
            self.buf += uvarint(len(items) + 1)
        else:
            self.buf += struct.pack(">i", len(items))
        for it in items:
            fn(self, it)
        return self

    def tags(self, tagged: Optional[Dict[int, bytes]] = None) -> "W":
        """Tagged-field section (only written when flexible)."""
        if not self.flex:
            return self
        tagged = tagged or {}
        self.buf += uvarint(len(tagged))
        for tag in sorted(tagged):
            self.buf += uvarint(tag) + uvarint(len(tagged[tag])) + tagged[tag]
        return self

    def done(self) -> bytes:
        return bytes(self.buf)


class DecodeError(Exception):
    pass


class R:
    def __init__(self, data: bytes, flexible: bool = False):
        self.d = data
        self.o = 0
        self.flex = flexible

    def _take(self, n: int) -> bytes:
        if n < 0 or self.o + n > len(self.d):
            raise DecodeError(f"need {n} bytes at offset {self.o}, have {len(self.d) - self.o}")
        b = self.d[self.o:self.o + n]
        self.o += n
        return b

    def remaining(self) -> int:
        return len(self.d) - self.o

    def i8(self): return struct.unpack(">b", self._take(1))[0]
    def i16(self): return struct.unpack(">h", self._take(2))[0]
    def i32(self): return struct.unpack(">i", self._take(4))[0]
    def i64(self): return struct.unpack(">q", self._take(8))[0]
    def u32(self): return struct.unpack(">I", self._take(4))[0]
    def bool(self): return self._take(1) != b"\x00"
    def uuid(self): return self._take(16)

    def uvarint(self) -> int:
        shift = 0
        n = 0
        while True:
            b = self._take(1)[0]
            n |= (b & 0x7F) << shift
            if not b & 0x80:
                return n
            shift += 7
            if shift > 63:
                raise DecodeError("varint too long")

    def varint(self) -> int:
        n = self.uvarint()
        return (n >> 1) ^ -(n & 1)

    def string(self) -> Optional[str]:
        if self.flex:
            n = self.uvarint() - 1
        else:
            n = self.i16()
        if n < 0:
            return None
        return self._take(n).decode("utf-8")

    nullable_string = string

    def bytes_(self) -> Optional[bytes]:
        if self.flex:
            n = self.uvarint() - 1
        else:
            n = self.i32()
        if n < 0:
            return None
        return self._take(n)

    def array(self, fn: Callable[["R"], Any]) -> Optional[list]:
        if self.flex:
            n = self.uvarint() - 1
        else:
            n = self.i32()
        if n < 0:
            return None
        if n > self.remaining() + 1:
            raise DecodeError(f"array length {n} larger than remaining bytes")
        return [fn(self) for _ in range(n)]

    def tags(self) -> Dict[int, bytes]:
        if not self.flex:
            return {}
        out = {}
        for _ in range(self.uvarint()):
            tag = self.uvarint()
            size = self.uvarint()
            out[tag] = self._take(size)
        return out

    def end(self) -> None:
        if self.remaining():
            raise DecodeError(f"{self.remaining()} trailing bytes after response body")


# ---------------------------------------------------------------------------
# framing
# ---------------------------------------------------------------------------


def is_flexible(api_key: int, version: int) -> bool:
    return api_key in FLEX and version >= FLEX[api_key]


def request_header(api_key: int, version: int, corr: int, client_id: Optional[str] = "gregor-proto-test",
                   flexible: Optional[bool] = None) -> bytes:
    """Request header v1 (non-flexible) or v2 (flexible: + empty tagged fields).
    client_id is always an int16-length nullable string."""
    if flexible is None:
        flexible = is_flexible(api_key, version)
    w = W(False).i16(api_key).i16(version).i32(corr).nullable_string(client_id)
    if flexible:
        w.uvarint(0)
    return w.done()


def frame(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def encode_request(api_key: int, version: int, corr: int, body: bytes, **kw) -> bytes:
    return frame(request_header(api_key, version, corr, **kw) + body)


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
        raise DecodeError(f"response frame size {size} too small")
    return recv_exact(sock, size)


def split_response(api_key: int, version: int, payload: bytes) -> Tuple[int, R]:
    """Return (correlation_id, reader positioned at the body)."""
    flex = is_flexible(api_key, version)
    r = R(payload, False)
    corr = r.i32()
    if flex and api_key != API_VERSIONS:  # ApiVersions responses always use header v0
        r.flex = True
        r.tags()
    r.flex = flex
    return corr, r


def wait_closed(sock: socket.socket, timeout: float = 15.0) -> bool:
    """True if the peer closes the connection (EOF/reset) before `timeout`.
    Any bytes received meanwhile are drained and ignored only if they form
    complete frames; returns False if the connection is still open at the end."""
    sock.settimeout(timeout)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            chunk = sock.recv(65536)
            if not chunk:
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except socket.timeout:
        return False
    return False


class Conn:
    """A connection with its own correlation-id counter."""

    def __init__(self, host: str, port: int, timeout: float = 30.0):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.settimeout(timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.corr = 1000

    def close(self):
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *a):
        self.close()

    def next_corr(self) -> int:
        self.corr += 1
        return self.corr

    def send(self, api_key: int, version: int, body: bytes, corr: Optional[int] = None, **kw) -> int:
        corr = self.next_corr() if corr is None else corr
        self.sock.sendall(encode_request(api_key, version, corr, body, **kw))
        return corr

    def recv(self, api_key: int, version: int, expect_corr: int) -> R:
        payload = recv_frame(self.sock)
        corr, r = split_response(api_key, version, payload)
        assert corr == expect_corr, (f"{API_NAMES.get(api_key, api_key)} v{version}: response correlation id "
                                     f"{corr} != request's {expect_corr}")
        return r

    def call(self, api_key: int, version: int, body: bytes, **kw) -> R:
        corr = self.send(api_key, version, body, **kw)
        return self.recv(api_key, version, corr)

    # typed helpers ---------------------------------------------------------
    def api_versions(self, version: int = 0, **kw) -> dict:
        r = self.call(API_VERSIONS, version, api_versions_request(version, **kw))
        return decode_api_versions(r, version)


# ---------------------------------------------------------------------------
# record batch v2
# ---------------------------------------------------------------------------

@dataclass
class Record:
    value: Optional[bytes]
    key: Optional[bytes] = None
    headers: List[Tuple[str, Optional[bytes]]] = field(default_factory=list)
    timestamp: Optional[int] = None  # absolute ms; default = batch base timestamp
    offset: Optional[int] = None  # filled in by the decoder


def encode_record(rec: Record, offset_delta: int, ts_delta: int) -> bytes:
    body = bytearray()
    body.append(0)  # attributes
    body += varint(ts_delta)
    body += varint(offset_delta)
    if rec.key is None:
        body += varint(-1)
    else:
        body += varint(len(rec.key)) + rec.key
    if rec.value is None:
        body += varint(-1)
    else:
        body += varint(len(rec.value)) + rec.value
    body += varint(len(rec.headers))
    for hk, hv in rec.headers:
        kb = hk.encode()
        body += varint(len(kb)) + kb
        if hv is None:
            body += varint(-1)
        else:
            body += varint(len(hv)) + hv
    return varint(len(body)) + bytes(body)


CODEC_NONE, CODEC_GZIP, CODEC_SNAPPY, CODEC_LZ4, CODEC_ZSTD = 0, 1, 2, 3, 4
_XERIAL = b"\x82SNAPPY\x00"


def compress(codec: int, data: bytes) -> bytes:
    """Record-batch payload compression as Kafka's Java producer writes it (snappy: xerial
    framing; lz4: LZ4 frame; zstd: a zstd frame).  snappy/lz4/zstd need python-snappy, lz4,
    zstandard (installed by scripts/test); imported only when used."""
    if codec == CODEC_NONE:
        return data
    if codec == CODEC_GZIP:
        return gzip.compress(data)
    if codec == CODEC_SNAPPY:
        import snappy
        out = bytearray(_XERIAL + struct.pack(">ii", 1, 1))
        for i in range(0, len(data), 32 * 1024):
            block = snappy.compress(data[i:i + 32 * 1024])
            out += struct.pack(">i", len(block)) + block
        return bytes(out)
    if codec == CODEC_LZ4:
        import lz4.frame
        return lz4.frame.compress(data)
    if codec == CODEC_ZSTD:
        import zstandard
        return zstandard.ZstdCompressor().compress(data)
    raise ValueError(f"codec {codec}")


def decompress(codec: int, data: bytes) -> bytes:
    if codec == CODEC_NONE:
        return data
    if codec == CODEC_GZIP:
        return gzip.decompress(data)
    if codec == CODEC_SNAPPY:
        import snappy
        if not data.startswith(_XERIAL):
            return snappy.decompress(data)
        out, o = bytearray(), 16
        while o < len(data):
            (n,) = struct.unpack(">i", data[o:o + 4])
            out += snappy.decompress(data[o + 4:o + 4 + n])
            o += 4 + n
        return bytes(out)
    if codec == CODEC_LZ4:
        import lz4.frame
        return lz4.frame.decompress(data)
    if codec == CODEC_ZSTD:
        import zstandard
        return zstandard.ZstdDecompressor().decompressobj().decompress(data)
    raise DecodeError(f"codec {codec} not supported by the raw decoder")


def build_batch(records: List[Record], base_timestamp: Optional[int] = None, codec: int = CODEC_NONE,
                producer_id: int = -1, producer_epoch: int = -1, base_sequence: int = -1,
                base_offset: int = 0, corrupt_crc: bool = False, transactional: bool = False) -> bytes:
    """A record batch v2 (magic 2), CRC-32C over [attributes, end)."""
    assert records
    if base_timestamp is None:
        base_timestamp = records[0].timestamp if records[0].timestamp is not None else int(time.time() * 1000)
    recs = bytearray()
    max_ts = base_timestamp
    for i, rec in enumerate(records):
        ts = rec.timestamp if rec.timestamp is not None else base_timestamp
        max_ts = max(max_ts, ts)
        recs += encode_record(rec, i, ts - base_timestamp)
    payload = compress(codec, bytes(recs))
    attributes = codec | (0x10 if transactional else 0)
    after_crc = (struct.pack(">hiqqqhii", attributes, len(records) - 1, base_timestamp, max_ts,
                             producer_id, producer_epoch, base_sequence, len(records)) + payload)
    crc = crc32c(after_crc)
    if corrupt_crc:
        crc ^= 0xDEADBEEF
    # batchLength = bytes after the batchLength field: epoch(4) + magic(1) + crc(4) + rest
    batch_length = 4 + 1 + 4 + len(after_crc)
    return struct.pack(">qiibI", base_offset, batch_length, -1, 2, crc) + after_crc


@dataclass
class Batch:
    base_offset: int
    partition_leader_epoch: int
    magic: int
    crc: int
    crc_ok: bool
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records: List[Record]
    raw: bytes


def decode_batches(data: Optional[bytes]) -> List[Batch]:
    """Decode a records blob (as in a Fetch response). A trailing partial batch is ignored."""
    out = []
    if not data:
        return out
    o = 0
    while o + 12 <= len(data):
        base_offset, batch_len = struct.unpack(">qi", data[o:o + 12])
        end = o + 12 + batch_len
        if end > len(data):
            break  # partial batch
        raw = data[o:end]
        (ple, magic, crc) = struct.unpack(">ibI", raw[12:21])
        if magic != 2:
            raise DecodeError(f"batch at {base_offset}: magic {magic} != 2")
        (attrs, lod, bts, mts, pid, pep, bseq, n) = struct.unpack(">hiqqqhii", raw[21:61])
        crc_ok = crc32c(raw[21:]) == crc
        payload = raw[61:]
        payload = decompress(attrs & 7, payload)
        rr = R(payload)
        recs = []
        for _ in range(n):
            length = rr.varint()
            start = rr.o
            rr.i8()
            tsd = rr.varint()
            od = rr.varint()
            kl = rr.varint()
            key = rr._take(kl) if kl >= 0 else None
            vl = rr.varint()
            val = rr._take(vl) if vl >= 0 else None
            hdrs = []
            for _ in range(rr.varint()):
                hkl = rr.varint()
                hk = rr._take(hkl).decode()
                hvl = rr.varint()
                hdrs.append((hk, rr._take(hvl) if hvl >= 0 else None))
            if rr.o - start != length:
                raise DecodeError("record length mismatch")
            recs.append(Record(value=val, key=key, headers=hdrs, timestamp=bts + tsd, offset=base_offset + od))
        out.append(Batch(base_offset, ple, magic, crc, crc_ok, attrs, lod, bts, mts, pid, pep, bseq, recs, raw))
        o = end
    return out


# ---------------------------------------------------------------------------
# request bodies
# ---------------------------------------------------------------------------


def api_versions_request(version: int, software_name: str = "gregor-proto-test",
                         software_version: str = "0.1") -> bytes:
    if version < 3:
        return b""
    return W(True).string(software_name).string(software_version).tags().done()


def decode_api_versions(r: R, version: int) -> dict:
    """ApiVersions response body. For an error response (e.g. unsupported version)
    the broker answers in v0 layout: decode with version=0."""
    flex = version >= 3
    r.flex = flex
    out = {"error_code": r.i16()}

    def key(rr):
        k, lo, hi = rr.i16(), rr.i16(), rr.i16()
        rr.tags()
        return (k, lo, hi)

    out["api_keys"] = {k: (lo, hi) for (k, lo, hi) in (r.array(key) or [])}
    if version >= 1:
        out["throttle_time_ms"] = r.i32()
    out["tags"] = r.tags()
    r.end()
    return out


def metadata_request(version: int, topics: Optional[List[str]] = None, allow_auto: bool = False) -> bytes:
    w = W(is_flexible(METADATA, version))
    if version == 0 and topics is None:
        topics = []  # v0: empty list = all topics

    def topic(w, name):
        if version >= 10:
            w.uuid()
            w.nullable_string(name)
        else:
            w.string(name)
        w.tags()

    w.array(topics, topic)
    if version >= 4:
        w.bool(allow_auto)
    if 8 <= version <= 10:
        w.bool(False)  # include_cluster_authorized_operations
    if version >= 8:
        w.bool(False)  # include_topic_authorized_operations
    return w.tags().done()


def decode_metadata(r: R, version: int) -> dict:
    out: Dict[str, Any] = {}
    if version >= 3:
        out["throttle_time_ms"] = r.i32()

    def broker(rr):
        b = {"node_id": rr.i32(), "host": rr.string(), "port": rr.i32()}
        if version >= 1:
            b["rack"] = rr.nullable_string()
        rr.tags()
        return b

    out["brokers"] = r.array(broker)
    if version >= 2:
        out["cluster_id"] = r.nullable_string()
    if version >= 1:
        out["controller_id"] = r.i32()

    def ints(rr):
        return rr.i32()

    def partition(rr):
        p = {"error_code": rr.i16(), "partition_index": rr.i32(), "leader_id": rr.i32()}
        if version >= 7:
            p["leader_epoch"] = rr.i32()
        p["replica_nodes"] = rr.array(ints)
        p["isr_nodes"] = rr.array(ints)
        if version >= 5:
            p["offline_replicas"] = rr.array(ints)
        rr.tags()
        return p

    def topic(rr):
        t = {"error_code": rr.i16(), "name": rr.nullable_string()}
        if version >= 10:
            t["topic_id"] = rr.uuid()
        if version >= 1:
            t["is_internal"] = rr.bool()
        t["partitions"] = rr.array(partition)
        if version >= 8:
            t["topic_authorized_operations"] = rr.i32()
        rr.tags()
        return t

    out["topics"] = r.array(topic)
    if 8 <= version <= 10:
        out["cluster_authorized_operations"] = r.i32()
    if version >= 13:
        out["error_code"] = r.i16()
    r.tags()
    r.end()
    return out


def produce_request(version: int, topic_data: Dict[str, Dict[int, bytes]], acks: int = -1,
                    timeout_ms: int = 30000, transactional_id: Optional[str] = None) -> bytes:
    w = W(is_flexible(PRODUCE, version))
    if version >= 3:
        w.nullable_string(transactional_id)
    w.i16(acks).i32(timeout_ms)

    def part(w, item):
        idx, records = item
        w.i32(idx).bytes_(records).tags()

    def topic(w, item):
        name, parts = item
        w.string(name)
        w.array(sorted(parts.items()), part)
        w.tags()

    w.array(list(topic_data.items()), topic)
    return w.tags().done()


def decode_produce(r: R, version: int) -> dict:
    def perr(rr):
        e = {"batch_index": rr.i32(), "message": rr.nullable_string()}
        rr.tags()
        return e

    def part(rr):
        p = {"index": rr.i32(), "error_code": rr.i16(), "base_offset": rr.i64()}
        p["log_append_time_ms"] = rr.i64() if version >= 2 else -1
        if version >= 5:
            p["log_start_offset"] = rr.i64()
        if version >= 8:
            p["record_errors"] = rr.array(perr)
            p["error_message"] = rr.nullable_string()
        p["tags"] = rr.tags()
        return p

    def topic(rr):
        t = {"name": rr.string(), "partitions": rr.array(part)}
        rr.tags()
        return t

    out = {"responses": r.array(topic), "throttle_time_ms": r.i32() if version >= 1 else 0}
    out["tags"] = r.tags()
    r.end()
    return out


def fetch_request(version: int, topics: Dict[Any, Dict[int, int]], max_wait_ms: int = 0, min_bytes: int = 1,
                  max_bytes: int = 50 * 1024 * 1024, partition_max_bytes: int = 10 * 1024 * 1024,
                  isolation_level: int = 0, session_id: int = 0, session_epoch: int = -1,
                  forgotten: Optional[Dict[Any, List[int]]] = None) -> bytes:
    """topics: {name: {partition: offset}} for v4-12, {topic_id (16 bytes): {...}} for v13+.
    The default session fields ask for a full fetch without a session; `forgotten` names the
    partitions an incremental fetch drops from its session."""
    w = W(is_flexible(FETCH, version))
    if version <= 14:
        w.i32(-1)  # replica_id (consumer); v15+ moves it into the ReplicaState tagged field
    w.i32(max_wait_ms).i32(min_bytes)
    if version >= 3:
        w.i32(max_bytes)
    if version >= 4:
        w.i8(isolation_level)
    if version >= 7:
        w.i32(session_id).i32(session_epoch)

    def part(w, item):
        idx, off = item
        w.i32(idx)
        if version >= 9:
            w.i32(-1)  # current_leader_epoch
        w.i64(off)
        if version >= 12:
            w.i32(-1)  # last_fetched_epoch
        if version >= 5:
            w.i64(-1)  # log_start_offset (follower only)
        w.i32(partition_max_bytes)
        # v17: the fetching replica's log directory id (tag 0), as Kafka's own replicas send it
        w.tags({0: bytes(range(16))} if version >= 17 else None)

    def topic(w, item):
        name, parts = item
        if version >= 13:
            assert isinstance(name, (bytes, bytearray)) and len(name) == 16, "Fetch v13+ needs a topic id"
            w.uuid(bytes(name))
        else:
            w.string(name)
        w.array(sorted(parts.items()), part)
        w.tags()

    def forgotten_topic(w, item):
        name, parts = item
        if version >= 13:
            w.uuid(bytes(name))
        else:
            w.string(name)
        w.array(parts, lambda w, p: w.i32(p))
        w.tags()

    w.array(list(topics.items()), topic)
    if version >= 7:
        w.array(list((forgotten or {}).items()), forgotten_topic)
    if version >= 11:
        w.string("")  # rack_id
    return w.tags().done()


def decode_fetch(r: R, version: int) -> dict:
    """v0-3 answers carry message sets (format v0 for v0-1, v1 for v2-3): see decode_message_set."""
    out: Dict[str, Any] = {"throttle_time_ms": r.i32() if version >= 1 else 0}
    if version >= 7:
        out["error_code"] = r.i16()
        out["session_id"] = r.i32()

    def aborted(rr):
        a = {"producer_id": rr.i64(), "first_offset": rr.i64()}
        rr.tags()
        return a

    def part(rr):
        p = {"partition_index": rr.i32(), "error_code": rr.i16(), "high_watermark": rr.i64()}
        if version < 4:
            p["records"] = rr.bytes_()
            return p
        p["last_stable_offset"] = rr.i64()
        if version >= 5:
            p["log_start_offset"] = rr.i64()
        p["aborted_transactions"] = rr.array(aborted)
        if version >= 11:
            p["preferred_read_replica"] = rr.i32()
        p["records"] = rr.bytes_()
        p["tags"] = rr.tags()
        return p

    def topic(rr):
        t = {}
        if version >= 13:
            t["topic_id"] = rr.uuid()
        else:
            t["topic"] = rr.string()
        t["partitions"] = rr.array(part)
        rr.tags()
        return t

    out["responses"] = r.array(topic)
    out["tags"] = r.tags()
    r.end()
    return out


LATEST, EARLIEST, MAX_TIMESTAMP = -1, -2, -3


def list_offsets_request(version: int, topics: Dict[str, Dict[int, int]], isolation_level: int = 0,
                         max_num_offsets: int = 1) -> bytes:
    """v0 asks for up to max_num_offsets offsets per partition (old_style_offsets)."""
    w = W(is_flexible(LIST_OFFSETS, version))
    w.i32(-1)  # replica_id
    if version >= 2:
        w.i8(isolation_level)

    def part(w, item):
        idx, ts = item
        w.i32(idx)
        if version >= 4:
            w.i32(-1)  # current_leader_epoch
        w.i64(ts)
        if version == 0:
            w.i32(max_num_offsets)
        w.tags()

    def topic(w, item):
        name, parts = item
        w.string(name)
        w.array(sorted(parts.items()), part)
        w.tags()

    w.array(list(topics.items()), topic)
    return w.tags().done()


def decode_list_offsets(r: R, version: int) -> dict:
    out: Dict[str, Any] = {}
    if version >= 2:
        out["throttle_time_ms"] = r.i32()

    def part(rr):
        p = {"partition_index": rr.i32(), "error_code": rr.i16()}
        if version == 0:
            p["old_style_offsets"] = rr.array(lambda r: r.i64())
            return p
        p["timestamp"], p["offset"] = rr.i64(), rr.i64()
        if version >= 4:
            p["leader_epoch"] = rr.i32()
        rr.tags()
        return p

    def topic(rr):
        t = {"name": rr.string(), "partitions": rr.array(part)}
        rr.tags()
        return t

    out["topics"] = r.array(topic)
    r.tags()
    r.end()
    return out


def create_topics_request(version: int, topics: List[Tuple[str, int, int]], timeout_ms: int = 30000,
                          validate_only: bool = False, configs: Optional[Dict[str, str]] = None) -> bytes:
    w = W(is_flexible(CREATE_TOPICS, version))

    def cfg(w, item):
        w.string(item[0]).nullable_string(item[1]).tags()

    def topic(w, item):
        name, np, rf = item
        w.string(name).i32(np).i16(rf)
        w.array([], lambda w, x: None)  # assignments
        w.array(list((configs or {}).items()), cfg)
        w.tags()

    w.array(topics, topic)
    w.i32(timeout_ms)
    if version >= 1:
        w.bool(validate_only)
    return w.tags().done()


def decode_create_topics(r: R, version: int) -> dict:
    out: Dict[str, Any] = {}
    if version >= 2:
        out["throttle_time_ms"] = r.i32()

    def cfg(rr):
        c = {"name": rr.string(), "value": rr.nullable_string(), "read_only": rr.bool(),
             "config_source": rr.i8(), "is_sensitive": rr.bool()}
        rr.tags()
        return c

    def topic(rr):
        t = {"name": rr.string()}
        if version >= 7:
            t["topic_id"] = rr.uuid()
        t["error_code"] = rr.i16()
        if version >= 1:
            t["error_message"] = rr.nullable_string()
        if version >= 5:
            t["num_partitions"] = rr.i32()
            t["replication_factor"] = rr.i16()
            t["configs"] = rr.array(cfg)
        t["tags"] = rr.tags()
        return t

    out["topics"] = r.array(topic)
    r.tags()
    r.end()
    return out


def delete_topics_request(version: int, names: List[str], timeout_ms: int = 30000) -> bytes:
    w = W(is_flexible(DELETE_TOPICS, version))
    if version >= 6:
        def topic(w, name):
            w.nullable_string(name).uuid().tags()
        w.array(names, topic)
    else:
        w.array(names, lambda w, n: w.string(n))
    w.i32(timeout_ms)
    return w.tags().done()


def decode_delete_topics(r: R, version: int) -> dict:
    out: Dict[str, Any] = {}
    if version >= 1:
        out["throttle_time_ms"] = r.i32()

    def resp(rr):
        t = {"name": rr.nullable_string()}
        if version >= 6:
            t["topic_id"] = rr.uuid()
        t["error_code"] = rr.i16()
        if version >= 5:
            t["error_message"] = rr.nullable_string()
        rr.tags()
        return t

    out["responses"] = r.array(resp)
    r.tags()
    r.end()
    return out


def create_partitions_request(version: int, topics: List[Tuple[str, int]], timeout_ms: int = 30000,
                              validate_only: bool = False) -> bytes:
    w = W(is_flexible(CREATE_PARTITIONS, version))

    def topic(w, item):
        w.string(item[0]).i32(item[1])
        w.array(None, lambda w, x: None)  # assignments: null
        w.tags()

    w.array(topics, topic)
    w.i32(timeout_ms).bool(validate_only)
    return w.tags().done()


def decode_create_partitions(r: R, version: int) -> dict:
    out = {"throttle_time_ms": r.i32()}

    def res(rr):
        t = {"name": rr.string(), "error_code": rr.i16(), "error_message": rr.nullable_string()}
        rr.tags()
        return t

    out["results"] = r.array(res)
    r.tags()
    r.end()
    return out


RESOURCE_TOPIC, RESOURCE_BROKER = 2, 4


def describe_configs_request(version: int, resources: List[Tuple[int, str, Optional[List[str]]]],
                             include_synonyms: bool = False) -> bytes:
    w = W(is_flexible(DESCRIBE_CONFIGS, version))

    def res(w, item):
        rtype, name, keys = item
        w.i8(rtype).string(name)
        w.array(keys, lambda w, k: w.string(k))
        w.tags()

    w.array(resources, res)
    if version >= 1:
        w.bool(include_synonyms)
    if version >= 3:
        w.bool(False)  # include_documentation
    return w.tags().done()


def decode_describe_configs(r: R, version: int) -> dict:
    out = {"throttle_time_ms": r.i32()}

    def syn(rr):
        s = {"name": rr.string(), "value": rr.nullable_string(), "source": rr.i8()}
        rr.tags()
        return s

    def cfg(rr):
        c = {"name": rr.string(), "value": rr.nullable_string(), "read_only": rr.bool()}
        if version == 0:
            c["is_default"] = rr.bool()
        else:
            c["config_source"] = rr.i8()
        c["is_sensitive"] = rr.bool()
        if version >= 1:
            c["synonyms"] = rr.array(syn)
        if version >= 3:
            c["config_type"] = rr.i8()
            c["documentation"] = rr.nullable_string()
        rr.tags()
        return c

    def res(rr):
        x = {"error_code": rr.i16(), "error_message": rr.nullable_string(), "resource_type": rr.i8(),
             "resource_name": rr.string(), "configs": rr.array(cfg)}
        rr.tags()
        return x

    out["results"] = r.array(res)
    r.tags()
    r.end()
    return out


def incremental_alter_configs_request(version: int, resources: List[Tuple[int, str, List[Tuple[str, int, Optional[str]]]]],
                                      validate_only: bool = False) -> bytes:
    w = W(is_flexible(INCREMENTAL_ALTER_CONFIGS, version))

    def cfg(w, item):
        w.string(item[0]).i8(item[1]).nullable_string(item[2]).tags()

    def res(w, item):
        w.i8(item[0]).string(item[1])
        w.array(item[2], cfg)
        w.tags()

    w.array(resources, res)
    w.bool(validate_only)
    return w.tags().done()


def decode_incremental_alter_configs(r: R, version: int) -> dict:
    out = {"throttle_time_ms": r.i32()}

    def res(rr):
        x = {"error_code": rr.i16(), "error_message": rr.nullable_string(), "resource_type": rr.i8(),
             "resource_name": rr.string()}
        rr.tags()
        return x

    out["responses"] = r.array(res)
    r.tags()
    r.end()
    return out


def describe_cluster_request(version: int, endpoint_type: int = 1) -> bytes:
    w = W(True).bool(False)
    if version >= 1:
        w.i8(endpoint_type)  # 1 = brokers, 2 = controllers
    return w.tags().done()


def decode_describe_cluster(r: R, version: int) -> dict:
    out = {"throttle_time_ms": r.i32(), "error_code": r.i16(), "error_message": r.nullable_string()}
    if version >= 1:
        out["endpoint_type"] = r.i8()
    out["cluster_id"] = r.string()
    out["controller_id"] = r.i32()

    def broker(rr):
        b = {"broker_id": rr.i32(), "host": rr.string(), "port": rr.i32(), "rack": rr.nullable_string()}
        if version >= 2:
            b["is_fenced"] = rr.bool()
        rr.tags()
        return b

    out["brokers"] = r.array(broker)
    out["cluster_authorized_operations"] = r.i32()
    r.tags()
    r.end()
    return out


def init_producer_id_request(version: int, transactional_id: Optional[str] = None,
                             timeout_ms: int = 60000, producer_id: int = -1, producer_epoch: int = -1) -> bytes:
    """producer_id/producer_epoch (v3+): what the client holds when it asks to bump its own epoch."""
    w = W(is_flexible(INIT_PRODUCER_ID, version))
    w.nullable_string(transactional_id).i32(timeout_ms)
    if version >= 3:
        w.i64(producer_id).i16(producer_epoch)
    return w.tags().done()


def decode_init_producer_id(r: R, version: int) -> dict:
    out = {"throttle_time_ms": r.i32(), "error_code": r.i16(), "producer_id": r.i64(), "producer_epoch": r.i16()}
    r.tags()
    r.end()
    return out


def delete_records_request(version: int, topics: Dict[str, Dict[int, int]], timeout_ms: int = 30000) -> bytes:
    w = W(is_flexible(DELETE_RECORDS, version))

    def part(w, item):
        w.i32(item[0]).i64(item[1]).tags()

    def topic(w, item):
        w.string(item[0])
        w.array(sorted(item[1].items()), part)
        w.tags()

    w.array(list(topics.items()), topic)
    w.i32(timeout_ms)
    return w.tags().done()


def decode_delete_records(r: R, version: int) -> dict:
    out = {"throttle_time_ms": r.i32()}

    def part(rr):
        p = {"partition_index": rr.i32(), "low_watermark": rr.i64(), "error_code": rr.i16()}
        rr.tags()
        return p

    def topic(rr):
        t = {"name": rr.string(), "partitions": rr.array(part)}
        rr.tags()
        return t

    out["topics"] = r.array(topic)
    r.tags()
    r.end()
    return out


# ---------------------------------------------------------------------------
# convenience operations on a Conn
# ---------------------------------------------------------------------------

def create_topic(c: Conn, name: str, partitions: int = 1, version: int = 5, rf: int = 1) -> dict:
    r = c.call(CREATE_TOPICS, version, create_topics_request(version, [(name, partitions, rf)]))
    return decode_create_topics(r, version)["topics"][0]


def produce(c: Conn, topic: str, partition: int, batch: bytes, version: int = 8, acks: int = -1) -> dict:
    r = c.call(PRODUCE, version, produce_request(version, {topic: {partition: batch}}, acks=acks))
    return decode_produce(r, version)["responses"][0]["partitions"][0]


def list_offset(c: Conn, topic: str, partition: int, ts: int, version: int = 5) -> dict:
    r = c.call(LIST_OFFSETS, version, list_offsets_request(version, {topic: {partition: ts}}))
    return decode_list_offsets(r, version)["topics"][0]["partitions"][0]


def topic_id(c: Conn, topic: str) -> bytes:
    return metadata(c, [topic], version=12)["topics"][0]["topic_id"]


def fetch(c: Conn, topic: str, partition: int, offset: int, version: int = 11, **kw) -> dict:
    key = topic_id(c, topic) if version >= 13 else topic
    r = c.call(FETCH, version, fetch_request(version, {key: {partition: offset}}, **kw))
    return decode_fetch(r, version)["responses"][0]["partitions"][0]


def fetch_all(c: Conn, topic: str, partition: int, version: int = 11) -> List[Record]:
    """All records from offset 0 (or log start) up to the high watermark."""
    out: List[Record] = []
    off = 0
    while True:
        p = fetch(c, topic, partition, off, version=version)
        assert p["error_code"] == 0, f"fetch {topic}-{partition}@{off}: error {p['error_code']}"
        batches = decode_batches(p["records"])
        new = [rec for b in batches for rec in b.records if rec.offset >= off]
        out.extend(new)
        if new:
            off = new[-1].offset + 1
        if off >= p["high_watermark"] or not batches:
            return out


def metadata(c: Conn, topics: Optional[List[str]] = None, version: int = 9, allow_auto: bool = False) -> dict:
    r = c.call(METADATA, version, metadata_request(version, topics, allow_auto))
    return decode_metadata(r, version)


# ---------------------------------------------------------------------------
# message sets (formats v0/v1), as Produce v0-2 carry them and Fetch v0-3 answer them
# ---------------------------------------------------------------------------

@dataclass
class Message:
    value: Optional[bytes]
    key: Optional[bytes] = None
    timestamp: int = -1
    offset: int = 0
    magic: int = 1
    attributes: int = 0


def encode_message(m: Message) -> bytes:
    import zlib
    body = struct.pack(">bb", m.magic, m.attributes)
    if m.magic >= 1:
        body += struct.pack(">q", m.timestamp)
    for f in (m.key, m.value):
        body += struct.pack(">i", -1) if f is None else struct.pack(">i", len(f)) + f
    crc = zlib.crc32(body) & 0xFFFFFFFF
    return struct.pack(">qiI", m.offset, 4 + len(body), crc) + body


def message_set(msgs: List[Message]) -> bytes:
    return b"".join(encode_message(m) for m in msgs)


def compressed_message_set(msgs: List[Message], codec: int, magic: int = 1) -> bytes:
    """One wrapper holding `msgs` (v1: relative inner offsets 0..n-1)."""
    inner = message_set([Message(m.value, m.key, m.timestamp, i, magic) for i, m in enumerate(msgs)])
    data = compress(codec, inner)
    return encode_message(Message(data, None, max(m.timestamp for m in msgs), len(msgs) - 1, magic, codec))


def decode_message_set(data: bytes) -> List[Message]:
    """Every message with its absolute offset, inner messages of wrappers resolved; a trailing
    partial message is ignored, as old clients do."""
    import zlib
    out: List[Message] = []
    pos = 0
    while pos + 12 <= len(data):
        offset, size = struct.unpack(">qi", data[pos:pos + 12])
        if pos + 12 + size > len(data):
            break
        msg = data[pos + 12:pos + 12 + size]
        pos += 12 + size
        crc, magic, attrs = struct.unpack(">Ibb", msg[:6])
        assert zlib.crc32(msg[4:]) & 0xFFFFFFFF == crc, "message CRC mismatch"
        at = 6
        ts = -1
        if magic >= 1:
            (ts,) = struct.unpack(">q", msg[at:at + 8])
            at += 8
        fields = []
        for _ in range(2):
            (n,) = struct.unpack(">i", msg[at:at + 4])
            at += 4
            fields.append(None if n < 0 else msg[at:at + n])
            at += max(n, 0)
        key, value = fields
        codec = attrs & 7
        if codec == 0:
            out.append(Message(value, key, ts, offset, magic, attrs))
            continue
        inner = decode_message_set(decompress(codec, value))
        last = inner[-1].offset
        for m in inner:
            m.offset = offset - last + m.offset if magic >= 1 else m.offset
            out.append(m)
    return out
