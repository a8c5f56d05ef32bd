"""Exhaustion never takes a broker down: partitions that would need more descriptors than the
open-file limit allows are refused (each segment holds one), and a broker out of descriptors
closes the connections it cannot serve instead of leaving them hanging or spinning on accept.

Each broker runs under a small open-file limit of its own (the harness's `nofile`)."""
import socket
import time

import kproto as kp
from test_apis import new_topic, sample_records, topic_name

INVALID_PARTITIONS = 37


def test_partitions_beyond_the_open_file_limit_are_refused(broker_factory):
    b = broker_factory({"gregor.open.files.reserved": "100"}, nofile=600)
    with kp.Conn(b.host, b.port) as c:
        keep = new_topic(c)
        # A topic far beyond the limit at once (a mutated CreatePartitions grew one to 19,932
        # partitions under a 20,000 limit, and then no client could connect).
        res = kp.create_topic(c, topic_name("huge"), 5000)
        assert res["error_code"] == INVALID_PARTITIONS, res
        assert "gregor.open.files.reserved" in (res.get("error_message") or ""), res
        # Topics of 50 partitions until the limit says no: a few fit, then every one is refused.
        created = []
        for _ in range(20):
            name = topic_name("fill")
            res = kp.create_topic(c, name, 50)
            if res["error_code"] != 0:
                assert res["error_code"] == INVALID_PARTITIONS, res
                break
            created.append(name)
        else:
            raise AssertionError("20 topics of 50 partitions fit under an open-file limit of 600")
        assert 3 <= len(created) <= 9, f"{len(created)} topics of 50 partitions under a budget of 500 descriptors"
        # Growing a topic is weighed the same way.
        r = kp.decode_create_partitions(c.call(kp.CREATE_PARTITIONS, 1, kp.create_partitions_request(1, [(keep, 400)])), 1)
        assert [x["error_code"] for x in r["results"]] == [INVALID_PARTITIONS], r
        # The broker still serves: new connections, produce and fetch.
        assert kp.produce(c, keep, 0, kp.build_batch(sample_records(2)))["error_code"] == 0
    with kp.Conn(b.host, b.port) as c:
        assert c.api_versions(3)["error_code"] == 0
        assert kp.list_offset(c, keep, 0, kp.LATEST)["offset"] == 2


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
