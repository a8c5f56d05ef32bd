"""Transactional produce next to idempotent produce, one gregor broker, confluent-kafka.

  txn_bench.py --gregor BIN [--records N] [--txn-records 100] [--size 100] [--rounds R]
              [--producers 1,4]

Both runs use the same broker process, topic shape (1 partition) and producer settings
(linger.ms=5); the transactional one commits every --txn-records records. Each is run with
each count of producers in --producers, as threads sharing the records (each transactional
producer with its own transactional id). Reports records/s,
broker CPU seconds per million records (utime+stime of the broker from /proc), the
transactional/idempotent ratio, and commit_transaction() latency p50/p99 (the call includes
flushing the transaction's last records). One JSON line per round on stdout, a summary on
stderr.
"""
import argparse
import json
import sys
import threading
import time
import uuid

from confluent_kafka import Producer

from one_broker import cpu_s, create, one_broker, pct


def in_threads(producers, work):
    """Runs work(i) for i in range(producers) at once; returns their results."""
    out = [None] * producers
    errors = []

    def run(i):
        try:
            out[i] = work(i)
        except BaseException as e:  # noqa: BLE001 - raised in the caller
            errors.append(e)
    threads = [threading.Thread(target=run, args=(i,)) for i in range(producers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return out


def run_idempotent(bootstrap, pid, n, size, producers):
    topic = "idem-" + uuid.uuid4().hex[:6]
    create(bootstrap, topic)
    clients = [Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
               for _ in range(producers)]
    value = b"x" * size
    each = n // producers

    def work(i):
        p = clients[i]
        for _ in range(each):
            while True:
                try:
                    p.produce(topic, value=value, partition=0)
                    break
                except BufferError:
                    p.poll(0.01)
        assert p.flush(120) == 0
    c0, t0 = cpu_s(pid), time.monotonic()
    in_threads(producers, work)
    dt, dc = time.monotonic() - t0, cpu_s(pid) - c0
    done = each * producers
    return {"rps": done / dt, "cpu_s_per_M": dc / done * 1e6}


def run_transactional(bootstrap, pid, n, txn_records, size, producers):
    topic = "txn-" + uuid.uuid4().hex[:6]
    create(bootstrap, topic)
    clients = []
    for _ in range(producers):
        p = Producer({"bootstrap.servers": bootstrap, "transactional.id": "bench-" + uuid.uuid4().hex[:6],
                      "linger.ms": 5})
        p.init_transactions(60)
        clients.append(p)
    value = b"x" * size
    each = n // producers // txn_records

    def work(i):
        p, commits = clients[i], []
        for _ in range(each):
            p.begin_transaction()
            for _ in range(txn_records):
                p.produce(topic, value=value, partition=0)
            t = time.monotonic()
            p.commit_transaction(60)
            commits.append((time.monotonic() - t) * 1000)
        return commits
    c0, t0 = cpu_s(pid), time.monotonic()
    commits = [c for per in in_threads(producers, work) for c in per]
    dt, dc = time.monotonic() - t0, cpu_s(pid) - c0
    done = each * producers * txn_records
    return {"rps": done / dt, "cpu_s_per_M": dc / done * 1e6, "commit_ms_p50": pct(commits, 0.5),
            "commit_ms_p99": pct(commits, 0.99), "commit_ms_max": max(commits, default=None),
            # librdkafka backs off 20 ms and more when AddPartitionsToTxn is answered
            # CONCURRENT_TRANSACTIONS: such commits stand out above 10 ms.
            "commits_over_10ms": sum(1 for c in commits if c > 10), "txns": len(commits)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gregor", required=True)
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--txn-records", type=int, default=100)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=2)
    # librdkafka registers a transaction's first partition after a 1 ms timer, so one
    # producer's transactions are bound by that and two round trips; several producers show
    # what the broker sustains.
    ap.add_argument("--producers", default="1,4", help="comma-separated producer counts")
    a = ap.parse_args()
    overrides = {"offsets.topic.replication.factor": "1", "transaction.state.log.replication.factor": "1",
                 "transaction.state.log.min.isr": "1"}
    with one_broker(a.gregor, "txn", overrides) as (bootstrap, proc):
        for r in range(a.rounds):
            for k in [int(x) for x in a.producers.split(",")]:
                idem = run_idempotent(bootstrap, proc.pid, a.records, a.size, k)
                txn = run_transactional(bootstrap, proc.pid, a.records, a.txn_records, a.size, k)
                row = {"round": r, "producers": k, "idempotent": idem, "transactional": txn,
                       "ratio": txn["rps"] / idem["rps"]}
                print(json.dumps(row), flush=True)
                print(f"round {r}, {k} producer(s): idempotent {idem['rps']:,.0f} rec/s "
                      f"({idem['cpu_s_per_M']:.2f} cpu-s/M), "
                      f"transactional {txn['rps']:,.0f} rec/s ({txn['cpu_s_per_M']:.2f} cpu-s/M), "
                      f"ratio {row['ratio']:.0%}, commit p50 {txn['commit_ms_p50']:.2f} ms "
                      f"p99 {txn['commit_ms_p99']:.2f} ms max {txn['commit_ms_max']:.1f} ms, "
                      f"{txn['commits_over_10ms']} of {txn['txns']} commits over 10 ms", file=sys.stderr)


if __name__ == "__main__":
    main()
