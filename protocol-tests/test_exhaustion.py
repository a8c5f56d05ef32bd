"""Exhaustion never takes a broker down: a broker out of descriptors closes the connections it
cannot serve instead of leaving them hanging or spinning on accept. (Partitions no longer hold
a descriptor each: compat/test_open_files.py serves more segments than the limit.)

Each broker runs under a small open-file limit of its own (the harness's `nofile`)."""
import socket
import time

import kproto as kp


def test_connections_beyond_the_open_file_limit_are_closed_not_left_hanging(broker_factory):
    b = broker_factory({"gregor.open.files.reserved": "50"}, nofile=150)
    since = b.log_path.stat().st_size
    socks = []
    try:
        for i in range(300):
            s = socket.create_connection((b.host, b.port), timeout=10)
            s.sendall(kp.encode_request(kp.API_VERSIONS, 0, i, b""))
            socks.append(s)
        served = closed = 0
        for s in socks:
            s.settimeout(15)
            try:
                data = s.recv(4)
            except (ConnectionResetError, BrokenPipeError):
                data = b""
            if data:
                served += 1
            else:
                closed += 1
        # Every connection got an answer or was closed; none was left waiting (a timeout
        # above would have raised).
        assert served + closed == 300
        assert closed > 0 and served > 0, (served, closed)
    finally:
        for s in socks:
            s.close()
    text = b.log_path.read_bytes()[since:].decode(errors="replace")
    assert "out of file descriptors" in text
    # Once the clients are gone the broker serves new connections as before.
    deadline = time.monotonic() + 30
    while True:
        try:
            with kp.Conn(b.host, b.port) as c:
                assert c.api_versions(3)["error_code"] == 0
                break
        except (ConnectionError, OSError):
            assert time.monotonic() < deadline, "the broker never served a connection again"
            time.sleep(0.1)
    assert b.proc.poll() is None
