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
"""
from __future__ import annotations

import pytest

from gregor_harness import Broker, ZooKeeper

__all__ = ["broker", "broker_factory", "zookeeper", "pytest_runtest_makereport"]


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
