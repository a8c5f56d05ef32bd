"""Disk full (KIP-112): a log dir that meets ENOSPC goes offline, the rest of the broker goes on.

Real ZooKeeper, three real gregor processes, real clients. Broker X has two log dirs: its
usual one and a small tmpfs mounted by the test. One topic X leads lands in each. An acks=all
idempotent producer fills the tmpfs until an append fails with ENOSPC; then:

* the dir goes offline: DescribeLogDirs on X reports it with KAFKA_STORAGE_ERROR (56);
* the controller moves the leadership of its partitions to other brokers and drops X from
  their ISRs (the partition state znodes say so); the producer's retries land there, so every
  record is acknowledged, and reading back finds each exactly once;
* X is alive and still leads the partition in its other dir;
* once the tmpfs is grown and X restarted, the dir is back and X rejoins the ISR.

Every wait polls ZooKeeper, Metadata or DescribeLogDirs; nothing sleeps and hopes.
"""
from __future__ import annotations

import os
import subprocess
import time
import uuid

import pytest

from confluent_kafka import Producer
from confluent_kafka.admin import NewTopic
from kafka.admin import KafkaAdminClient

from cluster_harness import Cluster
from gregor_fixtures import _failed, _register
from gregor_harness import wait_until
from replication_tools import parse_batches, read_partitions, segment_bytes

TMPFS_SIZE = "8m"
BIGGER = "96m"
VALUE_BYTES = 1000
RECORDS = 12000  # about 12 MB: more than the tmpfs holds
WAIT = 120
STORAGE_ERROR = 56


def mount_tmpfs(path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE}", "tmpfs", str(path)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        why = f"cannot mount a tmpfs at {path} (needs root): {r.stderr.strip()}"
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)


def unmount(path) -> None:
    if subprocess.run(["umount", str(path)], capture_output=True).returncode != 0:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


@pytest.fixture
def disk_cluster(request, zookeeper, x_id):
    mounted = []

    def on_new_broker(b):
        _register(request, b)
        if b.broker_id == x_id:
            small = b.base_dir / "small"
            mount_tmpfs(small)
            mounted.append(small)
            b.overrides["log.dirs"] = f"{b.data_dir},{small}"
            b.small_dir = small

    c = Cluster(zookeeper, 3, overrides={"replica.lag.time.max.ms": "3000"}, on_new_broker=on_new_broker)
    try:
        c.start()
        yield c
    finally:
        try:
            c.cleanup(keep=_failed(request))
        finally:
            for m in mounted:
                unmount(m)


def log_dirs_of(broker_id: int, bootstrap: str) -> dict:
    """{log dir: (error code, {(topic, partition)})} as DescribeLogDirs on one broker answers."""
    ka = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30000)
    try:
        out = {}
        for entry in ka.describe_log_dirs(brokers=[broker_id]):
            for d in entry["log_dirs"]:
                parts = {(t["name"], p["partition_index"]) for t in d["topics"] for p in t["partitions"]}
                out[d["log_dir"]] = (d["error_code"], parts)
        return out
    finally:
        ka.close()


def log_bytes(partition_dir) -> bytes:
    segs = sorted(partition_dir.glob("*.log"), key=lambda f: int(f.stem))
    return b"".join(f.read_bytes() for f in segs)


def producer(bootstrap: str) -> Producer:
    return Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                     "linger.ms": 20, "message.timeout.ms": 240000, "log_level": 2})


def value_of(n: int) -> bytes:
    head = f"{n}:".encode()
    return head + b"x" * (VALUE_BYTES - len(head))


def make_controller(c: Cluster, broker_id: int) -> None:
    """Deletes /controller until `broker_id` wins the election."""
    def won():
        if c.controller() == broker_id:
            return True
        if c.controller() is not None:
            c.kz.delete("/controller")
        return False
    wait_until(won, WAIT, f"broker {broker_id} to become the controller", interval=0.5)


# X, the broker whose small log dir fills: a plain broker, or the controller itself (which
# learns of its own offline replicas without a LeaderAndIsr round trip).
@pytest.mark.parametrize("x_id", [3, 1], ids=["broker", "controller"])
def test_a_full_log_dir_goes_offline_and_comes_back_after_restart(disk_cluster, x_id):
    c = disk_cluster
    X = x_id
    others = [b for b in (1, 2, 3) if b != X]
    if X == 1:
        make_controller(c, X)
        c.wait_metadata_converged()
    else:
        make_controller(c, others[0])
    x = c.brokers[X]
    small, big = x.small_dir, x.data_dir
    # Space the test can give back later without touching the logs.
    filler = small / "filler.bin"
    filler.write_bytes(b"\0" * (512 * 1024))
    admin = c.admin(c.controller())
    names = [f"disk-{i}-{uuid.uuid4().hex[:6]}" for i in range(2)]
    for name in names:
        # X leads; the log manager puts each new partition in the dir holding fewer.
        admin.create_topics([NewTopic(name, 1, replica_assignment=[[X] + others])])[name].result(WAIT)
        c.wait_topic_online(name, 1)
    placed = {}
    for name in names:
        wait_until(lambda: (small / f"{name}-0").is_dir() or (big / f"{name}-0").is_dir(), WAIT,
                   f"{name}-0 to exist on broker {X}")
        placed[name] = "small" if (small / f"{name}-0").is_dir() else "big"
    assert sorted(placed.values()) == ["big", "small"], placed
    full_topic = next(n for n, d in placed.items() if d == "small")
    other_topic = next(n for n, d in placed.items() if d == "big")
    print(f"controller={c.controller()} X={X} small-dir topic={full_topic} other={other_topic}")

    # Fill the small dir: a 12 MB stream into an 8 MB tmpfs.
    acked, failed = {}, {}

    def cb(err, msg):
        n = int(msg.value().split(b":", 1)[0])
        if err is not None:
            failed[n] = err
        elif n in acked:
            raise AssertionError(f"record {n} acknowledged twice")
        else:
            acked[n] = msg.offset()

    p = producer(c.bootstrap())
    t0 = time.monotonic()
    for n in range(RECORDS):
        while True:
            try:
                p.produce(full_topic, key=str(n % 50).encode(), value=value_of(n), on_delivery=cb)
                break
            except BufferError:
                p.poll(0.1)
        p.poll(0)

    def offline():
        dirs = log_dirs_of(X, x.bootstrap)
        return dirs.get(str(small), (None,))[0] == STORAGE_ERROR and dirs
    dirs = wait_until(offline, WAIT, f"broker {X} to report {small} offline", interval=0.2)
    t_offline = time.monotonic() - t0
    assert dirs[str(big)][0] == 0, dirs
    assert dirs[str(small)][1] == set(), dirs

    def moved():
        st = c.partition_state(full_topic, 0)
        return st["leader"] not in (X, -1) and X not in st["isr"] and st
    st = wait_until(moved, WAIT, f"leadership of {full_topic}-0 to leave broker {X}", interval=0.2)
    t_moved = time.monotonic() - t0
    assert p.flush(240) == 0, "records still undelivered"
    t_acked = time.monotonic() - t0
    assert not failed, {n: str(e) for n, e in list(failed.items())[:5]}
    assert len(acked) == RECORDS, len(acked)
    print(f"dir offline after {t_offline:.1f}s, leadership on {st['leader']} after {t_moved:.1f}s, "
          f"all {len(acked)} acknowledged after {t_acked:.1f}s (state {st})")
    assert x.alive(), x.stderr_tail()
    # The append that met ENOSPC was cut back: the offline dir holds whole batches only.
    left = parse_batches(log_bytes(small / f"{full_topic}-0"))
    assert left, "nothing was written to the small dir before it filled"
    print(f"offline dir keeps {len(left)} whole batches up to offset {left[-1]['last_offset']}")

    # Nothing lost, nothing twice.
    marks, recs = read_partitions(c.bootstrap(others), full_topic, [0])
    values = [int(v.split(b":", 1)[0]) for _, _, v in recs[0]]
    assert len(values) == len(set(values)), "duplicates in the log"
    assert sorted(values) == list(range(RECORDS)), (len(values), marks)
    assert all(acked[int(v.split(b":", 1)[0])] == off for off, _, v in recs[0])

    # Metadata names X an offline replica of the partition.
    def offline_replica():
        md = c.metadata(others[0], full_topic).topics[full_topic].partitions[0]
        return X in md.replicas and X not in md.isrs and md.leader != X
    wait_until(offline_replica, WAIT, "Metadata to show the moved leadership", interval=0.2)

    def listed_offline():
        # A broker other than the controller: it learns of offline replicas from UpdateMetadata.
        follower = next(b for b in others if b != c.controller())
        ka = KafkaAdminClient(bootstrap_servers=c.brokers[follower].bootstrap, request_timeout_ms=30000)
        try:
            [t] = ka.describe_topics([full_topic])
            return [p["offline_replicas"] for p in t["partitions"]] == [[X]]
        finally:
            ka.close()
    wait_until(listed_offline, WAIT, f"Metadata to list broker {X}'s replica offline", interval=0.5)

    # X still leads and serves the partition in its other dir.
    assert c.partition_state(other_topic, 0)["leader"] == X
    q = producer(x.bootstrap)
    done = []
    q.produce(other_topic, value=b"still-here", partition=0,
              on_delivery=lambda err, msg: done.append((err, msg.offset())))
    assert q.flush(60) == 0 and done and done[0][0] is None, done
    marks, recs = read_partitions(x.bootstrap, other_topic, [0])
    assert [v for _, _, v in recs[0]] == [b"still-here"], recs

    # Give the dir room (the tmpfs grows; its files stay) and restart X: the dir is back, and
    # X catches up and rejoins the ISR.
    filler.unlink()
    r = subprocess.run(["mount", "-o", f"remount,size={BIGGER}", str(small)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    x.restart()
    dirs = wait_until(lambda: (lambda d: d if d.get(str(small), (None,))[0] == 0 else None)(
        log_dirs_of(X, x.bootstrap)), WAIT, f"{small} online again on broker {X}", interval=0.5)
    assert (full_topic, 0) in dirs[str(small)][1], dirs
    wait_until(lambda: X in c.partition_state(full_topic, 0)["isr"], WAIT,
               f"broker {X} to rejoin the ISR of {full_topic}-0", interval=0.5)
    t_back = time.monotonic() - t0
    print(f"broker {X} back in the ISR after {t_back:.1f}s")
    # Its copy is the leader's, byte for byte.
    leader = c.brokers[c.partition_state(full_topic, 0)["leader"]]
    wait_until(lambda: log_bytes(small / f"{full_topic}-0") == segment_bytes(leader, full_topic, 0), WAIT,
               f"broker {X}'s log of {full_topic}-0 to equal the leader's", interval=0.5)
