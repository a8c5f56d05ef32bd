"""Multi-broker (ZooKeeper mode) helpers for compat/test_cluster.py.

A `Cluster` is N gregor processes (ids 1..N) sharing one real ZooKeeper under
their own chroot, plus a kazoo client bound to that chroot for reading and
writing znodes the way Kafka tools do.  Brokers are `gregor_harness.Broker`
objects (free ports, temp dirs, PR_SET_PDEATHSIG), so everything dies with
pytest.

Nothing here sleeps-and-hopes: every wait is `wait_until(...)` on a condition
read from ZooKeeper or from a Metadata response.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import uuid
from typing import Dict, Iterable, List, Optional

from gregor_harness import (FATAL_LOG_PATTERNS, Broker, ZooKeeper, _crash_exit, free_port, gregor_bin,
                            wait_until)

try:  # kazoo is only needed by the cluster suite
    from kazoo.client import KazooClient
    from kazoo.exceptions import NoNodeError
except ImportError:  # pragma: no cover - reported by the fixture as a skip/failure
    KazooClient = None  # type: ignore[assignment]
    NoNodeError = Exception  # type: ignore[assignment,misc]

DEFAULT_SESSION_TIMEOUT_MS = 6000


def predicted_assignment(brokers: Iterable[int], partitions: int, rf: int) -> Dict[int, List[int]]:
    """The seed's rule: sorted live brokers; partition i on broker (i mod n), replica j on
    ((i + j) mod n)."""
    b = sorted(brokers)
    n = len(b)
    return {p: [b[(p + j) % n] for j in range(rf)] for p in range(partitions)}


def new_chroot(prefix: str = "gregor-cluster") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


class Cluster:
    """N gregor brokers in ZooKeeper mode under `/<chroot>` of `zk`."""

    def __init__(self, zk: ZooKeeper, n: int = 3, chroot: Optional[str] = None,
                 session_timeout_ms: int = DEFAULT_SESSION_TIMEOUT_MS,
                 overrides: Optional[Dict[str, str]] = None, on_new_broker=None, broker_overrides=None):
        if KazooClient is None:
            raise RuntimeError("the cluster suite needs kazoo: .venv/bin/pip install kazoo")
        self.zk = zk
        self.n = n
        self.chroot = chroot or new_chroot()
        self.session_timeout_ms = session_timeout_ms
        self.extra_overrides = dict(overrides or {})
        self.on_new_broker = on_new_broker
        # broker_overrides(broker_id, port) -> {key: value}: settings of one broker (its own
        # listeners, credentials); the broker then keeps `port` for its PLAINTEXT listener.
        self.broker_overrides = broker_overrides
        self.brokers: Dict[int, Broker] = {}
        self.extra: List[Broker] = []
        root = KazooClient(hosts=zk.connect, timeout=10.0)
        root.start(timeout=30)
        try:
            root.ensure_path(f"/{self.chroot}")
        finally:
            root.stop()
            root.close()
        self.kz = KazooClient(hosts=f"{zk.connect}/{self.chroot}", timeout=10.0)
        self.kz.start(timeout=30)

    # -- config -------------------------------------------------------------
    @property
    def zookeeper_connect(self) -> str:
        return f"{self.zk.connect}/{self.chroot}"

    def overrides(self) -> Dict[str, str]:
        o = {
            "zookeeper.connect": self.zookeeper_connect,
            "zookeeper.session.timeout.ms": str(self.session_timeout_ms),
            # Kafka's default (1 s) would slow every failover and restart these tests make;
            # 200 ms was gregor's fixed pause before the key existed.
            "replica.fetch.backoff.ms": "200",
        }
        o.update(self.extra_overrides)
        return o

    def new_broker(self, broker_id: int) -> Broker:
        if self.broker_overrides is not None:
            port = free_port()
            b = Broker(broker_id=broker_id, port=port,
                       overrides={**self.overrides(), **self.broker_overrides(broker_id, port)})
        else:
            b = Broker(broker_id=broker_id, overrides=self.overrides())
        if self.on_new_broker:
            self.on_new_broker(b)
        return b

    # -- lifecycle ----------------------------------------------------------
    def start(self) -> "Cluster":
        for i in range(1, self.n + 1):
            self.brokers[i] = self.new_broker(i)
        # Sequential on purpose: gregor_harness sets PR_SET_PDEATHSIG, which fires when the
        # *thread* that forked the child exits, so brokers must be spawned by the main thread.
        for b in self.brokers.values():
            b.start()
        self.wait_registered(self.live_ids())
        self.wait_controller()
        self.wait_metadata_converged()
        return self

    def wait_metadata_converged(self, timeout: Optional[float] = None) -> None:
        """Every live broker's Metadata lists every live broker (each broker learns of the others
        through a ZooKeeper watch, so a request right after start can see fewer)."""
        want = self.live_ids()

        def ok():
            for i in want:
                try:
                    if sorted(self.metadata(i, timeout=5).brokers) != want:
                        return False
                except Exception:  # noqa: BLE001
                    return False
            return True

        wait_until(ok, timeout or self.failover_timeout, f"every broker's Metadata to list {want}", interval=0.2)

    def live_ids(self) -> List[int]:
        return sorted(i for i, b in self.brokers.items() if b.alive())

    def live(self) -> List[Broker]:
        return [self.brokers[i] for i in self.live_ids()]

    def bootstrap(self, ids: Optional[Iterable[int]] = None) -> str:
        ids = self.live_ids() if ids is None else ids
        return ",".join(self.brokers[i].bootstrap for i in ids)

    def stop(self) -> None:
        for b in list(self.brokers.values()) + self.extra:
            try:
                b.stop(timeout=15)
            except Exception:  # noqa: BLE001
                pass
        try:
            self.kz.stop()
            self.kz.close()
        except Exception:  # noqa: BLE001
            pass

    def cleanup(self, keep: bool = False) -> None:
        # the process guard (gregor_fixtures) judges each broker as it was before this stop
        for b in list(self.brokers.values()) + self.extra:
            b.snapshot_health()
        self.stop()
        for b in list(self.brokers.values()) + self.extra:
            b.cleanup(keep=keep)

    # -- ZooKeeper reads ----------------------------------------------------
    def get_json(self, path: str):
        data, _ = self.kz.get(path)
        return json.loads(data.decode())

    def get_text(self, path: str) -> str:
        data, _ = self.kz.get(path)
        return data.decode()

    def exists(self, path: str) -> bool:
        return self.kz.exists(path) is not None

    def registered_ids(self) -> List[int]:
        try:
            return sorted(int(c) for c in self.kz.get_children("/brokers/ids"))
        except NoNodeError:
            return []

    def controller(self) -> Optional[int]:
        try:
            return int(self.get_json("/controller")["brokerid"])
        except NoNodeError:
            return None

    def controller_epoch(self) -> int:
        return int(self.get_text("/controller_epoch").strip())

    def topic_znode(self, topic: str) -> dict:
        return self.get_json(f"/brokers/topics/{topic}")

    def zk_assignment(self, topic: str) -> Dict[int, List[int]]:
        return {int(p): r for p, r in self.topic_znode(topic)["partitions"].items()}

    def partition_state(self, topic: str, p: int) -> dict:
        return self.get_json(f"/brokers/topics/{topic}/partitions/{p}/state")

    def partition_states(self, topic: str) -> Dict[int, dict]:
        return {p: self.partition_state(topic, p) for p in self.zk_assignment(topic)}

    # -- waits --------------------------------------------------------------
    @property
    def failover_timeout(self) -> float:
        """Session timeout + a generous margin for re-election and convergence."""
        return self.session_timeout_ms / 1000.0 + 30.0

    def wait_registered(self, ids: Iterable[int], timeout: Optional[float] = None) -> None:
        want = sorted(ids)
        wait_until(lambda: self.registered_ids() == want, timeout or self.failover_timeout,
                   f"/brokers/ids == {want} (now {self.registered_ids()})", interval=0.1)

    def wait_controller(self, among: Optional[Iterable[int]] = None, timeout: Optional[float] = None) -> int:
        among = set(self.live_ids() if among is None else among)

        def ok():
            c = self.controller()
            return c if c in among else None

        return wait_until(ok, timeout or self.failover_timeout,
                          f"/controller to name one of {sorted(among)}", interval=0.1)

    def wait_topic_online(self, topic: str, partitions: int, timeout: float = 30.0) -> Dict[int, dict]:
        """Every partition has a state znode with a live leader."""
        live = set(self.live_ids())

        def ok():
            a = self.zk_assignment(topic)
            if len(a) != partitions:
                return None
            st = self.partition_states(topic)
            if all(s["leader"] in live for s in st.values()):
                return st
            return None

        return wait_until(ok, timeout, f"all {partitions} partitions of {topic} to have a live leader",
                          interval=0.1)

    # -- Metadata via real clients -----------------------------------------
    def admin(self, broker_id: int):
        """A fresh confluent AdminClient bootstrapped at exactly one broker."""
        from confluent_kafka.admin import AdminClient
        # log_level 2: no "Connect ... failed" noise from clients still alive when brokers stop
        return AdminClient({"bootstrap.servers": self.brokers[broker_id].bootstrap, "log_level": 2})

    def metadata(self, broker_id: int, topic: Optional[str] = None, timeout: float = 10.0):
        """confluent list_topics from a fresh client bootstrapped at one broker, so the answer
        comes from that broker (the only one the client knows)."""
        return self.admin(broker_id).list_topics(topic=topic, timeout=timeout)


def kcat_list(bootstrap: str, topic: Optional[str] = None, timeout: float = 20.0) -> dict:
    """`kcat -L -J` parsed.  kcat asks the bootstrap broker first."""
    cmd = ["kcat", "-b", bootstrap, "-L", "-J", "-m", "10"]
    if topic:
        cmd += ["-t", topic]
    out = subprocess.run(cmd, capture_output=True, timeout=timeout, check=True)
    return json.loads(out.stdout.decode())


def run_broker_expect_failure(broker_id: int, zk_connect: str, session_timeout_ms: int,
                              workdir: str, timeout: float) -> subprocess.CompletedProcess:
    """Run gregor in the foreground and wait for it to exit on its own."""
    port = free_port()
    data = os.path.join(workdir, "data")
    os.makedirs(data, exist_ok=True)
    cmd = [str(gregor_bin()),
           "--override", f"broker.id={broker_id}",
           "--override", f"listeners=PLAINTEXT://127.0.0.1:{port}",
           "--override", f"log.dirs={data}",
           "--override", f"zookeeper.connect={zk_connect}",
           "--override", f"zookeeper.session.timeout.ms={session_timeout_ms}"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("KAFKA_")}
    env["NO_COLOR"] = "1"
    r = subprocess.run(cmd, capture_output=True, timeout=timeout, env=env, cwd=workdir,
                       stdin=subprocess.DEVNULL)
    out = (r.stdout + r.stderr).decode(errors="replace")
    bad = [line for line in out.splitlines() if any(p in line for p in FATAL_LOG_PATTERNS)]
    # an expected failure must be a clean exit with a message, not a crash
    assert not bad and not _crash_exit(r.returncode), (
        f"gregor broker.id={broker_id} on 127.0.0.1:{port} (dir {workdir}) crashed instead of exiting "
        f"cleanly (exit code {r.returncode}):\n" + "\n".join(bad[:5]) + "\n--- output tail ---\n"
        + "\n".join(out.splitlines()[-40:]))
    return r


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def strip_ansi(s: str) -> str:
    return _ANSI.sub("", s)
