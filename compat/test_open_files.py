"""Segments beyond the open-file limit (issue 32): a broker keeps segment files open through
one bounded cache (`gregor.log.segment.fd.cache.size`), so it hosts more segments, and more
partitions, than its open-file limit would allow at one descriptor each, and still serves
reads of every old segment, before and after a restart.

The broker runs under `ulimit -n 512` (the harness's `nofile`) with 1,000 partitions of
several one-batch segments each (3,000 segment files)."""
import threading
from pathlib import Path

import pytest

from common import uniq
from gregor_harness import BrokerStartError, wait_until
from test_confluent import WAIT, admin, consumer
from test_metrics import scrape, with_metrics

ck = pytest.importorskip("confluent_kafka")
from confluent_kafka import KafkaError, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import NewTopic  # noqa: E402

NOFILE = 512
CACHE = 128
PARTITIONS = 1000
ROUNDS = 3


def value(p: int, r: int) -> bytes:
    # ~100 bytes: one batch (~170 bytes) fits a 200-byte segment, two do not, so every round
    # rolls a new segment.
    return f"p{p}-r{r}-".encode().ljust(100, b"x")


class FdWatch:
    """Samples the broker's open descriptors (/proc/<pid>/fd) until stopped; keeps the peak."""

    def __init__(self, pid: int):
        self.dir = Path(f"/proc/{pid}/fd")
        self.peak = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def sample(self) -> int:
        try:
            n = sum(1 for _ in self.dir.iterdir())
        except (FileNotFoundError, ProcessLookupError):
            return 0
        self.peak = max(self.peak, n)
        return n

    def _run(self):
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(0.02)

    def stop(self) -> int:
        self._stop.set()
        self._t.join()
        return self.peak


def read_all(b, topic, partitions: int = PARTITIONS, rounds: int = ROUNDS):
    """Every record of every partition from offset 0, by partition (compat/test_index_maps.py
    reads its topic with this too)."""
    c = consumer(b, **{"fetch.wait.max.ms": 50})
    try:
        c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        got = {p: [] for p in range(partitions)}
        eof = set()

        def done():
            for m in c.consume(1000, timeout=1):
                if m.error():
                    if m.error().code() == KafkaError._PARTITION_EOF:
                        eof.add(m.partition())
                        continue
                    raise AssertionError(f"consume error: {m.error()}")
                got[m.partition()].append((m.offset(), m.value()))
            return len(eof) == partitions and sum(map(len, got.values())) >= partitions * rounds

        wait_until(done, WAIT, "every partition read from offset 0 to its end")
        return got
    finally:
        c.close()


def check(got, rounds: int = ROUNDS, value=value):
    """Each partition holds `rounds` records, record r of partition p being value(p, r)."""
    for p, records in got.items():
        assert records == [(r, value(p, r)) for r in range(rounds)], f"partition {p}: {records[:10]}"


def test_more_segments_and_partitions_than_the_open_file_limit_are_served(broker_factory):
    overrides, mport = with_metrics({
        "gregor.log.segment.fd.cache.size": str(CACHE),
        "gregor.open.files.reserved": "256",
    })
    b = broker_factory(overrides, nofile=NOFILE)
    topic = uniq("fdcache")
    a = admin(b)
    fs = a.create_topics([NewTopic(topic, num_partitions=PARTITIONS, replication_factor=1,
                                   config={"segment.bytes": "200"})], operation_timeout=60)
    fs[topic].result(timeout=WAIT)
    watch = FdWatch(b.proc.pid)
    try:
        p = Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 5, "acks": "all"})
        for r in range(ROUNDS):
            for part in range(PARTITIONS):
                p.produce(topic, value(part, r), partition=part)
                p.poll(0)
            assert p.flush(WAIT) == 0, f"round {r}: records left unacknowledged"
        del p, a  # no client left to retry against the restarting broker

        logs = list(b.data_dir.glob(f"{topic}-*/*.log"))
        assert len(logs) >= PARTITIONS * ROUNDS > NOFILE, f"{len(logs)} segment files"

        check(read_all(b, topic))
        peak = watch.stop()
        # Each of 3,000 segments was read, none kept a descriptor of its own.
        assert peak < NOFILE, f"peak of {peak} open descriptors under a limit of {NOFILE}"
        m = scrape(mport)
        assert m.value("gregor_log_segment_fd_cache_size") == CACHE
        assert 0 < m.value("gregor_log_segment_fd_cache_open") <= CACHE
        assert m.value("gregor_log_segment_fd_cache_evictions_total") > 0
        assert m.value("gregor_log_segment_fd_cache_misses_total") > 0
        assert m.value("gregor_log_segment_fd_cache_hits_total") > 0
    finally:
        watch.stop()

    # After a kill -9, recovery reads the unflushed segments and loading opens every one, all
    # under the same limit; then they are all served again.
    b.restart(mode="kill")
    watch = FdWatch(b.proc.pid)
    try:
        check(read_all(b, topic))
    finally:
        peak = watch.stop()
    assert peak < NOFILE, f"peak of {peak} open descriptors after the restart"


def test_a_cache_the_limit_cannot_hold_is_refused_at_start_naming_the_keys(broker_factory):
    with pytest.raises(BrokerStartError) as e:
        broker_factory({"gregor.log.segment.fd.cache.size": "400", "gregor.open.files.reserved": "256"},
                       nofile=NOFILE)
    msg = str(e.value).split("during startup", 1)[-1]
    assert "gregor.log.segment.fd.cache.size (400)" in msg and "gregor.open.files.reserved (256)" in msg, msg
