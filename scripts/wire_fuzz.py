"""Black-box wire fuzzer: mutated real-client frames against running brokers.

    scripts/wire-fuzz run [--mode standalone|cluster] [--frames N] [--seed S]
    scripts/wire-fuzz record            # re-record fuzz/wire-corpus/ from kcat, confluent-kafka, kafka-python

`run` starts a broker (standalone, or ZooKeeper and three brokers), writes a sentinel topic
through confluent-kafka, then replays the recorded connections of fuzz/wire-corpus/ with random
mutations (bit flips, interesting integers over counts and lengths, truncation, splices, other
versions and API keys, a lying size prefix) on new connections, spread over the brokers. After
every 1,000 frames each broker must answer ApiVersions on a new connection within 1 s and still
be running; at the end the sentinel topic must read back byte for byte. A failure saves the last
frames sent to fuzz/wire-crashes/ (one connection's stream per file, as size-prefixed frames)
and exits 1.

`record` runs a small workload of each client through a recording proxy in front of a
standalone broker and writes each client connection's request stream to fuzz/wire-corpus/.

Uses the venv's Python (.venv, made by scripts/test) and target/release/gregor.
"""
from __future__ import annotations

import argparse
import os
import random
import selectors
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import List, Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "compat"))

import gregor_harness  # noqa: E402
from gregor_harness import Broker, ZooKeeper, free_port  # noqa: E402

CORPUS = ROOT / "fuzz" / "wire-corpus"
CRASHES = ROOT / "fuzz" / "wire-crashes"
SENTINEL = "wire-fuzz-sentinel"
CHECK_EVERY = 1000
CHECK_TIMEOUT = 1.0

INTERESTING16 = [0, 1, -1, 0x7F, 0x80, 0xFF, 0x7FFF, -0x8000, 0x100, 0x1000]
INTERESTING32 = [0, 1, -1, 0x7FFFFFFF, -0x80000000, 0xFFFF, 0x10000, 0x1000000, 1000000]


# ---------------------------------------------------------------- corpus
def split_frames(stream: bytes) -> List[bytes]:
    """A recorded stream (size-prefixed frames) as frame bodies."""
    frames, pos = [], 0
    while pos + 4 <= len(stream):
        (n,) = struct.unpack_from(">i", stream, pos)
        if n < 0 or pos + 4 + n > len(stream):
            break
        frames.append(stream[pos + 4:pos + 4 + n])
        pos += 4 + n
    return frames


def load_corpus() -> List[List[bytes]]:
    streams = []
    for p in sorted(CORPUS.glob("*.bin")):
        frames = split_frames(p.read_bytes())
        if frames:
            streams.append(frames)
    if not streams:
        sys.exit(f"no recorded connections in {CORPUS}: run scripts/wire-fuzz record")
    return streams


# ---------------------------------------------------------------- mutation
def mutate(frame: bytes, rng: random.Random, all_frames: List[bytes]) -> bytes:
    b = bytearray(frame)
    for _ in range(rng.choice((1, 1, 1, 2, 3, 5))):
        op = rng.randrange(10)
        if not b:
            b += bytes(rng.randrange(256) for _ in range(rng.randrange(1, 16)))
            continue
        i = rng.randrange(len(b))
        if op == 0:  # bit flip
            b[i] ^= 1 << rng.randrange(8)
        elif op == 1:  # random byte
            b[i] = rng.randrange(256)
        elif op == 2 and len(b) >= 2:  # interesting int16 (lengths of strings, versions, counts)
            i = rng.randrange(len(b) - 1)
            struct.pack_into(">h", b, i, rng.choice(INTERESTING16) if rng.random() < 0.8 else rng.randrange(-32768, 32768))
        elif op == 3 and len(b) >= 4:  # interesting int32 (array counts, sizes, partition counts)
            i = rng.randrange(len(b) - 3)
            v = rng.choice(INTERESTING32)
            struct.pack_into(">i", b, i, v if v < 0x80000000 else v - (1 << 32))
        elif op == 4:  # truncate
            del b[rng.randrange(len(b)):]
        elif op == 5:  # append random bytes
            b += bytes(rng.randrange(256) for _ in range(rng.randrange(1, 64)))
        elif op == 6:  # splice a piece of another frame
            other = rng.choice(all_frames)
            if other:
                j = rng.randrange(len(other))
                piece = other[j:j + rng.randrange(1, 64)]
                b[i:i + len(piece)] = piece
        elif op == 7 and len(b) >= 4:  # another version of the same API
            struct.pack_into(">h", b, 2, rng.randrange(-1, 20))
        elif op == 8 and len(b) >= 2:  # another API key (inter-broker ones included)
            struct.pack_into(">h", b, 0, rng.randrange(-1, 80))
        elif op == 9:  # duplicate a region (repeated array elements)
            j = rng.randrange(i, min(len(b), i + 64) + 1)
            b[i:i] = b[i:j]
    return bytes(b)


def frame_bytes(body: bytes, rng: random.Random) -> bytes:
    if rng.random() < 0.02:  # a size prefix that lies
        return struct.pack(">i", rng.choice([len(body) + rng.randrange(1, 100), -1, 0x7FFFFFFF, 0])) + body
    return struct.pack(">i", len(body)) + body


# ---------------------------------------------------------------- checks
SLOWEST = [0.0]


def api_versions_ok(host: str, port: int) -> Optional[str]:
    start = time.monotonic()
    try:
        gregor_harness.api_versions_probe(host, port, timeout=CHECK_TIMEOUT)
    except Exception as e:  # noqa: BLE001
        # Stalled, or only slow (a loaded machine)? The report says which.
        try:
            gregor_harness.api_versions_probe(host, port, timeout=30)
            late = f"answered {time.monotonic() - start:.1f}s after the check began"
        except Exception as e2:  # noqa: BLE001
            late = f"and none within 30 s either ({e2!r})"
        return f"no ApiVersions answer within {CHECK_TIMEOUT}s from {host}:{port} ({e!r}); {late}"
    took = time.monotonic() - start
    SLOWEST[0] = max(SLOWEST[0], took)
    if took > CHECK_TIMEOUT:
        return f"ApiVersions from {host}:{port} took {took:.2f}s"
    return None


class Sender:
    """Up to `parallel` connections at once, each sending its bytes, half-closing and reading
    what comes back until the broker closes it or `wait` passes (a long-poll fetch or a join
    may hold a connection longer: it is not waited for)."""

    def __init__(self, parallel: int, wait: float):
        self.parallel = parallel
        self.wait = wait
        self.sel = selectors.DefaultSelector()
        self.open = 0

    def add(self, host: str, port: int, data: bytes) -> None:
        while self.open >= self.parallel:
            self.step()
        s = socket.socket()
        s.setblocking(False)
        try:
            s.connect_ex((host, port))
        except OSError:
            s.close()
            return
        state = {"out": memoryview(data), "deadline": time.monotonic() + self.wait, "shut": False}
        self.sel.register(s, selectors.EVENT_READ | selectors.EVENT_WRITE, state)
        self.open += 1

    def close(self, s) -> None:
        self.sel.unregister(s)
        s.close()
        self.open -= 1

    def step(self, timeout: float = 0.05) -> None:
        for key, ev in self.sel.select(timeout):
            s, st = key.fileobj, key.data
            try:
                if ev & selectors.EVENT_READ:
                    if not s.recv(65536):
                        self.close(s)
                        continue
                if ev & selectors.EVENT_WRITE:
                    if st["out"]:
                        n = s.send(st["out"])
                        st["out"] = st["out"][n:]
                    if not st["out"] and not st["shut"]:
                        s.shutdown(socket.SHUT_WR)
                        st["shut"] = True
                        self.sel.modify(s, selectors.EVENT_READ, st)
            except (BlockingIOError, InterruptedError):
                pass
            except OSError:
                self.close(s)
        now = time.monotonic()
        for key in list(self.sel.get_map().values()):
            if key.data["deadline"] < now:
                self.close(key.fileobj)

    def drain(self) -> None:
        while self.open:
            self.step()


# ---------------------------------------------------------------- sentinel
def write_sentinel(bootstrap: str, rf: int, rng: random.Random):
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    fut = admin.create_topics([NewTopic(SENTINEL, num_partitions=2, replication_factor=rf)])[SENTINEL]
    fut.result(30)
    records = [(f"k{i}".encode(), bytes(rng.randrange(256) for _ in range(rng.randrange(0, 300))))
               for i in range(200)]
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True})
    errors = []

    def cb(err, _msg):
        if err is not None:
            errors.append(err)

    for i, (k, v) in enumerate(records):
        p.produce(SENTINEL, key=k, value=v, partition=i % 2, on_delivery=cb)
    left = p.flush(30)
    if left or errors:
        sys.exit(f"sentinel produce failed: {left} unflushed, errors {errors[:3]}")
    return records


def read_sentinel(bootstrap: str, records) -> Optional[str]:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "wire-fuzz-check", "enable.auto.commit": False,
                  "auto.offset.reset": "earliest"})
    try:
        c.assign([TopicPartition(SENTINEL, p, 0) for p in (0, 1)])
        got = {0: [], 1: []}
        deadline = time.monotonic() + 60
        while sum(map(len, got.values())) < len(records) and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None or m.error():
                continue
            got[m.partition()].append((m.key(), m.value() or b""))
    finally:
        c.close()
    for part in (0, 1):
        want = [r for i, r in enumerate(records) if i % 2 == part]
        if got[part] != want:
            return (f"sentinel partition {part}: read {len(got[part])} records, expected {len(want)}; "
                    f"first difference at {next((i for i, (a, b) in enumerate(zip(got[part], want)) if a != b), min(len(got[part]), len(want)))}")
    return None


# ---------------------------------------------------------------- run
def run(args) -> int:
    rng = random.Random(args.seed)
    streams = load_corpus()
    all_frames = [f for s in streams for f in s]
    zk = None
    brokers: List[Broker] = []
    cluster = None
    try:
        if args.mode == "standalone":
            b = Broker()
            b.start()
            brokers = [b]
            rf = 1
        else:
            from cluster_harness import Cluster
            zk = ZooKeeper()
            zk.start()
            cluster = Cluster(zk, n=3)
            cluster.start()
            brokers = [cluster.brokers[i] for i in sorted(cluster.brokers)]
            rf = 3
        bootstrap = ",".join(b.bootstrap for b in brokers)
        records = write_sentinel(bootstrap, rf, rng)
        print(f"wire-fuzz: {args.mode}, {len(brokers)} broker(s), {len(streams)} recorded connections "
              f"({len(all_frames)} frames), seed {args.seed}, {args.frames} frames", flush=True)

        sent = 0
        recent: List[bytes] = []
        started = time.monotonic()
        next_check = CHECK_EVERY
        sender = Sender(args.parallel, args.wait)
        while sent < args.frames:
            frames = rng.choice(streams)
            # A short window of one connection, from its start more often than not: the
            # first frames (ApiVersions, Metadata) set up what the later ones use.
            lo = 0 if rng.random() < 0.5 else rng.randrange(len(frames))
            window = frames[lo:lo + rng.randrange(1, 9)]
            out = bytearray()
            for f in window:
                body = mutate(f, rng, all_frames) if rng.random() < args.mutate else f
                out += frame_bytes(body, rng)
            b = rng.choice(brokers)
            recent.append(bytes(out))
            sender.add(b.host, b.port, bytes(out))
            sent += len(window)
            if sent >= next_check:
                next_check += CHECK_EVERY
                recent = recent[-400:]
                # The fuzz connections finish (or are given up on) first: the check is of the
                # broker, not of a listen backlog full of our own connections.
                sender.drain()
                problem = None
                for br in brokers:
                    if not br.alive():
                        problem = f"broker {br.broker_id} exited with {br.proc.returncode}"
                        break
                    problem = api_versions_ok(br.host, br.port)
                    if problem:
                        break
                if problem:
                    return fail(problem, recent, brokers)
        sender.drain()
        elapsed = time.monotonic() - started
        for br in brokers:
            if not br.alive():
                return fail(f"broker {br.broker_id} exited with {br.proc.returncode}", recent, brokers)
            problem = api_versions_ok(br.host, br.port)
            if problem:
                return fail(problem, recent, brokers)
        problem = read_sentinel(bootstrap, records)
        if problem:
            return fail(problem, recent, brokers)
        for br in brokers:
            hits = gregor_harness.scan_log(br.log_path)
            if hits:
                return fail("broker log: " + " / ".join(hits), recent, brokers)
        print(f"wire-fuzz: {sent} frames in {elapsed:.1f}s ({sent / elapsed:.0f} frames/s), "
              f"every broker answered each check (slowest {SLOWEST[0] * 1000:.0f} ms), "
              f"sentinel topic read back intact", flush=True)
        return 0
    finally:
        for b in brokers:
            b.cleanup()
        if cluster is not None:
            try:
                cluster.kz.stop()
                cluster.kz.close()
            except Exception:  # noqa: BLE001
                pass
        if zk is not None:
            zk.cleanup()


def replay(args) -> int:
    """Sends saved connections (wire-crashes files) to a fresh standalone broker, as the run
    did, checking after each batch of `--check-every` connections."""
    b = Broker()
    b.start()
    try:
        sender = Sender(args.parallel, args.wait)
        files = sorted(Path(f) for f in args.files)
        for i, f in enumerate(files):
            sender.add(b.host, b.port, f.read_bytes())
            if (i + 1) % args.check_every == 0 or i + 1 == len(files):
                sender.drain()
                problem = None if b.alive() else f"broker exited with {b.proc.returncode}"
                problem = problem or api_versions_ok(b.host, b.port)
                if problem:
                    print(f"replay: after {f.name} ({i + 1} connections): {problem}")
                    print(b.stderr_tail(20))
                    b.expect_exit()
                    b.health = []
                    return 1
        print(f"replay: {len(files)} connections, broker answered every check")
        return 0
    finally:
        b.cleanup()


def fail(problem: str, recent: List[bytes], brokers: List[Broker]) -> int:
    CRASHES.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for i, data in enumerate(recent):
        (CRASHES / f"{stamp}-{i:04d}.bin").write_bytes(data)
    # With its broker's log: a stall may need state built long before the last connections.
    print(f"wire-fuzz: FAILED: {problem}\n  the last {len(recent)} connections' bytes are in {CRASHES}/{stamp}-*.bin",
          file=sys.stderr)
    for b in brokers:
        print(b.stderr_tail(30), file=sys.stderr)
        if b.log_path.exists():
            (CRASHES / f"{stamp}-broker-{b.broker_id}.log").write_bytes(b.log_path.read_bytes())
        b.expect_exit()
        b.health = []  # keep nothing: the report above says it all
    return 1


# ---------------------------------------------------------------- record
class RecordingProxy(threading.Thread):
    """Forwards connections to the broker, keeping each one's client-to-broker bytes."""

    def __init__(self, upstream_port: int):
        super().__init__(daemon=True)
        self.upstream_port = upstream_port
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.label = "setup"
        self.recorded: List[tuple] = []  # (label, bytearray)
        self.lock = threading.Lock()

    def run(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            buf = bytearray()
            with self.lock:
                self.recorded.append((self.label, buf))
            threading.Thread(target=self.pipe, args=(c, buf), daemon=True).start()

    def pipe(self, c, buf):
        try:
            u = socket.create_connection(("127.0.0.1", self.upstream_port))
        except OSError:
            c.close()
            return

        def back():
            try:
                while True:
                    d = u.recv(65536)
                    if not d:
                        break
                    c.sendall(d)
            except OSError:
                pass
            finally:
                try:
                    c.shutdown(socket.SHUT_WR)
                except OSError:
                    pass

        threading.Thread(target=back, daemon=True).start()
        try:
            while True:
                d = c.recv(65536)
                if not d:
                    break
                buf += d
                u.sendall(d)
        except OSError:
            pass
        finally:
            try:
                u.shutdown(socket.SHUT_WR)
            except OSError:
                pass


def record(_args) -> int:
    from confluent_kafka import Consumer, Producer
    from confluent_kafka.admin import AdminClient, ConfigResource, NewPartitions, NewTopic

    port = free_port()
    proxy = RecordingProxy(port)
    b = Broker(port=port, overrides={"advertised.listeners": f"PLAINTEXT://127.0.0.1:{proxy.port}",
                                      "offsets.topic.num.partitions": "2", "offsets.topic.replication.factor": "1",
                                      "transaction.state.log.num.partitions": "2",
                                      "transaction.state.log.replication.factor": "1",
                                      "transaction.state.log.min.isr": "1"})
    b.start()
    proxy.start()
    boot = f"127.0.0.1:{proxy.port}"
    kcat = ["kcat", "-b", boot, "-q"]
    try:
        proxy.label = "kcat"
        subprocess.run(kcat + ["-L"], check=True, timeout=30, capture_output=True)
        subprocess.run(kcat + ["-P", "-t", "rec-kcat", "-K:", "-z", "gzip"], input=b"a:1\nb:2\nc:3\n",
                       check=True, timeout=30)
        subprocess.run(kcat + ["-P", "-t", "rec-kcat", "-z", "lz4"], input=b"x\ny\n", check=True, timeout=30)
        subprocess.run(kcat + ["-C", "-t", "rec-kcat", "-o", "beginning", "-e"], check=True, timeout=30,
                       capture_output=True)
        subprocess.run(kcat + ["-Q", "-t", "rec-kcat:0:-1"], timeout=30, capture_output=True)
        subprocess.run(kcat + ["-G", "rec-kcat-group", "rec-kcat", "-o", "beginning", "-e"], timeout=40,
                       capture_output=True)

        proxy.label = "confluent"
        admin = AdminClient({"bootstrap.servers": boot})
        for f in admin.create_topics([NewTopic("rec-ck", 2, 1, config={"retention.ms": "3600000"})]).values():
            f.result(30)
        for f in admin.create_partitions([NewPartitions("rec-ck", 3)]).values():
            f.result(30)
        for f in admin.describe_configs([ConfigResource("topic", "rec-ck")]).values():
            f.result(30)
        p = Producer({"bootstrap.servers": boot, "enable.idempotence": True, "compression.type": "snappy"})
        for i in range(20):
            p.produce("rec-ck", key=str(i).encode(), value=b"v" * i, headers=[("h", b"x")])
        p.flush(30)
        c = Consumer({"bootstrap.servers": boot, "group.id": "rec-ck-group", "auto.offset.reset": "earliest"})
        c.subscribe(["rec-ck"])
        got, deadline = 0, time.monotonic() + 30
        while got < 20 and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and not m.error():
                got += 1
        c.commit(asynchronous=False)
        c.close()
        for f in admin.delete_topics(["rec-ck"]).values():
            f.result(30)

        proxy.label = "kafka-python"
        from kafka import KafkaConsumer, KafkaProducer
        for api in ((0, 9), (0, 10), (2, 0)):
            kp = KafkaProducer(bootstrap_servers=boot, api_version=api)
            for i in range(3):
                kp.send("rec-kp", key=b"k", value=f"v{i}".encode())
            kp.flush(30)
            kp.close()
            kc = KafkaConsumer("rec-kp", bootstrap_servers=boot, api_version=api, auto_offset_reset="earliest",
                               consumer_timeout_ms=3000, group_id=None if api == (0, 9) else "rec-kp-group")
            for _ in kc:
                pass
            kc.close()
    finally:
        time.sleep(0.5)  # let the proxy's pipes see the clients' closes
        b.cleanup()
    CORPUS.mkdir(parents=True, exist_ok=True)
    for old in CORPUS.glob("*.bin"):
        old.unlink()
    seen = set()
    n = 0
    for label, buf in proxy.recorded:
        data = bytes(buf)
        if not split_frames(data) or data in seen:
            continue
        seen.add(data)
        (CORPUS / f"{label}-{n:03d}.bin").write_bytes(data)
        n += 1
    total = sum(p.stat().st_size for p in CORPUS.glob("*.bin"))
    print(f"recorded {n} connections ({total} bytes) into {CORPUS}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--mode", choices=("standalone", "cluster"), default="standalone")
    r.add_argument("--frames", type=int, default=10_000)
    r.add_argument("--seed", type=int, default=int(os.environ.get("WIRE_FUZZ_SEED", time.time_ns() % 1_000_000)))
    r.add_argument("--mutate", type=float, default=0.5, help="chance that a frame is mutated")
    r.add_argument("--wait", type=float, default=0.5, help="seconds to wait for one connection's answers")
    r.add_argument("--parallel", type=int, default=32, help="connections open at once")
    sub.add_parser("record")
    rp = sub.add_parser("replay")
    rp.add_argument("files", nargs="+")
    rp.add_argument("--parallel", type=int, default=32)
    rp.add_argument("--wait", type=float, default=0.5)
    rp.add_argument("--check-every", type=int, default=50)
    args = ap.parse_args()
    return {"run": run, "record": record, "replay": replay}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
