"""kcat (Debian's kcat 1.7.1, librdkafka 2.0.2) against gregor.

kcat has no admin API: topics are auto-created by producing (brokers started with
num.partitions=3 where 3 partitions are wanted).  Consumption uses kcat's simple
(group-less) consumer.
"""
import json
import re
import shutil
import subprocess
import time

import pytest

from common import CODECS, uniq, wait_until

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


def test_kill9_keeps_acked_data(broker_factory):
    broker = broker_factory({"num.partitions": "3"})
    t = uniq("kcat-kill")
    produce_lines(broker, t, lines_for(5000, "k9"), extra=["-X", "acks=all"])
    before = consume(broker, t)
    check_rows(before, 5000, tag="k9", ordered=False)
    broker.restart("kill")
    after = consume(broker, t)
    key = lambda r: (r["partition"], r["offset"])  # noqa: E731
    assert sorted(after, key=key) == sorted(before, key=key), "acknowledged data changed across kill -9"
