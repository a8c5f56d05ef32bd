"""Limits on what requests and new connections may claim, as Kafka's SocketServer has them:
queued.max.request.bytes (KIP-72's memory pool for requests being read and handled) and
max.connection.creation.rate (new connections are accepted no faster than the rate); both
refused at start when out of range, naming the key."""
import socket
import struct
import subprocess
import time

import kproto as kp
from gregor_harness import gregor_bin


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
    for key, value in [("queued.max.request.bytes", "0"), ("max.connection.creation.rate", "-1"),
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
