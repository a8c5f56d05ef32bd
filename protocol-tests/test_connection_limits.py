"""Connection quotas and idle connections, as Kafka's SocketServer has them:
max.connections.per.ip (and its overrides), listener.name.<l>.max.connections,
connections.max.idle.ms; and many idle connections held while clients work normally."""
import resource
import socket
import struct
import subprocess
import time

import kproto as kp


def served(b, timeout: float = 10.0):
    """A connection whose ApiVersions was answered, or None if the broker closed it."""
    c = kp.Conn(b.host, b.port, timeout=timeout)
    try:
        assert c.api_versions(0)["error_code"] == 0
        return c
    except Exception:  # reset, EOF, or the decoder's error on a short read: not served
        c.close()
        return None


def closed_by_broker(c: kp.Conn, timeout: float = 10.0) -> bool:
    c.sock.settimeout(timeout)
    try:
        return c.sock.recv(1) == b""
    except ConnectionResetError:
        return True


def wait_for(cond, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def admitted(b, n: int):
    """`n` served connections. The harness's readiness probe holds a slot until the broker has
    seen it close, so a refusal right after the start is retried."""
    return [wait_for(lambda: served(b), 10, f"connection {i + 1} of {n} to be served") for i in range(n)]


def test_max_connections_per_ip_refuses_the_next_one(broker_factory):
    b = broker_factory({"max.connections.per.ip": "3"})
    conns = admitted(b, 3)
    assert served(b) is None, "a fourth connection from 127.0.0.1 was served"
    conns.pop().close()
    again = wait_for(lambda: served(b), 10, "room for a new connection after one closed")
    for c in conns + [again]:
        assert c.api_versions(0)["error_code"] == 0, "the admitted connections keep working"
        c.close()


def test_per_ip_overrides_win_over_the_default(broker_factory):
    b = broker_factory({"max.connections.per.ip": "0", "max.connections.per.ip.overrides": "127.0.0.1:2"})
    conns = admitted(b, 2)
    assert served(b) is None
    for c in conns:
        c.close()


def test_listener_limit_makes_new_clients_wait_until_one_leaves(broker_factory):
    b = broker_factory({"listener.name.plaintext.max.connections": "2"})
    first, second = served(b), served(b)
    assert first and second
    # The third is not accepted: it waits in the listen backlog, its request unanswered.
    third = kp.Conn(b.host, b.port, timeout=30)
    third.sock.sendall(_api_versions_frame(7))
    third.sock.settimeout(1.0)
    try:
        early = third.sock.recv(4)
    except socket.timeout:
        early = None
    assert early is None, "a connection beyond listener.name.plaintext.max.connections was served"
    first.close()
    third.sock.settimeout(10)
    size = third.sock.recv(4)
    assert len(size) == 4, "the waiting connection was not served after another closed"
    second.close()
    third.close()


def _api_versions_frame(correlation_id: int) -> bytes:
    body = struct.pack(">hhih", kp.API_VERSIONS, 0, correlation_id, -1)
    return struct.pack(">i", len(body)) + body


def test_idle_connections_are_closed_busy_ones_kept(broker_factory):
    b = broker_factory({"connections.max.idle.ms": "500"})
    idle = served(b)
    busy = served(b)
    assert idle and busy
    started = time.monotonic()
    while time.monotonic() - started < 2.0:
        assert busy.api_versions(0)["error_code"] == 0, "a connection in use was closed"
        time.sleep(0.1)
    assert closed_by_broker(idle), "an idle connection outlived connections.max.idle.ms"
    busy.close()


def test_ten_thousand_idle_connections_while_clients_work(broker):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    n = min(10_000, hard - 2_000)
    assert n >= 10_000, f"the open-file limit here ({hard}) cannot hold 10,000 connections"
    socks = []
    try:
        frame = _api_versions_frame(1)
        for _ in range(n):
            s = socket.create_connection((broker.host, broker.port), timeout=30)
            s.sendall(frame)
            socks.append(s)
        for s in socks:
            assert len(s.recv(4)) == 4, "an idle connection was not served"
        topic = f"busy-{time.monotonic_ns()}"
        values = "\n".join(str(i) for i in range(1000)) + "\n"
        subprocess.run(["kcat", "-P", "-b", broker.bootstrap, "-t", topic], input=values.encode(),
                       check=True, timeout=120)
        out = subprocess.run(["kcat", "-C", "-b", broker.bootstrap, "-t", topic, "-e", "-q"],
                             capture_output=True, check=True, timeout=120).stdout
        assert out.decode().split() == [str(i) for i in range(1000)]
        with kp.Conn(broker.host, broker.port) as c:
            assert c.api_versions(0)["error_code"] == 0
    finally:
        for s in socks:
            s.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
