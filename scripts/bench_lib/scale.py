"""scripts/bench --scale: the control plane at cluster scale.

Three gregor brokers and one real ZooKeeper (the compat harness starts them on free ports in
temp dirs), TOPICS topics of 10 partitions with replication factor 3, then:
  - 100 new 1-partition topics in one CreateTopics: time from the request to each topic's
    first acks=all acknowledgement (p50, p99, max);
  - idle CPU and RSS of each broker over 10 s, and its open files;
  - kill -9 of a non-controller broker: time until every partition it led is led elsewhere;
  - its restart: time until it answers ApiVersions, and until it is in every ISR again;
  - ZooKeeper stopped (SIGSTOP) for 12 s with a 6 s session timeout: which brokers are alive
    after, and the time until all are registered again.
Times are reported, never asserted. Results go to stdout and bench/results/<date>-scale.md.
"""
import argparse
import datetime as dt
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "compat"))

from confluent_kafka import Producer  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

from cluster_harness import Cluster  # noqa: E402
from gregor_harness import ZooKeeper, api_versions_probe, wait_until  # noqa: E402

CLK_TCK = os.sysconf("SC_CLK_TCK")
SESSION_MS = 6000


def log(msg):
    print(f"[scale {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def cpu_s(pid):
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / CLK_TCK


def rss_mb(pid):
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def open_files(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def pct(vals, q):
    s = sorted(vals)
    return s[min(len(s) - 1, int(round(q / 100 * (len(s) - 1))))] if s else float("nan")


def create_topics(admin, names, partitions, rf=3, batch=100):
    for i in range(0, len(names), batch):
        fs = admin.create_topics([NewTopic(n, num_partitions=partitions, replication_factor=rf)
                                  for n in names[i:i + batch]], operation_timeout=60)
        for f in fs.values():
            f.result(timeout=300)


def view(admin):
    """{(topic, partition): (leader, isr)} from one broker's Metadata."""
    md = admin.list_topics(timeout=60)
    return {(t, p): (pm.leader, tuple(sorted(pm.isrs)))
            for t, tm in md.topics.items() if tm.error is None for p, pm in tm.partitions.items()}


def zk_leaders(c, partitions):
    """The leader of each partition as its state znode says, read with pipelined requests."""
    import json
    futures = [c.kz.get_async(f"/brokers/topics/{t}/partitions/{p}/state") for t, p in partitions]
    return [json.loads(f.get(timeout=30)[0])["leader"] for f in futures]


def first_acks(bootstrap, names, t0):
    """Produces one acks=all record to each topic as soon as it can; returns seconds from t0
    to each acknowledgement."""
    done = {}
    lock = threading.Lock()
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0,
                  "message.timeout.ms": 120000, "topic.metadata.refresh.interval.ms": 100,
                  "log_level": 2})

    def cb(err, msg):
        if err is None:
            with lock:
                done.setdefault(msg.topic(), time.monotonic() - t0)

    for n in names:
        p.produce(n, b"first", on_delivery=cb)
    p.flush(180)
    return [done[n] for n in names if n in done], len(names) - len(done)


PHASES = ("fresh", "idle", "kill", "restart", "zkpause")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--topics", type=int, default=int(os.environ.get("GREGOR_SCALE_TOPICS", "1000")))
    ap.add_argument("--phases", default=os.environ.get("GREGOR_SCALE_PHASES", ",".join(PHASES)),
                    help=f"comma-separated subset of {','.join(PHASES)} (the initial creation always runs;"
                         " restart needs kill)")
    ap.add_argument("--fresh-partitions", type=int, default=1, help="partitions of each of the 100 new topics")
    args = ap.parse_args()
    phases = set(args.phases.split(","))
    unknown = phases - set(PHASES)
    if unknown:
        ap.error(f"unknown phases {sorted(unknown)}")
    results = []
    zk = ZooKeeper()
    zk.start()
    c = Cluster(zk, 3, session_timeout_ms=SESSION_MS)
    try:
        c.start()
        admin = AdminClient({"bootstrap.servers": c.bootstrap(), "log_level": 2})
        total = args.topics * 10
        log(f"creating {args.topics} topics x 10 partitions, rf 3 ({total} partitions)")
        t0 = time.monotonic()
        names = [f"scale-{i:05d}" for i in range(args.topics)]
        create_topics(admin, names, 10)
        wait_until(lambda: sum(1 for (l, isr) in view(admin).values() if l >= 0 and len(isr) == 3) >= total,
                   900, f"{total} partitions with a leader and a full ISR", interval=2)
        results.append((f"create {args.topics} topics x 10 (rf 3): answered, every partition led",
                        f"{time.monotonic() - t0:.1f} s"))
        # A new partition's ISR starts full, so that says nothing about the followers: wait
        # until every broker has opened its replica of every partition.
        wait_until(lambda: all(sum(1 for d in os.listdir(b.data_dir) if d.startswith("scale-")) >= total
                               for b in c.brokers.values()), 900, "every replica's log opened", interval=0.5)
        results.append(("... and every replica's log opened on its broker", f"{time.monotonic() - t0:.1f} s"))

        fresh = [f"fresh-{i:03d}" for i in range(100)] if "fresh" in phases else []
        if fresh:
            log(f"100 new topics of {args.fresh_partitions}, first acks=all acknowledgement")
            t0 = time.monotonic()
            create_topics(admin, fresh, args.fresh_partitions)
            answered = time.monotonic() - t0
            lat, missing = first_acks(c.bootstrap(), fresh, t0)
            results.append(("100 new topics: first ack p50 / p99 / max",
                            f"{pct(lat, 50):.2f} / {pct(lat, 99):.2f} / {max(lat):.2f} s"
                            + (f" ({missing} never acknowledged)" if missing else "")))
            log(f"CreateTopics answered after {answered:.2f} s")

        if "idle" in phases:
            idle(c, results)
        if "kill" in phases:
            victim, oadmin = kill_one(c, results)
            if "restart" in phases:
                restart(c, victim, oadmin, total + len(fresh) * args.fresh_partitions, results)
        if "zkpause" in phases:
            zk_pause(c, zk, results)
    finally:
        c.cleanup()
        zk.cleanup()
        lines = [f"# gregor scale benchmark, {dt.date.today()}", "",
                 f"3 brokers, one ZooKeeper, {args.topics} topics x 10 partitions, replication factor 3,"
                 " zookeeper.session.timeout.ms=6000, on this machine (2 cores).", "",
                 "| what | measured |", "|---|---|"] + [f"| {k} | {v} |" for k, v in results]
        text = "\n".join(lines) + "\n"
        print(text)
        out = ROOT / "bench" / "results" / f"{dt.date.today()}-scale.md"
        out.write_text(text)
        log(f"wrote {out}")


def idle(c, results):
    log("idle brokers")
    pids = {i: b.proc.pid for i, b in c.brokers.items()}
    before = {i: cpu_s(p) for i, p in pids.items()}
    time.sleep(10)  # the measurement window, not a wait for a condition
    for i, p in pids.items():
        results.append((f"broker {i} idle: CPU / RSS / open files",
                        f"{(cpu_s(p) - before[i]) / 10 * 100:.1f}% / {rss_mb(p):.0f} MB / {open_files(p)}"))


def kill_one(c, results):
    ctrl = c.controller()
    victim = next(i for i in (1, 2, 3) if i != ctrl)
    other = next(i for i in (1, 2, 3) if i not in (victim,))
    oadmin = AdminClient({"bootstrap.servers": c.brokers[other].bootstrap, "log_level": 2})
    led = [k for k, (l, _) in view(oadmin).items() if l == victim]
    log(f"kill -9 broker {victim} (leads {len(led)} partitions)")
    t0 = time.monotonic()
    c.brokers[victim].kill()
    wait_until(lambda: not any(l == victim for l in zk_leaders(c, led)), 300,
               "every partition led elsewhere (in ZooKeeper)", interval=0.2)
    results.append((f"kill -9 (broker led {len(led)}): all led elsewhere", f"{time.monotonic() - t0:.1f} s"))
    return victim, oadmin


def restart(c, victim, oadmin, want, results):
    log(f"restart broker {victim}")
    b = c.brokers[victim]
    t0 = time.monotonic()
    b.start(timeout=600)
    up = time.monotonic() - t0
    api_versions_probe(b.host, b.port)
    results.append(("restart: answers ApiVersions", f"{up:.1f} s"))
    wait_until(lambda: sum(1 for (l, isr) in view(oadmin).values() if victim in isr) >= want, 900,
               f"broker {victim} in all {want} ISRs", interval=2)
    results.append(("restart: back in every ISR", f"{time.monotonic() - t0:.1f} s"))


def zk_pause(c, zk, results):
    log("ZooKeeper SIGSTOP for 12 s")
    owners = {i: c.kz.exists(f"/brokers/ids/{i}").ephemeralOwner for i in c.registered_ids()}
    zpids = [zk.proc.pid] + [int(x) for x in subprocess.run(
        ["pgrep", "-P", str(zk.proc.pid)], capture_output=True, text=True).stdout.split()]
    for p in zpids:
        os.kill(p, signal.SIGSTOP)
    time.sleep(12)  # the fault's duration
    for p in zpids:
        os.kill(p, signal.SIGCONT)
    t0 = time.monotonic()
    alive = [i for i, br in c.brokers.items() if br.alive()]
    results.append(("ZooKeeper paused 12 s: brokers alive after", f"{len(alive)} of 3"))

    def back():
        now = {i: c.kz.exists(f"/brokers/ids/{i}") for i in (1, 2, 3)}
        return all(s is not None and s.ephemeralOwner != owners.get(i) for i, s in now.items())
    wait_until(back, 120, "every broker registered in a new session", interval=0.2)
    results.append(("ZooKeeper paused 12 s: all re-registered after SIGCONT", f"{time.monotonic() - t0:.1f} s"))


if __name__ == "__main__":
    main()
