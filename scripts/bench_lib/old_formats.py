"""Old message formats next to record batches, in one run against one gregor (scripts/bench
--old-formats): kcat produces N records of S bytes, then consumes them from the beginning,
once as a current client (Produce v3+ with v2 batches, Fetch v4+ zero conversion) and once per
old protocol (librdkafka's api.version.request=false with broker.version.fallback 0.10.0:
Produce v2 with format v1, Fetch v2 down-converted to v1; 0.9.0: format v0 both ways).

Reported: records/s and broker CPU seconds per million records, for produce (up-conversion to
v2 batches on append) and consume (down-conversion on fetch), each codec in CODECS. kcat is
the client, so records/s are what such a user sees; CPU per million is the broker's cost.
"""
import datetime as dt
import os
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import bench  # noqa: E402

N = int(os.environ.get("GREGOR_BENCH_OLD_N", "1000000"))
SIZE = 100
CODECS = ["none", "lz4"]
MODES = [
    ("v2 batches (Produce v3+, Fetch v4+)", []),
    ("format v1 (fallback 0.10.0: Produce v2, Fetch v2)", ["-X", "api.version.request=false",
                                                           "-X", "broker.version.fallback=0.10.0"]),
    ("format v0 (fallback 0.9.0: Produce v0, Fetch v0)", ["-X", "api.version.request=false",
                                                          "-X", "broker.version.fallback=0.9.0"]),
]


class Ctx:
    pass


def kcat(b, args, n, produce, timeout=600):
    if produce:
        cmd = ["kcat", "-P", "-b", b.bootstrap] + args
        p = bench.spawn(cmd, stdout=bench.subprocess.DEVNULL, stderr=bench.subprocess.PIPE)
        t0 = bench.time.monotonic()
        _, err = p.communicate(timeout=timeout)
        dt_s = bench.time.monotonic() - t0
        bench.reap(p)
        if p.returncode != 0:
            raise RuntimeError(f"kcat -P rc={p.returncode}: {err.decode(errors='replace')[-300:]}")
        return dt_s
    cmd = ["kcat", "-C", "-b", b.bootstrap, "-e", "-o", "beginning", "-q"] + args
    p = bench.spawn(cmd, stdout=bench.subprocess.PIPE, stderr=bench.subprocess.PIPE)
    t0 = bench.time.monotonic()
    seen = 0
    while True:
        chunk = os.read(p.stdout.fileno(), 1 << 20)
        if not chunk:
            break
        seen += chunk.count(b"\n")
    dt_s = bench.time.monotonic() - t0
    p.wait(timeout=60)
    bench.reap(p)
    if seen < n:
        raise RuntimeError(f"kcat -C saw {seen}/{n} records")
    return dt_s


def main():
    ctx = Ctx()
    ctx.root = HERE.parent.parent
    ctx.gregor_bin = ctx.root / "target" / "release" / "gregor"
    ctx.starts = {"gregor": []}
    ctx.same_client = False
    (ctx.root / "bench" / "tmp").mkdir(parents=True, exist_ok=True)
    ctx.run_dir = Path(tempfile.mkdtemp(prefix="old-formats-", dir=ctx.root / "bench" / "tmp"))
    bench.TMPDIRS.append(ctx.run_dir)
    path = bench.make_records_file(ctx, N, SIZE)
    rows = []
    b = bench.Broker("gregor", ctx).start()
    try:
        for codec in CODECS:
            for i, (mode, extra) in enumerate(MODES):
                topic = f"old-{codec}-{i}"
                bench.create_topic(b, topic, 1)
                c0 = b.cpu()
                t_p = kcat(b, ["-t", topic, "-p", "0", "-l", str(path), "-z", codec] + extra, N, True)
                c1 = b.cpu()
                t_c = kcat(b, ["-t", topic, "-p", "0"] + extra, N, False)
                c2 = b.cpu()
                rows.append((codec, mode, N / t_p, (c1 - c0) / N * 1e6, N / t_c, (c2 - c1) / N * 1e6))
                bench.log(f"{codec} {mode}: produce {N / t_p:,.0f}/s, consume {N / t_c:,.0f}/s")
    finally:
        b.stop()
        bench.cleanup()
    lines = [f"## Old message formats ({dt.date.today()}, {N:,} records of {SIZE} B, 1 partition, kcat)", "",
             "| codec | protocol | produce rec/s | broker CPU s/M (produce) | consume rec/s | broker CPU s/M (consume) |",
             "|---|---|---:|---:|---:|---:|"]
    for codec, mode, prps, pcpu, crps, ccpu in rows:
        lines.append(f"| {codec} | {mode} | {prps:,.0f} | {pcpu:.3f} | {crps:,.0f} | {ccpu:.3f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    out = ctx.root / "bench" / "results" / f"{dt.date.today()}-old-formats.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
