"""Network-fault schedules against a 3-broker gregor cluster and a real ZooKeeper, each in its
own network namespace.

Layout (all created here, all removed at the end, even on failure):

    root ns (test process: clients, checker, kazoo)
      gf<pid>h 10.231.X.1 ──veth── hub ns: bridge br0 ──veth── <tag>-zk  eth0 10.231.X.2
                                                      ├─veth── <tag>-b1  eth0 10.231.X.11
                                                      ├─veth── <tag>-b2  eth0 10.231.X.12
                                                      └─veth── <tag>-b3  eth0 10.231.X.13

The bridge lives in its own namespace so that the root namespace's firewall (Docker's FORWARD
policy, br_netfilter) never sees the cluster's traffic, and the root namespace only gains one
route, to a /24 nothing else uses.  Faults are iptables DROP rules and tbf qdiscs inside the
node namespaces, so healing is "flush the namespace's rules".

A seed fixes a schedule (random.Random(seed)): which faults, on whom, for how long, and the
transactional producer's commit/abort pattern.  `python compat/netfault.py campaign ...` (via
scripts/fault-campaign) and compat/test_network_faults.py both call `run_schedule`.
"""
from __future__ import annotations

import atexit
import json
import os
import random
import re
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Dict, List, Optional, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from gregor_harness import (FATAL_LOG_PATTERNS, ZK_SERVER_SH, _die_with_parent, api_versions_probe,  # noqa: E402
                            gregor_bin, scan_log, wait_until, zk_four_letter)

SESSION_MS = 6000
BROKERS = (1, 2, 3)
# Topic names carry the seed: a client of an earlier schedule that outlived it (the addresses are
# reused) can then at worst auto-create a topic nobody uses, never this schedule's.
DATA_PARTS, TXN_PARTS = 6, 3
CHROOT = "/gregor-netfault"
KAFKA_PORT, ZK_PORT = 9092, 2181
# The liveness bounds, measured from the last heal.
SESSION_BOUND = SESSION_MS / 1000 + 5
PRODUCER_BOUND = 10.0
ISR_BOUND = 30.0
# How long a liveness measurement keeps going past its bound, so a failure still has a number.
MEASURE_CAP = 90.0
NS_RE = re.compile(r"^gf(\d+)-(hub|zk|b\d+)$")
WORK_ROOT = Path(os.environ.get("GREGOR_FAULT_DIR", "/tmp/gregor-fault"))

FAULT_KINDS = ("cut-from-cluster", "isolate", "zk-cut", "pair-cut", "sigstop", "kill9", "lossy")


class SetupError(RuntimeError):
    """The machine cannot run the suite (not root, no `ip`, ...)."""


def run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(list(args), capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({r.returncode}): {r.stderr.strip()}")
    return r


def can_run() -> Optional[str]:
    """None if this machine can build the namespaces, else why not."""
    if os.geteuid() != 0:
        return "the network-fault suite needs root (network namespaces, iptables, tc)"
    for tool in ("ip", "iptables", "tc"):
        if shutil.which(tool) is None:
            return f"the network-fault suite needs `{tool}` on PATH"
    if not Path(ZK_SERVER_SH).exists():
        return f"the network-fault suite needs Debian's zookeeper ({ZK_SERVER_SH})"
    if not gregor_bin().exists():
        return f"broker binary {gregor_bin()} does not exist"
    return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _kill_ns_pids(ns: str) -> None:
    # Every process in one of our namespaces was started by this suite (a JVM orphaned by a
    # killed zkServer.sh included), so ending them all is ending only our own.
    # Listed again until empty: a killed child of ours stays a zombie until reaped, and a zombie
    # is no longer in the namespace while os.kill(pid, 0) would still find it.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        pids = [int(p) for p in run("ip", "netns", "pids", ns, check=False).stdout.split()]
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)


def remove_stale_namespaces() -> List[str]:
    """Namespaces of earlier runs of this suite whose process is gone (a crash or SIGKILL skipped
    their cleanup).  A namespace of a run still going is left alone."""
    removed = []
    for line in run("ip", "netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        m = NS_RE.match(name)
        if m and not _pid_alive(int(m.group(1))):
            _kill_ns_pids(name)
            run("ip", "netns", "del", name, check=False)
            removed.append(name)
    return removed


def _pick_subnet() -> str:
    used = run("ip", "-4", "route", "show", "table", "all").stdout + run("ip", "-4", "addr").stdout
    start = 20 + os.getpid() % 200
    for i in range(235):
        x = (start + i) % 235 + 20
        prefix = f"10.231.{x}."
        if prefix not in used:
            return prefix
    raise SetupError("no free 10.231.X.0/24 subnet")


def reachable(addr: str, timeout: float = 1.0) -> bool:
    """A connection refused (nothing listens on port 1) proves the path works both ways."""
    import socket
    try:
        socket.create_connection((addr, 1), timeout=timeout).close()
        return True
    except ConnectionRefusedError:
        return True
    except OSError:
        return False


class Net:
    """The hub, the nodes' namespaces, and the faults applied to them."""

    def __init__(self, nodes=("zk", "b1", "b2", "b3")):
        self.tag = f"gf{os.getpid()}"
        self.prefix = _pick_subnet()
        self.host_ip = self.prefix + "1"
        self.hub = f"{self.tag}-hub"
        self.host_if = f"{self.tag}h"
        self.addr = {"zk": self.prefix + "2"}
        for n in nodes:
            if n.startswith("b"):
                self.addr[n] = self.prefix + str(10 + int(n[1:]))
        self.created: List[str] = []
        self.up_done = False

    def ns(self, node: str) -> str:
        return f"{self.tag}-{node}"

    def up(self) -> "Net":
        remove_stale_namespaces()
        run("ip", "netns", "add", self.hub)
        self.created.append(self.hub)
        run("ip", "-n", self.hub, "link", "set", "lo", "up")
        run("ip", "-n", self.hub, "link", "add", "br0", "type", "bridge")
        run("ip", "-n", self.hub, "link", "set", "br0", "up")
        run("ip", "link", "add", self.host_if, "type", "veth", "peer", "name", "vroot", "netns", self.hub)
        run("ip", "-n", self.hub, "link", "set", "vroot", "master", "br0", "up")
        run("ip", "addr", "add", f"{self.host_ip}/24", "dev", self.host_if)
        run("ip", "link", "set", self.host_if, "up")
        for node, a in self.addr.items():
            ns = self.ns(node)
            run("ip", "netns", "add", ns)
            self.created.append(ns)
            run("ip", "-n", ns, "link", "set", "lo", "up")
            run("ip", "-n", self.hub, "link", "add", f"v{node}", "type", "veth", "peer", "name", "eth0", "netns", ns)
            run("ip", "-n", self.hub, "link", "set", f"v{node}", "master", "br0", "up")
            run("ip", "-n", ns, "addr", "add", f"{a}/24", "dev", "eth0")
            run("ip", "-n", ns, "link", "set", "eth0", "up")
        self.up_done = True
        for node, a in self.addr.items():
            wait_until(lambda a=a: reachable(a), 20, f"{a} ({node}) reachable from the root namespace", interval=0.1)
        return self

    def down(self) -> None:
        for ns in reversed(self.created):
            _kill_ns_pids(ns)
        for ns in reversed(self.created):
            run("ip", "netns", "del", ns, check=False)
        # deleting the hub deletes the veth's root end; this is for a half-built hub
        run("ip", "link", "del", self.host_if, check=False)
        self.created = []

    # -- faults ---------------------------------------------------------------
    def ipt(self, node: str, *rule: str) -> None:
        run("ip", "netns", "exec", self.ns(node), "iptables", "-w", *rule)

    def drop_between(self, node: str, peers: List[str]) -> None:
        for p in peers:
            a = self.addr[p]
            self.ipt(node, "-I", "INPUT", "-s", a, "-j", "DROP")
            self.ipt(node, "-I", "OUTPUT", "-d", a, "-j", "DROP")

    def drop_all(self, node: str) -> None:
        self.ipt(node, "-I", "INPUT", "-i", "eth0", "-j", "DROP")
        self.ipt(node, "-I", "OUTPUT", "-o", "eth0", "-j", "DROP")

    def lossy(self, node: str, loss: float = 0.2, rate: str = "256kbit") -> None:
        self.ipt(node, "-I", "INPUT", "-i", "eth0", "-m", "statistic", "--mode", "random",
                 "--probability", str(loss), "-j", "DROP")
        self.ipt(node, "-I", "OUTPUT", "-o", "eth0", "-m", "statistic", "--mode", "random",
                 "--probability", str(loss), "-j", "DROP")
        tbf = ["root", "tbf", "rate", rate, "burst", "32kbit", "latency", "400ms"]
        # both ends of the node's veth: its egress, and the hub's egress towards it
        run("ip", "netns", "exec", self.ns(node), "tc", "qdisc", "add", "dev", "eth0", *tbf)
        run("ip", "netns", "exec", self.hub, "tc", "qdisc", "add", "dev", f"v{node}", *tbf)

    def heal(self) -> None:
        for node in self.addr:
            ns = self.ns(node)
            run("ip", "netns", "exec", ns, "iptables", "-w", "-F", "INPUT", check=False)
            run("ip", "netns", "exec", ns, "iptables", "-w", "-F", "OUTPUT", check=False)
            run("ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", "eth0", "root", check=False)
            run("ip", "netns", "exec", self.hub, "tc", "qdisc", "del", "dev", f"v{node}", "root", check=False)


# ---------------------------------------------------------------------------
# processes
# ---------------------------------------------------------------------------

class NsZooKeeper:
    def __init__(self, net: Net, base: Path):
        self.net, self.base = net, base
        self.host = net.addr["zk"]
        self.proc: Optional[subprocess.Popen] = None

    @property
    def connect(self) -> str:
        return f"{self.host}:{ZK_PORT}"

    def start(self) -> None:
        data = self.base / "zk-data"
        data.mkdir(parents=True, exist_ok=True)
        cfg = self.base / "zoo.cfg"
        cfg.write_text("tickTime=2000\ninitLimit=10\nsyncLimit=5\n"
                       f"dataDir={data}\nclientPort={ZK_PORT}\nclientPortAddress={self.host}\n"
                       "maxClientCnxns=0\nadmin.enableServer=false\n"
                       "4lw.commands.whitelist=ruok,srvr,stat\nstandaloneEnabled=true\n")
        env = dict(os.environ, ZOO_LOG_DIR=str(self.base), ZOO_LOG4J_PROP="INFO,CONSOLE",
                   JVMFLAGS="-Xmx256m -Dzookeeper.admin.enableServer=false")
        self.log = open(self.base / "zookeeper.out", "ab")
        self.proc = subprocess.Popen(["ip", "netns", "exec", self.net.ns("zk"), "bash", ZK_SERVER_SH,
                                      "start-foreground", str(cfg)], stdin=subprocess.DEVNULL, stdout=self.log,
                                     stderr=subprocess.STDOUT, cwd=str(self.base), env=env,
                                     preexec_fn=_die_with_parent)

        def ready():
            if self.proc.poll() is not None:
                raise RuntimeError(f"zookeeper exited with {self.proc.returncode}")
            return b"Mode:" in zk_four_letter(self.host, ZK_PORT, b"srvr")
        wait_until(ready, 60, f"zookeeper on {self.connect}", interval=0.1)

    def stop(self) -> None:
        _kill_ns_pids(self.net.ns("zk"))
        if self.proc is not None:
            self.proc.wait()
            self.log.close()


class NsBroker:
    def __init__(self, net: Net, base: Path, broker_id: int, zk_connect: str):
        self.net, self.id = net, broker_id
        self.node = f"b{broker_id}"
        self.host = net.addr[self.node]
        self.base = base / self.node
        self.data = self.base / "data"
        self.data.mkdir(parents=True, exist_ok=True)
        self.zk_connect = zk_connect
        self.proc: Optional[subprocess.Popen] = None
        self.starts = 0
        self.stopped = False  # SIGSTOPped

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{KAFKA_PORT}"

    def log_path(self, start: Optional[int] = None) -> Path:
        return self.base / f"broker.{start or self.starts}.log"

    def start(self, timeout: float = 60) -> None:
        self.starts += 1
        cfg = {
            "broker.id": str(self.id),
            "listeners": f"PLAINTEXT://{self.bootstrap}",
            "advertised.listeners": f"PLAINTEXT://{self.bootstrap}",
            "log.dirs": str(self.data),
            "zookeeper.connect": self.zk_connect,
            "zookeeper.session.timeout.ms": str(SESSION_MS),
            # As in the cluster harness: the follower's retry pause gregor used before the key.
            "replica.fetch.backoff.ms": "200",
            # Kafka's default (30 s) equals librdkafka's request.timeout.ms: an acks=all produce
            # waiting on a stalled follower then times out just before the ISR drops it, the
            # next batch succeeds, and librdkafka counts the timed-out one as delivered without
            # an offset (an "implicit ack"; Kafka's brokers race the same way). With the ISR
            # decided well inside the client's timeout, every acknowledgement carries its offset.
            "replica.lag.time.max.ms": "10000",
            # After a cut heals, a fetch answer lost in it is retransmitted by TCP only at its
            # next, exponentially backed-off attempt (12.8 s after a 14 s cut, seed 90 at
            # e1230fd): a follower asks again on a new connection sooner than Kafka's 30 s.
            "replica.socket.timeout.ms": "3000",
        }
        cmd = ["ip", "netns", "exec", self.net.ns(self.node), str(gregor_bin())]
        for k, v in cfg.items():
            cmd += ["--override", f"{k}={v}"]
        env = {k: v for k, v in os.environ.items() if not k.startswith("KAFKA_")}
        env.update(NO_COLOR="1", RUST_BACKTRACE="1")
        with open(self.log_path(), "wb") as logf:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
                                         cwd=str(self.base), env=env, preexec_fn=_die_with_parent)

        def ready():
            if self.proc.poll() is not None:
                raise RuntimeError(f"broker {self.id} exited with {self.proc.returncode}:\n{self.tail(30)}")
            api_versions_probe(self.host, KAFKA_PORT)
            return True
        wait_until(ready, timeout, f"broker {self.id} on {self.bootstrap}", interval=0.05)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill9(self) -> None:
        if self.alive():
            self.proc.kill()
        self.proc.wait()

    def sigstop(self) -> None:
        os.kill(self.proc.pid, signal.SIGSTOP)
        self.stopped = True

    def sigcont(self) -> None:
        if self.alive():
            os.kill(self.proc.pid, signal.SIGCONT)
        self.stopped = False

    def stop(self) -> None:
        if not self.alive():
            return
        os.kill(self.proc.pid, signal.SIGCONT)
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def tail(self, n: int = 40) -> str:
        p = self.log_path()
        return "\n".join(p.read_text(errors="replace").splitlines()[-n:]) if p.exists() else ""

    def grep(self, pattern: str, limit: int = 8) -> List[str]:
        rx = re.compile(pattern)
        out = []
        for s in range(1, self.starts + 1):
            p = self.log_path(s)
            if p.exists():
                for line in p.read_text(errors="replace").splitlines():
                    if rx.search(line):
                        out.append(f"b{self.id}#{s}: {line.strip()[:400]}")
        return out[-limit:]


# ---------------------------------------------------------------------------
# schedule
# ---------------------------------------------------------------------------

def make_schedule(seed: int, n_faults: Tuple[int, int] = (3, 5), hold: Tuple[float, float] = (10, 25)) -> dict:
    rng = random.Random(seed)
    faults = []
    for _ in range(rng.randint(*n_faults)):
        kind = rng.choice(FAULT_KINDS)
        if kind == "zk-cut":
            targets = []
        elif kind == "pair-cut":
            targets = sorted(rng.sample(BROKERS, 2))
        else:
            targets = [rng.choice(BROKERS)]
        faults.append({"kind": kind, "targets": targets, "hold": round(rng.uniform(*hold), 1),
                       "gap": round(rng.uniform(2, 6), 1)})
    return {"seed": seed, "faults": faults, "txn_seed": rng.randrange(1 << 30)}


def describe_fault(f: dict) -> str:
    t = ",".join(f"b{i}" for i in f["targets"])
    return f"{f['kind']}({t})" if t else f["kind"]


# ---------------------------------------------------------------------------
# workload
# ---------------------------------------------------------------------------

def _debug_to_file(conf: dict, path: Path, contexts: str) -> dict:
    """librdkafka debug output for `contexts` into `path` (not stderr): what explains a client's
    decisions (retries, implicit acks, epoch bumps, transaction state) after the fact."""
    import logging
    lg = logging.getLogger(f"netfault.{path}")
    lg.propagate = False
    if not lg.handlers:
        h = logging.FileHandler(path)
        h.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
        lg.addHandler(h)
    lg.setLevel(logging.DEBUG)
    return dict(conf, debug=contexts, log_level=7, logger=lg)


def _quiet(conf: dict) -> dict:
    # librdkafka would otherwise print every refused connection during a fault; and no client of
    # the suite may create a topic by asking for its metadata (a stray one would skew the checks)
    return dict(conf, log_level=0, error_cb=lambda e: None, **{"allow.auto.create.topics": False})


class IdemProducer(threading.Thread):
    """acks=all, idempotent; value = "<name>-<n>", each value produced once.  A producer that
    hits a fatal error is replaced (its outstanding messages fail, nothing is re-sent)."""

    def __init__(self, bootstrap: str, topic: str, name: str, logdir: Optional[Path] = None):
        super().__init__(daemon=True, name=name)
        self.bootstrap, self.topic, self.pname = bootstrap, topic, name
        self.logfile = (logdir / f"{name}.rdkafka.log") if logdir else None
        self.halt = threading.Event()
        self.lock = threading.Lock()
        self.acks: Dict[str, Tuple[int, int]] = {}
        self.no_offset: List[Tuple[str, int, int]] = []
        self.double: List[str] = []
        self.failed = 0
        self.fatal_errors: List[str] = []
        self.replaced = 0
        self.sent = 0
        self.exc: Optional[BaseException] = None
        self._fatal = threading.Event()

    def _cb(self, err, msg):
        v = msg.value().decode()
        with self.lock:
            if err is not None:
                self.failed += 1
            elif msg.offset() is None or msg.offset() < 0:
                self.no_offset.append((v, msg.partition(), f"{msg.offset()} at {time.strftime('%H:%M:%S')}"))
            elif v in self.acks:
                self.double.append(v)
            else:
                self.acks[v] = (msg.partition(), msg.offset())

    def _err(self, e):
        if e.fatal():
            with self.lock:
                self.fatal_errors.append(f"{e.name()}: {e.str()}")
            self._fatal.set()

    def _new(self):
        from confluent_kafka import Producer
        conf = dict(_quiet({"bootstrap.servers": self.bootstrap, "acks": "all", "enable.idempotence": True,
                            "linger.ms": 5, "message.timeout.ms": 60000}), error_cb=self._err)
        if self.logfile is not None:
            # an acknowledgement without an offset is explained by librdkafka's idempotence log
            conf = _debug_to_file(conf, self.logfile, "eos,msg")
        return Producer(conf)

    def run(self):
        try:
            p = self._new()
            n = 0
            while not self.halt.is_set():
                if self._fatal.is_set():
                    p.purge()
                    p.flush(5)
                    self._fatal.clear()
                    self.replaced += 1
                    p = self._new()
                for _ in range(2):
                    try:
                        p.produce(self.topic, key=f"k{n % 50}".encode(), value=f"{self.pname}-{n}".encode(),
                                  on_delivery=self._cb)
                        n += 1
                        self.sent = n
                    except BufferError:
                        p.poll(0.1)
                p.poll(0)
                time.sleep(0.02)
            p.flush(60)
        except BaseException as e:  # noqa: BLE001
            self.exc = e


class TxnProducer(threading.Thread):
    """Transactions of 1-5 records over the txn topic's partitions; commits or aborts as the
    schedule's txn_seed says.  outcome: committed / aborted (the call returned OK) or unknown
    (a fatal error mid-way: the transaction may have gone either way, but must be all-or-nothing)."""

    def __init__(self, bootstrap: str, topic: str, txn_seed: int, tid: str, logdir: Optional[Path] = None):
        super().__init__(daemon=True, name="txn-producer")
        self.bootstrap, self.topic, self.tid = bootstrap, topic, tid
        self.logfile = (logdir / "txn.rdkafka.log") if logdir else None
        self.rng = random.Random(txn_seed)
        self.halt = threading.Event()
        self.txns: List[dict] = []
        self.notes: List[str] = []
        self.no_offset: List[Tuple[str, int, int]] = []
        self.exc: Optional[BaseException] = None

    def _cb(self, err, msg):
        if err is None and (msg.offset() is None or msg.offset() < 0):
            self.no_offset.append((msg.value().decode(), msg.partition(), msg.offset()))

    def _new(self):
        from confluent_kafka import Producer
        conf = _quiet({"bootstrap.servers": self.bootstrap, "transactional.id": self.tid,
                       "transaction.timeout.ms": 30000, "message.timeout.ms": 30000, "linger.ms": 5})
        if self.logfile is not None:
            conf = _debug_to_file(conf, self.logfile, "eos")
        p = Producer(conf)
        self._retry(lambda: p.init_transactions(10), deadline=time.monotonic() + 120)
        return p

    def _retry(self, op, deadline: float):
        """Run op until it succeeds; retriable errors are retried until deadline."""
        from confluent_kafka import KafkaException
        while True:
            try:
                return op()
            except KafkaException as e:
                err = e.args[0]
                if not err.retriable() or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def run(self):
        from confluent_kafka import KafkaException
        try:
            p = self._new()
            k = 0
            while not self.halt.is_set():
                k += 1
                n = self.rng.randint(1, 5)
                commit = self.rng.random() < 0.6
                vals = [f"t{k}-{i}/{n}" for i in range(n)]
                t = {"id": k, "values": vals, "intent": "commit" if commit else "abort", "outcome": None}
                self.txns.append(t)
                try:
                    p.begin_transaction()
                    for i, v in enumerate(vals):
                        while True:
                            try:
                                p.produce(self.topic, key=v.encode(), value=v.encode(), partition=(k + i) % TXN_PARTS,
                                          on_delivery=self._cb)
                                break
                            except BufferError:
                                p.poll(0.1)
                    dl = time.monotonic() + 120
                    if commit:
                        self._retry(lambda: p.commit_transaction(10), dl)
                        t["outcome"] = "committed"
                    else:
                        self._retry(lambda: p.abort_transaction(10), dl)
                        t["outcome"] = "aborted"
                except KafkaException as e:
                    err = e.args[0]
                    self.notes.append(f"txn {k}: {err.name()}: {err.str()}")
                    if err.txn_requires_abort():
                        try:
                            self._retry(lambda: p.abort_transaction(10), time.monotonic() + 120)
                            t["outcome"] = "aborted"
                            continue
                        except KafkaException as e2:
                            self.notes.append(f"txn {k}: abort: {e2.args[0].str()}")
                    t["outcome"] = "unknown"
                    p = self._new()
                time.sleep(0.05)
        except BaseException as e:  # noqa: BLE001
            self.exc = e


class GroupReader(threading.Thread):
    """A member of a consumer group that records every record it is given."""

    def __init__(self, bootstrap: str, topic: str, group: str, read_committed: bool):
        super().__init__(daemon=True, name=f"reader-{group}")
        self.bootstrap, self.topic, self.group = bootstrap, topic, group
        self.isolation = "read_committed" if read_committed else "read_uncommitted"
        self.halt = threading.Event()
        self.reads: List[Tuple[int, int, str]] = []
        self.exc: Optional[BaseException] = None

    def run(self):
        from confluent_kafka import Consumer
        try:
            c = Consumer(_quiet({"bootstrap.servers": self.bootstrap, "group.id": self.group,
                                 "auto.offset.reset": "earliest", "isolation.level": self.isolation,
                                 "session.timeout.ms": 10000, "heartbeat.interval.ms": 1000}))
            c.subscribe([self.topic])
            while not self.halt.is_set():
                m = c.poll(0.2)
                if m is not None and m.error() is None:
                    self.reads.append((m.partition(), m.offset(), m.value().decode()))
            c.close()
        except BaseException as e:  # noqa: BLE001
            self.exc = e


def read_back(bootstrap: str, topic: str, parts: int, read_committed: bool,
              timeout: float = 90) -> Tuple[Dict[int, int], Dict[Tuple[int, int], str]]:
    """Every partition from the beginning to its end (high watermark, or last stable offset with
    read_committed), without a group.  Returns ({p: end}, {(p, offset): value})."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
    c = Consumer(_quiet({"bootstrap.servers": bootstrap, "group.id": "nf-readback", "enable.auto.commit": False,
                         "isolation.level": "read_committed" if read_committed else "read_uncommitted"}))
    try:
        ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=20, cached=False)[1]
                for p in range(parts)}
        recs: Dict[Tuple[int, int], str] = {}
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(parts)])

        def done():
            for _ in range(1000):
                m = c.poll(0.1)
                if m is None:
                    break
                if m.error() is None:
                    recs[(m.partition(), m.offset())] = m.value().decode()
            pos = {tp.partition: tp.offset for tp in c.position([TopicPartition(topic, p) for p in range(parts)])}
            return all(ends[p] == 0 or pos[p] >= ends[p] for p in range(parts))
        wait_until(done, timeout, f"{topic} read to its end {ends}", interval=0)
        return ends, {k: v for k, v in recs.items() if k[1] < ends[k[0]]}
    finally:
        c.close()


# ---------------------------------------------------------------------------
# one schedule
# ---------------------------------------------------------------------------

class Schedule:
    def __init__(self, net: Net, plan: dict, base: Path, log=print):
        self.net, self.plan, self.base, self.log = net, plan, base, log
        self.zk: Optional[NsZooKeeper] = None
        self.brokers: Dict[int, NsBroker] = {}
        self.kz = None
        self.violations: List[str] = []
        self.liveness: Dict[str, Optional[float]] = {}
        self.info: Dict[str, object] = {}
        self.killed: List[int] = []
        self.data_topic = f"nf-data-{plan['seed']}"
        self.txn_topic = f"nf-txn-{plan['seed']}"

    @property
    def bootstrap(self) -> str:
        return ",".join(b.bootstrap for b in self.brokers.values())

    # -- setup ----------------------------------------------------------------
    def start(self) -> None:
        from kazoo.client import KazooClient
        self.zk = NsZooKeeper(self.net, self.base)
        self.zk.start()
        root = KazooClient(hosts=self.zk.connect, timeout=10.0)
        root.start(timeout=30)
        root.ensure_path(CHROOT)
        root.stop()
        root.close()
        self.kz = KazooClient(hosts=self.zk.connect + CHROOT, timeout=10.0)
        self.kz.start(timeout=30)
        for i in BROKERS:
            self.brokers[i] = NsBroker(self.net, self.base, i, self.zk.connect + CHROOT)
            self.brokers[i].start()
        wait_until(lambda: self.registered() == list(BROKERS), 60, "all brokers registered", interval=0.1)
        from confluent_kafka.admin import AdminClient, NewTopic

        def all_listed():
            def settled(b):
                md = AdminClient(_quiet({"bootstrap.servers": b.bootstrap})).list_topics(timeout=5)
                return len(md.brokers) == 3 and md.controller_id in BROKERS
            return all(settled(b) for b in self.brokers.values())
        wait_until(all_listed, 60, "every broker's Metadata lists 3 brokers and the controller", interval=0.2)
        # Made only now: librdkafka asks for the controller once, and an admin client whose first
        # Metadata named none (a broker that had not read /controller yet) waits for a broker
        # state change that never comes, until its request times out (seed 64 at 2c19461).
        a = AdminClient(_quiet({"bootstrap.servers": self.bootstrap}))
        fs = a.create_topics([NewTopic(self.data_topic, DATA_PARTS, 3, config={"min.insync.replicas": "2"}),
                              NewTopic(self.txn_topic, TXN_PARTS, 3, config={"min.insync.replicas": "2"})])
        try:
            for f in fs.values():
                f.result(timeout=60)
        except Exception as e:
            # Seen once per ~100 schedules under load (librdkafka: "Failed while waiting for
            # controller"): what each broker's Metadata says of the controller is the first clue.
            seen = {}
            for i, b in self.brokers.items():
                try:
                    seen[i] = AdminClient(_quiet({"bootstrap.servers": b.bootstrap})).list_topics(timeout=5).controller_id
                except Exception as probe:  # noqa: BLE001 - a clue, not the failure
                    seen[i] = repr(probe)
            raise RuntimeError(f"{e!r}; controller per broker's Metadata {seen}; "
                               f"/controller {self.kz.get('/controller')[0]!r}") from e
        wait_until(lambda: self.isr_full(), 60, "every ISR full after topic creation", interval=0.2)

    def registered(self) -> List[int]:
        try:
            return sorted(int(c) for c in self.kz.get_children("/brokers/ids"))
        except Exception:  # noqa: BLE001
            return []

    def partition_states(self) -> Dict[Tuple[str, int], Tuple[List[int], dict]]:
        out = {}
        for t in self.kz.get_children("/brokers/topics"):
            assign = json.loads(self.kz.get(f"/brokers/topics/{t}")[0])["partitions"]
            for p, replicas in assign.items():
                st = json.loads(self.kz.get(f"/brokers/topics/{t}/partitions/{p}/state")[0])
                out[(t, int(p))] = (replicas, st)
        return out

    def isr_full(self) -> bool:
        st = self.partition_states()
        return bool(st) and all(sorted(s["isr"]) == sorted(r) for r, s in st.values())

    # -- faults ---------------------------------------------------------------
    def apply(self, f: dict) -> None:
        kind, tg = f["kind"], f["targets"]
        others = lambda b: ["zk"] + [f"b{i}" for i in BROKERS if i != b]  # noqa: E731
        if kind == "cut-from-cluster":
            self.net.drop_between(f"b{tg[0]}", others(tg[0]))
        elif kind == "isolate":
            self.net.drop_all(f"b{tg[0]}")
        elif kind == "zk-cut":
            self.net.drop_between("zk", [f"b{i}" for i in BROKERS])
        elif kind == "pair-cut":
            self.net.drop_between(f"b{tg[0]}", [f"b{tg[1]}"])
            self.net.drop_between(f"b{tg[1]}", [f"b{tg[0]}"])
        elif kind == "sigstop":
            self.brokers[tg[0]].sigstop()
        elif kind == "kill9":
            self.brokers[tg[0]].kill9()
        elif kind == "lossy":
            self.net.lossy(f"b{tg[0]}")
        else:
            raise ValueError(kind)

    def heal(self, f: dict) -> None:
        self.net.heal()
        if f["kind"] == "sigstop":
            self.brokers[f["targets"][0]].sigcont()
        elif f["kind"] == "kill9":
            self.brokers[f["targets"][0]].start()

    # -- liveness after the last heal --------------------------------------------
    def measure_liveness(self, healed_at: float) -> None:
        probe: Dict[str, Optional[float]] = {"producer_ok": None}
        probe_detail: Dict[str, object] = {}

        def producer_probe():
            from confluent_kafka import Producer
            p = Producer(_quiet({"bootstrap.servers": self.bootstrap, "acks": "all", "enable.idempotence": True,
                                 "message.timeout.ms": 15000, "linger.ms": 0}))
            want = ([(self.data_topic, i) for i in range(DATA_PARTS)]
                    + [(self.txn_topic, i) for i in range(TXN_PARTS)])
            acked: Dict[Tuple[str, int], int] = {}
            inflight = set()
            errors: List[str] = []

            def cb(err, msg):
                tp = (msg.topic(), msg.partition())
                inflight.discard(tp)
                if err is None and msg.offset() is not None and msg.offset() >= 0:
                    acked[tp] = msg.offset()
                elif err is None:
                    self.violations.append(f"missing-offset: liveness probe ack on {tp} with offset {msg.offset()}")
                else:
                    errors.append(f"{tp}: {err.name()}")
            while time.monotonic() - healed_at < MEASURE_CAP:
                for tp in want:
                    if tp not in acked and tp not in inflight:
                        inflight.add(tp)
                        p.produce(tp[0], value=f"probe-{tp[0]}-{tp[1]}".encode(), partition=tp[1], on_delivery=cb)
                p.poll(0.05)
                if len(acked) == len(want):
                    probe["producer_ok"] = time.monotonic() - healed_at
                    break
            probe_detail["missing"] = [tp for tp in want if tp not in acked]
            probe_detail["errors"] = errors[-5:]
            p.flush(5)

        th = threading.Thread(target=producer_probe, daemon=True)
        th.start()
        session = isr = None
        while time.monotonic() - healed_at < MEASURE_CAP and (session is None or isr is None):
            now = time.monotonic() - healed_at
            if session is None and self.registered() == list(BROKERS):
                session = now
            if isr is None:
                try:
                    if self.isr_full():
                        isr = now
                except Exception:  # noqa: BLE001
                    pass
            time.sleep(0.1)
        th.join(MEASURE_CAP + 20)
        self.liveness = {"session_back": session, "producer_ok": probe["producer_ok"], "isr_full": isr}
        self.info["probe"] = probe_detail
        if isr is None:
            try:
                self.info["isr_not_full"] = {f"{t}-{p}": {"replicas": r, "isr": s["isr"], "leader": s["leader"]}
                                             for (t, p), (r, s) in self.partition_states().items()
                                             if sorted(s["isr"]) != sorted(r)}
            except Exception as e:  # noqa: BLE001
                self.info["isr_not_full"] = repr(e)
        self.info["registered_at_end"] = self.registered()

    def liveness_failures(self) -> List[str]:
        out = []
        for key, bound in (("session_back", SESSION_BOUND), ("producer_ok", PRODUCER_BOUND), ("isr_full", ISR_BOUND)):
            v = self.liveness.get(key)
            if v is None or v > bound:
                shown = f">{MEASURE_CAP:.0f}" if v is None else f"{v:.1f}"
                out.append(f"{key}: {shown} s after the last heal (bound {bound:.0f} s)")
        return out

    # -- checks -----------------------------------------------------------------
    def check(self, producers: List[IdemProducer], txn: TxnProducer, data_reader: GroupReader,
              rc_reader: GroupReader) -> None:
        v = self.violations
        _, data_log = read_back(self.bootstrap, self.data_topic, DATA_PARTS, read_committed=False)
        where: Dict[str, List[Tuple[int, int]]] = {}
        for (p, o), val in data_log.items():
            where.setdefault(val, []).append((p, o))
        client_dups = []
        for val, locs in where.items():
            if len(locs) > 1 and not val.startswith("probe"):
                why = self.client_epoch_bump_duplicate(val, sorted(locs), producers)
                if why:
                    client_dups.append(f"{val!r} at {sorted(locs)}: {why}")
                else:
                    v.append(f"duplicated: {val!r} at {sorted(locs)}")
        if client_dups:
            self.info["client_duplicates"] = client_dups
        acks = 0
        for pr in producers:
            for val, p, o in pr.no_offset:
                v.append(f"missing-offset: {pr.pname} ack for {val!r} on partition {p} with offset {o}")
            for val in pr.double:
                v.append(f"duplicated: {val!r} acknowledged twice by {pr.pname}")
            for val, (p, o) in pr.acks.items():
                acks += 1
                got = data_log.get((p, o))
                if got == val:
                    continue
                if val not in where:
                    v.append(f"lost: {val!r} acknowledged at {self.data_topic}-{p}@{o}, not in the log "
                             f"(that offset holds {got!r})")
                else:
                    v.append(f"wrong-offset: {val!r} acknowledged at {self.data_topic}-{p}@{o}, found at "
                             f"{where[val]} (that offset holds {got!r})")
        self.info["acks"] = acks
        for p, o, val in data_reader.reads:
            if data_log.get((p, o)) != val:
                v.append(f"inconsistent-read: group read {val!r} at {self.data_topic}-{p}@{o}; the log holds "
                         f"{data_log.get((p, o))!r}")

        _, txn_all = read_back(self.bootstrap, self.txn_topic, TXN_PARTS, read_committed=False)
        _, txn_rc = read_back(self.bootstrap, self.txn_topic, TXN_PARTS, read_committed=True)
        seen_rc: Dict[str, List[Tuple[int, int]]] = {}
        for (p, o), val in txn_rc.items():
            seen_rc.setdefault(val, []).append((p, o))
            if txn_all.get((p, o)) != val:
                v.append(f"inconsistent-read: read_committed read-back {val!r} at {self.txn_topic}-{p}@{o}, "
                         f"read_uncommitted has {txn_all.get((p, o))!r}")
        for val, p, o in txn.no_offset:
            v.append(f"missing-offset: transactional ack for {val!r} on {self.txn_topic}-{p} with offset {o}")
        outcome = {val: t for t in txn.txns for val in t["values"]}
        counts = {"committed": 0, "aborted": 0, "unknown": 0, None: 0}
        for t in txn.txns:
            counts[t["outcome"]] += 1
            present = [val for val in t["values"] if val in seen_rc]
            if t["outcome"] == "committed" and len(present) != len(t["values"]):
                kind = "missing" if not present else "partial"
                v.append(f"{kind}-committed-txn: txn {t['id']} committed {t['values']}, read_committed read-back "
                         f"has {present}")
            elif t["outcome"] == "aborted" and present:
                v.append(f"aborted-visible: txn {t['id']} aborted, read_committed read-back has {present} "
                         f"at {[seen_rc[x] for x in present]}")
            elif t["outcome"] in ("unknown", None) and present and len(present) != len(t["values"]):
                v.append(f"partial-txn: txn {t['id']} ({t['outcome']}) {t['values']}, read_committed read-back "
                         f"has {present}")
        for val, locs in seen_rc.items():
            if len(locs) > 1:
                v.append(f"duplicated: txn record {val!r} at {locs}")
        for p, o, val in rc_reader.reads:
            t = outcome.get(val)
            if t is not None and t["outcome"] == "aborted":
                v.append(f"aborted-read: read_committed group read {val!r} at {self.txn_topic}-{p}@{o} of aborted "
                         f"txn {t['id']}")
            if txn_all.get((p, o)) != val:
                v.append(f"inconsistent-read: read_committed group read {val!r} at {self.txn_topic}-{p}@{o}; "
                         f"the log holds {txn_all.get((p, o))!r}")
        counts.pop(None)
        self.info["txns"] = counts
        self.check_replicas()
        for b in self.brokers.values():
            if not b.alive():
                v.append(f"crash: broker {b.id} exited on its own (code {b.proc.returncode if b.proc else None}):\n"
                         + b.tail(15))
            for s in range(1, b.starts + 1):
                for hit in scan_log(b.log_path(s), FATAL_LOG_PATTERNS):
                    v.append(f"crash: {hit}")

    def batch_stamps(self, p: int) -> Dict[int, Tuple[int, int, int]]:
        """offset -> (producer id, producer epoch, sequence) of the data topic's partition `p`, from
        the segment files of the first broker that has them."""
        from replication_tools import parse_batches
        for b in self.brokers.values():
            out: Dict[int, Tuple[int, int, int]] = {}
            for seg in sorted((b.data / f"{self.data_topic}-{p}").glob("*.log")):
                data = seg.read_bytes()
                try:
                    batches = parse_batches(data)
                except ValueError:
                    continue
                for bt in batches:
                    pid, pepoch, seq = struct.unpack_from(">qhi", data, bt["pos"] + 43)
                    for i in range(bt["last_offset"] - bt["base_offset"] + 1):
                        out[bt["base_offset"] + i] = (pid, pepoch, seq + i if seq >= 0 else -1)
            if out:
                return out
        return {}

    def client_epoch_bump_duplicate(self, val: str, locs: List[Tuple[int, int]],
                                    producers: List["IdemProducer"]) -> Optional[str]:
        """Why a record is in the log twice when the broker did what Kafka does and the client
        wrote it again under a new producer epoch, or None.

        librdkafka (issue #4953, open): a produce answered NOT_LEADER_OR_FOLLOWER is taken as not
        persisted, although a leader that lost its leadership while waiting for acks=all answers
        that for records already in its log (Kafka's DelayedProduce does the same), and the new
        leader has them.  Normally the client retries with the same sequence and the broker
        answers it as a duplicate.  But when an out-of-order answer on another partition makes
        the client bump its epoch first, the record goes out again as (epoch + 1, new sequence),
        which no broker can recognise.  This is that case only when: both copies come from the
        same producer id, the later copy's epoch is higher, the client's own log shows the epoch
        bump to that epoch and a NOT_LEADER_OR_FOLLOWER answer for the first copy's sequence."""
        parts = {p for p, _ in locs}
        if len(parts) != 1:
            return None
        p = parts.pop()
        stamps = self.batch_stamps(p)
        got = [stamps.get(o) for _, o in locs]
        if any(s is None for s in got) or len({s[0] for s in got}) != 1:
            return None
        first, later = got[0], got[1:]
        if any(s[1] <= first[1] for s in later):
            return None
        name = val.rsplit("-", 1)[0]
        pr = next((x for x in producers if x.pname == name), None)
        if pr is None or pr.logfile is None or not pr.logfile.exists():
            return None
        text = pr.logfile.read_text(errors="replace")
        pid = first[0]
        bumped = all(f"bumped epoch to PID{{Id:{pid},Epoch:{s[1]}}}" in text for s in later)
        not_leader = re.search(rf"{re.escape(self.data_topic)} \[{p}\]: MessageSet with \d+ message\(s\) "
                               rf"\(MsgId \d+, BaseSeq {first[2]}\) encountered error: Broker: Not leader", text)
        if not (bumped and not_leader):
            return None
        return (f"producer {pid} epoch {first[1]} seq {first[2]} answered NOT_LEADER_OR_FOLLOWER, then re-sent as "
                f"epoch {later[0][1]} seq {later[0][2]} after the client's epoch bump (librdkafka #4953)")

    def check_replicas(self, timeout: float = 30) -> None:
        """Each partition's replicas hold the same batches below the high watermark (segment
        files, compared batch by batch).  Polled: a replica that rejoined may still be fetching."""
        from confluent_kafka import Consumer, TopicPartition
        from replication_tools import parse_batches
        c = Consumer(_quiet({"bootstrap.servers": self.bootstrap, "group.id": "nf-hw"}))
        try:
            states = self.partition_states()
            hw = {}
            for (t, p) in states:
                hw[(t, p)] = c.get_watermark_offsets(TopicPartition(t, p), timeout=20, cached=False)[1]
        finally:
            c.close()

        def batches(b: NsBroker, t: str, p: int):
            d = b.data / f"{t}-{p}"
            segs = sorted(d.glob("*.log"), key=lambda x: int(x.stem)) if d.is_dir() else []
            out = []
            for s in segs:
                data = s.read_bytes()
                try:
                    bs = parse_batches(data)
                except ValueError as e:  # a torn tail past the HW is fine; parse what precedes it
                    bs = []
                    m = re.search(r"at byte (\d+)", str(e))
                    if m:
                        bs = parse_batches(data[:int(m.group(1))])
                out += [(x["base_offset"], x["last_offset"], data[x["pos"]:x["pos"] + x["size"]]) for x in bs]
            return out

        def diverged():
            bad = {}
            for (t, p), (replicas, _st) in states.items():
                h = hw[(t, p)]
                if h <= 0:
                    continue
                logs = {}
                for r in replicas:
                    bl = [x for x in batches(self.brokers[r], t, p) if x[0] < h]
                    logs[r] = bl
                ref = logs[replicas[0]]
                for r in replicas[1:]:
                    if logs[r] != ref:
                        bad[(t, p)] = logs
                        break
                for r, bl in logs.items():
                    if not bl or bl[-1][1] < h - 1:
                        bad[(t, p)] = logs
            return bad
        try:
            wait_until(lambda: not diverged(), timeout, "replicas identical below the high watermark", interval=0.5)
        except TimeoutError:
            for (t, p), logs in diverged().items():
                summary = {}
                for r, bl in logs.items():
                    summary[r] = (len(bl), bl[-1][1] if bl else None)
                first_diff = None
                ref = logs[states[(t, p)][0][0]]
                for r, bl in logs.items():
                    for i, (a, b) in enumerate(zip(ref, bl)):
                        if a != b:
                            first_diff = (r, a[0], b[0])
                            break
                self.violations.append(f"replica-divergence: {t}-{p} hw={hw[(t, p)]}: per replica (batches, last "
                                       f"offset) {summary}; first differing batch (replica, ref base, its base) "
                                       f"{first_diff}")

    # -- the whole thing ----------------------------------------------------------
    def run(self) -> dict:
        plan = self.plan
        t0 = time.monotonic()
        producers: List[IdemProducer] = []
        readers: List[GroupReader] = []
        txn = None
        try:
            try:
                self.start()
            except Exception:
                self.dump_stacks("setup")
                raise
            producers = [IdemProducer(self.bootstrap, self.data_topic, f"p{i}", self.base) for i in range(3)]
            txn = TxnProducer(self.bootstrap, self.txn_topic, plan["txn_seed"], f"nf-txn-{plan['seed']}", self.base)
            data_reader = GroupReader(self.bootstrap, self.data_topic, "nf-g-data", read_committed=False)
            rc_reader = GroupReader(self.bootstrap, self.txn_topic, "nf-g-rc", read_committed=True)
            readers = [data_reader, rc_reader]
            for th in producers + [txn] + readers:
                th.start()
            wait_until(lambda: all(len(p.acks) > 50 for p in producers) and len(txn.txns) > 2
                       and data_reader.reads and rc_reader.reads, 60, "the workload running", interval=0.1)
            for f in plan["faults"]:
                self.log(f"  [{time.monotonic() - t0:5.1f}s] {describe_fault(f)} for {f['hold']} s")
                self.apply(f)
                try:
                    time.sleep(f["hold"])  # the fault's hold time is the schedule itself
                finally:
                    # measured from the start of the heal: a kill -9's restart counts against the bounds
                    healed_at = time.monotonic()
                    self.heal(f)
                if f is not plan["faults"][-1]:
                    time.sleep(f["gap"])
            self.log(f"  [{time.monotonic() - t0:5.1f}s] last heal; measuring liveness")
            self.measure_liveness(healed_at)
            for th in producers:
                th.halt.set()
            txn.halt.set()
            for th in producers + [txn]:
                th.join(150)
            # let the readers see the tail end before they stop
            time.sleep(2)
            for th in readers:
                th.halt.set()
                th.join(30)
            for th in producers + [txn] + readers:
                if th.exc is not None:
                    raise RuntimeError(f"workload thread {th.name} failed: {th.exc!r}")
            self.log(f"  [{time.monotonic() - t0:5.1f}s] checking")
            self.check(producers, txn, data_reader, rc_reader)
        finally:
            for th in producers + readers + ([txn] if txn else []):
                th.halt.set()
            self.info["producer_fatal"] = sum(len(p.fatal_errors) for p in producers)
            self.info["lingering_threads"] = [th.name for th in producers + readers + ([txn] if txn else [])
                                              if th.is_alive()]
            self.info["txn_notes"] = txn.notes[-10:] if txn else []
            self.stop()
        self.info["duration"] = time.monotonic() - t0
        return self.result()

    def result(self) -> dict:
        return {"seed": self.plan["seed"], "faults": [describe_fault(f) for f in self.plan["faults"]],
                "acks": self.info.get("acks", 0), "txns": self.info.get("txns", {}),
                "violations": list(self.violations), "liveness": dict(self.liveness),
                "liveness_failures": self.liveness_failures() if self.liveness else ["not measured"],
                "info": self.info, "dir": str(self.base)}

    def evidence(self, limit: int = 8) -> List[str]:
        """Broker log lines around what usually explains a failure."""
        pat = r"( WARN | ERROR |session|truncat|diverg)"
        out = []
        for b in self.brokers.values():
            out += b.grep(pat, limit)
        if any(x.startswith("missing-offset") for x in self.violations):
            rx = re.compile(r"(IMPLICITACK|PossiblyPersisted|OUT_OF_ORDER|Out of order|DUPLICATE_SEQ|epoch bump)")
            for f in sorted(self.base.glob("p*.rdkafka.log")):
                hits = [f"{f.name}: {ln.strip()[:300]}" for ln in f.read_text(errors="replace").splitlines()
                        if rx.search(ln)]
                # the implicit acks first: each is an acknowledgement librdkafka gave without an offset
                out += sorted(hits, key=lambda h: "IMPLICITACK" not in h)[:limit]
        return out

    def dump_stacks(self, why: str) -> None:
        """Every live broker's thread stacks, beside its log: a stall that leaves every thread
        parked is otherwise invisible once the processes are gone."""
        if not shutil.which("gdb"):
            return
        for b in self.brokers.values():
            if not b.alive():
                continue
            out = b.base / f"stacks-{why}.txt"
            with open(out, "wb") as f:
                subprocess.run(["gdb", "-p", str(b.proc.pid), "-batch", "-ex", "thread apply all bt"],
                               stdout=f, stderr=subprocess.STDOUT, timeout=120, check=False)

    def stop(self) -> None:
        for b in self.brokers.values():
            try:
                b.stop()
            except Exception:  # noqa: BLE001
                pass
        if self.kz is not None:
            try:
                self.kz.stop()
                self.kz.close()
            except Exception:  # noqa: BLE001
                pass
        if self.zk is not None:
            self.zk.stop()
        self.net.heal()


# ---------------------------------------------------------------------------
# running schedules, with cleanup on every exit path
# ---------------------------------------------------------------------------

_ACTIVE_NETS: List[Net] = []


def _cleanup_all() -> None:
    while _ACTIVE_NETS:
        _ACTIVE_NETS.pop().down()


def _on_signal(signum, _frame):
    _cleanup_all()
    # Not SystemExit: a heal in a `finally` that fails (its namespace is gone) would replace it,
    # be reported as a failed schedule, and the campaign would go on without a network.
    sys.stdout.flush()
    os._exit(128 + signum)


def open_net() -> Net:
    problem = can_run()
    if problem:
        raise SetupError(problem)
    atexit.register(_cleanup_all)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _on_signal)
        signal.signal(signal.SIGHUP, _on_signal)
    net = Net()
    _ACTIVE_NETS.append(net)
    try:
        net.up()
    except BaseException:
        close_net(net)
        raise
    return net


def close_net(net: Net) -> None:
    if net in _ACTIVE_NETS:
        _ACTIVE_NETS.remove(net)
    net.down()


def run_schedule(net: Net, plan: dict, log=print) -> dict:
    base = WORK_ROOT / f"run-{os.getpid()}" / f"seed-{plan['seed']}"
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    log(f"seed {plan['seed']}: " + ", ".join(f"{describe_fault(f)} {f['hold']}s" for f in plan["faults"]))
    s = Schedule(net, plan, base, log)
    try:
        res = s.run()
    except Exception as e:  # noqa: BLE001 - a schedule that could not finish is reported, not hidden
        res = s.result()
        res["error"] = f"{e!r}\n{traceback.format_exc(limit=6)}"
    if res["violations"] or res["liveness_failures"] or res.get("error"):
        res["evidence"] = s.evidence()
    elif os.environ.get("GREGOR_KEEP_DIRS") != "1":
        shutil.rmtree(base, ignore_errors=True)
    return res


def fmt(v: Optional[float]) -> str:
    return f">{MEASURE_CAP:.0f}" if v is None else f"{v:.1f}"


def table_row(r: dict) -> str:
    t = r["txns"]
    txns = f"{t.get('committed', 0)}c/{t.get('aborted', 0)}a/{t.get('unknown', 0)}u" if t else "-"
    lv = r["liveness"]
    return (f"{r['seed']:>5}  {' '.join(r['faults']):<62.62}  {r['acks']:>6}  {txns:>11}  {len(r['violations']):>4}"
            f"  {fmt(lv.get('session_back')):>7}  {fmt(lv.get('producer_ok')):>7}  {fmt(lv.get('isr_full')):>7}"
            + ("  ERROR" if r.get("error") else "") + ("  LIVENESS" if r["liveness_failures"] else ""))


TABLE_HEAD = (f"{'seed':>5}  {'faults':<62}  {'acks':>6}  {'txns c/a/u':>11}  {'viol':>4}  {'sess s':>7}"
              f"  {'prod s':>7}  {'isr s':>7}")


def report(r: dict) -> str:
    lines = []
    for x in r["violations"][:30]:
        lines.append(f"    SAFETY {x}")
    if len(r["violations"]) > 30:
        lines.append(f"    ... {len(r['violations']) - 30} more")
    for x in r["liveness_failures"]:
        lines.append(f"    LIVENESS {x}")
    if r.get("error"):
        lines.append(f"    ERROR {r['error']}")
    # Not a violation (the broker answered as Kafka does), but never hidden.
    client_dups = [f"    CLIENT-DUPLICATE {x}" for x in r.get("info", {}).get("client_duplicates", [])]
    if lines:
        info = {k: r["info"][k] for k in ("probe", "isr_not_full", "registered_at_end", "producer_fatal",
                                          "txn_notes", "lingering_threads") if k in r["info"]}
        lines.append(f"    details: {json.dumps(info, default=str)[:3000]}")
        for e in r.get("evidence", [])[:40]:
            lines.append(f"    log {e}")
        lines.append(f"    dir {r['dir']}")
    return "\n".join(client_dups + lines)


def campaign(seeds: List[int], n_faults=(3, 5), hold=(10, 25)) -> int:
    net = open_net()
    signal.signal(signal.SIGINT, _on_signal)
    results = []
    try:
        print(f"network {net.prefix}0/24, namespaces {net.tag}-*, broker {gregor_bin()}", flush=True)
        for seed in seeds:
            r = run_schedule(net, make_schedule(seed, n_faults, hold), log=lambda m: print(m, flush=True))
            results.append(r)
            print(TABLE_HEAD + "\n" + table_row(r), flush=True)
            rep = report(r)
            if rep:
                print(rep, flush=True)
    finally:
        close_net(net)
    print("\n" + TABLE_HEAD)
    for r in results:
        print(table_row(r))
    safety = sum(len(r["violations"]) for r in results)
    live = sum(1 for r in results if r["liveness_failures"])
    errors = sum(1 for r in results if r.get("error"))
    print(f"\n{len(results)} schedules: {safety} safety violations, {live} with a liveness bound missed, "
          f"{errors} could not finish")
    return 0 if safety == 0 and live == 0 and errors == 0 else 1


def main(argv: List[str]) -> int:
    import argparse
    ap = argparse.ArgumentParser(prog="fault-campaign", description="network-fault schedules against gregor")
    ap.add_argument("n", nargs="?", type=int, default=None, help="number of seeds (default 100)")
    ap.add_argument("--seed", type=int, default=None, help="first seed (alone: run only this seed)")
    ap.add_argument("--short", action="store_true", help="3 faults held 10-15 s (the pytest schedule)")
    a = ap.parse_args(argv)
    if a.seed is not None and a.n is None:
        seeds = [a.seed]
    else:
        first = 1 if a.seed is None else a.seed
        seeds = list(range(first, first + (a.n if a.n is not None else 100)))
    shape = ((3, 3), (10, 15)) if a.short else ((3, 5), (10, 25))
    try:
        return campaign(seeds, *shape)
    except SetupError as e:
        print(f"fault-campaign: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
