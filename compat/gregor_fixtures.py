"""pytest fixtures/hooks shared by compat/ and protocol-tests/.

Import with `from gregor_fixtures import *` from a conftest.py (after putting
compat/ on sys.path).

Fixtures
  broker           a fresh gregor on a free port with a fresh temp log.dirs
                   (function scope). Attributes: .bootstrap ("host:port"), .host,
                   .port, .data_dir, .proc (Popen), .restart("term"|"kill"),
                   .stop(), .kill(), .stderr_tail().  Unpacks as a tuple:
                   `addr, data_dir, proc = broker` (or broker.as_tuple()).
  broker_factory   call broker_factory(overrides={...}) to start more brokers,
                   e.g. with --override socket.request.max.bytes=1048576.
  zookeeper        session-scoped ZooKeeper; started lazily on first use only.

On a failed test, the stderr tail of every broker the test used is attached
to the report as a section "gregor stderr".

Guard (autouse, every test of every suite): at teardown, every broker and ZooKeeper
started through gregor_harness must still be running unless the test stopped or
killed it through the harness (stop/kill/restart, or expect_exit() for a process
that is meant to end on its own), must not have died of SIGABRT/SIGSEGV when
stopped, and no broker's output may contain gregor_harness.FATAL_LOG_PATTERNS
(`panicked at`, `RUST_BACKTRACE`, `memory allocation of`, `Aborted`).  A violation
fails the test (an error at teardown) naming the process, its dir (kept) and its
log tail.
"""
from __future__ import annotations

import pytest

import gregor_harness
from gregor_harness import Broker, ZooKeeper

__all__ = ["broker", "broker_factory", "zookeeper", "pytest_runtest_makereport", "gregor_process_guard"]


def _register(request, b: Broker) -> None:
    lst = getattr(request.node, "_gregor_brokers", None)
    if lst is None:
        lst = []
        request.node._gregor_brokers = lst
    lst.append(b)


def _failed(request) -> bool:
    for phase in ("setup", "call"):
        rep = getattr(request.node, f"_gregor_rep_{phase}", None)
        if rep is not None and rep.failed:
            return True
    return False


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, f"_gregor_rep_{rep.when}", rep)
    if rep.failed and rep.when in ("call", "setup"):
        for i, b in enumerate(getattr(item, "_gregor_brokers", []) or []):
            rep.sections.append((f"gregor stderr (broker #{i}, {b.bootstrap}, dir {b.base_dir})",
                                 b.stderr_tail(80)))


def _as_tuple(self):
    return (self.bootstrap, self.data_dir, self.proc)


Broker.as_tuple = _as_tuple  # type: ignore[attr-defined]


@pytest.fixture
def broker_factory(request):
    started = []

    def make(overrides=None, **kw) -> Broker:
        b = Broker(overrides=overrides, **kw)
        _register(request, b)
        started.append(b)
        b.start()
        return b

    yield make
    failed = _failed(request)
    for b in started:
        b.cleanup(keep=failed)


@pytest.fixture
def broker(broker_factory) -> Broker:
    return broker_factory()


@pytest.fixture(autouse=True)
def gregor_process_guard():
    """Set up before (so torn down after) every other function-scoped fixture."""
    yield
    reports = []
    keep = []
    for p in list(gregor_harness.STARTED):
        if isinstance(p, Broker):
            cleaned = p.health is not None  # Broker.cleanup() recorded it before killing
            problems = p.health if cleaned else p.health_problems()
        else:
            cleaned = False  # the session ZooKeeper: checked after every test
            problems = p.health_problems()
        if problems and not p.checked:
            reports.append(p.report())
            p.checked = True  # report each dead process once
        if not cleaned:
            keep.append(p)
    gregor_harness.STARTED[:] = keep
    if reports:
        pytest.fail("process guard: a broker/ZooKeeper died or crashed during this test\n\n"
                    + "\n\n".join(reports), pytrace=False)


_ZK = {}


@pytest.fixture(scope="session")
def zookeeper():
    """Session-scoped ZooKeeper; only started when a test requests it."""
    zk = ZooKeeper()
    zk.start()
    _ZK["zk"] = zk
    try:
        yield zk
    finally:
        zk.cleanup()
