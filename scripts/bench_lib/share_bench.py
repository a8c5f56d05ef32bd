"""Share groups (KIP-932) next to a classic consumer group, one gregor broker, confluent-kafka.

  share_bench.py --gregor BIN [--records N] [--consumers 1,4,16] [--size 100] [--timeout 60]

For each count of share consumers, and then for one classic consumer, on a fresh topic of ONE
partition and a fresh group, in one broker process:

  join:  the consumers start, each in its own process (confluent-kafka `ShareConsumer`, implicit
         acknowledgement, max.poll.records 500; the classic one a `Consumer` with
         auto.offset.reset=earliest). A share-partition starts at the log end when its leader
         first sees a ShareFetch for it, so warm records are produced one at a time until every
         consumer has received one (at most 30 s; the table says how many did).
  hold:  the consumers stop polling (the classic one pauses its partition) and acknowledge or
         commit what they have; then --records records of --size bytes are produced.
  go:    the consumers poll again. Measured from go until the broker has confirmed an
         acknowledgement (ACCEPT) of every one of the records: for share consumers, the offsets
         the acknowledgement-commit callback reports as accepted without error (implicit mode
         sends each poll's records as ACCEPT with the next ShareFetch); for the classic
         consumer, a synchronous offset commit after its last record. Broker CPU is utime+stime
         of the broker from /proc over the same interval (10 ms ticks: use enough records);
         consumers' CPU is the consumer processes' own, summed, from go until they close.

Every record must be delivered and accepted exactly once: the table counts records delivered
more than once (to one member or to several), records never delivered, records delivered with
a delivery count above 1, and acknowledgements the broker refused. The exit status is 1 if any
is non-zero. One JSON line per run on stdout, then a markdown table.
"""
import argparse
import json
import os
import queue
import subprocess
import sys
import threading
import time
import uuid

from one_broker import cpu_s, create, one_broker

OVERRIDES = {
    "offsets.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "5",
    "group.coordinator.rebalance.protocols": "classic,consumer,share",
    # Members learn their assignment on a heartbeat: 1 s instead of 5 s shortens joining only.
    "group.share.min.heartbeat.interval.ms": "1000",
    "group.share.heartbeat.interval.ms": "1000",
}
WARM_S = 30


# --- consumer process ---------------------------------------------------------------------

def _emit(ev):
    ev["t"] = time.time()
    sys.stdout.write(json.dumps(ev) + "\n")
    sys.stdout.flush()


def _runs(counts):
    """[start, end, count] runs of equal counts over a bytearray, zeros left out."""
    out, i, n = [], 0, len(counts)
    while i < n:
        j = i
        while j < n and counts[j] == counts[i]:
            j += 1
        if counts[i]:
            out.append([i, j, counts[i]])
        i = j
    return out


def child(cfg):
    """One consumer: warm phase, then "hold", then "go BASE N" (count offsets BASE..BASE+N),
    then "close". Reports progress lines while running and its counts at the end."""
    cmds = queue.Queue()

    def read_stdin():
        for line in sys.stdin:
            if line.strip():
                cmds.put(line.split())
        cmds.put(["close"])

    threading.Thread(target=read_stdin, daemon=True).start()
    share = cfg["kind"] == "share"
    st = {"base": None, "n": 0, "recv": bytearray(), "acked": bytearray(), "acked_n": 0, "recv_n": 0,
          "ack_err": 0, "t_ack": 0.0, "redelivered": 0, "warm": 0, "errors": 0, "other": 0}

    def on_ack(offsets, exc):
        base, n = st["base"], st["n"]
        for _tp, offs in offsets.items():
            if exc is not None:
                st["ack_err"] += len(offs)
                continue
            if base is None:
                continue
            for o in offs:
                i = o - base
                if 0 <= i < n:
                    if st["acked"][i] == 0:
                        st["acked_n"] += 1
                        st["t_ack"] = time.time()
                    st["acked"][i] = min(255, st["acked"][i] + 1)

    conf = {"bootstrap.servers": cfg["bootstrap"], "group.id": cfg["group"], "log_level": 3}
    if share:
        from confluent_kafka import ShareConsumer
        conf["max.poll.records"] = 500
        c = ShareConsumer(conf)
        c.set_acknowledgement_commit_callback(on_ack)
    else:
        from confluent_kafka import Consumer
        conf["auto.offset.reset"] = "earliest"
        c = Consumer(conf)
    c.subscribe([cfg["topic"]])
    _emit({"ev": "started"})

    def poll():
        return c.poll(0.1) if share else c.consume(500, 0.1)

    last_emit = cpu0 = 0.0
    running = False
    while True:
        try:
            cmd = cmds.get_nowait()
        except queue.Empty:
            cmd = None
        if cmd and cmd[0] == "close":
            break
        if cmd and cmd[0] == "hold":
            if share:
                c.commit_sync(30)
            else:
                c.commit(asynchronous=False)
                c.pause(c.assignment())
            _emit({"ev": "held"})
            while True:
                cmd = cmds.get()
                if cmd[0] in ("go", "close"):
                    break
            if cmd[0] == "close":
                break
            st["base"], st["n"] = int(cmd[1]), int(cmd[2])
            st["recv"], st["acked"] = bytearray(st["n"]), bytearray(st["n"])
            if not share:
                c.resume(c.assignment())
            running, cpu0 = True, time.process_time()
        msgs = poll()
        for m in msgs:
            if m.error():
                st["errors"] += 1
                continue
            if not running:
                if st["warm"] == 0:
                    _emit({"ev": "warm"})
                st["warm"] += 1
                continue
            i = m.offset() - st["base"]
            if not 0 <= i < st["n"]:
                st["other"] += 1
                continue
            if st["recv"][i] == 0:
                st["recv_n"] += 1
            st["recv"][i] = min(255, st["recv"][i] + 1)
            if share and m.delivery_count() > 1:
                st["redelivered"] += 1
        if running and not share and st["acked_n"] < st["n"] == st["recv_n"]:
            # The classic consumer's acknowledgement: the committed offset past its last record.
            c.commit(asynchronous=False)
            st["acked"] = bytearray(b"\x01" * st["n"])
            st["acked_n"], st["t_ack"] = st["n"], time.time()
        now = time.time()
        if running and now - last_emit >= 0.02:
            _emit({"ev": "p", "acked": st["acked_n"], "t_ack": st["t_ack"]})
            last_emit = now
    cpu = time.process_time() - cpu0 if running else 0.0
    c.close()
    _emit({"ev": "final", "cpu": cpu, "acked": st["acked_n"], "t_ack": st["t_ack"], "ack_err": st["ack_err"],
           "recv_runs": _runs(st["recv"]), "acked_runs": _runs(st["acked"]), "redelivered": st["redelivered"],
           "warm": st["warm"], "errors": st["errors"], "other": st["other"]})


# --- benchmark process --------------------------------------------------------------------

class Worker:
    def __init__(self, kind, bootstrap, group, topic):
        cfg = {"kind": kind, "bootstrap": bootstrap, "group": group, "topic": topic}
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child", json.dumps(cfg)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)
        self.last = {}
        self.lock = threading.Lock()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            with self.lock:
                self.last[ev["ev"]] = ev

    def get(self, kind):
        with self.lock:
            return self.last.get(kind)

    def send(self, line):
        try:
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass

    def dead(self):
        """Exited, and everything it wrote has been read."""
        if self.proc.poll() is None:
            return False
        self.reader.join(5)
        return True

    def stderr_tail(self):
        return self.proc.stderr.read()[-2000:] if self.dead() else ""

    def kill(self):
        if not self.dead():
            self.proc.kill()
            self.proc.wait(10)


def wait_for(cond, timeout, what, workers):
    end = time.monotonic() + timeout
    while not cond():
        for w in workers:
            if w.dead() and not w.get("final") and not cond():
                raise RuntimeError(f"a consumer exited ({w.proc.returncode}) while waiting for {what}: "
                                   f"{sorted(w.last)} {w.stderr_tail()}")
        if time.monotonic() > end:
            raise TimeoutError(what)
        time.sleep(0.01)


def produce(bootstrap, topic, n, size):
    """n records to partition 0; returns the first offset (they are contiguous: one idempotent
    producer, one partition)."""
    from confluent_kafka import Producer
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, "enable.idempotence": True})
    got = {"lo": None, "hi": None, "err": 0, "n": 0}

    def dr(err, m):
        if err is not None:
            got["err"] += 1
            return
        o = m.offset()
        got["n"] += 1
        got["lo"] = o if got["lo"] is None else min(got["lo"], o)
        got["hi"] = o if got["hi"] is None else max(got["hi"], o)

    value = b"x" * size
    for _ in range(n):
        while True:
            try:
                p.produce(topic, value=value, partition=0, on_delivery=dr)
                break
            except BufferError:
                p.poll(0.01)
        p.poll(0)
    if p.flush(120) != 0 or got["err"] or got["n"] != n or got["hi"] - got["lo"] != n - 1:
        raise RuntimeError(f"produce failed: {got}")
    return got["lo"]


def warm_up(bootstrap, topic, workers):
    """Warm records one at a time until every consumer has received one (or WARM_S passed)."""
    from confluent_kafka import Producer
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0})
    end = time.monotonic() + WARM_S
    while time.monotonic() < end and not all(w.get("warm") for w in workers):
        p.produce(topic, value=b"warm", partition=0)
        p.flush(30)
        t = time.monotonic() + 0.1
        while time.monotonic() < t and not all(w.get("warm") for w in workers):
            time.sleep(0.01)
    return sum(1 for w in workers if w.get("warm"))


def run(kind, consumers, bootstrap, pid, n, size, timeout):
    topic, group = f"{kind}-{uuid.uuid4().hex[:6]}", f"{kind}-g-{uuid.uuid4().hex[:6]}"
    create(bootstrap, topic)
    workers = [Worker(kind, bootstrap, group, topic) for _ in range(consumers)]
    try:
        wait_for(lambda: all(w.get("started") for w in workers), 60, "the consumers to start", workers)
        t_join = time.monotonic()
        warmed = warm_up(bootstrap, topic, workers)
        join_s = time.monotonic() - t_join
        for w in workers:
            w.send("hold")
        wait_for(lambda: all(w.get("held") for w in workers), 60, "the consumers to hold", workers)
        base = produce(bootstrap, topic, n, size)
        c0, t0 = cpu_s(pid), time.time()
        for w in workers:
            w.send(f"go {base} {n}")

        def acked():
            return sum((w.get("p") or {}).get("acked", 0) for w in workers)

        timed_out = False
        try:
            wait_for(lambda: acked() >= n, timeout, "every record acknowledged", workers)
        except TimeoutError:
            timed_out = True
        c1 = cpu_s(pid)
        t1 = max((w.get("p") or {}).get("t_ack", 0) for w in workers) if not timed_out else time.time()
        for w in workers:
            w.send("close")
        wait_for(lambda: all(w.get("final") for w in workers), 60, "the consumers to close", workers)
    finally:
        for w in workers:
            w.send("close")
        for w in workers:
            try:
                w.proc.wait(30)
            except subprocess.TimeoutExpired:
                w.kill()
    finals = [w.get("final") for w in workers]
    recv, acks = bytearray(n), bytearray(n)
    for f in finals:
        for a, b, k in f["recv_runs"]:
            for i in range(a, b):
                recv[i] = min(255, recv[i] + k)
        for a, b, k in f["acked_runs"]:
            for i in range(a, b):
                acks[i] = min(255, acks[i] + k)
    done = sum(1 for x in acks if x)
    secs = max(t1 - t0, 1e-9)
    return {
        "kind": kind, "consumers": consumers, "records": n, "warmed": warmed, "join_s": round(join_s, 2),
        "seconds": round(secs, 3), "rps": done / secs, "cpu_s_per_M": (c1 - c0) / max(done, 1) * 1e6,
        "client_cpu_s_per_M": sum(f["cpu"] for f in finals) / max(done, 1) * 1e6,
        "acked": done, "timed_out": timed_out,
        "duplicates": sum(1 for x in recv if x > 1), "missing": sum(1 for x in recv if x == 0),
        "acked_twice": sum(1 for x in acks if x > 1), "not_acked": n - done,
        "redelivered": sum(f["redelivered"] for f in finals), "ack_errors": sum(f["ack_err"] for f in finals),
        "per_member": sorted((sum((b - a) for a, b, _ in f["recv_runs"]) for f in finals), reverse=True),
    }


def table(rows):
    out = ["| group | consumers | records | seconds | records/s | broker CPU s / M records "
           "| consumers' CPU s / M | joined "
           "| duplicates | missing | not accepted | redelivered | ack errors |",
           "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for r in rows:
        out.append(f"| {r['kind']} | {r['consumers']} | {r['records']:,} | {r['seconds']:.2f} | {r['rps']:,.0f} "
                   f"| {r['cpu_s_per_M']:.2f} | {r['client_cpu_s_per_M']:.1f} | {r['warmed']}/{r['consumers']} | {r['duplicates']} "
                   f"| {r['missing']} | {r['not_acked']} | {r['redelivered']} | {r['ack_errors']} |")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gregor")
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--consumers", default="1,4,16")
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--timeout", type=float, default=60, help="seconds allowed per run after go")
    ap.add_argument("--child")
    a = ap.parse_args()
    if a.child:
        child(json.loads(a.child))
        return
    if not a.gregor:
        ap.error("--gregor is required")
    from confluent_kafka import ShareConsumer  # noqa: F401 - fail early without it (confluent-kafka >= 2.16)
    rows = []
    with one_broker(a.gregor, "share", OVERRIDES) as (bootstrap, proc):
        plan = [("share", int(c)) for c in a.consumers.split(",") if c.strip()] + [("classic", 1)]
        for kind, consumers in plan:
            r = run(kind, consumers, bootstrap, proc.pid, a.records, a.size, a.timeout)
            rows.append(r)
            print(json.dumps(r), flush=True)
    print()
    print(f"Share groups next to a classic group: one broker, one partition, {a.records:,} records of "
          f"{a.size} B, each delivered and accepted once (classic: read and committed).")
    print()
    print(table(rows))
    bad = [r for r in rows if r["duplicates"] or r["missing"] or r["not_acked"] or r["acked_twice"]
           or r["redelivered"] or r["ack_errors"] or r["timed_out"]]
    if bad:
        print(f"\nNOT CLEAN: {[(r['kind'], r['consumers']) for r in bad]}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
