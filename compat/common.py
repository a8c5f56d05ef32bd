"""Helpers shared by the client suites: deterministic record sets and checks."""
from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Tuple

from gregor_harness import wait_until  # noqa: F401 (re-exported)

BASE_TS = 1_700_000_000_000
CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]


def uniq(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@dataclass
class Rec:
    seq: int
    key: bytes
    value: bytes
    headers: List[Tuple[str, bytes]] = field(default_factory=list)
    ts: int = 0


def make_records(n: int, client: str, value_size: int = 100, with_ts: bool = True) -> List[Rec]:
    out = []
    for i in range(n):
        v = f"value-{i}-".encode() + bytes(97 + (i + j) % 26 for j in range(value_size))
        out.append(Rec(seq=i, key=f"key-{i % 97}-{i}".encode(), value=v,
                       headers=[("seq", str(i).encode()), ("client", client.encode()), ("dup", b"first"),
                                ("dup", b"second")],
                       ts=BASE_TS + i * 10 if with_ts else 0))
    return out


@dataclass
class Got:
    partition: int
    offset: int
    key: Optional[bytes]
    value: Optional[bytes]
    headers: List[Tuple[str, Optional[bytes]]]
    ts: int


def verify_records(sent: List[Rec], got: List[Got], check_ts: bool = True,
                   acked: Optional[Dict[int, Tuple[int, int]]] = None, check_order: bool = True) -> None:
    """Every sent record comes back exactly once, identical; per partition the
    offsets are consecutive from 0 and (check_order) records are in send order.
    With `acked`, each record must be at the (partition, offset) it was acknowledged at."""
    assert len(got) == len(sent), f"consumed {len(got)} records, produced {len(sent)}"
    by_part: Dict[int, List[Got]] = {}
    for g in got:
        by_part.setdefault(g.partition, []).append(g)
    seen = set()
    for p, recs in by_part.items():
        recs.sort(key=lambda g: g.offset)
        offs = [g.offset for g in recs]
        assert offs == list(range(len(recs))), f"partition {p}: offsets not 0..{len(recs) - 1}: {offs[:10]}..."
        last = -1
        for g in recs:
            assert g.headers and g.headers[0][0] == "seq", f"{p}/{g.offset}: headers {g.headers}"
            seq = int(g.headers[0][1])
            assert 0 <= seq < len(sent) and seq not in seen, f"{p}/{g.offset}: unexpected or duplicate seq {seq}"
            seen.add(seq)
            e = sent[seq]
            assert g.key == e.key, f"seq {seq}: key {g.key!r} != {e.key!r}"
            assert g.value == e.value, f"seq {seq}: value {g.value[:40]!r} != {e.value[:40]!r}"
            assert g.headers == e.headers, f"seq {seq}: headers {g.headers} != {e.headers}"
            if check_ts:
                assert g.ts == e.ts, f"seq {seq}: timestamp {g.ts} != {e.ts}"
            if acked is not None:
                assert acked[seq] == (g.partition, g.offset), \
                    f"seq {seq}: acknowledged at {acked[seq]}, consumed at {(g.partition, g.offset)}"
            if check_order:
                assert seq > last, f"partition {p} out of send order: seq {last} then {seq}"
            last = seq
    assert len(seen) == len(sent)


# -- kill -9 during a produce run ------------------------------------------------------------

def check_acked_survived(sent: List[Rec], acked: Dict[int, Tuple[int, int]], got: List[Got],
                         check_ts: bool = True) -> None:
    """After a kill -9 in the middle of a produce run and a restart: every acknowledged record
    is at the (partition, offset) it was acknowledged at, identical; each partition's offsets
    are 0..n-1 without holes; nothing was stored twice (the producers here are idempotent) and
    nothing is there that was not sent.  Records sent but never acknowledged may or may not be
    there."""
    at = {(g.partition, g.offset): g for g in got}
    assert len(at) == len(got), "the same offset was consumed twice"
    by_part: Dict[int, List[int]] = {}
    for g in got:
        by_part.setdefault(g.partition, []).append(g.offset)
    for p, offs in by_part.items():
        assert sorted(offs) == list(range(len(offs))), f"partition {p}: offsets have holes: {sorted(offs)[:10]}..."
    seqs: Dict[int, Tuple[int, int]] = {}
    for g in got:
        assert g.headers and g.headers[0][0] == "seq", f"{g.partition}/{g.offset}: headers {g.headers}"
        seq = int(g.headers[0][1])
        assert 0 <= seq < len(sent), f"{g.partition}/{g.offset}: seq {seq} was never sent"
        assert seq not in seqs, f"seq {seq} stored twice: at {seqs[seq]} and {(g.partition, g.offset)}"
        seqs[seq] = (g.partition, g.offset)
    lost = []
    for seq, (p, o) in sorted(acked.items()):
        g = at.get((p, o))
        if g is None or int(g.headers[0][1]) != seq:
            lost.append((seq, (p, o), None if g is None else int(g.headers[0][1])))
            continue
        e = sent[seq]
        assert (g.key, g.value, g.headers) == (e.key, e.value, e.headers), f"seq {seq} at {p}/{o} changed"
        if check_ts:
            assert g.ts == e.ts, f"seq {seq}: timestamp {g.ts} != {e.ts}"
    assert not lost, (f"{len(lost)} of {len(acked)} acknowledged records are not at their acknowledged offset "
                      f"after kill -9 (seq, acked at, seq found there): {lost[:10]}")


def kill9_during_produce(broker, acked_count, running, stop, before: int = 1000, after: int = 500,
                         timeout: float = 120) -> int:
    """Drive a produce run that is already going (in a thread or child process): once `before`
    records are acknowledged, kill -9 the broker while the producer is still sending, restart it,
    let `after` more be acknowledged, then stop() the producer (which must flush).  Returns the
    acknowledged count at the kill.  after=0: the producer is not expected to survive the outage
    (kcat exits when all brokers are down); stop() is called right after the restart."""
    wait_until(lambda: acked_count() >= before or not running(), timeout, f"{before} acknowledged records")
    assert running(), f"the producer stopped before the kill ({acked_count()} acked): give it more records"
    at_kill = acked_count()
    assert broker.restart("kill") == -9
    if after:
        wait_until(lambda: acked_count() >= at_kill + after or not running(), timeout,
                   f"{after} more acknowledgements after the restart (had {at_kill} at the kill)")
        assert running(), f"the producer stopped before {after} acknowledgements after the restart"
    stop()
    assert acked_count() >= at_kill
    return at_kill


class PacedProducer(threading.Thread):
    """Sends recs in order, paced (a short sleep every `chunk` records) so that the run lasts,
    until halted; then `finish()` flushes. Subclasses send one record with `send(r)` and
    record every acknowledgement: acked[seq] = (partition, offset), errors = [(seq, error)]."""

    def __init__(self, p, topic, recs, join_timeout: float, chunk=20, pause=0.005):
        super().__init__(daemon=True)
        self.p, self.topic, self.recs, self.chunk, self.pause = p, topic, recs, chunk, pause
        self.join_timeout = join_timeout
        self.acked, self.errors = {}, []
        self.halt = threading.Event()
        self.exc = None

    def send(self, r) -> None:
        raise NotImplementedError

    def finish(self) -> None:
        raise NotImplementedError

    def check_finished(self) -> None:
        """Further checks once the thread is done (e.g. nothing left undelivered)."""

    def run(self):
        try:
            for r in self.recs:
                if self.halt.is_set():
                    break
                self.send(r)
                if r.seq % self.chunk == 0:
                    time.sleep(self.pause)
            self.finish()
        except BaseException as e:  # noqa: BLE001 - reported by the test
            self.exc = e

    def running(self):
        return self.is_alive() and not self.halt.is_set()

    def stop(self):
        self.halt.set()
        self.join(self.join_timeout)
        assert not self.is_alive(), "producer thread did not finish"
        assert self.exc is None, f"producer thread failed: {self.exc!r}"
        self.check_finished()
