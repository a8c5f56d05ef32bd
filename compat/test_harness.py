"""Self-tests of the harness itself: broker fixture, restarts, ZooKeeper fixture."""
import os
import signal
import socket

from gregor_harness import api_versions_probe, zk_four_letter


def test_broker_fixture(broker):
    addr, data_dir, proc = broker
    assert (addr, data_dir, proc) == broker.as_tuple()
    host, port = addr.rsplit(":", 1)
    assert proc.poll() is None
    assert data_dir.is_dir()
    versions = api_versions_probe(host, int(port))
    assert 18 in versions  # ApiVersions
    # the broker wrote something into its fresh log dir
    assert any(data_dir.iterdir()), "broker created nothing in log.dirs"


def test_two_brokers_distinct_ports_and_dirs(broker, broker_factory):
    other = broker_factory()
    assert other.port != broker.port and other.data_dir != broker.data_dir
    assert api_versions_probe(other.host, other.port) and api_versions_probe(broker.host, broker.port)


def test_restart_sigterm_same_port_and_dir(broker):
    port, data_dir = broker.port, broker.data_dir
    rc = broker.restart("term")
    assert rc == 0, f"gregor exit code after SIGTERM: {rc}"
    assert (broker.port, broker.data_dir) == (port, data_dir)
    assert api_versions_probe(broker.host, broker.port)


def test_restart_kill9_same_port_and_dir(broker):
    port = broker.port
    rc = broker.restart("kill")
    assert rc == -signal.SIGKILL
    assert broker.port == port
    assert api_versions_probe(broker.host, broker.port)


def test_stop_frees_port(broker):
    assert broker.stop() == 0
    with socket.socket() as s:
        assert s.connect_ex((broker.host, broker.port)) != 0, "port still accepting after stop"


def test_zookeeper_fixture(zookeeper):
    assert zk_four_letter(zookeeper.host, zookeeper.port, b"ruok") == b"imok"
    assert b"Mode: standalone" in zk_four_letter(zookeeper.host, zookeeper.port, b"srvr")
    assert os.path.exists(zookeeper.base_dir / "zoo.cfg")
