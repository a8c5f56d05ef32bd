"""The client library and the monitoring tool of ZooKeeper-era Kafka clusters against gregor.

* Sarama 1.22 (Debian's golang-github-shopify-sarama-dev, built here with Debian's Go) with
  `Version` 0.10.2 (Produce v2 with message format v1, Fetch v3 answered with down-converted
  message sets, JoinGroup v1, OffsetCommit v2) and 2.0.0 (record batches, Fetch v8): a producer
  and a consumer-group program (compat/go/saramatool) round trip records with each codec, and
  the offsets Sarama commits are the ones confluent-kafka then reads.
* Burrow 1.2.1 (Debian), started against a 3-broker cluster before any group exists: its
  `kafka` module reads `__consumer_offsets` with Sarama, its `kafka_zk` module reads
  `/consumers/<group>/offsets/<topic>/<partition>`, which gregor copies committed offsets into
  (`gregor.offsets.zookeeper.mirror.*`). Both report the lag of a group that consumed half a
  topic, and groups of other clients go on committing while Burrow watches.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

ck = pytest.importorskip("confluent_kafka")
from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

from cluster_harness import Cluster  # noqa: E402
from gregor_fixtures import _failed, _register  # noqa: E402
from gregor_harness import free_port, wait_until  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
GO = shutil.which("go")
BURROW = shutil.which("Burrow")
GOPATH = "/usr/share/gocode"
SARAMA_SRC = Path(GOPATH) / "src/github.com/Shopify/sarama"
WAIT = 60


def uniq(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def saramatool(tmp_path_factory):
    if GO is None or not SARAMA_SRC.is_dir():
        pytest.skip("Go or Sarama not installed (scripts/test installs golang-go and golang-github-shopify-sarama-dev)")
    out = tmp_path_factory.mktemp("sarama") / "saramatool"
    cache = ROOT / ".cache" / "go-build"
    cache.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, GOPATH=GOPATH, GO111MODULE="off", GOCACHE=str(cache), GOFLAGS="")
    p = subprocess.run([GO, "build", "-o", str(out), "."], cwd=ROOT / "compat/go/saramatool", env=env,
                       capture_output=True, timeout=600)
    assert p.returncode == 0, f"go build failed: {p.stderr.decode(errors='replace')[-3000:]}"
    return out


def sarama(tool, bootstrap, version, *args, timeout=90):
    p = subprocess.run([str(tool), "-brokers", bootstrap.split(",")[0], "-version", version, *args],
                       capture_output=True, timeout=timeout)
    assert p.returncode == 0, f"saramatool {version} {' '.join(args)}: {p.stderr.decode(errors='replace')[-2000:]}"
    return [line.split(" ") for line in p.stdout.decode().splitlines() if line]


def create_topic(bootstrap, topic, partitions, rf=1):
    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept alive until the result is in
    fs = admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=rf)],
                             operation_timeout=30)
    fs[topic].result(timeout=WAIT)


def committed(bootstrap, group, topic, partitions):
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        got = c.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=30)
        return {tp.partition: tp.offset for tp in got}
    finally:
        c.close()


# --------------------------------------------------------------------------- Sarama

@pytest.mark.parametrize("version,codec", [("0.10.2.0", "none"), ("0.10.2.0", "gzip"), ("0.10.2.0", "lz4"),
                                           ("2.0.0", "snappy"), ("2.0.0", "lz4"), ("2.0.0", "gzip")])
def test_sarama_produce_and_consumer_group(broker, saramatool, version, codec):
    topic, group = uniq(f"sarama-{codec}"), uniq("sarama-group")
    create_topic(broker.bootstrap, topic, 3)
    n = 300
    acked = sarama(saramatool, broker.bootstrap, version, "produce", "-topic", topic, "-n", str(n), "-codec", codec)
    assert len(acked) == n
    placed = {(int(p), int(o)): k for p, o, k in acked}
    assert len(placed) == n, "two records acknowledged at the same offset"
    # offsets per partition are dense from 0
    for part in range(3):
        offs = sorted(o for p, o in placed if p == part)
        assert offs == list(range(len(offs)))

    read = sarama(saramatool, broker.bootstrap, version, "consume", "-topic", topic, "-group", group, "-n", str(n))
    got = {(int(p), int(o)): (k, v) for p, o, k, v in read}
    assert {po: k for po, (k, _v) in got.items()} == placed
    assert all(v == f"sarama-{version}-{k[1:]}" for k, v in got.values())

    # what Sarama committed is what another client sees, and Sarama reads it back the same
    per_partition = {part: sum(1 for p, _ in placed if p == part) for part in range(3)}
    assert committed(broker.bootstrap, group, topic, 3) == per_partition
    back = sarama(saramatool, broker.bootstrap, version, "offsets", "-topic", topic, "-group", group)
    assert {int(p): int(o) for p, o in back} == per_partition


def test_sarama_reads_what_a_modern_client_wrote(broker, saramatool):
    """Record batches written by librdkafka (headers, zstd excluded) come back to a 0.10.2
    Sarama as down-converted message sets with the same keys and values."""
    topic = uniq("sarama-modern")
    create_topic(broker.bootstrap, topic, 1)
    p = Producer({"bootstrap.servers": broker.bootstrap, "compression.type": "lz4", "linger.ms": 5})
    for i in range(200):
        p.produce(topic, key=f"k{i}", value=f"sarama-0.10.2.0-{i}", headers=[("h", b"x")])
    assert p.flush(30) == 0
    read = sarama(saramatool, broker.bootstrap, "0.10.2.0", "consume", "-topic", topic, "-group", uniq("g"), "-n", "200")
    assert [(int(o), k, v) for _p, o, k, v in read] == [(i, f"k{i}", f"sarama-0.10.2.0-{i}") for i in range(200)]


# --------------------------------------------------------------------------- Burrow

@pytest.fixture
def cluster(request, zookeeper):
    c = Cluster(zookeeper, 3, on_new_broker=lambda b: _register(request, b),
                overrides={"gregor.offsets.zookeeper.mirror.interval.ms": "300",
                           "offsets.topic.num.partitions": "50", "offsets.topic.replication.factor": "3"})
    c.start()
    yield c
    c.stop()
    c.cleanup(keep=_failed(request))


class Burrow:
    def __init__(self, cluster: Cluster, workdir: Path):
        self.port = free_port()
        servers = json.dumps(cluster.bootstrap().split(","))
        zk = json.dumps([cluster.zk.connect])
        # Two Burrow clusters over the same brokers, one per consumer module, so each module's
        # view is asked for separately.
        clusters = "".join(f"""[cluster.{name}]
class-name="kafka"
servers={servers}
client-profile="p"
topic-refresh=1
offset-refresh=1
""" for name in ("kafka", "zk"))
        (workdir / "burrow.toml").write_text(f"""
[general]
pidfile="{workdir}/burrow.pid"
[logging]
level="info"
[zookeeper]
servers={zk}
timeout=6
root-path="/burrow-{uuid.uuid4().hex[:8]}"
[client-profile.p]
client-id="burrow"
kafka-version="2.0.0"
{clusters}[consumer.kafka]
class-name="kafka"
cluster="kafka"
servers={servers}
client-profile="p"
start-latest=false
[consumer.zk]
class-name="kafka_zk"
cluster="zk"
servers={zk}
zookeeper-path="/{cluster.chroot}"
zookeeper-timeout=6
[httpserver.default]
address="127.0.0.1:{self.port}"
[storage.default]
class-name="inmemory"
workers=4
intervals=10
expire-group=604800
min-distance=1
""")
        self.log = open(workdir / "burrow.log", "wb")
        self.proc = subprocess.Popen([BURROW, "--config-dir", str(workdir)], cwd=workdir,
                                     stdout=self.log, stderr=subprocess.STDOUT)
        self.workdir = workdir

    def get(self, path):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as r:
                return json.loads(r.read())
        except Exception:  # noqa: BLE001 - not up yet, or 404 for a group it has not seen
            return None

    def up(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/burrow/admin", timeout=5) as r:
                return r.status == 200
        except Exception:  # noqa: BLE001 - not listening yet
            return False

    def lag(self, cluster, group):
        r = self.get(f"/v3/kafka/{cluster}/consumer/{group}/lag")
        return r["status"] if r and not r.get("error") else None

    def tail(self):
        self.log.flush()
        return (self.workdir / "burrow.log").read_text(errors="replace")[-3000:]

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


@pytest.fixture
def burrow(cluster):
    if BURROW is None:
        pytest.skip("Burrow not installed (scripts/test installs Debian's burrow)")
    with tempfile.TemporaryDirectory(prefix="gregor-burrow-") as d:
        b = Burrow(cluster, Path(d))
        try:
            wait_until(lambda: b.proc.poll() is not None or b.up(), WAIT,
                       "Burrow's HTTP server")
            assert b.proc.poll() is None, f"Burrow exited: {b.tail()}"
            yield b
        finally:
            b.stop()


def test_burrow_reports_lag_from_both_modules(cluster, burrow, saramatool):
    # Burrow asked for __consumer_offsets before any group existed: it must have been created
    # as the coordinator needs it, not with num.partitions.
    def offsets_topic_partitions():
        return len(cluster.zk_assignment("__consumer_offsets")) if cluster.exists("/brokers/topics/__consumer_offsets") else 0
    wait_until(lambda: offsets_topic_partitions() == 50, WAIT, "Burrow to have __consumer_offsets created")
    assert all(len(r) == 3 for r in cluster.zk_assignment("__consumer_offsets").values())

    bootstrap = cluster.bootstrap()
    topic, group = uniq("burrow"), uniq("half")
    create_topic(bootstrap, topic, 4, rf=3)
    # Burrow drops a commit for a topic its cluster module has not listed yet (a real consumer
    # commits again; this test's groups commit once), so the groups start after it has.
    for module in ("kafka", "zk"):
        wait_until(lambda module=module: topic in ((burrow.get(f"/v3/kafka/{module}/topic") or {}).get("topics") or []),
                   WAIT, f"Burrow's {module} cluster module to list {topic}")
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for i in range(400):
        p.produce(topic, key=str(i), value=b"v" * 50, partition=i % 4)
    assert p.flush(30) == 0

    # A confluent-kafka group consumes half of each partition and commits.
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
                  "auto.offset.reset": "earliest"})
    c.assign([TopicPartition(topic, part, 0) for part in range(4)])
    seen = {part: 0 for part in range(4)}
    deadline = time.time() + WAIT
    while sum(seen.values()) < 200 and time.time() < deadline:
        m = c.poll(1.0)
        if m is None or m.error():
            continue
        if seen[m.partition()] < 50:
            seen[m.partition()] += 1
            if seen[m.partition()] == 50:
                c.pause([TopicPartition(topic, m.partition())])
    assert seen == {part: 50 for part in range(4)}
    c.commit(offsets=[TopicPartition(topic, part, 50) for part in range(4)], asynchronous=False)
    c.close()

    # A Sarama group (Burrow's own client library) commits alongside while Burrow watches.
    other = uniq("sarama-alongside")
    read = sarama(saramatool, bootstrap, "2.0.0", "consume", "-topic", topic, "-group", other, "-n", "400")
    assert len(read) == 400
    assert committed(bootstrap, other, topic, 4) == {part: 100 for part in range(4)}

    for module in ("kafka", "zk"):
        def lag_is_half(module=module):
            s = burrow.lag(module, group)
            return s is not None and s["totallag"] == 200 and len(s["partitions"]) == 4 and \
                all(pp["end"]["offset"] == 50 and pp["current_lag"] == 50 for pp in s["partitions"])
        wait_until(lag_is_half, WAIT, f"Burrow's {module} module to report a lag of 50 per partition "
                   f"(last: {burrow.lag(module, group)}; log: {burrow.tail()[-800:]})")
        wait_until(lambda module=module: (burrow.lag(module, other) or {}).get("totallag") == 0
                   and all(pp["end"]["offset"] == 100 for pp in burrow.lag(module, other)["partitions"]),
                   WAIT, f"Burrow's {module} module to report no lag for the group that read everything")

    # The copy in ZooKeeper is the committed offset itself, under Kafka's old layout.
    for part in range(4):
        assert cluster.get_text(f"/consumers/{group}/offsets/{topic}/{part}") == "50"
    assert committed(bootstrap, group, topic, 4) == {part: 50 for part in range(4)}


def test_offsets_copy_follows_commits_and_deletes(cluster):
    bootstrap = cluster.bootstrap()
    topic, group = uniq("mirror"), uniq("mirror-group")
    create_topic(bootstrap, topic, 2, rf=3)
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        for offset in (5, 17, 42):
            c.commit(offsets=[TopicPartition(topic, 0, offset), TopicPartition(topic, 1, offset + 1)],
                     asynchronous=False)
        path = f"/consumers/{group}/offsets/{topic}"
        wait_until(lambda: cluster.exists(f"{path}/1") and cluster.get_text(f"{path}/0") == "42"
                   and cluster.get_text(f"{path}/1") == "43", WAIT, "the latest commit copied to ZooKeeper")
    finally:
        c.close()
    # confluent-kafka 2.x has no OffsetDelete; kafka-python's admin client does
    from kafka import TopicPartition as KTopicPartition
    from kafka.admin import KafkaAdminClient
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        result = admin.delete_group_offsets(group, [KTopicPartition(topic, 0)])
        assert all(err is None or getattr(err, "errno", 0) == 0 for err in
                   (result.values() if isinstance(result, dict) else [])), result
    finally:
        admin.close()
    wait_until(lambda: not cluster.exists(f"{path}/0"), WAIT, "a deleted offset removed from ZooKeeper")
    assert cluster.get_text(f"{path}/1") == "43"
