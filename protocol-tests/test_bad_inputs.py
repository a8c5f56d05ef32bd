"""Malformed / hostile input. After each one the broker must still serve a fresh
connection, and data produced before must be unchanged."""
import re
import socket
import struct
import time
import uuid

import pytest

import kproto as kp

SMALL_MAX = 1048576


class Sentinel:
    """A topic with known content; check() asserts the broker is healthy and the content unchanged."""

    def __init__(self, broker):
        self.broker = broker
        self.topic = f"sentinel-{uuid.uuid4().hex[:8]}"
        with self.conn() as c:
            res = kp.create_topic(c, self.topic, 1)
            assert res["error_code"] == 0, res
            deadline = time.monotonic() + 30
            while True:
                t = kp.metadata(c, [self.topic])["topics"][0]
                if t["error_code"] == 0 and t["partitions"] and t["partitions"][0]["leader_id"] >= 0:
                    break
                assert time.monotonic() < deadline, "sentinel topic has no leader"
                time.sleep(0.05)
            recs = [kp.Record(value=b"sentinel-%d" % i, key=b"k%d" % i, headers=[("h", b"%d" % i)],
                              timestamp=1_700_000_000_000 + i) for i in range(20)]
            for chunk in (recs[:10], recs[10:]):
                p = kp.produce(c, self.topic, 0, kp.build_batch(chunk))
                assert p["error_code"] == 0, p
            self.latest = kp.list_offset(c, self.topic, 0, kp.LATEST)["offset"]
            assert self.latest == 20
            self.content = self._content(c)

    def conn(self):
        return kp.Conn(self.broker.host, self.broker.port)

    def _content(self, c):
        return [(r.offset, r.key, r.value, r.headers, r.timestamp) for r in kp.fetch_all(c, self.topic, 0)]

    def expect_appended(self, start: int, values) -> None:
        """The test wrote `values` at offsets start, start+1, ...: the records before are
        unchanged and exactly these follow them.  Later check()s compare with the result."""
        values = list(values)
        with self.conn() as c:
            now = self._content(c)
        n = len(self.content)
        assert start == self.latest, f"appended at {start}, log end was {self.latest}"
        assert now[:n] == self.content, "records stored before the test changed"
        tail = [(o, v) for (o, _k, v, _h, _t) in now[n:]]
        want = list(zip(range(start, start + len(values)), values))
        assert tail == want, f"after the known content: {tail[:5]}... ({len(tail)}), expected {want[:5]}... ({len(want)})"
        self.content = now
        self.latest = start + len(values)

    def check(self):
        assert self.broker.alive(), f"broker process died (exit {self.broker.proc.returncode})"
        with self.conn() as c:
            av = c.api_versions(0)
            assert av["error_code"] == 0
            assert kp.list_offset(c, self.topic, 0, kp.LATEST)["offset"] == self.latest, "log end offset changed"
            assert self._content(c) == self.content, "stored records changed"


@pytest.fixture
def sentinel(broker):
    return Sentinel(broker)


@pytest.fixture
def small_broker(broker_factory):
    return broker_factory({"socket.request.max.bytes": str(SMALL_MAX)})


def raw_conn(broker):
    s = socket.create_connection((broker.host, broker.port), timeout=30)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def test_truncated_frame_then_close(sentinel):
    s = raw_conn(sentinel.broker)
    full = kp.encode_request(kp.METADATA, 1, 1, kp.metadata_request(1, None))
    s.sendall(struct.pack(">i", 100) + full[4:4 + 10])  # promise 100 bytes, send 10
    s.close()
    sentinel.check()


def test_truncated_produce_then_close(sentinel):
    s = raw_conn(sentinel.broker)
    batch = kp.build_batch([kp.Record(b"never")])
    full = kp.encode_request(kp.PRODUCE, 8, 1, kp.produce_request(8, {sentinel.topic: {0: batch}}))
    s.sendall(full[:-5])
    s.close()
    sentinel.check()


def test_oversized_frame_closes_connection(small_broker):
    sentinel = Sentinel(small_broker)
    s = raw_conn(small_broker)
    s.sendall(struct.pack(">i", SMALL_MAX + 1) + b"\x00\x03\x00\x01\x00\x00\x00\x01")
    assert kp.wait_closed(s), "connection not closed after a size prefix above socket.request.max.bytes"
    s.close()
    sentinel.check()


def test_huge_size_prefix_closes_connection(sentinel):
    s = raw_conn(sentinel.broker)
    s.sendall(struct.pack(">i", 0x7FFFFFFF) + b"\x00" * 16)
    assert kp.wait_closed(s), "connection not closed after a 2 GiB size prefix"
    s.close()
    sentinel.check()


def test_request_within_small_limit_still_served(small_broker):
    sentinel = Sentinel(small_broker)
    with sentinel.conn() as c:
        big = kp.build_batch([kp.Record(b"x" * 500_000)])
        p = kp.produce(c, sentinel.topic, 0, big)
        assert p["error_code"] == 0 and p["base_offset"] == 20


@pytest.mark.parametrize("garbage", [
    b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n",
    struct.pack(">i", 16) + b"\xff" * 16,
    struct.pack(">i", -5) + b"\x00" * 8,
    struct.pack(">i", 2) + b"\x00\x03",  # frame too short for a request header
    struct.pack(">i", 6) + b"\x00\x03\x00\x01\x00\x00",  # header cut inside correlation id
], ids=["http", "ff-bytes", "negative-size", "short-frame", "cut-header"])
def test_garbage_closes_connection(sentinel, garbage):
    s = raw_conn(sentinel.broker)
    s.sendall(garbage)
    assert kp.wait_closed(s), f"connection not closed after garbage {garbage[:20]!r}"
    s.close()
    sentinel.check()


def test_unknown_api_key_closes_connection(sentinel):
    s = raw_conn(sentinel.broker)
    s.sendall(kp.encode_request(999, 0, 7, b"\x00\x00\x00\x00"))
    assert kp.wait_closed(s), "connection not closed after api key 999"
    s.close()
    sentinel.check()


def test_unsupported_produce_version_closes_connection(sentinel):
    s = raw_conn(sentinel.broker)
    batch = kp.build_batch([kp.Record(b"never")])
    s.sendall(kp.encode_request(kp.PRODUCE, 99, 7, kp.produce_request(8, {sentinel.topic: {0: batch}}),
                                flexible=False))
    assert kp.wait_closed(s), "connection not closed after Produce v99"
    s.close()
    sentinel.check()


def test_old_produce_with_a_bad_message_crc_stores_nothing(sentinel):
    """Produce v2 (message format v1) with a flipped bit: CORRUPT_MESSAGE, the log unchanged."""
    data = bytearray(kp.message_set([kp.Message(b"never", None, 1_700_000_000_000)]))
    data[-1] ^= 1
    with sentinel.conn() as c:
        r = kp.decode_produce(c.call(kp.PRODUCE, 2, kp.produce_request(2, {sentinel.topic: {0: bytes(data)}})), 2)
    assert r["responses"][0]["partitions"][0]["error_code"] == kp.CORRUPT_MESSAGE
    sentinel.check()


def test_create_topics_invalid_names(sentinel):
    bad = ["..", ".", "x" * 250, "bad/name"]
    good = f"good-{uuid.uuid4().hex[:8]}"
    with sentinel.conn() as c:
        for v in (2, 5):
            topics = [(n, 1, 1) for n in bad] + ([(good, 1, 1)] if v == 5 else [])
            r = c.call(kp.CREATE_TOPICS, v, kp.create_topics_request(v, topics))
            res = {t["name"]: t for t in kp.decode_create_topics(r, v)["topics"]}
            for n in bad:
                assert n in res, f"v{v}: no result for {n[:20]!r}; got {[k[:20] for k in res]}"
                assert res[n]["error_code"] == kp.INVALID_TOPIC_EXCEPTION, \
                    f"CreateTopics v{v} {n[:20]!r}: error {res[n]['error_code']} {res[n].get('error_message')}"
            if v == 5:
                assert res[good]["error_code"] == 0, res[good]
        md = kp.metadata(c, None)
        names = {t["name"] for t in md["topics"]}
        assert not names & set(bad), f"invalid topics were created: {names & set(bad)}"
    sentinel.check()


def test_corrupted_crc_rejected_nothing_stored(sentinel):
    with sentinel.conn() as c:
        for v in (3, 8):
            batch = kp.build_batch([kp.Record(b"corrupt-%d" % i) for i in range(3)], corrupt_crc=True)
            r = c.call(kp.PRODUCE, v, kp.produce_request(v, {sentinel.topic: {0: batch}}))
            p = kp.decode_produce(r, v)["responses"][0]["partitions"][0]
            assert p["error_code"] == kp.CORRUPT_MESSAGE, f"Produce v{v} corrupted CRC: error {p['error_code']}"
        # the payload flipped after the CRC was computed
        batch = bytearray(kp.build_batch([kp.Record(b"flipped")]))
        batch[-3] ^= 0x01
        p = kp.produce(c, sentinel.topic, 0, bytes(batch))
        assert p["error_code"] == kp.CORRUPT_MESSAGE, f"payload bit flip: error {p['error_code']}"
    sentinel.check()


def test_batch_length_mismatch_rejected(sentinel):
    with sentinel.conn() as c:
        batch = bytearray(kp.build_batch([kp.Record(b"short")]))
        struct.pack_into(">i", batch, 8, len(batch))  # claims 12 bytes more than present
        p = kp.produce(c, sentinel.topic, 0, bytes(batch))
        assert p["error_code"] != 0, "a batch whose length field exceeds the data was accepted"
    sentinel.check()


def test_pipelined_requests_answered_in_order(sentinel):
    topic = sentinel.topic
    reqs = [
        (kp.API_VERSIONS, 0, b""),
        (kp.METADATA, 1, kp.metadata_request(1, [topic])),
        (kp.LIST_OFFSETS, 1, kp.list_offsets_request(1, {topic: {0: kp.LATEST}})),
        (kp.PRODUCE, 3, kp.produce_request(3, {topic: {0: kp.build_batch([kp.Record(b"piped")])}})),
        (kp.FETCH, 4, kp.fetch_request(4, {topic: {0: 0}})),
        (kp.METADATA, 9, kp.metadata_request(9, [topic])),
        (kp.API_VERSIONS, 3, kp.api_versions_request(3)),
        (kp.LIST_OFFSETS, 7, kp.list_offsets_request(7, {topic: {0: kp.LATEST}})),
    ]
    with sentinel.conn() as c:
        wire = b""
        corrs = []
        for i, (api, v, body) in enumerate(reqs):
            corr = 5000 + i * 7
            corrs.append(corr)
            wire += kp.encode_request(api, v, corr, body)
        c.sock.sendall(wire)
        decoded = []
        for (api, v, _), corr in zip(reqs, corrs):
            r = c.recv(api, v, corr)
            decoded.append(DECODERS[api](r, v))
    assert decoded[0]["error_code"] == 0
    assert decoded[2]["topics"][0]["partitions"][0]["offset"] == 20
    assert decoded[3]["responses"][0]["partitions"][0]["base_offset"] == 20
    assert decoded[7]["topics"][0]["partitions"][0]["offset"] == 21
    sentinel.expect_appended(20, [b"piped"])
    sentinel.check()


DECODERS = {
    kp.API_VERSIONS: kp.decode_api_versions, kp.METADATA: kp.decode_metadata,
    kp.LIST_OFFSETS: kp.decode_list_offsets, kp.PRODUCE: kp.decode_produce, kp.FETCH: kp.decode_fetch,
}


def test_many_connections_closed_abruptly(sentinel):
    """Connections reset mid-request (RST via SO_LINGER 0) don't hurt the broker."""
    for i in range(20):
        s = raw_conn(sentinel.broker)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.sendall(kp.encode_request(kp.METADATA, 1, i, kp.metadata_request(1, None))[: 5 + i % 10])
        s.close()
    sentinel.check()


def test_pipelined_read_your_writes(sentinel):
    """Kafka handles one request per connection at a time, in order: a ListOffsets or
    Fetch pipelined behind a Produce (acks=all) on the same connection must see it."""
    topic = sentinel.topic
    problems = []
    with sentinel.conn() as c:
        for i in range(30):
            base = 20 + i
            wire = (kp.encode_request(kp.PRODUCE, 8, 1, kp.produce_request(
                        8, {topic: {0: kp.build_batch([kp.Record(b"ryw-%d" % i)])}}))
                    + kp.encode_request(kp.LIST_OFFSETS, 7, 2, kp.list_offsets_request(7, {topic: {0: kp.LATEST}}))
                    + kp.encode_request(kp.FETCH, 11, 3, kp.fetch_request(11, {topic: {0: base}})))
            c.sock.sendall(wire)
            p = kp.decode_produce(c.recv(kp.PRODUCE, 8, 1), 8)["responses"][0]["partitions"][0]
            lo = kp.decode_list_offsets(c.recv(kp.LIST_OFFSETS, 7, 2), 7)["topics"][0]["partitions"][0]
            f = kp.decode_fetch(c.recv(kp.FETCH, 11, 3), 11)["responses"][0]["partitions"][0]
            assert p["error_code"] == 0 and p["base_offset"] == base, p
            vals = [r.value for b in kp.decode_batches(f["records"]) for r in b.records if r.offset == base]
            if lo["offset"] != base + 1 or f["high_watermark"] != base + 1 or vals != [b"ryw-%d" % i]:
                problems.append(f"iteration {i}: produced at {base}; pipelined ListOffsets latest={lo['offset']}, "
                                f"Fetch@{base} error={f['error_code']} hw={f['high_watermark']} values={vals}")
    assert not problems, f"{len(problems)}/30 pipelined reads missed the preceding write:\n" + "\n".join(problems[:10])
    sentinel.expect_appended(20, [b"ryw-%d" % i for i in range(30)])
    sentinel.check()


def test_pipelined_produces_appended_in_request_order(sentinel):
    """Clients keep up to 5 (librdkafka without idempotence: many more) Produce requests in
    flight per connection and rely on them being appended in order."""
    topic = sentinel.topic
    n = 100
    with sentinel.conn() as c:
        wire = b"".join(kp.encode_request(kp.PRODUCE, 7, 9000 + i, kp.produce_request(
            7, {topic: {0: kp.build_batch([kp.Record(b"pp-%03d" % i)])}})) for i in range(n))
        c.sock.sendall(wire)
        bases = []
        for i in range(n):
            p = kp.decode_produce(c.recv(kp.PRODUCE, 7, 9000 + i), 7)["responses"][0]["partitions"][0]
            assert p["error_code"] == 0, p
            bases.append(p["base_offset"])
        values = [r.value for r in kp.fetch_all(c, topic, 0)][20:]
    expected = [b"pp-%03d" % i for i in range(n)]
    inversions = [(i, values[i - 1], values[i]) for i in range(1, len(values)) if values[i] < values[i - 1]]
    assert values == expected and bases == list(range(20, 20 + n)), (
        f"pipelined produces appended out of request order: {len(inversions)} inversions, first "
        f"{inversions[:3]}; base offsets in response order: {bases[:12]}...")
    sentinel.expect_appended(20, expected)
    sentinel.check()


# A small frame whose array length claims 2^31 elements: decoding must not reserve memory for
# what the frame claims (it once made the allocator abort the whole broker; see
# vendor/kafka-protocol/README.gregor.md).  Answer or close, and stay up; the process guard
# also fails the test on "memory allocation of ... failed" in the broker's log.
HUGE = 0x7FFFFFFF
ALLOC_CASES = {
    "metadata-v1": (kp.METADATA, 1, struct.pack(">i", HUGE)),
    "metadata-v9-compact": (kp.METADATA, 9, kp.uvarint(HUGE + 1)),
    "produce-v8-topics": (kp.PRODUCE, 8, struct.pack(">hhii", -1, -1, 30000, HUGE)),
    "create-topics-v5-compact": (kp.CREATE_TOPICS, 5, kp.uvarint(HUGE + 1)),
    "delete-topics-v4-compact": (kp.DELETE_TOPICS, 4, kp.uvarint(HUGE + 1)),
    "list-offsets-v1-partitions": (kp.LIST_OFFSETS, 1, struct.pack(">ii", -1, 1) + struct.pack(">h", 1) + b"t"
                                   + struct.pack(">i", HUGE)),
    # versions older than the protocol crate knows, read by gregor's own codec (api::legacy)
    "list-offsets-v0-partitions": (kp.LIST_OFFSETS, 0, struct.pack(">ii", -1, 1) + struct.pack(">h", 1) + b"t"
                                   + struct.pack(">i", HUGE)),
    "offset-commit-v0-topics": (8, 0, struct.pack(">h", 1) + b"g" + struct.pack(">i", HUGE)),
    "offset-commit-v1-partitions": (8, 1, struct.pack(">h", 1) + b"g" + struct.pack(">ih", 1, 0)
                                    + struct.pack(">ih", 1, 1) + b"t" + struct.pack(">i", HUGE)),
    "offset-for-leader-epoch-v0-topics": (23, 0, struct.pack(">i", HUGE)),
    "create-topics-v0-topics": (kp.CREATE_TOPICS, 0, struct.pack(">i", HUGE)),
    "produce-v0-topics": (kp.PRODUCE, 0, struct.pack(">hii", -1, 30000, HUGE)),
    "fetch-v0-topics": (kp.FETCH, 0, struct.pack(">iiii", -1, 0, 1, HUGE)),
}


# Old-version requests cut short: the connection closes, nothing is stored, the broker stays up.
TRUNCATED_OLD = {
    "list-offsets-v0": (kp.LIST_OFFSETS, 0, struct.pack(">ii", -1, 1) + struct.pack(">h", 1) + b"t"
                        + struct.pack(">i", 1) + struct.pack(">i", 0)),
    "offset-commit-v0": (8, 0, struct.pack(">h", 5) + b"gr"),
    "offset-commit-v1": (8, 1, struct.pack(">h", 1) + b"g" + struct.pack(">i", 3)),
    "describe-configs-v0": (kp.DESCRIBE_CONFIGS, 0, struct.pack(">ib", 1, 2)),
    "offset-for-leader-epoch-v1": (23, 1, struct.pack(">i", 1) + struct.pack(">h", 1) + b"t" + struct.pack(">i", 1)),
    "produce-v1": (kp.PRODUCE, 1, struct.pack(">hii", 1, 30000, 1) + struct.pack(">h", 1) + b"t"
                   + struct.pack(">ii", 1, 0) + struct.pack(">i", 500) + b"short"),
    "fetch-v3": (kp.FETCH, 3, struct.pack(">iiii", -1, 0, 1, 100) + struct.pack(">i", 1)),
}


@pytest.mark.parametrize("case", sorted(TRUNCATED_OLD))
def test_truncated_old_version_request_closes_connection(sentinel, case):
    api, v, body = TRUNCATED_OLD[case]
    s = raw_conn(sentinel.broker)
    s.sendall(kp.encode_request(api, v, 78, body))
    assert kp.wait_closed(s), f"connection not closed after a truncated {case}"
    s.close()
    sentinel.check()


@pytest.mark.parametrize("case", sorted(ALLOC_CASES))
def test_array_length_claiming_2g_elements(sentinel, case):
    api, v, body = ALLOC_CASES[case]
    s = raw_conn(sentinel.broker)
    s.sendall(kp.encode_request(api, v, 77, body))
    s.settimeout(30)
    try:
        head = s.recv(4)
        if head:  # an answer instead of a close: a whole frame with our correlation id
            (size,) = struct.unpack(">i", head + kp.recv_exact(s, 4 - len(head)))
            payload = kp.recv_exact(s, size)
            assert struct.unpack(">i", payload[:4])[0] == 77, payload[:16]
    except (ConnectionResetError, BrokenPipeError):
        pass
    finally:
        s.close()
    sentinel.check()


INT32_MAX = 2**31 - 1


def test_create_partitions_with_a_huge_count_is_refused(sentinel):
    # Once an abort: the assignment for 2^31 partitions asked for a 68 GB allocation.
    with sentinel.conn() as c:
        r = c.call(kp.CREATE_PARTITIONS, 3, kp.create_partitions_request(3, [(sentinel.topic, INT32_MAX)]))
        [t] = kp.decode_create_partitions(r, 3)["results"]
        assert t["error_code"] == 37, t  # INVALID_PARTITIONS
        assert "gregor.max.partitions.per.topic" in (t["error_message"] or ""), t
    sentinel.check()


def test_create_topics_with_a_huge_partition_count_is_refused(sentinel):
    with sentinel.conn() as c:
        res = kp.create_topic(c, f"huge-{uuid.uuid4().hex[:8]}", INT32_MAX)
        assert res["error_code"] == 37, res
        res = kp.create_topic(c, f"huge-{uuid.uuid4().hex[:8]}", 50_001)
        assert res["error_code"] == 37, res
    sentinel.check()


def test_partition_bounds_per_topic_and_per_request(broker_factory):
    b = broker_factory({"gregor.max.partitions.per.topic": "10", "gregor.max.partitions.per.request": "15"})
    a, bb, cc = (f"bound-{x}-{uuid.uuid4().hex[:6]}" for x in "abc")
    with kp.Conn(b.host, b.port) as c:
        r = c.call(kp.CREATE_TOPICS, 5, kp.create_topics_request(5, [(a, 10, 1), (bb, 10, 1), (cc, 5, 1)]))
        got = {t["name"]: t["error_code"] for t in kp.decode_create_topics(r, 5)["topics"]}
        # the second topic would bring the request to 20 partitions; the third fits in what is left
        assert got == {a: 0, bb: 37, cc: 0}, got
        r = c.call(kp.CREATE_PARTITIONS, 3, kp.create_partitions_request(3, [(a, 11)]))
        [t] = kp.decode_create_partitions(r, 3)["results"]
        assert t["error_code"] == 37 and "per.topic" in t["error_message"], t
        r = c.call(kp.CREATE_PARTITIONS, 3, kp.create_partitions_request(3, [(a, 10), (cc, 10)]))
        res = {t["name"]: t["error_code"] for t in kp.decode_create_partitions(r, 3)["results"]}
        # a: 10 is not more than it has (37); cc: 10 more would pass 15 in this request
        assert res == {a: 37, cc: 37}, res
        r = c.call(kp.CREATE_PARTITIONS, 3, kp.create_partitions_request(3, [(cc, 8)]))
        [t] = kp.decode_create_partitions(r, 3)["results"]
        assert t["error_code"] == 0, t


def test_num_partitions_above_the_bound_is_refused_at_start(broker_factory):
    from gregor_harness import BrokerStartError
    with pytest.raises(BrokerStartError) as e:
        broker_factory({"num.partitions": "60000"})
    msg = str(e.value)
    assert 'invalid value "60000" for configuration num.partitions' in msg, msg
    assert "gregor.max.partitions.per.topic (50000)" in msg, msg


def closing_lines(broker, since):
    text = broker.log_path.read_bytes()[since:].decode(errors="replace")
    return [line for line in text.splitlines() if "closing connection" in line]


def test_a_client_refused_in_a_loop_gets_one_log_line_per_interval(broker_factory):
    """A client that reconnects after each refusal (Kafka 3.9's tools sending a version the
    broker does not serve) gets one log line per gregor.connection.log.interval.ms, then one
    line that counts the ones left out, not one line per attempt."""
    b = broker_factory({"gregor.connection.log.interval.ms": "3000"})
    since = b.log_path.stat().st_size
    attempts = 300
    t0 = time.monotonic()
    for i in range(attempts):
        s = raw_conn(b)
        s.sendall(kp.encode_request(kp.FETCH, 99, i, b"\x00" * 16, flexible=False))
        assert kp.wait_closed(s), f"connection {i} not closed after Fetch v99"
        s.close()
    spent = time.monotonic() - t0
    lines = closing_lines(b, since)
    # One line per interval begun while the attempts ran, whatever the machine's speed.
    assert 1 <= len(lines) <= 1 + int(spent / 3.0) + 1, f"{len(lines)} lines for {attempts} attempts in {spent:.1f}s"
    assert "unsupported version 99" in lines[0]
    # The next refusal after the interval names how many were left out since the last line.
    deadline = time.monotonic() + 30
    while True:
        s = raw_conn(b)
        s.sendall(kp.encode_request(kp.FETCH, 99, 1, b"\x00" * 16, flexible=False))
        assert kp.wait_closed(s)
        s.close()
        lines = closing_lines(b, since)
        counts = [int(m) for line in lines for m in re.findall(r"suppressed=(\d+)", line)]
        if sum(counts) > 0:
            break
        assert time.monotonic() < deadline, f"no line counted the suppressed ones: {lines}"
        time.sleep(0.2)
    assert sum(counts) + len(lines) >= attempts, f"lines {len(lines)}, counted {counts}"
