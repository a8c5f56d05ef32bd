"""Consumer groups: the classic protocol next to the new one (KIP-848), one gregor broker.

  groups_bench.py --gregor BIN [--members 50] [--partitions 64] [--join-every 0.2]

For each protocol (classic with librdkafka's default eager `range,roundrobin`, classic with
`cooperative-sticky`, and `group.protocol=consumer` with the broker's `uniform` assignor), in
one broker process and one run:

  join:  --members confluent-kafka consumers start one by one, --join-every seconds apart, in a
         fresh group on a topic of --partitions partitions. Measured: the time from the first
         start until every member owns at least one partition and every partition is owned by
         exactly one member; and the same from the last start.
  +1:    with that group settled, one more member joins. Measured from its start: how long the
         group owned nothing at all (an eager rebalance takes every partition away), how many
         partitions stopped being owned at some point, the longest time one partition had no
         owner, the sum of those (partition-seconds without an owner), and the time until the
         newcomer owns partitions and the group is settled again.

Ownership comes from the rebalance callbacks (on_assign / on_revoke / on_lost, timed when
librdkafka delivers them in poll()): a partition without an owner is one nobody consumes. Each
consumer runs in its own thread and polls every 50 ms. Timeouts are each protocol's defaults
(classic: session 45 s, heartbeat 3 s; consumer: the broker's 45 s / 5 s), as a user gets them,
unless GREGOR_BENCH_GROUPS_HB_MS sets both heartbeat intervals.
One JSON line per protocol on stdout, a table on stderr.
"""
import argparse
import json
import os
import sys
import threading
import time
import uuid

from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient, NewTopic

from one_broker import one_broker

PROTOCOLS = [
    ("classic-eager", {"group.protocol": "classic"}),
    ("classic-cooperative", {"group.protocol": "classic", "partition.assignment.strategy": "cooperative-sticky"}),
    ("consumer (KIP-848)", {"group.protocol": "consumer"}),
]


class Member:
    """One consumer in a thread; keeps its ownership history [(t, frozenset)]."""

    def __init__(self, name, conf, topic):
        self.name = name
        self.conf = conf
        self.topic = topic
        self.owned = frozenset()
        self.history = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.errors = []
        self.started = None
        self.thread = threading.Thread(target=self.run, daemon=True)

    def _set(self, owned):
        with self.lock:
            self.owned = frozenset(owned)
            self.history.append((time.monotonic(), self.owned))

    def run(self):
        c = Consumer(self.conf)
        incremental = self.conf.get("group.protocol") == "consumer" or \
            self.conf.get("partition.assignment.strategy") == "cooperative-sticky"

        def on_assign(consumer, parts):
            got = {p.partition for p in parts}
            self._set((self.owned | got) if incremental else got)
            if incremental:
                consumer.incremental_assign(parts)
            else:
                consumer.assign(parts)

        def on_revoke(consumer, parts):
            gone = {p.partition for p in parts}
            self._set(self.owned - gone if incremental else set())
            if incremental:
                consumer.incremental_unassign(parts)
            else:
                consumer.unassign()

        c.subscribe([self.topic], on_assign=on_assign, on_revoke=on_revoke, on_lost=on_revoke)
        try:
            while not self.stop.is_set():
                c.poll(0.05)
        finally:
            c.close()

    def start(self):
        self.started = time.monotonic()
        self.thread.start()
        return self

    def owned_now(self):
        with self.lock:
            return self.owned


def settled(members, partitions):
    owned = [m.owned_now() for m in members]
    flat = [p for o in owned for p in o]
    return all(owned) and len(flat) == partitions and set(flat) == set(range(partitions))


def wait_settled(members, partitions, timeout):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if settled(members, partitions):
            return time.monotonic()
        time.sleep(0.01)
    raise TimeoutError(f"not settled in {timeout}s: {[sorted(m.owned_now()) for m in members]}")


def owner_gaps(members, partitions, t0, t1):
    """From the members' ownership histories between t0 and t1: (time nobody owned anything,
    {partition: seconds without an owner})."""
    events = sorted((t, i, o) for i, m in enumerate(members) for t, o in m.history if t0 <= t <= t1)
    cur = {}
    for i, m in enumerate(members):
        before = [o for t, o in m.history if t < t0]
        cur[i] = before[-1] if before else frozenset()
    unowned_since = {}
    gaps = {}
    nothing_since, nothing_total = None, 0.0

    def update(t):
        nonlocal nothing_since, nothing_total
        owned = set().union(*cur.values())
        for p in range(partitions):
            if p not in owned and p not in unowned_since:
                unowned_since[p] = t
            elif p in owned and p in unowned_since:
                gaps[p] = gaps.get(p, 0.0) + t - unowned_since.pop(p)
        if not owned and nothing_since is None:
            nothing_since = t
        elif owned and nothing_since is not None:
            nothing_total += t - nothing_since
            nothing_since = None

    update(t0)
    for t, i, o in events:
        cur[i] = o
        update(t)
    for p, since in unowned_since.items():
        gaps[p] = gaps.get(p, 0.0) + t1 - since
    if nothing_since is not None:
        nothing_total += t1 - nothing_since
    return nothing_total, gaps


def run_protocol(bootstrap, label, extra, members_n, partitions, join_every, hb_ms, timeout):
    topic = "groups-" + uuid.uuid4().hex[:6]
    a = AdminClient({"bootstrap.servers": bootstrap})
    a.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)
    group = "bench-" + uuid.uuid4().hex[:6]
    base = {"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
            "auto.offset.reset": "latest", "log_level": 3, "topic.metadata.refresh.interval.ms": 5000}
    conf = dict(base, **extra)
    if hb_ms and conf["group.protocol"] == "classic":
        conf["heartbeat.interval.ms"] = hb_ms
    members = []
    t_first = time.monotonic()
    for i in range(members_n):
        members.append(Member(f"m{i}", dict(conf, **{"client.id": f"m{i}"}), topic).start())
        time.sleep(join_every)
    t_last = members[-1].started
    t_done = wait_settled(members, partitions, timeout)
    row = {"protocol": label, "members": members_n, "partitions": partitions,
           "join_all_s": t_done - t_first, "join_after_last_s": t_done - t_last}
    # Let the group sit still for two heartbeats so that no move is still in flight.
    time.sleep(2 * (hb_ms or 5000) / 1000)
    if not settled(members, partitions):
        wait_settled(members, partitions, timeout)
    newcomer = Member(f"m{members_n}", dict(conf, **{"client.id": f"m{members_n}"}), topic).start()
    t_join = newcomer.started
    everyone = members + [newcomer]
    t_settled = wait_settled(everyone, partitions, timeout)
    # Moves that finish after the newcomer owns something still count: watch a little longer.
    time.sleep(1.0)
    nothing, gaps = owner_gaps(everyone, partitions, t_join, time.monotonic())
    first_owned = next((t for t, o in newcomer.history if o), None)
    row.update({
        "plus_one_settled_s": t_settled - t_join,
        "plus_one_newcomer_owns_s": (first_owned - t_join) if first_owned else None,
        "plus_one_group_owned_nothing_s": nothing,
        "plus_one_partitions_paused": len(gaps),
        "plus_one_max_partition_pause_s": max(gaps.values(), default=0.0),
        "plus_one_partition_seconds_unowned": sum(gaps.values()),
    })
    for m in everyone:
        m.stop.set()
    for m in everyone:
        m.thread.join(60)
    a.delete_topics([topic])
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gregor", required=True)
    ap.add_argument("--members", type=int, default=int(os.environ.get("GREGOR_BENCH_GROUPS_MEMBERS", "50")))
    ap.add_argument("--partitions", type=int, default=64)
    ap.add_argument("--join-every", type=float, default=0.2)
    ap.add_argument("--timeout", type=float, default=600)
    a = ap.parse_args()
    hb_ms = int(os.environ.get("GREGOR_BENCH_GROUPS_HB_MS", "0")) or None
    overrides = {"offsets.topic.replication.factor": "1"}
    if hb_ms:
        overrides["group.consumer.heartbeat.interval.ms"] = str(hb_ms)
        overrides["group.consumer.min.heartbeat.interval.ms"] = str(min(hb_ms, 5000))
    rows = []
    with one_broker(a.gregor, "groups", overrides) as (bootstrap, _proc):
        for label, extra in PROTOCOLS:
            row = run_protocol(bootstrap, label, extra, a.members, a.partitions, a.join_every, hb_ms, a.timeout)
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(f"\n{a.members} consumers joining {a.join_every:.1f}s apart, {a.partitions} partitions, one broker",
          file=sys.stderr)
    cols = [("join_all_s", "all own partitions after first start (s)"),
            ("join_after_last_s", "... after last start (s)"),
            ("plus_one_group_owned_nothing_s", "+1 member: group owned nothing for (s)"),
            ("plus_one_partitions_paused", "+1 member: partitions that lost their owner"),
            ("plus_one_max_partition_pause_s", "+1 member: longest partition pause (s)"),
            ("plus_one_partition_seconds_unowned", "+1 member: partition-seconds unowned"),
            ("plus_one_newcomer_owns_s", "+1 member: newcomer owns partitions after (s)"),
            ("plus_one_settled_s", "+1 member: group settled after (s)")]
    print(f"| {'':46} | " + " | ".join(f"{r['protocol']:>20}" for r in rows) + " |", file=sys.stderr)
    for key, title in cols:
        vals = []
        for r in rows:
            v = r[key]
            vals.append(f"{v:>20.2f}" if isinstance(v, float) else f"{v!s:>20}")
        print(f"| {title:46} | " + " | ".join(vals) + " |", file=sys.stderr)


if __name__ == "__main__":
    main()
