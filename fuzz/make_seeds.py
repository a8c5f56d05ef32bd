"""Seed corpora for the libFuzzer targets, made from the recorded real-client connections in
fuzz/wire-corpus/ (scripts/wire-fuzz record) and a few znode JSON documents as Kafka writes
them. Run again after re-recording: `python3 fuzz/make_seeds.py`; the output is committed
under fuzz/seeds/<target>/.
"""
import hashlib
import struct
from pathlib import Path

HERE = Path(__file__).resolve().parent
SEEDS = HERE / "seeds"


def frames(stream: bytes):
    pos = 0
    while pos + 4 <= len(stream):
        (n,) = struct.unpack_from(">i", stream, pos)
        if n < 0 or pos + 4 + n > len(stream):
            return
        yield stream[pos + 4:pos + 4 + n]
        pos += 4 + n


def produce_records(frame: bytes):
    """The records of each partition of a non-flexible Produce (v0-v8) frame."""
    key, version = struct.unpack_from(">hh", frame)
    if key != 0 or version > 8:
        return
    pos = 8
    (n,) = struct.unpack_from(">h", frame, pos)
    pos += 2 + max(n, 0)
    if version >= 3:
        (n,) = struct.unpack_from(">h", frame, pos)
        pos += 2 + max(n, 0)
    pos += 2 + 4  # acks, timeout
    (topics,) = struct.unpack_from(">i", frame, pos)
    pos += 4
    for _ in range(topics):
        (n,) = struct.unpack_from(">h", frame, pos)
        pos += 2 + n
        (parts,) = struct.unpack_from(">i", frame, pos)
        pos += 4
        for _ in range(parts):
            _p, size = struct.unpack_from(">ii", frame, pos)
            pos += 8
            yield frame[pos:pos + size]
            pos += size


def put(target: str, data: bytes) -> None:
    d = SEEDS / target
    d.mkdir(parents=True, exist_ok=True)
    (d / hashlib.sha1(data).hexdigest()[:16]).write_bytes(data)


def packed(files, clean: bool) -> bytes:
    """The log_recovery target's input: a flags byte, then each file as u16 length + bytes."""
    out = bytearray([1 if clean else 0])
    for f in files:
        f = f[:0xFFFF]
        out += struct.pack(">H", len(f)) + f
    return bytes(out)


ZNODES = [
    b'{"version":1,"id":"Y2x1c3Rlci1pZC0xMjM0NQ"}',
    b'{"version":3,"topic_id":"c2VudGluZWwtdG9waWMtaQ","partitions":{"0":[1,2,3],"1":[2,3,1]},'
    b'"adding_replicas":{},"removing_replicas":{}}',
    b'{"controller_epoch":3,"leader":1,"version":1,"leader_epoch":7,"isr":[1,2,3]}',
    b'{"version":1,"config":{"retention.ms":"3600000","cleanup.policy":"delete"}}',
    b'{"features":{},"listener_security_protocol_map":{"PLAINTEXT":"PLAINTEXT"},'
    b'"endpoints":["PLAINTEXT://127.0.0.1:9092"],"jmx_port":-1,"port":9092,"host":"127.0.0.1",'
    b'"version":5,"timestamp":"1700000000000","rack":null}',
    b'{"version":1,"partitions":[{"topic":"t","partition":0,"replicas":[1,2]}]}',
    b'{"version":1,"broker":1,"block_start":"0","block_end":"999"}',
    b'{"version":2,"brokerid":1,"timestamp":"1700000000000","kraftControllerEpoch":-1}',
]


def main() -> None:
    batches = []
    for p in sorted((HERE / "wire-corpus").glob("*.bin")):
        stream = p.read_bytes()
        put("broker_request", stream)
        put("frame_codec", stream)
        for f in frames(stream):
            put("request_decode", f)
            try:
                for records in produce_records(f):
                    if records:
                        put("record_batch", records)
                        batches.append(records)
            except struct.error:
                pass
    v2 = [b for b in batches if len(b) > 16 and b[16] == 2]
    log = b"".join(v2)
    put("log_recovery", packed([log], clean=False))
    put("log_recovery", packed([log], clean=True))
    put("log_recovery", packed([log, b"", b"", log[: len(log) // 2]], clean=False))
    for z in ZNODES:
        put("znode_json", z)
    for t in sorted(SEEDS.iterdir()):
        files = list(t.iterdir())
        print(f"{t.name}: {len(files)} seeds, {sum(f.stat().st_size for f in files)} bytes")


if __name__ == "__main__":
    main()
