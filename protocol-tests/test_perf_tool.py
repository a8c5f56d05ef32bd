"""gregor-perf, the load generator behind scripts/bench: a short run against a broker must
produce exactly the records asked for (the broker's high watermarks say so), read them all back,
and see each one end to end.  Only counts are checked; the speed it reports is never asserted."""
import json
import subprocess

import kproto as kp
from gregor_harness import gregor_bin, wait_until
from test_apis import topic_name


def perf_bin():
    path = gregor_bin().parent / "gregor-perf"
    assert path.exists(), f"{path} is missing: cargo build --release builds it beside the broker"
    return path


def perf(broker, *args, timeout=120):
    cmd = [str(perf_bin()), *args, "--bootstrap-server", broker.bootstrap, "--json",
           "--broker-pid", str(broker.proc.pid)]
    out = subprocess.run(cmd, capture_output=True, timeout=timeout)
    assert out.returncode == 0, f"{' '.join(cmd)}: rc={out.returncode} {out.stderr.decode(errors='replace')}"
    return json.loads(out.stdout.decode().strip().splitlines()[-1])


def stored(broker, topic, partitions):
    with kp.Conn(broker.host, broker.port) as c:
        return [kp.list_offset(c, topic, p, -1)["offset"] - kp.list_offset(c, topic, p, -2)["offset"]
                for p in range(partitions)]


def test_produced_records_are_all_stored_and_consumed(broker):
    topic = topic_name()
    n = 50_000
    # 3 partitions, batches of ~40 records, 3 requests in flight: the last request is a short one.
    p = perf(broker, "produce", "--topic", topic, "--partitions", "3", "--records", str(n),
             "--record-size", "100", "--acks", "all", "--batch-size", "4096", "--max-in-flight", "3")
    assert p["records"] == n, p
    assert "broker_cpu_s_per_million" in p, p
    per_partition = stored(broker, topic, 3)
    assert sum(per_partition) == n and all(x > 0 for x in per_partition), per_partition

    c = perf(broker, "consume", "--topic", topic, "--partition-max-bytes", "65536")
    assert c["records"] == n, c
    # --records stops early, and counts no record twice.
    c = perf(broker, "consume", "--topic", topic, "--records", "1000")
    assert 1000 <= c["records"] <= n, c


def test_end_to_end_sees_every_record(broker):
    topic = topic_name()
    n = 600
    r = perf(broker, "end-to-end", "--topic", topic, "--partitions", "1", "--records", str(n),
             "--throughput", "2000", "--acks", "all", "--record-size", "100")
    assert r["records"] == n and r["measured"] == n, r
    assert 0 <= r["latency_ms_p50"] <= r["latency_ms_p99"] <= r["latency_ms_max"], r
    assert stored(broker, topic, 1) == [n]


def test_acks_zero_records_arrive(broker):
    topic = topic_name()
    n = 5_000
    perf(broker, "produce", "--topic", topic, "--partitions", "2", "--records", str(n), "--acks", "0")
    # acks=0 gets no answer: the broker may still be appending when the tool exits.
    wait_until(lambda: sum(stored(broker, topic, 2)) >= n, 30, f"{n} records stored")
    assert sum(stored(broker, topic, 2)) == n
