"""Consumer-group helpers for compat/test_groups.py.

Two halves:

* `python groups_tools.py worker '<json config>'` runs ONE group consumer (confluent-kafka or
  kafka-python) in its own process, so a test can kill -9 it.  It reports everything it does as
  JSON lines on stdout (assign / revoke / lost / recs / commit / error / closed) and reads
  commands from stdin ("close" = commit and close the consumer, then exit).  Offsets are
  committed synchronously after every batch, explicitly (last offset + 1 per partition).

* `Worker` (parent side) spawns that process, collects its events from a reader thread and
  answers questions about them (current assignment, member id, what was consumed/committed).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Dict, List, Optional, Set, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))


# ---------------------------------------------------------------------------
# child side
# ---------------------------------------------------------------------------

def _emit(ev: dict) -> None:
    ev["t"] = time.time()
    sys.stdout.write(json.dumps(ev) + "\n")
    sys.stdout.flush()


def _stdin_watcher(flags: dict) -> None:
    for line in sys.stdin:
        cmd = line.strip()
        if cmd:
            flags[cmd] = True
    flags["close"] = True  # parent went away: close


def _run_confluent(cfg: dict, flags: dict) -> None:
    from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

    conf = {
        "bootstrap.servers": cfg["bootstrap"],
        "group.id": cfg["group"],
        "client.id": cfg.get("client_id", "groups-worker"),
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "session.timeout.ms": cfg.get("session_timeout_ms", 6000),
        "heartbeat.interval.ms": cfg.get("heartbeat_interval_ms", 1000),
        "topic.metadata.refresh.interval.ms": 2000,
        "log_level": 3,
    }
    if cfg.get("instance_id"):
        conf["group.instance.id"] = cfg["instance_id"]
    if cfg.get("strategy"):
        conf["partition.assignment.strategy"] = cfg["strategy"]
    conf.update(cfg.get("extra", {}))
    if conf.get("group.protocol") == "consumer":
        # KIP-848: the broker sets the session and heartbeat, and assigns; librdkafka refuses these.
        for k in ("session.timeout.ms", "heartbeat.interval.ms", "partition.assignment.strategy"):
            conf.pop(k, None)

    def on_error(err):
        _emit({"ev": "error", "err": str(err), "code": err.code(), "fatal": err.fatal()})

    conf["error_cb"] = on_error
    c = Consumer(conf)
    topic = cfg["topics"][0]

    def member():
        try:
            return c.memberid()
        except Exception:  # noqa: BLE001
            return None

    def on_assign(consumer, parts):
        _emit({"ev": "assign", "parts": sorted(p.partition for p in parts), "member": member()})

    def on_revoke(consumer, parts):
        _emit({"ev": "revoke", "parts": sorted(p.partition for p in parts), "member": member()})

    def on_lost(consumer, parts):
        _emit({"ev": "lost", "parts": sorted(p.partition for p in parts), "member": member()})

    c.subscribe(cfg["topics"], on_assign=on_assign, on_revoke=on_revoke, on_lost=on_lost)
    _emit({"ev": "start", "pid": os.getpid(), "client": "confluent"})
    while not flags.get("close"):
        msgs = c.consume(500, 0.2)
        recs, last = [], {}
        for m in msgs:
            if m.error() is not None:
                if m.error().code() != KafkaError._PARTITION_EOF:
                    _emit({"ev": "error", "err": str(m.error()), "code": m.error().code(),
                           "fatal": m.error().fatal()})
                continue
            recs.append([m.partition(), m.offset()])
            last[m.partition()] = m.offset()
        if not recs:
            continue
        _emit({"ev": "recs", "recs": recs, "member": member()})
        if cfg.get("commit", True):
            offs = [TopicPartition(topic, p, o + 1) for p, o in sorted(last.items())]
            try:
                res = c.commit(offsets=offs, asynchronous=False)
                bad = [(tp.partition, str(tp.error)) for tp in res if tp.error is not None]
                if bad:
                    _emit({"ev": "commit_error", "err": str(bad)})
                else:
                    _emit({"ev": "commit", "offsets": {str(tp.partition): tp.offset for tp in res}})
            except KafkaException as e:
                _emit({"ev": "commit_error", "err": str(e)})
    c.close()
    _emit({"ev": "closed"})


def _run_kafka_python(cfg: dict, flags: dict) -> None:
    from kafka import KafkaConsumer, TopicPartition
    from kafka.consumer.subscription_state import ConsumerRebalanceListener
    from kafka.structs import OffsetAndMetadata

    kw = dict(bootstrap_servers=cfg["bootstrap"], group_id=cfg["group"],
              client_id=cfg.get("client_id", "groups-worker-kp"),
              enable_auto_commit=False, auto_offset_reset="earliest",
              session_timeout_ms=cfg.get("session_timeout_ms", 6000),
              heartbeat_interval_ms=cfg.get("heartbeat_interval_ms", 1000),
              metadata_max_age_ms=2000)
    if cfg.get("instance_id"):
        kw["group_instance_id"] = cfg["instance_id"]
    if cfg.get("strategy"):
        from kafka.coordinator.assignors.range import RangePartitionAssignor
        from kafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
        from kafka.coordinator.assignors.sticky.sticky_assignor import StickyPartitionAssignor
        names = {"range": RangePartitionAssignor, "roundrobin": RoundRobinPartitionAssignor,
                 "sticky": StickyPartitionAssignor}
        try:
            from kafka.coordinator.assignors import cooperative_sticky as cs
            names["cooperative-sticky"] = getattr(cs, "CooperativeStickyAssignor", None) or \
                getattr(cs, "CooperativeStickyPartitionAssignor")
        except (ImportError, AttributeError):
            pass
        kw["partition_assignment_strategy"] = [names[s.strip()] for s in cfg["strategy"].split(",")]
    kw.update(cfg.get("extra", {}))
    c = KafkaConsumer(**kw)
    topic = cfg["topics"][0]

    def member():
        try:
            return c._coordinator._generation.member_id or None
        except Exception:  # noqa: BLE001
            return None

    class L(ConsumerRebalanceListener):
        def on_partitions_revoked(self, revoked):
            _emit({"ev": "revoke", "parts": sorted(p.partition for p in revoked), "member": member()})

        def on_partitions_assigned(self, assigned):
            _emit({"ev": "assign", "parts": sorted(p.partition for p in assigned), "member": member()})

        def on_partitions_lost(self, lost):
            _emit({"ev": "lost", "parts": sorted(p.partition for p in lost), "member": member()})

    c.subscribe(cfg["topics"], listener=L())
    _emit({"ev": "start", "pid": os.getpid(), "client": "kafka-python"})
    while not flags.get("close"):
        batch = c.poll(timeout_ms=200, max_records=500)
        recs, last = [], {}
        for tp, ms in batch.items():
            for m in ms:
                recs.append([m.partition, m.offset])
                last[m.partition] = m.offset
        if not recs:
            continue
        _emit({"ev": "recs", "recs": recs, "member": member()})
        if cfg.get("commit", True):
            offs = {TopicPartition(topic, p): OffsetAndMetadata(o + 1, "", -1) for p, o in last.items()}
            try:
                c.commit(offs)
                _emit({"ev": "commit", "offsets": {str(p): o + 1 for p, o in last.items()}})
            except Exception as e:  # noqa: BLE001
                _emit({"ev": "commit_error", "err": repr(e)})
    c.close()
    _emit({"ev": "closed"})


def worker_main(cfg: dict) -> None:
    flags: dict = {}
    threading.Thread(target=_stdin_watcher, args=(flags,), daemon=True).start()
    if cfg.get("client", "confluent") == "confluent":
        _run_confluent(cfg, flags)
    else:
        _run_kafka_python(cfg, flags)


# ---------------------------------------------------------------------------
# parent side
# ---------------------------------------------------------------------------

class Worker:
    """A group consumer in a subprocess; events are collected from its stdout."""

    def __init__(self, name: str, bootstrap: str, group: str, topic: str, client: str = "confluent",
                 instance_id: Optional[str] = None, strategy: Optional[str] = None,
                 session_timeout_ms: int = 6000, extra: Optional[dict] = None, log_dir: Optional[str] = None):
        self.name = name
        self.cfg = {"client": client, "bootstrap": bootstrap, "group": group, "topics": [topic],
                    "instance_id": instance_id, "strategy": strategy, "client_id": name,
                    "session_timeout_ms": session_timeout_ms, "extra": extra or {}}
        self.events: List[dict] = []
        self.lock = threading.Lock()
        self.log_dir = log_dir
        self.proc: Optional[subprocess.Popen] = None
        self._errf = None

    # -- lifecycle ----------------------------------------------------------
    def start(self) -> "Worker":
        errpath = os.path.join(self.log_dir, f"{self.name}.stderr") if self.log_dir else os.devnull
        self._errf = open(errpath, "ab")
        from gregor_harness import _die_with_parent
        self.proc = subprocess.Popen([sys.executable, os.path.join(HERE, "groups_tools.py"), "worker",
                                      json.dumps(self.cfg)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._errf,
                                     cwd=HERE, preexec_fn=_die_with_parent)
        self.started_at = time.time()
        threading.Thread(target=self._reader, args=(self.proc,), daemon=True).start()
        return self

    def _reader(self, proc) -> None:
        for line in proc.stdout:
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            with self.lock:
                self.events.append(ev)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def close(self, timeout: float = 60) -> None:
        """Ask the consumer to close (LeaveGroup for dynamic members) and wait for the process."""
        if not self.alive():
            return
        try:
            self.proc.stdin.write(b"close\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"worker {self.name} did not close within {timeout}s\n{self.stderr_tail()}")

    def kill(self) -> float:
        """kill -9; returns the time of the kill."""
        t = time.time()
        if self.alive():
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        return t

    def stderr_tail(self, n: int = 30) -> str:
        if not self.log_dir:
            return ""
        p = os.path.join(self.log_dir, f"{self.name}.stderr")
        try:
            with open(p, errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return ""

    # -- event queries ------------------------------------------------------
    def evs(self, kind: Optional[str] = None) -> List[dict]:
        with self.lock:
            return [e for e in self.events if kind is None or e["ev"] == kind]

    def assignment(self) -> Set[int]:
        """Current assignment from the callbacks: eager assign/revoke carry the full set,
        cooperative ones the increment, so union/difference handles both."""
        cur: Set[int] = set()
        for e in self.evs():
            if e["ev"] == "assign":
                cur |= set(e["parts"])
            elif e["ev"] in ("revoke", "lost"):
                cur -= set(e["parts"])
        return cur

    def member_id(self) -> Optional[str]:
        for e in reversed(self.evs()):
            if e.get("member"):
                return e["member"]
        return None

    def consumed(self) -> List[Tuple[int, int, float]]:
        out = []
        for e in self.evs("recs"):
            out.extend((p, o, e["t"]) for p, o in e["recs"])
        return out

    def committed(self) -> Dict[int, int]:
        """Highest offset this worker committed successfully per partition."""
        best: Dict[int, int] = {}
        for e in self.evs("commit"):
            for p, o in e["offsets"].items():
                best[int(p)] = max(best.get(int(p), -1), o)
        return best

    def errors(self) -> List[dict]:
        return self.evs("error") + self.evs("commit_error")

    def rebalance_events_after(self, t: float) -> List[dict]:
        return [e for e in self.evs() if e["ev"] in ("assign", "revoke", "lost") and e["t"] > t]


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "worker":
        sys.path.insert(0, HERE)
        worker_main(json.loads(sys.argv[2]))
    else:
        print("usage: groups_tools.py worker '<json config>'", file=sys.stderr)
        sys.exit(2)


def offsets_partition(group: str, partitions: int = 50) -> int:
    """The group's __consumer_offsets partition, as Kafka picks it: abs(javaHash(group)) % n."""
    h = 0
    data = group.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + int.from_bytes(data[i:i + 2], "big")) & 0xFFFFFFFF
    if h >= 1 << 31:
        h -= 1 << 32
    return (0 if h == -(1 << 31) else abs(h)) % partitions
