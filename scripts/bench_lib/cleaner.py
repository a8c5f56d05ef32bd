"""Produce throughput while the log cleaner runs, on one gregor (scripts/bench --cleaner).

1. A compacted topic is filled with GREGOR_BENCH_CLEANER_MB (1024) of keyed 1 KiB records, 10%
   of the keys live (each written 10 times), held back from cleaning by min.compaction.lag.ms.
2. kcat produces chunks of GREGOR_BENCH_CHUNK_MB (32) of 1 KiB records, acks=1, to another
   topic on the same broker, back to back: first with the cleaner idle (baseline), then after
   min.compaction.lag.ms is set to 0, while the cleaner's pass runs. A chunk counts as "while
   cleaning" only if it started after the cleaner had begun (the alteration plus two
   log.cleaner.backoff.ms, 100 ms: the pass starts by reading the whole dirty log into its offset
   map, before its first `.cleaned` file) and ended before the broker logged the end of the pass.
3. Reported: median MB/s of each set, the cleaner's own MB/s from its "log cleaned" line, and a
   sequential write + fdatasync of 1 GiB to the same disk (dd).

kcat is the client, so MB/s are what such a producer sees; the difference between the sets is
what the cleaner's reads and writes cost the produce path (the same disk, the same 2 cores).
"""
import datetime as dt
import os
import re
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import bench  # noqa: E402

DIRTY_MB = int(os.environ.get("GREGOR_BENCH_CLEANER_MB", "1024"))
CHUNK_MB = int(os.environ.get("GREGOR_BENCH_CHUNK_MB", "32"))
BASELINE_CHUNKS = int(os.environ.get("GREGOR_BENCH_BASELINE_CHUNKS", "12"))
BACKOFF_MS = 100
RECORD = 1024
DIRTY_TOPIC = "dirty"


class Ctx:
    pass


def keyed_file(ctx, mb):
    """kcat -K: lines: 1 KiB records, keys cycling over a tenth of the records."""
    n = (mb << 20) // (RECORD + 14)
    live = max(1, n // 10)
    path = ctx.run_dir / f"keyed-{mb}.txt"
    value = b"v" * RECORD
    with open(path, "wb", buffering=1 << 22) as f:
        for i in range(n):
            f.write(b"key-%08d:" % (i % live) + value + b"\n")
    return path, n, live


def kcat_produce(b, topic, path, extra=()):
    t0 = time.monotonic()
    p = bench.spawn(["kcat", "-P", "-b", b.bootstrap, "-t", topic, "-p", "0", "-l", str(path),
                     "-X", "acks=1", *extra], stdout=bench.subprocess.DEVNULL, stderr=bench.subprocess.PIPE)
    _, err = p.communicate(timeout=900)
    bench.reap(p)
    if p.returncode != 0:
        raise RuntimeError(f"kcat -P rc={p.returncode}: {err.decode(errors='replace')[-300:]}")
    return t0, time.monotonic()


def alter(b, topic, key, value):
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource
    a = AdminClient({"bootstrap.servers": b.bootstrap})
    entry = ConfigEntry(key, value, incremental_operation=AlterConfigOpType.SET)
    res = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[entry])
    for f in a.incremental_alter_configs([res]).values():
        f.result(30)


def create(b, topic, config):
    from confluent_kafka.admin import AdminClient, NewTopic
    a = AdminClient({"bootstrap.servers": b.bootstrap})
    for f in a.create_topics([NewTopic(topic, 1, 1, config=config)], operation_timeout=30).values():
        f.result(30)


def cleaned_line(b):
    for line in b.log_path.read_text(errors="replace").splitlines():
        if "log cleaned" in line and f"topic={DIRTY_TOPIC}" in line:
            return line
    return None


def field(line, name):
    m = re.search(rf"\b{name}=([\d.]+)", line)
    return float(m.group(1)) if m else None


def main():
    ctx = Ctx()
    ctx.root = HERE.parent.parent
    ctx.gregor_bin = ctx.root / "target" / "release" / "gregor"
    ctx.starts = {"gregor": []}
    ctx.same_client = False
    (ctx.root / "bench" / "tmp").mkdir(parents=True, exist_ok=True)
    ctx.run_dir = Path(tempfile.mkdtemp(prefix="cleaner-", dir=ctx.root / "bench" / "tmp"))
    bench.TMPDIRS.append(ctx.run_dir)
    dirty_path, n_dirty, live = keyed_file(ctx, DIRTY_MB)
    chunk_n = (CHUNK_MB << 20) // RECORD
    chunk_path = bench.make_records_file(ctx, chunk_n, RECORD)
    chunk_bytes = chunk_n * RECORD
    b = bench.Broker("gregor", ctx, extra=["--override", f"log.cleaner.backoff.ms={BACKOFF_MS}"]).start()
    try:
        create(b, DIRTY_TOPIC, {"cleanup.policy": "compact", "min.compaction.lag.ms": "3600000",
                                "segment.bytes": str(128 << 20), "min.cleanable.dirty.ratio": "0.01"})
        create(b, "load", {"segment.bytes": str(256 << 20)})
        t0, t1 = kcat_produce(b, DIRTY_TOPIC, dirty_path, ["-K", ":"])
        bench.log(f"dirty log: {n_dirty:,} records, {live:,} keys, {DIRTY_MB} MB in {t1 - t0:.1f}s")
        # Roll the dirty log's active segment: segment.ms, then one more record.
        alter(b, DIRTY_TOPIC, "segment.ms", "1")
        time.sleep(0.01)
        one = ctx.run_dir / "one.txt"
        one.write_bytes(b"roll:r\n")
        kcat_produce(b, DIRTY_TOPIC, one, ["-K", ":"])
        alter(b, DIRTY_TOPIC, "segment.ms", "604800000")

        baseline = []
        for _ in range(BASELINE_CHUNKS):
            s, e = kcat_produce(b, "load", chunk_path)
            baseline.append(chunk_bytes / (e - s))
        bench.log(f"baseline: {[f'{x / 1e6:.0f}' for x in baseline]} MB/s")

        dirty_dir = b.data_dir / f"{DIRTY_TOPIC}-0"
        marks = {}

        def watch():
            while "end" not in marks:
                if "first_cleaned" not in marks and any(dirty_dir.glob("*.cleaned")):
                    marks["first_cleaned"] = time.monotonic()
                if cleaned_line(b):
                    marks["end"] = time.monotonic()
                time.sleep(0.01)

        t_release = time.monotonic()
        alter(b, DIRTY_TOPIC, "min.compaction.lag.ms", "0")
        marks["start"] = time.monotonic() + 2 * BACKOFF_MS / 1000
        w = threading.Thread(target=watch, daemon=True)
        w.start()
        during, overlapping = [], 0
        deadline = time.monotonic() + 900
        while "end" not in marks and time.monotonic() < deadline:
            s, e = kcat_produce(b, "load", chunk_path)
            rate = chunk_bytes / (e - s)
            if marks["start"] <= s and ("end" not in marks or e <= marks["end"]):
                during.append(rate)
            else:
                overlapping += 1
        w.join(timeout=900)
        line = cleaned_line(b) or ""
        mb_read, mb_written, ms = field(line, "mb_read"), field(line, "mb_written"), field(line, "ms")
    finally:
        b.stop()
    seq, seq_sync = bench.disk_limit(ctx, 1 << 30)
    bench.cleanup()

    med = lambda xs: statistics.median(xs) if xs else None  # noqa: E731
    fmt = lambda x: "n/a" if x is None else f"{x / 1e6:.1f}"  # noqa: E731
    pass_s = (ms or 0) / 1000
    lines = [
        f"## Produce while the log cleaner runs ({dt.date.today()}, one gregor, kcat acks=1, 1 KiB records)",
        "",
        f"Dirty log: {DIRTY_MB} MB, {n_dirty:,} records over {live:,} keys (10% live), one 128 MiB-segment "
        f"partition. Produce: chunks of {CHUNK_MB} MB to another topic on the same broker and disk.",
        "",
        "| | chunks | median MB/s | min | max |",
        "|---|---:|---:|---:|---:|",
        f"| cleaner idle | {len(baseline)} | {fmt(med(baseline))} | {fmt(min(baseline))} | {fmt(max(baseline))} |",
        f"| cleaner running | {len(during)} | {fmt(med(during))} | "
        f"{fmt(min(during) if during else None)} | {fmt(max(during) if during else None)} |",
        "",
        f"Cleaner pass (broker log): {mb_read} MB read, {mb_written} MB written in {pass_s:.2f} s = "
        f"{(mb_read or 0) / pass_s if pass_s else 0:.0f} MB/s of log read while producing "
        f"({overlapping} chunk(s) straddled its start or end and are not counted; released "
        f"{(marks.get('first_cleaned', t_release) - t_release):.2f} s before the first .cleaned file, "
        f"the offset map built by then).",
        f"Disk: sequential write {seq / 1e6:.0f} MB/s, with fdatasync {seq_sync / 1e6:.0f} MB/s (dd, 1 GiB).",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    out = ctx.root / "bench" / "results" / f"{dt.date.today()}-cleaner.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
