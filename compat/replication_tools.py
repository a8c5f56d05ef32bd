"""Helpers for compat/test_replication.py: a background sequence producer, a consumer that reads
whole partitions up to the high watermark, on-disk log/checkpoint readers, Kafka's group ->
__consumer_offsets partition rule.

Everything here is client-side or reads files; brokers are started and stopped by the test's
main thread only (gregor_harness sets PR_SET_PDEATHSIG, which is tied to the forking thread).
"""
from __future__ import annotations

import os
import signal
import struct
import threading
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition

from gregor_harness import wait_until

NKEYS = 50


def key_of(n: int) -> bytes:
    return f"k{n % NKEYS}".encode()


# ---------------------------------------------------------------------------
# Kafka rules
# ---------------------------------------------------------------------------

def java_string_hash(s: str) -> int:
    """java.lang.String.hashCode (UTF-16 code units, 32-bit wrap-around)."""
    h = 0
    data = s.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h >= (1 << 31) else h


def kafka_abs(n: int) -> int:
    """org.apache.kafka.common.utils.Utils.abs."""
    return 0 if n == -(1 << 31) else abs(n)


def offsets_partition_for(group: str, partitions: int = 50) -> int:
    """GroupMetadataManager.partitionFor: Utils.abs(groupId.hashCode) % offsets.topic.num.partitions."""
    return kafka_abs(java_string_hash(group)) % partitions


# ---------------------------------------------------------------------------
# on-disk files
# ---------------------------------------------------------------------------

def partition_dir(broker, topic: str, p: int) -> Path:
    return Path(broker.data_dir) / f"{topic}-{p}"


def segment_bytes(broker, topic: str, p: int, first_only: bool = False) -> Optional[bytes]:
    """The bytes of the partition's .log segments (in base-offset order, concatenated), or of
    00000000000000000000.log only.  None if the partition dir is missing."""
    d = partition_dir(broker, topic, p)
    if not d.is_dir():
        return None
    if first_only:
        f = d / "00000000000000000000.log"
        return f.read_bytes() if f.exists() else None
    segs = sorted(d.glob("*.log"), key=lambda x: int(x.stem))
    return b"".join(s.read_bytes() for s in segs)


def parse_batches(data: bytes) -> List[dict]:
    """Kafka record batches (magic 2) in a segment: base_offset, last_offset, leader epoch, size.
    Raises ValueError on anything that is not a complete, well-formed v2 batch."""
    out = []
    pos = 0
    while pos < len(data):
        if len(data) - pos < 61:
            raise ValueError(f"truncated batch header at byte {pos} ({len(data) - pos} bytes left)")
        base_offset, length, epoch, magic = struct.unpack_from(">qiib", data, pos)
        if magic != 2:
            raise ValueError(f"batch at byte {pos}: magic {magic}")
        if length < 49 or pos + 12 + length > len(data):
            raise ValueError(f"batch at byte {pos}: length {length} exceeds the file ({len(data)} bytes)")
        (last_delta,) = struct.unpack_from(">i", data, pos + 23)
        (count,) = struct.unpack_from(">i", data, pos + 57)
        out.append({"pos": pos, "base_offset": base_offset, "last_offset": base_offset + last_delta,
                    "epoch": epoch, "count": count, "size": 12 + length})
        pos += 12 + length
    return out


def epochs_from_batches(batches: List[dict]) -> List[Tuple[int, int]]:
    """(epoch, start offset) for every epoch change in the log, as a leader epoch cache holds."""
    out: List[Tuple[int, int]] = []
    for b in batches:
        if not out or b["epoch"] > out[-1][0]:
            out.append((b["epoch"], b["base_offset"]))
    return out


def read_epoch_checkpoint(broker, topic: str, p: int) -> Optional[str]:
    f = partition_dir(broker, topic, p) / "leader-epoch-checkpoint"
    return f.read_text() if f.exists() else None


def format_epoch_checkpoint(entries: List[Tuple[int, int]]) -> str:
    """Kafka's CheckpointFile: version line, count line, one `epoch offset` line per entry."""
    return "0\n" + f"{len(entries)}\n" + "".join(f"{e} {o}\n" for e, o in entries)


# ---------------------------------------------------------------------------
# process control
# ---------------------------------------------------------------------------

def sigstop(broker) -> None:
    os.kill(broker.proc.pid, signal.SIGSTOP)


def sigcont(broker) -> None:
    if broker.proc is not None and broker.proc.poll() is None:
        os.kill(broker.proc.pid, signal.SIGCONT)


# ---------------------------------------------------------------------------
# producer running in a thread
# ---------------------------------------------------------------------------

class SeqProducer(threading.Thread):
    """Writes value = str(n), key = k<n mod 50> for n = 0, 1, 2, ... until stop(); records every
    delivery report.  `acked[n] = (partition, offset)`, `failed[n] = KafkaError`."""

    def __init__(self, bootstrap: str, topic: str, conf: Optional[dict] = None, per_tick: int = 5,
                 tick: float = 0.02):
        super().__init__(daemon=True, name=f"seq-producer-{topic}")
        self.topic = topic
        self.conf = {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 5,
            # long enough to ride out two dead brokers plus the session timeouts: a message that
            # cannot be written is retried, never dropped
            "message.timeout.ms": 240000,
            "log_level": 2,
        }
        self.conf.update(conf or {})
        self.per_tick = per_tick
        self.tick = tick
        self._halt = threading.Event()
        self.lock = threading.Lock()
        self.sent = 0
        self.acked: Dict[int, Tuple[int, int]] = {}
        self.double_acks: List[Tuple[int, Tuple[int, int], Tuple[int, int]]] = []
        self.failed: Dict[int, KafkaError] = {}
        self.client_errors: List[Tuple[str, str, bool]] = []
        self.unflushed: Optional[int] = None
        self.exc: Optional[BaseException] = None

    def _on_delivery(self, err, msg):
        n = int(msg.value().decode())
        with self.lock:
            if err is not None:
                self.failed[n] = err
            elif n in self.acked:
                self.double_acks.append((n, self.acked[n], (msg.partition(), msg.offset())))
            else:
                self.acked[n] = (msg.partition(), msg.offset())

    def _on_error(self, err):
        with self.lock:
            self.client_errors.append((err.name(), err.str(), err.fatal()))

    def acked_count(self) -> int:
        with self.lock:
            return len(self.acked)

    def fatal(self) -> List[Tuple[str, str, bool]]:
        with self.lock:
            return [e for e in self.client_errors if e[2]]

    def run(self):
        try:
            conf = dict(self.conf)
            conf["error_cb"] = self._on_error
            p = Producer(conf)
            n = 0
            while not self._halt.is_set():
                for _ in range(self.per_tick):
                    while True:
                        try:
                            p.produce(self.topic, key=key_of(n), value=str(n).encode(),
                                      on_delivery=self._on_delivery)
                            break
                        except BufferError:
                            p.poll(0.1)
                    n += 1
                    self.sent = n
                p.poll(0)
                time.sleep(self.tick)  # pacing only; nothing waits on this
            self.unflushed = p.flush(180)
        except BaseException as e:  # noqa: BLE001
            self.exc = e

    def stop(self, timeout: float = 240) -> None:
        self._halt.set()
        self.join(timeout)
        if self.is_alive():
            raise AssertionError("producer thread did not finish flushing")
        if self.exc is not None:
            raise self.exc


def produce_sync(bootstrap: str, topic: str, values, partition: Optional[int] = None,
                 conf: Optional[dict] = None, timeout: float = 120):
    """Produce `values` (ints; key = key_of(v)); return ({v: (partition, offset)}, {v: KafkaError})."""
    c = {"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, "log_level": 2}
    c.update(conf or {})
    p = Producer(c)
    acked, failed = {}, {}

    def cb(err, msg):
        v = int(msg.value().decode())
        if err is not None:
            failed[v] = err
        else:
            acked[v] = (msg.partition(), msg.offset())

    for v in values:
        kw = {} if partition is None else {"partition": partition}
        p.produce(topic, key=key_of(v), value=str(v).encode(), on_delivery=cb, **kw)
        p.poll(0)
    left = p.flush(timeout)
    assert left == 0, f"{left} messages still undelivered after {timeout}s"
    return acked, failed


# ---------------------------------------------------------------------------
# reading whole partitions
# ---------------------------------------------------------------------------

def read_partitions(bootstrap: str, topic: str, partitions, timeout: float = 90):
    """Read every partition from the beginning (assign, no group) up to its high watermark.
    Returns ({p: (low, high)}, {p: [(offset, key, value), ...]})."""
    cons = Consumer({"bootstrap.servers": bootstrap, "group.id": "replication-check-unused",
                     "enable.auto.commit": False, "enable.auto.offset.store": False,
                     "auto.offset.reset": "earliest", "log_level": 2})
    try:
        marks = {}
        for p in partitions:
            marks[p] = cons.get_watermark_offsets(TopicPartition(topic, p), timeout=20, cached=False)
        recs: Dict[int, list] = {p: [] for p in partitions}
        todo = [p for p in partitions if marks[p][1] > marks[p][0]]
        if not todo:
            return marks, recs
        cons.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in todo])
        errors = []

        def done():
            for _ in range(500):
                m = cons.poll(0.2)
                if m is None:
                    break
                if m.error() is not None:
                    errors.append(m.error())
                    continue
                recs[m.partition()].append((m.offset(), m.key(), m.value()))
            if errors:
                raise AssertionError(f"consumer errors: {errors[:5]}")
            pos = {tp.partition: tp.offset for tp in cons.position([TopicPartition(topic, p) for p in todo])}
            return all(pos[p] >= marks[p][1] for p in todo)

        try:
            wait_until(done, timeout, f"{topic}: every partition read up to its high watermark {marks}", interval=0)
        except TimeoutError as e:
            pos = {tp.partition: (tp.offset, tp.error) for tp in
                   cons.position([TopicPartition(topic, p) for p in todo])}
            got = {p: (len(r), r[0][0] if r else None, r[-1][0] if r else None) for p, r in recs.items()}
            raise AssertionError(f"{e}\n  positions {pos}\n  read (count, first, last offset) {got}") from None
        # records past the high watermark read above cannot exist (consumers stop at the HW)
        for p in todo:
            recs[p] = [r for r in recs[p] if r[0] < marks[p][1]]
        return marks, recs
    finally:
        cons.close()
