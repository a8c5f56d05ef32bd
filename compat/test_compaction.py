"""Compacted topics with confluent-kafka: the log cleaner, tombstones, keyless records, offsets
that retention must not take, and a kill -9 in the middle of a segment swap.

Cleaning is made fast by config, not by waiting: small segments, min.cleanable.dirty.ratio=0.01,
a cleaner backoff of 100 ms, delete.retention.ms of 2 s.
"""
import errno
import os
import subprocess
import time
from pathlib import Path

import pytest

from common import CODECS, uniq, wait_until

ck = pytest.importorskip("confluent_kafka")
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic  # noqa: E402

WAIT = 90
KEYS = 100
VERSIONS = 200
TOMBSTONED = [f"key-{i:03d}" for i in range(0, KEYS, 10)]  # 10 keys
FAST_CLEANER = {"log.cleaner.backoff.ms": "100"}


def compact_topic(broker, name, **configs):
    cfg = {"cleanup.policy": "compact", "segment.bytes": "16384", "min.cleanable.dirty.ratio": "0.01",
           "segment.ms": "300", "delete.retention.ms": "2000"}
    cfg.update({k.replace("_", "."): v for k, v in configs.items()})
    a = AdminClient({"bootstrap.servers": broker.bootstrap})
    for f in a.create_topics([NewTopic(name, 1, 1, config=cfg)], operation_timeout=30).values():
        f.result(30)
    return a


def release_cleaner(a, topic):
    """min.compaction.lag.ms back to 0 (IncrementalAlterConfigs): the cleaner may start."""
    entry = ConfigEntry("min.compaction.lag.ms", "0", incremental_operation=AlterConfigOpType.SET)
    res = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[entry])
    for f in a.incremental_alter_configs([res]).values():
        f.result(30)


def produce_versions(broker, topic, codec="none"):
    """100 keys x 200 versions, then tombstones for 10 keys. Returns the expected final view."""
    p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5, "compression.type": codec,
                  "batch.num.messages": 100})
    errors = []

    def cb(err, _msg):
        if err is not None:
            errors.append(err)

    for v in range(VERSIONS):
        for k in range(KEYS):
            p.produce(topic, key=f"key-{k:03d}", value=f"value-{v:03d}-" + "x" * 40, partition=0, on_delivery=cb)
        p.poll(0)
    for k in TOMBSTONED:
        p.produce(topic, key=k, value=None, partition=0, on_delivery=cb)
    assert p.flush(60) == 0
    assert not errors, errors[:3]
    latest = {f"key-{k:03d}": f"value-{VERSIONS - 1:03d}-" + "x" * 40 for k in range(KEYS)}
    for k in TOMBSTONED:
        latest[k] = None
    return p, latest


def roll_active_segment(p, topic):
    """segment.ms rolls only on an append: wait it out, then write one more record."""
    time.sleep(0.4)
    p.produce(topic, key="roll", value="r", partition=0)
    assert p.flush(30) == 0


def read_all(broker, topic):
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": uniq("compact-reader"),
                  "enable.auto.commit": False, "enable.partition.eof": True, "auto.offset.reset": "earliest"})
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        out = []
        deadline = time.time() + 30
        while time.time() < deadline:
            m = c.poll(1.0)
            if m is None:
                continue
            if m.error():
                if m.error().code() == KafkaError._PARTITION_EOF:
                    return out
                raise AssertionError(m.error())
            out.append((m.offset(), m.key().decode() if m.key() else None,
                        None if m.value() is None else m.value().decode()))
        raise AssertionError("no end of partition within 30 s")
    finally:
        c.close()


def log_dir_bytes(broker, topic):
    d = Path(broker.data_dir) / f"{topic}-0"
    return sum(f.stat().st_size for f in d.glob("*.log"))


def compacted_view(recs):
    """Offsets strictly increasing, one record per key: the view as a dict."""
    offsets = [o for o, _, _ in recs]
    assert offsets == sorted(set(offsets)), "offsets strictly increasing"
    view = {}
    for _, k, v in recs:
        view[k] = v
    return view


def fully_compacted(broker, topic, latest, tombstones_gone=True):
    recs = read_all(broker, topic)
    keys = [k for _, k, _ in recs if k != "roll"]
    if len(keys) != len(set(keys)):
        return None  # not yet cleaned
    view = compacted_view(recs)
    view.pop("roll", None)
    want = {k: v for k, v in latest.items() if v is not None or not tombstones_gone}
    if view != want:
        return None
    return recs


@pytest.mark.parametrize("codec", CODECS)
def test_compaction_keeps_the_latest_value_per_key(broker_factory, codec):
    b = broker_factory(overrides=FAST_CLEANER)
    topic = uniq(f"compact-{codec}")
    # Held back by min.compaction.lag.ms while the uncompacted size is measured.
    a = compact_topic(b, topic, min_compaction_lag_ms="3600000")
    p, latest = produce_versions(b, topic, codec)
    roll_active_segment(p, topic)
    uncompacted = log_dir_bytes(b, topic)
    assert len(read_all(b, topic)) == KEYS * VERSIONS + len(TOMBSTONED) + 1, "nothing cleaned yet"
    release_cleaner(a, topic)

    recs = wait_until(lambda: fully_compacted(b, topic, latest), WAIT, "the cleaner to compact and drop tombstones")
    offsets = [o for o, _, _ in recs]
    assert offsets[-1] - offsets[0] + 1 > len(offsets), "offsets keep their gaps, never renumbered"
    assert offsets[-1] == KEYS * VERSIONS + len(TOMBSTONED), "the last offset is unchanged"
    after = log_dir_bytes(b, topic)
    assert after * 10 < uncompacted, f"{codec}: {uncompacted} bytes -> {after}"
    text = (Path(b.data_dir) / "cleaner-offset-checkpoint").read_text().splitlines()
    assert text[0] == "0" and any(line.startswith(f"{topic} 0 ") for line in text[2:]), text


def test_tombstones_outlive_the_first_pass(broker_factory):
    """A tombstone is still readable right after the pass that compacted its key's history."""
    b = broker_factory(overrides=FAST_CLEANER)
    topic = uniq("compact-tomb")
    compact_topic(b, topic, delete_retention_ms="600000")
    p, latest = produce_versions(b, topic)
    roll_active_segment(p, topic)
    recs = wait_until(lambda: fully_compacted(b, topic, latest, tombstones_gone=False), WAIT,
                      "the cleaner to compact while keeping tombstones")
    assert sum(1 for _, k, v in recs if v is None) == len(TOMBSTONED)


def test_keyless_records_are_refused_with_invalid_record(broker_factory):
    b = broker_factory(overrides=FAST_CLEANER)
    topic = uniq("compact-keyless")
    compact_topic(b, topic)
    p = Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 10000})
    results = []
    # One batch: keyed, keyless, keyed. Kafka refuses the batch whole. The long linger keeps
    # a test descheduled between two produce() calls from sending the first record alone
    # (seen under CI load with 200 ms); flush() sends at once whatever the linger.
    for key in (b"a", None, b"c"):
        p.produce(topic, key=key, value=b"v", partition=0,
                  on_delivery=lambda err, m, key=key: results.append((key, err)))
    assert p.flush(30) == 0
    assert len(results) == 3
    for key, err in results:
        assert err is not None and err.code() == KafkaError.INVALID_RECORD, (key, err)
    done = []
    p.produce(topic, key=b"ok", value=b"v", partition=0, on_delivery=lambda err, m: done.append(err))
    assert p.flush(30) == 0 and done == [None]
    assert [(k, v) for _, k, v in read_all(b, topic)] == [("ok", "v")]
    # A topic with cleanup.policy=delete takes keyless records.
    other = uniq("delete-keyless")
    a = AdminClient({"bootstrap.servers": b.bootstrap})
    for f in a.create_topics([NewTopic(other, 1, 1)], operation_timeout=30).values():
        f.result(30)
    p.produce(other, value=b"v", partition=0, on_delivery=lambda err, m: done.append(err))
    assert p.flush(30) == 0 and done == [None, None]


def test_compaction_configs_are_accepted_validated_and_described(broker_factory):
    b = broker_factory()
    topic = uniq("compact-cfg")
    a = compact_topic(b, topic, max_compaction_lag_ms="7200000", min_compaction_lag_ms="1000",
                      segment_jitter_ms="10", preallocate="false", message_timestamp_after_max_ms="5000")
    res = ConfigResource(ConfigResource.Type.TOPIC, topic)
    described = a.describe_configs([res])[res].result(30)
    assert described["cleanup.policy"].value == "compact"
    assert described["delete.retention.ms"].value == "2000"
    assert described["max.compaction.lag.ms"].value == "7200000"
    assert described["min.cleanable.dirty.ratio"].value == "0.01"
    assert described["min.compaction.lag.ms"].value == "1000"
    assert described["segment.jitter.ms"].value == "10"
    assert described["local.retention.ms"].value == "-2"
    assert described["remote.storage.enable"].value == "false"
    assert described["compression.zstd.level"].value == "3"
    for bad in ({"min.cleanable.dirty.ratio": "1.5"}, {"delete.retention.ms": "-1"},
                {"min.compaction.lag.ms": "10", "max.compaction.lag.ms": "5"},
                {"remote.storage.enable": "true"}, {"compression.gzip.level": "0"},
                {"no.such.config": "1"}):
        fs = a.create_topics([NewTopic(uniq("bad-cfg"), 1, 1, config=bad)], operation_timeout=30)
        for f in fs.values():
            with pytest.raises(ck.KafkaException) as e:
                f.result(30)
            assert e.value.args[0].code() == KafkaError.INVALID_CONFIG, bad


def test_offsets_survive_retention_and_restart(broker_factory):
    """__consumer_offsets is compact-only: time retention must not take a group's one commit."""
    b = broker_factory(overrides={**FAST_CLEANER, "log.retention.ms": "1000",
                                  "log.retention.check.interval.ms": "200",
                                  "offsets.topic.num.partitions": "1", "offsets.topic.replication.factor": "1",
                                  "offsets.topic.segment.bytes": "2048"})
    topic = uniq("offsets-src")
    a = AdminClient({"bootstrap.servers": b.bootstrap})
    for f in a.create_topics([NewTopic(topic, 1, 1)], operation_timeout=30).values():
        f.result(30)

    def consumer(group):
        return Consumer({"bootstrap.servers": b.bootstrap, "group.id": group, "enable.auto.commit": False})

    once = uniq("commits-once")
    c = consumer(once)
    c.commit(offsets=[TopicPartition(topic, 0, 42)], asynchronous=False)
    c.close()
    # Another group commits until the offsets partition has rolled many segments.
    busy = consumer(uniq("commits-often"))
    for n in range(1, 301):  # about 15 segments of 2 KiB
        busy.commit(offsets=[TopicPartition(topic, 0, n)], asynchronous=False)
    busy.close()
    # The commit is now older than log.retention.ms in a segment retention would take; let
    # several retention checks pass (a negative cannot be polled for).
    # Twice: the second time the log was loaded at startup, and must have taken the topic's
    # cleanup.policy rather than the broker default.
    for _ in range(2):
        time.sleep(1.5)
        b.restart("term")
        c = consumer(once)
        try:
            got = c.committed([TopicPartition(topic, 0)], timeout=30)
            assert got[0].offset == 42
        finally:
            c.close()


def test_kill9_at_the_swap_leaves_reads_unchanged(broker_factory):
    b = broker_factory(overrides=FAST_CLEANER, env={"GREGOR_TEST_CRASH_AT": "swap"})
    topic = uniq("compact-crash")
    a = compact_topic(b, topic, min_compaction_lag_ms="3600000")
    p, latest = produce_versions(b, topic)
    roll_active_segment(p, topic)
    b.expect_exit()
    release_cleaner(a, topic)
    wait_until(lambda: not b.alive(), WAIT, "the broker to kill itself at the first cleaner swap")
    d = Path(b.data_dir) / f"{topic}-0"
    assert list(d.glob("*.log.swap")), "the crash came mid-swap"
    del b.extra_env["GREGOR_TEST_CRASH_AT"]
    # Recovery alone first: a running cleaner would write .cleaned/.swap files of its own.
    b.overrides["log.cleaner.enable"] = "false"
    b.restart("kill")
    assert not list(d.glob("*.swap")) and not list(d.glob("*.cleaned"))
    view = compacted_view(read_all(b, topic))
    view.pop("roll", None)
    assert view == latest, "the same latest value per key as before the crash"
    # and the cleaner finishes the job after the next restart
    del b.overrides["log.cleaner.enable"]
    b.restart("term")
    wait_until(lambda: fully_compacted(b, topic, latest), WAIT, "the cleaner to finish after the restart")


def test_offsets_of_an_empty_group_expire(broker_factory):
    """offsets.retention.minutes (1, Kafka's minimum) after the commit of a memberless group:
    tombstones written, so the offsets stay gone after a restart."""
    b = broker_factory(overrides={"offsets.retention.minutes": "1", "offsets.retention.check.interval.ms": "500",
                                  "offsets.topic.num.partitions": "1", "offsets.topic.replication.factor": "1"})
    topic = uniq("expiry-src")
    a = AdminClient({"bootstrap.servers": b.bootstrap})
    for f in a.create_topics([NewTopic(topic, 1, 1)], operation_timeout=30).values():
        f.result(30)
    group = uniq("expires")
    c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        c.commit(offsets=[TopicPartition(topic, 0, 7)], asynchronous=False)
        assert c.committed([TopicPartition(topic, 0)], timeout=30)[0].offset == 7
        started = time.time()
        wait_until(lambda: c.committed([TopicPartition(topic, 0)], timeout=30)[0].offset < 0, 120,
                   "the committed offset to expire")
        assert time.time() - started > 50, "not before offsets.retention.minutes"
    finally:
        c.close()
    b.restart("term")
    c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        assert c.committed([TopicPartition(topic, 0)], timeout=30)[0].offset < 0, "the tombstone outlives a restart"
    finally:
        c.close()


@pytest.fixture
def small_fs(tmp_path):
    """A 6 MiB tmpfs: a file system that really fills up (writes fail with ENOSPC). Mounting
    needs root (CAP_SYS_ADMIN); without it the test is skipped, saying why."""
    mnt = tmp_path / "small-fs"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs (needs root): {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def fill_up(path: Path):
    """Writes `path` until the file system is full."""
    chunk = b"\0" * 65536
    with open(path, "wb", buffering=0) as f:
        try:
            while f.write(chunk):
                pass
        except OSError as e:
            assert e.errno == errno.ENOSPC, e


def cleaner_done(b, topic):
    f = Path(b.data_dir) / "cleaner-offset-checkpoint"
    return f.exists() and f" {topic} 0 " in " " + f.read_text().replace("\n", " ")


def test_a_full_disk_during_cleaning_backs_off_and_loses_nothing(broker_factory, small_fs):
    """The cleaner's copy of a segment whose records are all still live is as large as the
    segment: with the disk full it fails with ENOSPC, removes its partial files, backs off and
    retries; the broker stays up and the partition reads the same; once space is freed the
    pass completes."""
    b = broker_factory(data_dir=small_fs / "data", overrides=FAST_CLEANER)
    topic = uniq("compact-full")
    a = compact_topic(b, topic, min_compaction_lag_ms="3600000")
    p = Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 5, "batch.size": 8192})
    errors = []
    latest = {}
    # 5000 keys, then the last 1000 again: the first segments are all live records.
    for i in list(range(5000)) + list(range(4000, 5000)):
        k, v = f"key-{i:04d}", f"v{i}-" + "y" * 60
        latest[k] = v
        p.produce(topic, key=k, value=v, partition=0, on_delivery=lambda err, _m: err and errors.append(err))
        if i % 500 == 0:
            p.poll(0)
    assert p.flush(60) == 0
    assert not errors, errors[:3]
    roll_active_segment(p, topic)
    before = read_all(b, topic)
    assert len(before) == 6001

    filler = small_fs / "filler"
    log = b.log_path
    failures = lambda: log.read_text(errors="replace").count("log cleaning failed; backing off")  # noqa: E731
    fill_up(filler)
    release_cleaner(a, topic)
    # Full, then two pages free (shrinking the filler, never emptying it): the copy's first
    # batch (about 8 KiB) takes them and the second fails to write.
    for free in (0, 8192):
        if free:
            os.truncate(filler, filler.stat().st_size - free)
        seen = failures()
        wait_until(lambda: failures() > seen, WAIT, f"the cleaner to fail for want of space ({free} bytes freed)")
        assert b.alive(), b.stderr_tail(40)
        assert read_all(b, topic) == before, "the partition reads the same"
    assert "No space left on device" in log.read_text(errors="replace")
    # Two more pages: both batches of the first segment's copy fit, and its index entry for
    # the second finds no page (a store into a hole of the mapped index would be a SIGBUS). The
    # pass may fail there or go on, each swap freeing what the next copy needs; either way the
    # broker stays up and every key reads its latest value.
    os.truncate(filler, filler.stat().st_size - 8192)
    seen = failures()
    wait_until(lambda: failures() > seen or cleaner_done(b, topic), WAIT, "the cleaner to fail or finish")
    assert b.alive(), b.stderr_tail(40)
    view = compacted_view(read_all(b, topic))
    view.pop("roll", None)
    assert view == latest

    filler.unlink()
    recs = wait_until(lambda: fully_compacted(b, topic, latest), WAIT, "the cleaner to finish once space is free")
    assert len(recs) == 5001
    d = Path(b.data_dir) / f"{topic}-0"
    assert not list(d.glob("*.cleaned")) and not list(d.glob("*.swap")), "no leftovers"
    assert b.alive()
