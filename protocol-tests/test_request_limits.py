"""Limits on what requests and new connections may claim, as Kafka's SocketServer has them:
queued.max.request.bytes (KIP-72's memory pool for requests being read and handled),
queued.max.requests (requests handled at once; parked ones excluded) and
max.connection.creation.rate (new connections are accepted no faster than the rate); all
refused at start when out of range, naming the key."""
import os
import signal
import socket
import struct
import subprocess
import time
import urllib.request
import uuid

import kproto as kp
from gregor_harness import ZooKeeper, free_port, gregor_bin, wait_until

HANDLING = "kafka_network_requestchannel_requestqueuesize"
FETCH_PURGATORY = 'kafka_server_delayedoperationpurgatory_purgatorysize{delayedOperation="Fetch"}'


def api_versions_v0(corr: int, client_id_len: int) -> bytes:
    """An ApiVersions v0 frame whose client id pads it to a chosen size."""
    cid = b"c" * client_id_len
    body = struct.pack(">hhih", 18, 0, corr, len(cid)) + cid
    return struct.pack(">i", len(body)) + body


def answered(sock: socket.socket, corr: int, timeout: float) -> bool:
    sock.settimeout(timeout)
    try:
        (size,) = struct.unpack(">i", kp.recv_exact(sock, 4))
    except socket.timeout:
        return False
    payload = kp.recv_exact(sock, size)
    assert struct.unpack(">i", payload[:4])[0] == corr
    return True


def test_a_frame_waits_for_room_in_queued_max_request_bytes(broker_factory):
    b = broker_factory({"queued.max.request.bytes": "16384"})
    # A holds 12,000 bytes of the pool with a frame it has only half sent.
    a = socket.create_connection((b.host, b.port), timeout=10)
    frame_a = api_versions_v0(1, 12000 - 10)
    a.sendall(frame_a[:6000])
    # Once A's frame has its room, a whole 8,000-byte frame does not fit beside it: it is not
    # read, so not answered. Until then such frames are answered; poll for the first that is not.
    deadline = time.monotonic() + 20
    corr = 100
    while True:
        waiting = socket.create_connection((b.host, b.port), timeout=10)
        waiting.sendall(api_versions_v0(corr, 8000 - 10))
        if not answered(waiting, corr, 0.5):
            break
        waiting.close()
        corr += 1
        assert time.monotonic() < deadline, "8,000-byte frames kept being read beside A's 12,000 in a 16,384-byte pool"
    # A's frame completes and is handled; its room is given back and the waiting frame is served.
    a.sendall(frame_a[6000:])
    assert answered(a, 1, 10)
    assert answered(waiting, corr, 10), "the waiting frame was not read once the pool had room"
    a.close()
    waiting.close()


def test_a_frame_larger_than_the_pool_is_still_served(broker_factory):
    b = broker_factory({"queued.max.request.bytes": "1024"})
    s = socket.create_connection((b.host, b.port), timeout=10)
    s.sendall(api_versions_v0(9, 5000))
    assert answered(s, 9, 10), "a frame larger than the whole pool waits for all of it, then is served"
    s.close()


def test_connections_are_accepted_no_faster_than_the_listeners_creation_rate(broker_factory):
    # The listener's own rate: the broker-wide max.connection.creation.rate exempts the
    # inter-broker listener, as Kafka's does, which is the only listener here.
    rate, n = 10, 30
    b = broker_factory({"listener.name.plaintext.max.connection.creation.rate": str(rate)})
    start = time.monotonic()
    for i in range(n):
        s = socket.create_connection((b.host, b.port), timeout=30)
        s.sendall(api_versions_v0(i, 4))
        assert answered(s, i, 30)
        s.close()
    took = time.monotonic() - start
    # At most one second's worth at once (the bucket starts full), the rest at the rate.
    assert took >= (n - rate) / rate * 0.9, f"{n} connections accepted in {took:.2f}s at a rate of {rate}/s"


def test_out_of_range_values_are_refused_at_start(tmp_path):
    for key, value in [("queued.max.request.bytes", "0"), ("queued.max.requests", "0"),
                       ("max.connection.creation.rate", "-1"),
                       ("listener.name.plaintext.max.connection.creation.rate", "-5")]:
        p = subprocess.run([str(gregor_bin()), "--override", f"log.dirs={tmp_path / 'd'}",
                            "--override", "listeners=PLAINTEXT://127.0.0.1:0", "--override", f"{key}={value}"],
                           capture_output=True, text=True, timeout=30)
        assert p.returncode != 0, f"{key}={value} was accepted"
        assert key in p.stderr, f"the refusal does not name {key}: {p.stderr[-500:]}"


def create_topic_with_assignment(version: int, name: str, assignment) -> bytes:
    w = kp.W(kp.is_flexible(kp.CREATE_TOPICS, version))

    def part(w, item):
        p, replicas = item
        w.i32(p).array(replicas, lambda w, r: w.i32(r))
        w.tags()

    def topic(w, _):
        w.string(name).i32(-1).i16(-1)
        w.array(list(assignment.items()), part)
        w.array([], lambda w, x: None)
        w.tags()

    w.array([None], topic)
    w.i32(30000)
    w.bool(False)
    return w.tags().done()


def test_replica_assignments_are_bounded_by_the_brokers(broker):
    """A manual assignment is the one way to ask for any replication factor: Kafka refuses one
    that names a broker twice or gives partitions different replica counts
    (INVALID_REPLICA_ASSIGNMENT), so the factor is bounded by the brokers there are."""
    c = kp.Conn(broker.host, broker.port)
    for i, assignment in enumerate([{0: [0] * 30000}, {0: [0, 0]}, {0: [0], 1: []}]):
        name = f"bad-assignment-{i}"
        r = c.call(kp.CREATE_TOPICS, 4, create_topic_with_assignment(4, name, assignment))
        t = kp.decode_create_topics(r, 4)["topics"][0]
        assert t["error_code"] == 39, f"{name}: {t}"  # INVALID_REPLICA_ASSIGNMENT
        meta = kp.decode_metadata(c.call(kp.METADATA, 4, kp.metadata_request(4, [name])), 4)
        assert meta["topics"][0]["error_code"] == 3, f"{name} was created: {meta['topics'][0]}"
    # A good manual assignment still works.
    r = c.call(kp.CREATE_TOPICS, 4, create_topic_with_assignment(4, "good-assignment", {0: [0], 1: [0]}))
    assert kp.decode_create_topics(r, 4)["topics"][0]["error_code"] == 0
    c.close()


def test_an_error_quoting_a_long_input_is_still_answered(broker):
    """A topic config of a 20,000-character name and value: the refusal's message quotes
    both, and must be cut to what the response's int16-length string carries rather than
    fail the response (which closed the connection, leaving the client without an answer)."""
    c = kp.Conn(broker.host, broker.port)
    r = c.call(kp.CREATE_TOPICS, 4, kp.create_topics_request(4, [("long-config", 1, 1)],
                                                              configs={"x" * 20000: "y" * 20000}))
    t = kp.decode_create_topics(r, 4)["topics"][0]
    assert t["error_code"] == 40, t  # INVALID_CONFIG
    assert len(t["error_message"]) <= 1024
    c.close()


def metric(port: int, series: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(series + " "):
                return float(line.split()[1])
    return 0.0


def metadata_answered(c: kp.Conn, timeout: float) -> bool:
    """Sends Metadata v9 for no topic; whether its answer comes within `timeout`."""
    corr = c.send(kp.METADATA, 9, kp.metadata_request(9, []))
    c.sock.settimeout(timeout)
    try:
        c.recv(kp.METADATA, 9, corr)
    except socket.timeout:
        return False
    finally:
        c.sock.settimeout(30)
    return True


def test_a_parked_fetch_does_not_hold_a_queued_max_requests_slot(broker_factory):
    mport = free_port()
    b = broker_factory({"queued.max.requests": "1", "metrics.port": str(mport), "metrics.host": "127.0.0.1"})
    with kp.Conn(b.host, b.port) as a, kp.Conn(b.host, b.port) as other:
        topic = f"parked-{uuid.uuid4().hex[:8]}"
        kp.create_topic(a, topic)
        # A long poll on an empty partition: parked for 20 s unless something is produced.
        corr = a.send(kp.FETCH, 11, kp.fetch_request(11, {topic: {0: 0}}, max_wait_ms=20000, min_bytes=1))
        wait_until(lambda: metric(mport, FETCH_PURGATORY) == 1, 10, "the fetch to be parked")
        assert metric(mport, HANDLING) == 0, "a parked fetch is still counted as being handled"
        assert metadata_answered(other, 5), "the only request slot stayed with a parked fetch"
        assert kp.produce(other, topic, 0, kp.build_batch([kp.Record(b"v", b"k")]))["error_code"] == 0
        fetched = kp.decode_fetch(a.recv(kp.FETCH, 11, corr), 11)
        assert fetched["responses"][0]["partitions"][0]["error_code"] == 0


def test_queued_max_requests_bounds_requests_handled_at_once(broker_factory, tmp_path):
    """One slot, held by a CreateTopics waiting on a stopped ZooKeeper: a Metadata request
    that needs no ZooKeeper waits for the slot; with two slots it is answered meanwhile."""
    zk = ZooKeeper(base_dir=tmp_path / "zk")
    zk.start()
    try:
        for slots, blocked in (("2", False), ("1", True)):
            mport = free_port()
            b = broker_factory({"zookeeper.connect": zk.connect, "queued.max.requests": slots,
                                "metrics.port": str(mport), "metrics.host": "127.0.0.1"})
            with kp.Conn(b.host, b.port) as creator, kp.Conn(b.host, b.port) as other:
                assert metadata_answered(other, 10)
                pids = zk_pids(zk)
                for pid in pids:
                    os.kill(pid, signal.SIGSTOP)
                try:
                    corr = creator.send(kp.CREATE_TOPICS, 5,
                                        kp.create_topics_request(5, [(f"slow-{uuid.uuid4().hex[:8]}", 1, 1)]))
                    wait_until(lambda: metric(mport, HANDLING) == 1, 10, "the CreateTopics to be handled")
                    assert metadata_answered(other, 3) is not blocked, \
                        f"queued.max.requests={slots}: Metadata {'answered' if not blocked else 'not answered'} " \
                        "beside a CreateTopics waiting on ZooKeeper was expected"
                finally:
                    for pid in pids:
                        os.kill(pid, signal.SIGCONT)
                creator.recv(kp.CREATE_TOPICS, 5, corr)
                if blocked:
                    # The Metadata sent meanwhile is answered once the slot is given back.
                    other.recv(kp.METADATA, 9, other.corr)
            b.cleanup()
    finally:
        zk.cleanup()


def zk_pids(zk) -> list:
    """The ZooKeeper launcher and its JVM child."""
    out = subprocess.run(["pgrep", "-P", str(zk.proc.pid)], capture_output=True, text=True).stdout
    return [zk.proc.pid] + [int(p) for p in out.split()]


def uvarint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        if not n:
            out.append(b)
            return bytes(out)
        out.append(b | 0x80)


def create_topics_of_empty_elements(n: int) -> bytes:
    """CreateTopics v5 naming topic "a" n times with nothing else: 10 bytes per element, each
    a struct of well over 100 bytes once decoded."""
    el = b"\x02a" + struct.pack(">ih", 1, 1) + b"\x01\x01\x00"
    body = uvarint(n + 1) + el * n + struct.pack(">i", 1000) + b"\x01\x00"
    return kp.encode_request(kp.CREATE_TOPICS, 5, 7, body)


def peak_rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise AssertionError("no VmHWM in /proc/<pid>/status")


def test_a_request_decoding_past_its_memory_budget_is_refused(broker):
    """2 million empty topics in a 20 MB CreateTopics: decoded, answered and validated they
    took 900 MB; the decode budget (gregor.max.decoded.bytes.per.request, 64 MiB) refuses the
    request and closes its connection, and the broker goes on."""
    before = peak_rss_kb(broker.proc.pid)
    s = socket.create_connection((broker.host, broker.port), timeout=60)
    s.sendall(create_topics_of_empty_elements(2_000_000))
    assert kp.wait_closed(s, 60), "a request past the decode budget was not refused"
    grown_mb = (peak_rss_kb(broker.proc.pid) - before) / 1024
    # The frame itself is 20 MB and the budget 64 MiB: far below the 900 MB it cost unbounded.
    assert grown_mb < 256, f"the broker's peak memory grew by {grown_mb:.0f} MB for one refused request"
    with kp.Conn(broker.host, broker.port) as c:
        # A large legitimate request is inside the budget: 100,000 topics named in Metadata.
        names = [f"absent-{i}" for i in range(100_000)]
        md = kp.decode_metadata(c.call(kp.METADATA, 9, kp.metadata_request(9, names)), 9)
        assert len(md["topics"]) == 100_000
        assert all(t["error_code"] == kp.UNKNOWN_TOPIC_OR_PARTITION for t in md["topics"])


def test_the_decode_budget_is_configurable(broker_factory):
    b = broker_factory({"gregor.max.decoded.bytes.per.request": "100000"})
    with kp.Conn(b.host, b.port) as c:
        assert len(kp.decode_metadata(c.call(kp.METADATA, 9, kp.metadata_request(9, ["x"] * 100)), 9)["topics"]) == 100
    s = socket.create_connection((b.host, b.port), timeout=30)
    s.sendall(kp.encode_request(kp.METADATA, 9, 1, kp.metadata_request(9, ["x"] * 10_000)))
    assert kp.wait_closed(s, 30), "10,000 topics decoded within a 100,000-byte budget"
