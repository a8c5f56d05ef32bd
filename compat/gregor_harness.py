"""Shared test harness for gregor: start/stop/restart a broker process, ZooKeeper.

Used by compat/conftest.py and protocol-tests/conftest.py.  No Kafka client
library is needed here: readiness is checked with a hand-built ApiVersions v0
request.

Environment:
  GREGOR_BIN           path of the broker binary (default: <repo>/target/release/gregor)
  GREGOR_START_TIMEOUT seconds to wait for a broker to become ready (default 60)
  GREGOR_KEEP_DIRS=1   keep broker temp dirs even when the test passed
"""
from __future__ import annotations

import ctypes
import os
import random
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

REPO = Path(__file__).resolve().parent.parent
DEFAULT_BIN = REPO / "target" / "release" / "gregor"
ZK_SERVER_SH = "/usr/share/zookeeper/bin/zkServer.sh"

# A broker whose output contains one of these crashed somewhere (a panic in a spawned tokio task
# does not end the process, so only its log tells).  Checked at every test's teardown.
FATAL_LOG_PATTERNS = ("panicked at", "RUST_BACKTRACE", "memory allocation of", "Aborted")
# exit by one of these signals is a crash even when the test asked the process to stop
_CRASH_SIGNALS = {signal.SIGABRT, signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE}

# Every Broker / ZooKeeper that was started, in order; gregor_fixtures' autouse guard checks
# them at each test's teardown (alive unless a test stopped them, no crash in the log).
STARTED: List[object] = []


def _crash_exit(rc: Optional[int]) -> bool:
    return rc is not None and (-rc in _CRASH_SIGNALS or rc - 128 in _CRASH_SIGNALS)


def scan_log(path: Path, patterns=FATAL_LOG_PATTERNS, limit: int = 5) -> List[str]:
    """`path:line: text` for the first `limit` lines containing one of `patterns`."""
    hits = []
    if not path.exists():
        return hits
    for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        if any(pat in line for pat in patterns):
            hits.append(f"{path}:{n}: {line.strip()[:300]}")
            if len(hits) >= limit:
                break
    return hits

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except Exception:
        pass


def gregor_bin() -> Path:
    return Path(os.environ.get("GREGOR_BIN", str(DEFAULT_BIN)))


# Its own source: a test that seeds the random module must not make files pick the same ports.
_PORT_RNG = random.SystemRandom()


def _ephemeral_range() -> Tuple[int, int]:
    try:
        lo, hi = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(lo), int(hi)
    except (OSError, ValueError):
        return 32768, 60999


def free_port() -> int:
    """A port that was free a moment ago, picked at random below the kernel's ephemeral range:
    the outgoing connections of test files running side by side take their local ports from
    that range, so one of them cannot grab the port before the server binds it."""
    lo, _ = _ephemeral_range()
    if lo > 12000:
        for _ in range(100):
            port = _PORT_RNG.randint(10000, lo - 1)
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class WaitAborted(Exception):
    """Raised by a wait_until() condition to stop waiting at once (e.g. the process exited)."""


def wait_until(cond: Callable[[], object], timeout: float, what: str, interval: float = 0.05):
    """Poll cond() until it returns a truthy value; raise TimeoutError otherwise.  An exception
    from cond() counts as "not yet", except WaitAborted, which is raised at once."""
    deadline = time.monotonic() + timeout
    last_exc = None
    while True:
        try:
            v = cond()
            if v:
                return v
        except WaitAborted:
            raise
        except Exception as e:  # noqa: BLE001 - the condition may raise while not ready
            last_exc = e
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}"
                               + (f" (last error: {last_exc!r})" if last_exc else ""))
        time.sleep(interval)


# ---------------------------------------------------------------------------
# minimal ApiVersions v0 probe
# ---------------------------------------------------------------------------

def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError(f"connection closed after {len(buf)} of {n} bytes")
        buf += chunk
    return bytes(buf)


def api_versions_probe(host: str, port: int, timeout: float = 2.0) -> Dict[int, tuple]:
    """Send ApiVersions v0; return {api_key: (min, max)}. Raises on any problem."""
    corr = 0x5EED
    client_id = b"gregor-harness"
    body = struct.pack(">hhih", 18, 0, corr, len(client_id)) + client_id
    with socket.create_connection((host, port), timeout=timeout) as s:
        s.settimeout(timeout)
        s.sendall(struct.pack(">i", len(body)) + body)
        (size,) = struct.unpack(">i", _recv_exact(s, 4))
        resp = _recv_exact(s, size)
    (rcorr, err, n) = struct.unpack(">ihi", resp[:10])
    if rcorr != corr:
        raise AssertionError(f"ApiVersions probe: correlation id {rcorr} != {corr}")
    if err != 0:
        raise AssertionError(f"ApiVersions probe: error_code {err}")
    out = {}
    off = 10
    for _ in range(n):
        k, lo, hi = struct.unpack(">hhh", resp[off:off + 6])
        off += 6
        out[k] = (lo, hi)
    return out


# ---------------------------------------------------------------------------
# Broker
# ---------------------------------------------------------------------------

class BrokerStartError(RuntimeError, WaitAborted):
    pass


class ZooKeeperExited(RuntimeError, WaitAborted):
    pass


class Broker:
    """One gregor process. `start()` polls until it answers ApiVersions."""

    def __init__(self, data_dir: Optional[Path] = None, port: Optional[int] = None,
                 overrides: Optional[Dict[str, str]] = None, broker_id: int = 0,
                 base_dir: Optional[Path] = None, config_file: Optional[Path] = None,
                 env: Optional[Dict[str, str]] = None, nofile: Optional[int] = None):
        self.base_dir = Path(base_dir) if base_dir else Path(tempfile.mkdtemp(prefix="gregor-test-"))
        self.data_dir = Path(data_dir) if data_dir else self.base_dir / "data"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.port = port
        self._fixed_port = port is not None
        self.host = "127.0.0.1"
        self.broker_id = broker_id
        self.overrides = dict(overrides or {})
        self.config_file = config_file  # passed as the positional server.properties / .toml argument
        self.extra_env = dict(env or {})  # e.g. {"KAFKA_NUM_PARTITIONS": "3"}
        self.nofile = nofile  # the process's open-file limit (soft and hard), for exhaustion tests
        self.proc: Optional[subprocess.Popen] = None
        self.starts = 0
        self.exit_codes: List[int] = []
        self.api_versions: Dict[int, tuple] = {}
        # guard state: a process is expected to be running unless stop()/kill() (or a failed
        # start) ended it; an exit nobody asked for is recorded as (start #, exit code)
        self.expect_down = True
        self.unexpected_exits: List[tuple] = []
        self.crash_exits: List[tuple] = []
        self.health: Optional[List[str]] = None  # problems found when the harness tore it down
        self.checked = False

    # -- info ---------------------------------------------------------------
    def __iter__(self):
        """`addr, data_dir, proc = broker` (proc is the current Popen; it changes on restart)."""
        return iter((self.bootstrap, self.data_dir, self.proc))

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.base_dir / f"broker-stderr.{self.starts}.log"

    def stderr_tail(self, lines: int = 80) -> str:
        parts = []
        for i in range(1, self.starts + 1):
            p = self.base_dir / f"broker-stderr.{i}.log"
            if p.exists():
                text = p.read_text(errors="replace").splitlines()
                parts.append(f"--- {p} (start #{i}, last {min(lines, len(text))} lines) ---")
                parts.extend(text[-lines:])
        return "\n".join(parts) if parts else "(no broker stderr captured)"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def describe(self) -> str:
        return f"gregor broker.id={self.broker_id} on {self.bootstrap} (dir {self.base_dir})"

    # -- guard --------------------------------------------------------------
    def expect_exit(self) -> None:
        """The test expects this process to end on its own (the guard then does not flag it)."""
        self.expect_down = True

    def _note_exit(self) -> None:
        """Before the harness signals the process: was it already gone without being asked?"""
        if self.proc is None:
            return
        rc = self.proc.poll()
        if rc is not None and not self.expect_down:
            self.unexpected_exits.append((self.starts, rc))
        self.expect_down = True

    def health_problems(self) -> List[str]:
        """Everything wrong with this broker as a test's teardown sees it."""
        problems = []
        for start, rc in self.unexpected_exits:
            problems.append(f"exited on its own (start #{start}, exit code {rc}) before the test stopped it")
        if self.proc is not None and not self.expect_down and self.proc.poll() is not None:
            problems.append(f"not running at teardown (start #{self.starts}, exit code {self.proc.returncode}); "
                            "the test did not stop or kill it")
        for start, rc in self.crash_exits:
            problems.append(f"crashed when stopped (start #{start}, exit code {rc})")
        for i in range(1, self.starts + 1):
            hits = scan_log(self.base_dir / f"broker-stderr.{i}.log")
            if hits:
                problems.append(f"log of start #{i} contains {'/'.join(FATAL_LOG_PATTERNS)}:\n    "
                                + "\n    ".join(hits))
        return problems

    def snapshot_health(self) -> List[str]:
        """Record the teardown-time health once, before the harness stops the process."""
        if self.health is None:
            self.health = self.health_problems()
        return self.health

    def _reaped_rc(self, rc: int) -> int:
        if _crash_exit(rc):
            self.crash_exits.append((self.starts, rc))
        return rc

    # -- lifecycle ----------------------------------------------------------
    def _cmd(self) -> List[str]:
        cfg = {
            "broker.id": str(self.broker_id),
            "listeners": f"PLAINTEXT://{self.host}:{self.port}",
            "advertised.listeners": f"PLAINTEXT://{self.host}:{self.port}",
            "log.dirs": str(self.data_dir),
        }
        cfg.update(self.overrides)
        cmd = [str(gregor_bin())]
        if self.config_file is not None:
            cmd.append(str(self.config_file))
        for k, v in cfg.items():
            cmd += ["--override", f"{k}={v}"]
        return cmd

    def start(self, timeout: Optional[float] = None) -> "Broker":
        if self.alive():
            raise RuntimeError("broker already running")
        binp = gregor_bin()
        if not binp.exists():
            raise BrokerStartError(f"broker binary {binp} does not exist (run cargo build --release)")
        timeout = timeout or float(os.environ.get("GREGOR_START_TIMEOUT", "60"))
        attempts = 1 if self._fixed_port else 3
        last = None
        for _ in range(attempts):
            if not self._fixed_port:
                self.port = free_port()
            try:
                self._start_once(timeout)
                return self
            except BrokerStartError as e:
                last = e
                # only retry when another process grabbed the port in the meantime
                if "in use" not in self.stderr_tail(20).lower():
                    raise
        raise last  # type: ignore[misc]

    def _preexec(self) -> None:  # runs in the child between fork and exec
        _die_with_parent()
        if self.nofile is not None:
            import resource
            resource.setrlimit(resource.RLIMIT_NOFILE, (self.nofile, self.nofile))

    def _start_once(self, timeout: float) -> None:
        if self not in STARTED:
            STARTED.append(self)
        self.starts += 1
        self.expect_down = False
        self.health = None
        self.checked = False
        env = dict(os.environ)
        env.setdefault("RUST_BACKTRACE", "1")
        env.setdefault("NO_COLOR", "1")
        # keep KAFKA_* from the outer environment from changing the test broker
        for k in list(env):
            if k.startswith("KAFKA_"):
                del env[k]
        env.update(self.extra_env)
        self._logf = open(self.log_path, "wb")
        self.proc = subprocess.Popen(self._cmd(), stdin=subprocess.DEVNULL, stdout=self._logf,
                                     stderr=subprocess.STDOUT, cwd=str(self.base_dir), env=env,
                                     preexec_fn=self._preexec)

        def ready():
            if self.proc.poll() is not None:
                raise BrokerStartError(
                    f"gregor exited with code {self.proc.returncode} during startup\n" + self.stderr_tail(40))
            self.api_versions = api_versions_probe(self.host, self.port)
            return True

        try:
            wait_until(ready, timeout, f"gregor on {self.bootstrap} to answer ApiVersions", interval=0.05)
        except BrokerStartError:
            self.expect_down = True  # the caller is told by the exception
            self._reap()
            raise
        except TimeoutError as e:
            self.kill()
            raise BrokerStartError(f"{e}\n{self.stderr_tail(60)}") from None

    def _reap(self) -> None:
        if self.proc is not None:
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.exit_codes.append(self.proc.returncode)
        if getattr(self, "_logf", None):
            self._logf.close()
            self._logf = None

    def stop(self, timeout: float = 30) -> int:
        """SIGTERM, wait for exit (SIGKILL after `timeout`). Returns the exit code
        (negative = killed by that signal, as in subprocess)."""
        if self.proc is None:
            return 0
        self._note_exit()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        rc = self.proc.returncode
        self._reap()
        return self._reaped_rc(rc)

    def kill(self) -> int:
        """kill -9."""
        if self.proc is None:
            return 0
        self._note_exit()
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        rc = self.proc.returncode
        self._reap()
        return self._reaped_rc(rc)

    def restart(self, mode: str = "term") -> int:
        """Stop (mode 'term' = SIGTERM, 'kill' = SIGKILL) and start again on the same
        port and data dir. Returns the exit code of the stopped process."""
        rc = self.stop() if mode == "term" else self.kill()
        self._fixed_port = True
        # the same port can briefly be unavailable; the broker itself must use
        # SO_REUSEADDR, so a bind failure here is reported as a failure.
        self.start()
        return rc

    def cleanup(self, keep: bool = False) -> None:
        problems = self.snapshot_health()
        try:
            self.kill()
        finally:
            if problems:
                self.health_report = self.report()  # the guard shows it; the dir is kept
            elif not keep and not os.environ.get("GREGOR_KEEP_DIRS"):
                shutil.rmtree(self.base_dir, ignore_errors=True)

    def report(self) -> str:
        problems = self.health if self.health is not None else self.health_problems()
        return (f"{self.describe}:\n  - " + "\n  - ".join(problems) + "\n" + self.stderr_tail(40))


# ---------------------------------------------------------------------------
# ZooKeeper (Debian package)
# ---------------------------------------------------------------------------

def zk_four_letter(host: str, port: int, cmd: bytes = b"ruok", timeout: float = 2.0) -> bytes:
    with socket.create_connection((host, port), timeout=timeout) as s:
        s.settimeout(timeout)
        s.sendall(cmd)
        out = bytearray()
        while True:
            chunk = s.recv(4096)
            if not chunk:
                break
            out += chunk
    return bytes(out)


class ZooKeeper:
    def __init__(self, base_dir: Optional[Path] = None):
        self.base_dir = Path(base_dir) if base_dir else Path(tempfile.mkdtemp(prefix="gregor-zk-"))
        self.host = "127.0.0.1"
        self.port: Optional[int] = None
        self.proc: Optional[subprocess.Popen] = None
        self.expect_down = True
        self.unexpected_exits: List[int] = []
        self.checked = False

    @property
    def connect(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def describe(self) -> str:
        return f"ZooKeeper on {self.host}:{self.port} (dir {self.base_dir})"

    def health_problems(self) -> List[str]:
        problems = [f"exited on its own (exit code {rc}) before the test stopped it"
                    for rc in self.unexpected_exits]
        if self.proc is not None and not self.expect_down and self.proc.poll() is not None:
            problems.append(f"not running (exit code {self.proc.returncode}); nobody stopped it")
        return problems

    def report(self) -> str:
        return f"{self.describe}:\n  - " + "\n  - ".join(self.health_problems()) + "\n" + self.stderr_tail(40)

    def stderr_tail(self, lines: int = 60) -> str:
        p = self.base_dir / "zookeeper.out"
        if not p.exists():
            return "(no zookeeper output)"
        return "\n".join(p.read_text(errors="replace").splitlines()[-lines:])

    def start(self, timeout: float = 60) -> "ZooKeeper":
        if not Path(ZK_SERVER_SH).exists():
            raise RuntimeError(f"{ZK_SERVER_SH} missing: apt-get install zookeeper")
        last = None
        for _ in range(3):
            self.port = free_port()
            data = self.base_dir / "data"
            logs = self.base_dir / "logs"
            data.mkdir(parents=True, exist_ok=True)
            logs.mkdir(parents=True, exist_ok=True)
            cfg = self.base_dir / "zoo.cfg"
            cfg.write_text(
                "tickTime=2000\n"
                "initLimit=10\nsyncLimit=5\n"
                f"dataDir={data}\n"
                f"clientPort={self.port}\n"
                f"clientPortAddress={self.host}\n"
                "maxClientCnxns=0\n"
                "admin.enableServer=false\n"
                "4lw.commands.whitelist=ruok,srvr,stat,wchc\n"
                "standaloneEnabled=true\n"
            )
            env = dict(os.environ)
            env["ZOO_LOG_DIR"] = str(logs)
            env["ZOO_LOG4J_PROP"] = "INFO,CONSOLE"
            env["JVMFLAGS"] = "-Xmx256m -Dzookeeper.admin.enableServer=false"
            self._logf = open(self.base_dir / "zookeeper.out", "ab")
            if self not in STARTED:
                STARTED.append(self)
            self.expect_down = False
            self.proc = subprocess.Popen(["bash", ZK_SERVER_SH, "start-foreground", str(cfg)],
                                         stdin=subprocess.DEVNULL, stdout=self._logf, stderr=subprocess.STDOUT,
                                         cwd=str(self.base_dir), env=env, preexec_fn=_die_with_parent)

            def ready():
                if self.proc.poll() is not None:
                    raise ZooKeeperExited(f"zookeeper exited with {self.proc.returncode}")
                # ruok answers imok before the server is serving; srvr tells the mode
                if zk_four_letter(self.host, self.port, b"ruok") != b"imok":
                    return False
                return b"Mode:" in zk_four_letter(self.host, self.port, b"srvr")

            try:
                wait_until(ready, timeout, f"zookeeper on {self.connect} to answer ruok/srvr", interval=0.1)
                return self
            except Exception as e:  # noqa: BLE001
                last = e
                self.expect_down = True  # the caller is told by the exception
                self.stop()
                if "address already in use" not in self.stderr_tail(200).lower():
                    break
        raise RuntimeError(f"zookeeper did not start: {last}\n{self.stderr_tail()}")

    def stop(self, timeout: float = 20) -> None:
        if self.proc is not None and self.proc.poll() is not None and not self.expect_down:
            self.unexpected_exits.append(self.proc.returncode)
        self.expect_down = True
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if getattr(self, "_logf", None):
            self._logf.close()
            self._logf = None

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.base_dir, ignore_errors=True)
