"""Share-consumer helpers for compat/test_share_groups.py.

* `python share_tools.py '<json config>'` runs ONE confluent-kafka `ShareConsumer` in its own
  process, so a test can kill -9 it.  It reports each record it receives as a JSON line on
  stdout ({"ev": "rec", "o": offset, "v": value, "dc": delivery count}) and polls until stdin
  says "close" (close the consumer, then exit).  With "hold": true it takes one non-empty poll
  in explicit mode, acknowledges nothing and keeps polling nothing more: it holds its records'
  acquisition locks until it is killed.

* `ShareWorker` (parent side) spawns that process and collects its events.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from typing import List

HERE = os.path.dirname(os.path.abspath(__file__))


def _emit(ev: dict) -> None:
    ev["t"] = time.time()
    sys.stdout.write(json.dumps(ev) + "\n")
    sys.stdout.flush()


def _child(cfg: dict) -> None:
    from confluent_kafka import ShareConsumer

    flags: dict = {}

    def watch_stdin():
        for line in sys.stdin:
            if line.strip():
                flags[line.strip()] = True
        flags["close"] = True

    threading.Thread(target=watch_stdin, daemon=True).start()
    conf = {"bootstrap.servers": cfg["bootstrap"], "group.id": cfg["group"], "log_level": 3,
            "max.poll.records": cfg.get("max_records", 500)}
    if cfg.get("hold"):
        conf["share.acknowledgement.mode"] = "explicit"
    c = ShareConsumer(conf)
    c.subscribe([cfg["topic"]])
    _emit({"ev": "started"})
    delay = cfg.get("delay", 0.0)
    while not flags.get("close"):
        msgs = c.poll(0.2)
        got = False
        for m in msgs:
            if m.error():
                _emit({"ev": "error", "err": str(m.error())})
                continue
            got = True
            _emit({"ev": "rec", "o": m.offset(), "v": m.value().decode(), "dc": m.delivery_count()})
        if got and cfg.get("hold"):
            _emit({"ev": "holding"})
            while not flags.get("close"):
                time.sleep(0.1)
            return
        if got and delay:
            time.sleep(delay)
    c.close()
    _emit({"ev": "closed"})


class ShareWorker:
    def __init__(self, name: str, bootstrap: str, group: str, topic: str, **opts):
        self.name = name
        cfg = dict(bootstrap=bootstrap, group=group, topic=topic, **opts)
        self.proc = subprocess.Popen([sys.executable, os.path.join(HERE, "share_tools.py"), json.dumps(cfg)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)
        self.events: List[dict] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            with self._lock:
                self.events.append(ev)

    def evs(self, kind: str) -> List[dict]:
        with self._lock:
            return [e for e in self.events if e["ev"] == kind]

    def records(self) -> List[dict]:
        return self.evs("rec")

    def close(self, timeout: float = 30) -> None:
        if self.proc.poll() is None and self.proc.stdin:
            try:
                self.proc.stdin.write("close\n")
                self.proc.stdin.flush()
            except BrokenPipeError:
                pass
            self.proc.wait(timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stderr_tail(self) -> str:
        if self.proc.poll() is None or self.proc.stderr is None:
            return ""
        return self.proc.stderr.read()[-3000:]


if __name__ == "__main__":
    _child(json.loads(sys.argv[1]))
