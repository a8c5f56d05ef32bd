"""confluent-kafka client processes for scripts/bench (each role runs in its own process).

  clients.py consume  BOOTSTRAP TOPIC N MODE        MODE = group | assign
  clients.py lat-consumer BOOTSTRAP TOPIC           prints "ready" on the first warm-up record,
                                                    then a JSON line of latencies (ms) at the end
  clients.py lat-producer BOOTSTRAP TOPIC RATE N LINGER_MS
                                                    sends warm-up records until it reads a line on
                                                    stdin, then N timestamped records at RATE/s

Timestamps are time.monotonic_ns(), which is one clock for all processes on Linux.
All loops are bounded in time.
"""
import json
import os
import select
import struct
import sys
import time
import uuid

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition


def out(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def consume(bootstrap, topic, n, mode, deadline_s=120.0, first_deadline_s=30.0):
    """Consume N records from the beginning; default client settings except the group plumbing."""
    cfg = {"bootstrap.servers": bootstrap, "auto.offset.reset": "earliest"}
    if mode == "group":
        cfg["group.id"] = "bench-fresh-" + uuid.uuid4().hex[:8]
    else:
        cfg.update({"group.id": "bench-assign-unused", "enable.auto.commit": False,
                    "enable.auto.offset.store": False})
    t0 = time.monotonic()
    c = Consumer(cfg)
    if mode == "group":
        c.subscribe([topic])
    else:
        md = c.list_topics(topic, timeout=10)
        parts = sorted(md.topics[topic].partitions)
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
    got = 0
    nbytes = 0
    t_first = None
    err = None
    while got < n:
        now = time.monotonic()
        if now - t0 > deadline_s or (t_first is None and now - t0 > first_deadline_s):
            err = f"timeout after {now - t0:.1f}s with {got}/{n} records"
            break
        # never ask for more than what is left: consume() waits for num_messages or the timeout
        msgs = c.consume(num_messages=min(10000, n - got), timeout=0.5)
        for m in msgs:
            e = m.error()
            if e is not None:
                if e.code() != KafkaError._PARTITION_EOF:
                    err = str(e)
                continue
            got += 1
            nbytes += len(m.value() or b"")
        if got and t_first is None:
            t_first = time.monotonic() - t0
    t_total = time.monotonic() - t0
    try:
        c.close()
    except Exception:  # noqa: BLE001
        pass
    out({"mode": mode, "count": got, "bytes": nbytes, "t_first": t_first, "t_total": t_total,
         "error": err if got < n else None})


def lat_consumer(bootstrap, topic, deadline_s=180.0):
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-lat-unused",
                  "enable.auto.commit": False, "enable.auto.offset.store": False,
                  "auto.offset.reset": "earliest"})
    c.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    lats = []
    seqs = set()
    offsets = []
    gaps = []
    prev_off = None
    ready = False
    t0 = time.monotonic()
    done = False
    while not done and time.monotonic() - t0 < deadline_s:
        # poll() returns each record as soon as librdkafka has it (consume(n) would wait for n)
        m = c.poll(0.2)
        if m is None or m.error() is not None:
            continue
        now = time.monotonic_ns()
        if prev_off is not None and m.offset() != prev_off + 1:
            gaps.append((prev_off, m.offset()))
        prev_off = m.offset()
        v = m.value()
        tag = v[:1]
        if tag == b"W":
            if not ready:
                ready = True
                print("ready", flush=True)
        elif tag == b"M":
            ts, seq = struct.unpack_from(">qi", v, 1)
            lats.append((now - ts) / 1e6)
            seqs.add(seq)
            offsets.append(m.offset())
        elif tag == b"E":
            done = True
    c.close()
    n_sent = struct.unpack_from(">i", v, 1)[0] if done else None
    missing = sorted(set(range(n_sent)) - seqs) if done else []
    out({"lat_ms": lats, "complete": done, "sent": n_sent, "missing": missing[:20], "n_missing": len(missing),
         "offset_gaps": gaps[:20],
         "first_offset": offsets[0] if offsets else None, "last_offset": offsets[-1] if offsets else None})


def lat_producer(bootstrap, topic, rate, n, linger_ms, deadline_s=180.0):
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": linger_ms})
    errors = []

    def on_delivery(err, msg):
        if err is not None:
            errors.append(str(err))
    pad = b"x" * (100 - 9)
    t0 = time.monotonic()
    # warm-up until the orchestrator says go (a line on stdin)
    while True:
        p.produce(topic, b"W" + pad, partition=0)
        p.poll(0)
        r, _, _ = select.select([sys.stdin], [], [], 0.02)
        if r:
            sys.stdin.readline()
            break
        if time.monotonic() - t0 > 60:
            out({"error": "no go signal"})
            return
    p.flush(10)
    interval = 1.0 / rate
    start = time.monotonic()
    for i in range(n):
        target = start + i * interval
        while True:
            now = time.monotonic()
            if now >= target:
                break
            # poll for delivery reports while waiting; sleep the rest
            p.poll(0)
            d = target - time.monotonic()
            if d > 0.0005:
                time.sleep(d - 0.0003 if d > 0.001 else d / 2)
        v = b"M" + struct.pack(">qi", time.monotonic_ns(), i) + pad[4:]
        while True:
            try:
                p.produce(topic, v, partition=0, on_delivery=on_delivery)
                break
            except BufferError:
                p.poll(0.01)
        p.poll(0)
        if time.monotonic() - start > deadline_s:
            break
    sent_s = time.monotonic() - start
    p.produce(topic, b"E" + struct.pack(">i", n) + pad[4:], partition=0)
    left = p.flush(30)
    out({"sent": n, "delivery_errors": errors[:5], "n_delivery_errors": len(errors), "seconds": sent_s, "achieved_rate": n / sent_s if sent_s else None, "unflushed": left})


def main():
    role = sys.argv[1]
    a = sys.argv[2:]
    if role == "consume":
        consume(a[0], a[1], int(a[2]), a[3])
    elif role == "lat-consumer":
        lat_consumer(a[0], a[1])
    elif role == "lat-producer":
        lat_producer(a[0], a[1], float(a[2]), int(a[3]), int(a[4]))
    else:
        raise SystemExit(f"unknown role {role}")


if __name__ == "__main__":
    main()
