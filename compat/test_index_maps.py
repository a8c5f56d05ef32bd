"""Index mappings beyond vm.max_map_count (issue 32): a broker maps segment indexes through
one bounded cache (`gregor.log.index.mmap.cache.size`) only while it reads or writes them, so
the maps it holds do not grow with partitions x segments, and it still serves reads of every
old segment (through its offset index), before and after a kill -9.

1,000 partitions of 3 segments, each segment 3 batches with index entries after the first
(`index.interval.bytes=0`): 6,000 index files, under a cache of 64 mappings."""
import threading
from pathlib import Path

import pytest

from common import uniq
from gregor_harness import BrokerStartError
from test_confluent import WAIT, admin
from test_metrics import scrape, with_metrics
from test_open_files import check, read_all

ck = pytest.importorskip("confluent_kafka")
from confluent_kafka import Producer  # noqa: E402
from confluent_kafka.admin import NewTopic  # noqa: E402

CACHE = 64
# Mappings a lookup or append in flight may still hold after the cache let them go: one per
# thread working on a log at that moment.
IN_FLIGHT = 32
PARTITIONS = 1000
ROUNDS = 9


def value(p: int, r: int) -> bytes:
    # ~100 bytes: a batch is ~170 bytes, so a 600-byte segment takes three and rolls.
    return f"p{p}-r{r}-".encode().ljust(100, b"x")


def index_maps(pid: int) -> int:
    try:
        lines = Path(f"/proc/{pid}/maps").read_text().splitlines()
    except (FileNotFoundError, ProcessLookupError):
        return 0
    return sum(1 for line in lines if line.endswith((".index", ".timeindex")))


class MapWatch:
    """Samples the broker's index mappings (/proc/<pid>/maps) until stopped; keeps the peak."""

    def __init__(self, pid: int):
        self.pid = pid
        self.peak = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, index_maps(self.pid))
            self._stop.wait(0.02)

    def stop(self) -> int:
        self._stop.set()
        self._t.join()
        return self.peak


def test_more_indexes_than_the_map_cache_holds_are_served(broker_factory):
    overrides, mport = with_metrics({"gregor.log.index.mmap.cache.size": str(CACHE)})
    b = broker_factory(overrides)
    topic = uniq("mapcache")
    a = admin(b)
    config = {"segment.bytes": "600", "index.interval.bytes": "0"}
    fs = a.create_topics([NewTopic(topic, num_partitions=PARTITIONS, replication_factor=1, config=config)],
                         operation_timeout=60)
    fs[topic].result(timeout=WAIT)
    watch = MapWatch(b.proc.pid)
    try:
        p = Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 5, "acks": "all"})
        for r in range(ROUNDS):
            for part in range(PARTITIONS):
                p.produce(topic, value(part, r), partition=part)
                p.poll(0)
            assert p.flush(WAIT) == 0, f"round {r}: records left unacknowledged"
        del p, a  # no client left to retry against the restarting broker

        indexes = list(b.data_dir.glob(f"{topic}-*/*.index"))
        with_entries = [i for i in indexes if i.stat().st_size > 0]
        assert len(with_entries) >= PARTITIONS * 2, f"{len(with_entries)} of {len(indexes)} indexes have entries"

        check(read_all(b, topic, PARTITIONS, ROUNDS), ROUNDS, value)
        peak = watch.stop()
        assert peak <= CACHE + IN_FLIGHT, f"peak of {peak} index mappings with a cache of {CACHE}"
        m = scrape(mport)
        assert m.value("gregor_log_index_mmap_cache_size") == CACHE
        assert 0 < m.value("gregor_log_index_mmap_cache_mapped") <= CACHE
        assert m.value("gregor_log_index_mmap_cache_evictions_total") > 0
        assert m.value("gregor_log_index_mmap_cache_misses_total") > 0
    finally:
        watch.stop()

    # After a kill -9 the active segments' preallocated indexes are recovered (entries
    # counted from the file, not a mapping), and every old segment is looked up again.
    b.restart(mode="kill")
    watch = MapWatch(b.proc.pid)
    try:
        check(read_all(b, topic, PARTITIONS, ROUNDS), ROUNDS, value)
    finally:
        peak = watch.stop()
    assert peak <= CACHE + IN_FLIGHT, f"peak of {peak} index mappings after the restart"


def test_a_map_cache_the_kernel_cannot_hold_is_refused_at_start_naming_the_key(broker_factory):
    limit = int(Path("/proc/sys/vm/max_map_count").read_text())
    with pytest.raises(BrokerStartError) as e:
        broker_factory({"gregor.log.index.mmap.cache.size": str(limit)})
    msg = str(e.value).split("during startup", 1)[-1]
    assert f"gregor.log.index.mmap.cache.size ({limit})" in msg and "vm.max_map_count" in msg, msg
