"""kcat (Debian's kcat 1.7.1, librdkafka 2.0.2) against gregor.

kcat has no admin API: topics are auto-created by producing (brokers started with
num.partitions=3 where 3 partitions are wanted).  Consumption uses kcat's simple
(group-less) consumer.
"""
import json
import re
import shutil
import subprocess
import threading
import time

import pytest

from common import CODECS, kill9_during_produce, uniq, wait_until

KCAT = shutil.which("kcat") or shutil.which("kafkacat")
pytestmark = pytest.mark.skipif(KCAT is None, reason="kcat not installed (scripts/test installs it)")

FMT = "%p\\t%o\\t%T\\t%K\\t%k\\t%S\\t%s\\t%h\\n"
STATIC_HEADERS = [("src", "kcat"), ("dup", "a"), ("dup", "b")]


def kcat(args, input=None, timeout=180, check=True):
    cmd = [KCAT, "-m", "30"] + args
    p = subprocess.run(cmd, input=input, capture_output=True, timeout=timeout)
    if check:
        assert p.returncode == 0, (f"kcat {' '.join(args)} exited {p.returncode}\n"
                                   f"stderr: {p.stderr.decode(errors='replace')[-3000:]}")
    return p


def produce_lines(broker, topic, lines, extra=(), headers=True):
    args = ["-P", "-b", broker.bootstrap, "-t", topic, "-K", "\\t"]
    if headers:
        for k, v in STATIC_HEADERS:
            args += ["-H", f"{k}={v}"]
    args += list(extra)
    return kcat(args, input=("\n".join(lines) + "\n").encode())


def consume(broker, topic, extra=("-o", "beginning"), partition=None):
    args = ["-C", "-b", broker.bootstrap, "-t", topic, "-e", "-f", FMT] + list(extra)
    if partition is not None:
        args += ["-p", str(partition)]
    out = kcat(args).stdout.decode()
    rows = []
    for line in out.split("\n"):
        if not line:
            continue
        p, o, ts, klen, key, vlen, val, hdrs = line.split("\t")
        rows.append({"partition": int(p), "offset": int(o), "ts": int(ts), "key": key, "klen": int(klen),
                     "value": val, "vlen": int(vlen), "headers": hdrs})
    return rows


def metadata(broker, topic=None):
    args = ["-L", "-J", "-b", broker.bootstrap]
    if topic:
        args += ["-t", topic]
    return json.loads(kcat(args).stdout.decode())


def lines_for(n, tag="r"):
    return [f"key-{i % 97}-{i}\tvalue-{tag}-{i}-" + "x" * (i % 50) for i in range(n)]


def check_rows(rows, n, tag="r", t0=None, t1=None, headers=True, ordered=True):
    assert len(rows) == n, f"consumed {len(rows)} messages, produced {n}"
    by_part = {}
    seen = set()
    for r in rows:
        by_part.setdefault(r["partition"], []).append(r)
    for p, rs in by_part.items():
        assert [r["offset"] for r in rs] == list(range(len(rs))), f"partition {p}: offsets not consecutive from 0"
        last = -1
        for r in rs:
            m = re.fullmatch(rf"value-{tag}-(\d+)-x*", r["value"])
            assert m, f"unexpected value {r['value']!r}"
            seq = int(m.group(1))
            if ordered:
                assert seq > last, f"partition {p}: out of order, seq {last} then {seq}"
            last = seq
            assert seq not in seen, f"duplicate seq {seq}"
            seen.add(seq)
            assert r["key"] == f"key-{seq % 97}-{seq}" and r["klen"] == len(r["key"]), f"seq {seq}: key {r['key']!r}"
            assert r["value"] == f"value-{tag}-{seq}-" + "x" * (seq % 50), f"seq {seq}: value {r['value']!r}"
            assert r["vlen"] == len(r["value"])
            if headers:
                assert r["headers"] == ",".join(f"{k}={v}" for k, v in STATIC_HEADERS), \
                    f"seq {seq}: headers {r['headers']!r}"
            if t0 is not None:
                assert t0 <= r["ts"] <= t1, f"seq {seq}: timestamp {r['ts']} not within produce window [{t0}, {t1}]"
    assert seen == set(range(n))


def now_ms():
    return int(time.time() * 1000)


# ---------------------------------------------------------------------------


def test_metadata_lists_broker_and_topics(broker):
    t = uniq("kcat-md")
    produce_lines(broker, t, lines_for(3))
    md = metadata(broker)
    assert [(b["id"], b["name"]) for b in md["brokers"]] == [(0, broker.bootstrap)], md["brokers"]
    assert md.get("controllerid") == 0, md.get("controllerid")
    topics = {x["topic"]: x for x in md["topics"]}
    assert t in topics, f"{t} not in {sorted(topics)}"
    # auto-created with the default num.partitions=1 (an empty list would make the loop vacuous)
    assert [p["partition"] for p in topics[t]["partitions"]] == [0], topics[t]
    for p in topics[t]["partitions"]:
        assert p["leader"] == 0
        assert [r["id"] for r in p["replicas"]] == [0]
        assert [r["id"] for r in p["isrs"]] == [0]
    plain = kcat(["-L", "-b", broker.bootstrap]).stdout.decode()
    assert "1 brokers:" in plain and f"broker 0 at {broker.bootstrap}" in plain, plain
    assert f'topic "{t}"' in plain


def test_auto_create_three_partitions(broker_factory):
    broker = broker_factory({"num.partitions": "3"})
    t = uniq("kcat-auto")
    produce_lines(broker, t, lines_for(30))
    md = metadata(broker, t)
    [topic] = md["topics"]
    assert topic["topic"] == t and "error" not in topic, topic
    assert sorted(p["partition"] for p in topic["partitions"]) == [0, 1, 2]
    rows = consume(broker, t)
    check_rows(rows, 30)


def test_produce_consume_10k_keys_headers(broker_factory):
    broker = broker_factory({"num.partitions": "3"})
    t = uniq("kcat-10k")
    t0 = now_ms()
    produce_lines(broker, t, lines_for(10_000))
    t1 = now_ms()
    rows = consume(broker, t)
    assert len({r["partition"] for r in rows}) == 3, "keys did not spread over 3 partitions"
    check_rows(rows, 10_000, t0=t0, t1=t1)
    # per-partition consumption gives the same records
    per = []
    for p in range(3):
        per += consume(broker, t, partition=p)
    assert sorted((r["partition"], r["offset"], r["value"]) for r in per) == \
           sorted((r["partition"], r["offset"], r["value"]) for r in rows)


def test_json_envelope(broker):
    t = uniq("kcat-json")
    produce_lines(broker, t, lines_for(5))
    out = kcat(["-C", "-b", broker.bootstrap, "-t", t, "-o", "beginning", "-e", "-J"]).stdout.decode()
    msgs = [json.loads(x) for x in out.splitlines() if x.strip()]
    assert [m["offset"] for m in msgs] == [0, 1, 2, 3, 4]
    for i, m in enumerate(msgs):
        assert m["key"] == f"key-{i}-{i}" and m["payload"] == f"value-r-{i}-" + "x" * i
        assert m["headers"] == ["src", "kcat", "dup", "a", "dup", "b"], m["headers"]
        assert m["tstype"] == "create"


@pytest.mark.parametrize("codec", CODECS)
def test_codec_roundtrip(broker, codec):
    t = uniq(f"kcat-{codec}")
    produce_lines(broker, t, lines_for(3000, codec), extra=["-z", codec, "-X", "linger.ms=20"])
    check_rows(consume(broker, t), 3000, tag=codec)


@pytest.mark.parametrize("acks", ["0", "1", "all"])
def test_acks(broker, acks):
    t = uniq(f"kcat-acks{acks}")
    extra = ["-X", f"acks={acks}"]
    if acks != "all":
        extra += ["-X", "enable.idempotence=false"]
    produce_lines(broker, t, lines_for(1000, "a" + acks), extra=extra)
    if acks == "0":
        # no acknowledgement: wait until the broker has everything
        wait_until(lambda: len(consume(broker, t)) == 1000, 60, "all acks=0 messages to arrive")
    check_rows(consume(broker, t), 1000, tag="a" + acks)


def test_idempotent_producer(broker):
    t = uniq("kcat-idem")
    produce_lines(broker, t, lines_for(2000, "idem"), extra=["-X", "enable.idempotence=true", "-X", "acks=all"])
    check_rows(consume(broker, t), 2000, tag="idem")


def test_offsets_and_query_by_timestamp(broker):
    t = uniq("kcat-off")
    produce_lines(broker, t, lines_for(50, "o"))
    first = consume(broker, t)
    assert len(first) == 50
    max_ts = max(r["ts"] for r in first)
    # make sure the wall clock is past every timestamp of the first batch
    wait_until(lambda: now_ms() > max_ts, 10, "the clock to pass the first batch's timestamps")
    produce_lines(broker, t, [f"key-{i % 97}-{i}\tvalue-o-{i}-" + "x" * (i % 50) for i in range(50, 100)])
    rows = consume(broker, t)
    check_rows(rows, 100, tag="o")
    second_ts = min(r["ts"] for r in rows if r["offset"] >= 50)
    assert second_ts > max_ts

    # -o <absolute>, -o -N (relative to end), -o end, -o s@ts
    r = consume(broker, t, extra=["-o", "42", "-c", "1"])
    assert [x["offset"] for x in r] == [42] and r[0]["value"].startswith("value-o-42-")
    r = consume(broker, t, extra=["-o", "-10"])
    assert [x["offset"] for x in r] == list(range(90, 100))
    r = consume(broker, t, extra=["-o", "end"])
    assert r == []
    r = consume(broker, t, extra=["-o", f"s@{second_ts}"])
    assert [x["offset"] for x in r] == list(range(50, 100))
    r = consume(broker, t, extra=["-o", "beginning", "-o", f"e@{second_ts}"])
    assert [x["offset"] for x in r] == list(range(0, 50))

    # -Q: offsets by timestamp
    out = kcat(["-Q", "-b", broker.bootstrap, "-t", f"{t}:0:{second_ts}"]).stdout.decode()
    m = re.search(r"\[0\] offset (-?\d+)", out)
    assert m and int(m.group(1)) == 50, f"-Q {second_ts}: {out!r}"
    out = kcat(["-Q", "-b", broker.bootstrap, "-t", f"{t}:0:{first[0]['ts']}"]).stdout.decode()
    m = re.search(r"\[0\] offset (-?\d+)", out)
    assert m and int(m.group(1)) == 0, f"-Q first ts: {out!r}"
    out = kcat(["-Q", "-b", broker.bootstrap, "-t", f"{t}:0:{now_ms() + 3_600_000}"]).stdout.decode()
    m = re.search(r"\[0\] offset (-?\d+)", out)
    assert m and int(m.group(1)) == -1, f"-Q future ts: {out!r}"


def test_readme_example(broker):
    hp = broker.bootstrap
    p = subprocess.run(["bash", "-c", f"set -o pipefail; seq 1 100000 | {KCAT} -P -b {hp} -t t"],
                       capture_output=True, timeout=300)
    assert p.returncode == 0, p.stderr.decode(errors="replace")[-2000:]
    p = subprocess.run(["bash", "-c", f"set -o pipefail; {KCAT} -C -b {hp} -t t -e | wc -l"],
                       capture_output=True, timeout=300)
    assert p.returncode == 0, p.stderr.decode(errors="replace")[-2000:]
    assert int(p.stdout.decode().strip()) == 100000
    # and the content is exactly 1..100000 in order (1 partition by default)
    out = kcat(["-C", "-b", hp, "-t", "t", "-o", "beginning", "-e"]).stdout.decode().split("\n")
    assert out[:-1] == [str(i) for i in range(1, 100001)]


def test_restart_sigterm_keeps_data(broker_factory):
    broker = broker_factory({"num.partitions": "3"})
    t = uniq("kcat-restart")
    produce_lines(broker, t, lines_for(5000, "rs"), extra=["-X", "acks=all"])
    before = consume(broker, t)
    # durability only here; ordering is checked by the other tests
    check_rows(before, 5000, tag="rs", ordered=False)
    rc = broker.restart("term")
    assert rc == 0, f"SIGTERM shutdown exit code {rc}"
    after = consume(broker, t)
    key = lambda r: (r["partition"], r["offset"])  # noqa: E731
    assert sorted(after, key=key) == sorted(before, key=key), "log content changed across a clean restart"
    # and the log continues where it stopped
    produce_lines(broker, t, [f"key-{i % 97}-{i}\tvalue-rs-{i}-" + "x" * (i % 50) for i in range(5000, 5100)])
    check_rows(consume(broker, t), 5100, tag="rs", ordered=False)


_DELIVERED = re.compile(rb"Message delivered to partition (\d+) \(offset (-?\d+)\)")
_DELIVERY_FAILED = re.compile(rb"Message delivery failed")
# what kcat prints when it gives up because its only broker is down (it then exits 1)
_OUTAGE = (b"Broker transport failure", b"All broker connections are down", b"Error at error_cb",
           b"Disconnected", b"Connection refused", b"Connect to")


class KcatProducer:
    """`kcat -P -p <partition>` fed line by line from a thread (paced, so the run lasts until
    halted or kcat exits); its delivery reports (-v -v -v) are read from stderr.  The producer is
    idempotent, so reports come in send order: the k-th report is about the k-th line."""

    def __init__(self, broker, topic, partition, lines, chunk=20, pause=0.005):
        self.partition, self.lines = partition, lines
        self.reports = []  # per line in order: its acknowledged offset, or None if delivery failed
        self.unexpected = []  # stderr lines that are neither reports nor the outage
        self.halt = threading.Event()
        self.proc = subprocess.Popen(
            [KCAT, "-P", "-b", broker.bootstrap, "-t", topic, "-p", str(partition), "-K", "\t", "-v", "-v", "-v",
             "-X", "enable.idempotence=true", "-X", "acks=all", "-X", "linger.ms=5"],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.feeder = threading.Thread(target=self._feed, args=(chunk, pause), daemon=True)
        self.reader.start()
        self.feeder.start()

    @property
    def offsets(self):
        return [o for o in self.reports if o is not None]

    def _read(self):
        for line in self.proc.stderr:
            m = _DELIVERED.search(line)
            if m:
                self.reports.append(int(m.group(2)) if int(m.group(1)) == self.partition else ("wrong", line))
            elif _DELIVERY_FAILED.search(line):
                self.reports.append(None)
            elif (line.startswith(b"%") and (b"ERROR" in line or b"|FAIL|" in line or b"Error" in line)
                  and not any(o in line for o in _OUTAGE)):
                self.unexpected.append(line.decode(errors="replace").strip())

    def _feed(self, chunk, pause):
        try:
            for i in range(0, len(self.lines), chunk):
                if self.halt.is_set():
                    break
                self.proc.stdin.write(("\n".join(self.lines[i:i + chunk]) + "\n").encode())
                self.proc.stdin.flush()
                time.sleep(pause)
        except BrokenPipeError:  # kcat exited (its broker went away)
            pass
        finally:
            try:
                self.proc.stdin.close()
            except BrokenPipeError:
                pass

    def running(self):
        return self.feeder.is_alive() and self.proc.poll() is None and not self.halt.is_set()

    def stop(self):
        self.halt.set()
        self.feeder.join(60)
        self.proc.wait(180)
        self.reader.join(30)
        assert not self.unexpected, f"kcat -P -p {self.partition}: {self.unexpected[:5]}"
        bad = [r for r in self.reports if isinstance(r, tuple)]
        assert not bad, bad[:3]
        # idempotent: once one delivery failed, none after it may have succeeded
        if None in self.reports:
            first_fail = self.reports.index(None)
            assert all(r is None for r in self.reports[first_fail:]), "a delivery succeeded after one failed"


def test_kill9_keeps_acked_data(broker_factory):
    """kill -9 while three kcat producers (one per partition) are still sending; every record
    acknowledged to them is at its acknowledged offset after the restart."""
    broker = broker_factory({"num.partitions": "3"})
    t = uniq("kcat-kill")
    produce_lines(broker, t, ["warm\tup"], extra=["-p", "0"])  # auto-create the 3 partitions
    lines = {p: [f"key-{p}-{i}\tvalue-k9-{p}-{i}" for i in range(1, 100_000)] for p in range(3)}
    prods = [KcatProducer(broker, t, p, lines[p]) for p in range(3)]
    try:
        # kcat exits once its only broker is gone: what it was told before that must survive
        at_kill = kill9_during_produce(broker, lambda: min(len(k.offsets) for k in prods),
                                       lambda: all(k.running() for k in prods),
                                       lambda: [k.stop() for k in prods], before=500, after=0)
    finally:
        for k in prods:
            k.halt.set()
    rows = {(r["partition"], r["offset"]): r for r in consume(broker, t)}
    for k in prods:
        p = k.partition
        assert k.offsets == sorted(set(k.offsets)), f"partition {p}: delivery reports out of order"
        lost = []
        for i, o in enumerate(k.offsets):
            key, value = lines[p][i].split("\t")
            r = rows.get((p, o))
            if r is None or (r["key"], r["value"]) != (key, value):
                lost.append((i, o, None if r is None else r["value"]))
        assert not lost, (f"partition {p}: {len(lost)} of {len(k.offsets)} acknowledged records not at their "
                          f"offset after kill -9 (line, acked offset, found): {lost[:10]}")
        stored = [rows[(q, o)]["value"] for (q, o) in sorted(rows) if q == p]
        if p == 0:
            assert stored[0] == "up"
            stored = stored[1:]
        # nothing twice, nothing out of order, nothing that was not sent
        assert stored == [ln.split("\t")[1] for ln in lines[p][:len(stored)]], f"partition {p}: stored {stored[:5]}..."
    print(f"kill -9 with >= {at_kill} acknowledged per partition; acknowledged "
          f"{[len(k.offsets) for k in prods]}; stored {[sum(1 for q, _ in rows if q == p) for p in range(3)]}")
