"""Clients of Kafka 0.8.2 to 0.10 against gregor: Kafka 3.9's oldest API versions and message
formats v0 and v1.

* kcat (librdkafka 2.0.2) with api.version.request=false and broker.version.fallback 0.8.2,
  0.9.0, 0.10.0, 0.11.0: Metadata v0, Produce v0/v0/v2/v3 (message format v0/v0/v1/v2), Fetch
  v0/v0/v2/v4, ListOffsets v0, each codec the format has (gzip, snappy, lz4).
* kafka-python with api_version (0, 8, 1) to (0, 10, 0): the same produce and fetch
  paths, consumer groups from 0.9 on (JoinGroup v0, OffsetCommit v2/v1), offsets kept in the
  znode tree with OffsetCommit/OffsetFetch v0 for 0.8.1.
* kafka-python 1.4.7 (the release ZooKeeper-era deployments pinned) with api_version (0, 10)
  and with auto-negotiation (it settles on 1.0.0): produce, group consume, commit, resume.
* what a modern client wrote (v2 batches, headers, every codec) reads back through the
  down-converted old fetches with the same keys, values and (format v1) timestamps; zstd
  batches cannot be expressed in v0/v1 and an old fetch of them answers
  UNSUPPORTED_COMPRESSION_TYPE, as Kafka 3.9 does.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from common import uniq

KCAT = shutil.which("kcat") or shutil.which("kafkacat")
pytestmark = pytest.mark.skipif(KCAT is None, reason="kcat not installed (scripts/test installs it)")

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "protocol-tests"))
import kproto  # noqa: E402

WAIT = 60
N = 1000
FMT = "%o\\t%T\\t%k\\t%s\\n"
FALLBACK_CODECS = {
    # librdkafka's old-broker mode: 0.8.2/0.9.0 send message format v0, 0.10.0 format v1
    "0.8.2": ["none", "gzip", "snappy", "lz4"],
    "0.9.0": ["none", "gzip", "snappy", "lz4"],
    "0.10.0": ["none", "gzip", "snappy", "lz4"],
    # 0.11.0: record batches (Produce v3, Fetch v4) without ApiVersions; zstd needs Produce v7
    "0.11.0": ["none", "gzip", "snappy", "lz4"],
}
UNSUPPORTED_COMPRESSION_TYPE = 76


def kcat(args, input=None, timeout=120):
    p = subprocess.run([KCAT] + args, input=input, capture_output=True, timeout=timeout)
    assert p.returncode == 0, f"kcat {' '.join(args)} exited {p.returncode}: {p.stderr.decode(errors='replace')[-2000:]}"
    return p


def old(fallback):
    return ["-X", "api.version.request=false", "-X", f"broker.version.fallback={fallback}"]


def kcat_consume(bootstrap, topic, extra=(), start="beginning"):
    out = kcat(["-C", "-b", bootstrap, "-t", topic, "-p", "0", "-o", start, "-e", "-q", "-f", FMT] + list(extra))
    rows = []
    for line in out.stdout.decode().split("\n"):
        if line:
            o, ts, k, v = line.split("\t")
            rows.append((int(o), int(ts), k, v))
    return rows


def lines(n, tag):
    return [f"key-{i}\tvalue-{tag}-{i}-" + "x" * (i % 40) for i in range(n)]


@pytest.mark.parametrize("fallback,codec", [(f, c) for f, cs in FALLBACK_CODECS.items() for c in cs])
def test_kcat_old_broker_mode_round_trip(broker, fallback, codec):
    topic = uniq(f"old-{fallback.replace('.', '')}-{codec}")
    sent = lines(N, codec)
    t0 = int(time.time() * 1000)
    kcat(["-P", "-b", broker.bootstrap, "-t", topic, "-K", "\\t", "-z", codec] + old(fallback),
         input=("\n".join(sent) + "\n").encode())
    t1 = int(time.time() * 1000)
    want = [(i, *s.split("\t")) for i, s in enumerate(sent)]
    got = kcat_consume(broker.bootstrap, topic, old(fallback))
    assert [(o, k, v) for o, _ts, k, v in got] == want
    modern = kcat_consume(broker.bootstrap, topic)
    assert [(o, k, v) for o, _ts, k, v in modern] == want
    if fallback in ("0.10.0", "0.11.0"):  # formats v1/v2: the producer's timestamps survive both ways
        assert all(t0 - 1000 <= ts <= t1 + 1000 for _o, ts, _k, _v in modern), modern[:3]
        assert [r[1] for r in got] == [r[1] for r in modern]
    else:  # format v0 has no timestamps
        assert {ts for _o, ts, _k, _v in modern} == {-1}
    # from the middle of the log, as a restarted old consumer would read
    mid = kcat_consume(broker.bootstrap, topic, old(fallback), start="700")
    assert [(o, k, v) for o, _ts, k, v in mid] == want[700:]


def test_modern_batches_read_back_through_old_fetches(broker):
    """confluent-kafka writes v2 batches with headers in every codec; old readers see the same
    keys and values (timestamps too in format v1), headers dropped, zstd refused."""
    ck = pytest.importorskip("confluent_kafka")
    for codec in ["none", "gzip", "snappy", "lz4", "zstd"]:
        topic = uniq(f"modern-{codec}")
        p = ck.Producer({"bootstrap.servers": broker.bootstrap, "compression.type": codec, "linger.ms": 50})
        for i in range(300):
            p.produce(topic, key=f"k{i}", value=f"v{i}", timestamp=1_700_000_000_000 + i, headers=[("h", b"x")])
        assert p.flush(WAIT) == 0
        modern = kcat_consume(broker.bootstrap, topic)
        assert [(o, ts, k, v) for o, ts, k, v in modern] == \
            [(i, 1_700_000_000_000 + i, f"k{i}", f"v{i}") for i in range(300)]
        if codec == "zstd":
            with kproto.Conn(broker.host, broker.port) as c:
                for v in (0, 2, 3):
                    r = kproto.decode_fetch(c.call(kproto.FETCH, v, kproto.fetch_request(v, {topic: {0: 0}})), v)
                    part = r["responses"][0]["partitions"][0]
                    assert part["error_code"] == UNSUPPORTED_COMPRESSION_TYPE, (v, part)
            continue
        v1 = kcat_consume(broker.bootstrap, topic, old("0.10.0"))
        assert v1 == modern, f"{codec}: Fetch v2 (format v1) differs"
        v0 = kcat_consume(broker.bootstrap, topic, old("0.9.0"))
        assert [(o, k, v) for o, _t, k, v in v0] == [(o, k, v) for o, _t, k, v in modern], codec


KAFKA_PYTHON_CASES = [((0, 10, 0), c) for c in (None, "gzip", "snappy", "lz4")] + \
    [((0, 9), c) for c in (None, "gzip", "snappy", "lz4")] + [((0, 8, 2), None), ((0, 8, 1), None)]


@pytest.mark.parametrize("api_version,codec", KAFKA_PYTHON_CASES,
                         ids=[f"{'.'.join(map(str, a))}-{c}" for a, c in KAFKA_PYTHON_CASES])
def test_kafka_python_old_api_versions(broker, api_version, codec):
    kafka = pytest.importorskip("kafka")
    if codec == "lz4" and api_version < (0, 10):
        pytest.importorskip("xxhash")  # kafka-python's format-v0 lz4 needs it
    from kafka.structs import TopicPartition

    topic = uniq("kp-old")
    with_ts = api_version >= (0, 10)
    p = kafka.KafkaProducer(bootstrap_servers=broker.bootstrap, api_version=api_version, compression_type=codec)
    for i in range(200):
        p.send(topic, key=b"k%d" % i, value=b"v%d" % i, timestamp_ms=(1_700_000_000_000 + i) if with_ts else None)
    p.flush(WAIT)
    p.close()
    group = uniq("kp-old-g")
    c = kafka.KafkaConsumer(topic, bootstrap_servers=broker.bootstrap, api_version=api_version, group_id=group,
                            auto_offset_reset="earliest", enable_auto_commit=False, consumer_timeout_ms=WAIT * 1000)
    try:
        got = []
        for m in c:
            got.append((m.offset, m.timestamp, m.key, m.value))
            if len(got) == 200:
                break
        want_ts = [(1_700_000_000_000 + i) if with_ts else None for i in range(200)]
        assert got == [(i, want_ts[i], b"k%d" % i, b"v%d" % i) for i in range(200)]
        c.commit()
        assert c.committed(TopicPartition(topic, 0)) == 200
    finally:
        c.close()
    # a new member of the group resumes from the commit
    c = kafka.KafkaConsumer(bootstrap_servers=broker.bootstrap, api_version=api_version, group_id=group,
                            enable_auto_commit=False)
    try:
        assert c.committed(TopicPartition(topic, 0)) == 200
    finally:
        c.close()
    # what the old client wrote reads back the same through a modern fetch
    modern = kcat_consume(broker.bootstrap, topic)
    assert [(o, k, v) for o, _ts, k, v in modern] == [(i, f"k{i}", f"v{i}") for i in range(200)]
    if with_ts:
        assert [ts for _o, ts, _k, _v in modern] == want_ts


KP_OLD = Path(__file__).resolve().parent.parent / ".cache" / "kafka-python-1.4.7"
KP_OLD_CASES = [(a, c) for a in ("0.10", "auto") for c in ("none", "gzip", "snappy", "lz4")]


@pytest.mark.parametrize("api,codec", KP_OLD_CASES, ids=[f"{a}-{c}" for a, c in KP_OLD_CASES])
def test_kafka_python_1_4_7(broker, api, codec):
    if not (KP_OLD / "kafka" / "version.py").is_file():
        pytest.skip(f"kafka-python 1.4.7 not installed in {KP_OLD} (scripts/test installs it)")
    import json
    import os
    topic, group = uniq("kp147"), uniq("kp147-g")
    p = subprocess.run([sys.executable, str(Path(__file__).resolve().parent / "kafka_python_legacy.py"),
                        broker.bootstrap, topic, group, "200", api, codec],
                       env=dict(os.environ, PYTHONPATH=str(KP_OLD)), capture_output=True, timeout=180)
    assert p.returncode == 0, p.stderr.decode(errors="replace")[-3000:]
    r = json.loads(p.stdout.decode().strip().splitlines()[-1])
    assert r["version"] == "1.4.7"
    assert r["api_version"] == ([0, 10] if api == "0.10" else [1, 0, 0])
    assert r["records"] == [[i, 1_700_000_000_000 + i, f"k{i}", f"v{i}"] for i in range(200)]
    assert r["committed"] == 200 and r["resumed"] == 200
    modern = kcat_consume(broker.bootstrap, topic)
    assert modern == [(i, 1_700_000_000_000 + i, f"k{i}", f"v{i}") for i in range(200)]


def test_old_formats_in_a_cluster(request, zookeeper):
    """A converted batch replicates like any other: an old producer's records, acks=all on a
    three-replica topic, read back by old and modern readers from the leader."""
    from cluster_harness import Cluster
    from gregor_fixtures import _failed, _register

    c = Cluster(zookeeper, 3, on_new_broker=lambda b: _register(request, b))
    try:
        c.start()
        ck = pytest.importorskip("confluent_kafka")
        from confluent_kafka.admin import AdminClient, NewTopic

        topic = uniq("old-cluster")
        a = AdminClient({"bootstrap.servers": c.bootstrap()})
        a.create_topics([NewTopic(topic, 1, 3)])[topic].result(timeout=WAIT)
        c.wait_topic_online(topic, 1)
        sent = lines(300, "cl")
        kcat(["-P", "-b", c.bootstrap(), "-t", topic, "-K", "\\t", "-z", "snappy", "-X", "acks=all"] + old("0.10.0"),
             input=("\n".join(sent) + "\n").encode())
        want = [(i, *s.split("\t")) for i, s in enumerate(sent)]
        for extra in (old("0.9.0"), old("0.10.0"), []):
            got = kcat_consume(c.bootstrap(), topic, extra)
            assert [(o, k, v) for o, _ts, k, v in got] == want
        del ck
        # OffsetCommit v0 (kafka-python's 0.8.1 mode) writes ZooKeeper, where Kafka 3.9 keeps it
        kafka = pytest.importorskip("kafka")
        from kafka.structs import OffsetAndMetadata, TopicPartition

        group = uniq("zk-offsets")
        kc = kafka.KafkaConsumer(bootstrap_servers=c.bootstrap(), api_version=(0, 8, 1), group_id=group,
                                 enable_auto_commit=False)
        try:
            tp = TopicPartition(topic, 0)
            kc.assign([tp])
            kc.commit({tp: OffsetAndMetadata(123, "", -1)})
            assert c.get_text(f"/consumers/{group}/offsets/{topic}/0") == "123"
            assert kc.committed(tp) == 123
        finally:
            kc.close()
    finally:
        c.cleanup(keep=_failed(request))
