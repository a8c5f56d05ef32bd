"""Message formats v0 and v1 at the wire, with raw frames: Produce v0-v2 message sets are
validated and stored as v2 batches; Fetch v0-v3 answers are down-converted message sets.

What Kafka 3.9 does and these tests hold gregor to:
* every message's CRC-32 (inner messages of compressed wrappers too) is checked; a bad one is
  CORRUPT_MESSAGE and nothing is stored; a compressed message inside a compressed message is
  INVALID_RECORD; zstd in format v0/v1 is UNSUPPORTED_COMPRESSION_TYPE;
* a set becomes one v2 batch with the codec of its last message, timestamps kept (format v1)
  or -1 (format v0), offsets assigned by the broker;
* Fetch v0/v1 get format v0, v2/v3 format v1; uncompressed batches are trimmed to the fetch
  offset, compressed ones come as one wrapper each; a fetch is down-converted no further than
  its size limit after the first batch.
"""
import urllib.request
import uuid

import pytest

import kproto as kp
from gregor_harness import free_port
from test_apis import new_topic, wait_leader

CORRUPT_MESSAGE, INVALID_RECORD, UNSUPPORTED_COMPRESSION_TYPE = 2, 87, 76
CODECS = [kp.CODEC_GZIP, kp.CODEC_SNAPPY, kp.CODEC_LZ4]
TS = 1_700_000_000_000


def produce(c, topic, v, records):
    r = kp.decode_produce(c.call(kp.PRODUCE, v, kp.produce_request(v, {topic: {0: records}})), v)
    return r["responses"][0]["partitions"][0]


def fetch_v11(c, topic, offset=0):
    """What a modern reader sees: (offset, key, value, timestamp, codec) per record."""
    r = kp.decode_fetch(c.call(kp.FETCH, 11, kp.fetch_request(11, {topic: {0: offset}})), 11)
    p = r["responses"][0]["partitions"][0]
    assert p["error_code"] == 0, p
    return [(rec.offset, rec.key, rec.value, rec.timestamp, b.attributes & 7)
            for b in kp.decode_batches(p["records"]) for rec in b.records]


def fetch_old(c, topic, v, offset=0, partition_max_bytes=10 * 1024 * 1024):
    req = kp.fetch_request(v, {topic: {0: offset}}, partition_max_bytes=partition_max_bytes)
    p = kp.decode_fetch(c.call(kp.FETCH, v, req), v)["responses"][0]["partitions"][0]
    return p


def msgs(n, magic, prefix=b"m"):
    return [kp.Message(prefix + b"-v%d" % i, prefix + b"-k%d" % i if i % 2 else None,
                       TS + i if magic else -1, 0, magic) for i in range(n)]


@pytest.mark.parametrize("v", [0, 1, 2])
@pytest.mark.parametrize("codec", [kp.CODEC_NONE] + CODECS)
def test_old_produce_is_stored_as_one_v2_batch(broker, v, codec):
    magic = 1 if v == 2 else 0
    with kp.Conn(broker.host, broker.port) as c:
        topic = new_topic(c)
        sent = msgs(5, magic)
        data = kp.message_set(sent) if codec == kp.CODEC_NONE else kp.compressed_message_set(sent, codec, magic)
        for base in (0, 5):
            p = produce(c, topic, v, data)
            assert (p["error_code"], p["base_offset"]) == (0, base), p
        got = fetch_v11(c, topic)
        want = [(i, m.key, m.value, m.timestamp, codec) for i, m in enumerate(sent + sent)]
        assert got == want
        r = kp.decode_fetch(c.call(kp.FETCH, 11, kp.fetch_request(11, {topic: {0: 0}})), 11)
        assert len(kp.decode_batches(r["responses"][0]["partitions"][0]["records"])) == 2, "one batch per request"


def test_uncompressed_and_compressed_messages_in_one_set(broker):
    with kp.Conn(broker.host, broker.port) as c:
        topic = new_topic(c)
        a, b = msgs(2, 1, b"a"), msgs(3, 1, b"b")
        data = kp.message_set(a) + kp.compressed_message_set(b, kp.CODEC_GZIP)
        assert produce(c, topic, 2, data)["error_code"] == 0
        got = fetch_v11(c, topic)
        assert [(o, k, v, t) for o, k, v, t, _ in got] == [(i, m.key, m.value, m.timestamp) for i, m in enumerate(a + b)]
        assert {codec for *_, codec in got} == {kp.CODEC_GZIP}, "the set takes the codec of its last message"


def bad_sets():
    good = kp.message_set(msgs(3, 1))
    flipped = bytearray(good)
    flipped[36] ^= 0x01  # inside the first value
    inner_bad = bytearray(kp.message_set(msgs(2, 1)))
    inner_bad[-1] ^= 0x01
    bad_wrapper = kp.encode_message(kp.Message(kp.compress(kp.CODEC_GZIP, bytes(inner_bad)), None, TS, 1, 1,
                                               kp.CODEC_GZIP))
    nested = kp.encode_message(kp.Message(kp.compress(kp.CODEC_GZIP, kp.compressed_message_set(msgs(2, 1), kp.CODEC_GZIP)),
                                          None, TS, 0, 1, kp.CODEC_GZIP))
    zstd = kp.encode_message(kp.Message(kp.compress(kp.CODEC_ZSTD, kp.message_set(msgs(2, 1))), None, TS, 1, 1,
                                        kp.CODEC_ZSTD))
    garbage = kp.encode_message(kp.Message(b"not gzip at all", None, TS, 0, 1, kp.CODEC_GZIP))
    return {
        "bad-crc": (bytes(flipped), CORRUPT_MESSAGE),
        "truncated": (good[:-3], CORRUPT_MESSAGE),
        "inner-bad-crc": (bad_wrapper, CORRUPT_MESSAGE),
        "undecompressable": (garbage, CORRUPT_MESSAGE),
        "nested-compression": (nested, INVALID_RECORD),
        "zstd-in-v1": (zstd, UNSUPPORTED_COMPRESSION_TYPE),
    }


@pytest.mark.parametrize("case", sorted(bad_sets()))
def test_bad_message_sets_are_refused_and_nothing_is_stored(broker, case):
    data, code = bad_sets()[case]
    with kp.Conn(broker.host, broker.port) as c:
        topic = new_topic(c)
        assert produce(c, topic, 2, kp.message_set(msgs(1, 1)))["error_code"] == 0
        p = produce(c, topic, 2, data)
        assert p["error_code"] == code, p
        assert kp.list_offset(c, topic, 0, kp.LATEST)["offset"] == 1
        assert len(fetch_v11(c, topic)) == 1
        # the connection still works: the refusal was an answer, not a close
        assert produce(c, topic, 2, kp.message_set(msgs(1, 1)))["base_offset"] == 1


@pytest.mark.parametrize("v", [0, 1, 2, 3])
@pytest.mark.parametrize("codec", [kp.CODEC_NONE] + CODECS)
def test_old_fetch_reads_modern_batches(broker, v, codec):
    """v2 batches (headers and all) read through Fetch v0-3: same keys, values and, in format
    v1, timestamps; an uncompressed batch trimmed to the fetch offset, a compressed one whole."""
    magic = 0 if v <= 1 else 1
    recs = [kp.Record(value=b"v%d" % i, key=b"k%d" % i, headers=[("h", b"x")], timestamp=TS + i) for i in range(6)]
    with kp.Conn(broker.host, broker.port) as c:
        topic = new_topic(c)
        assert kp.produce(c, topic, 0, kp.build_batch(recs[:4], codec=codec))["error_code"] == 0
        assert kp.produce(c, topic, 0, kp.build_batch(recs[4:], codec=codec))["error_code"] == 0
        for start in (0, 2, 5):
            p = fetch_old(c, topic, v, start)
            assert (p["error_code"], p["high_watermark"]) == (0, 6), p
            got = [(m.offset, m.magic, m.key, m.value, m.timestamp) for m in kp.decode_message_set(p["records"])]
            want = [(i, magic, r.key, r.value, r.timestamp if magic else -1) for i, r in enumerate(recs)]
            if codec == kp.CODEC_NONE:
                assert got == want[start:], (start, got)
            else:
                first = 0 if start < 4 else 4
                assert got == want[first:], (start, got)


def test_old_fetch_is_converted_no_further_than_its_limit(broker):
    with kp.Conn(broker.host, broker.port) as c:
        topic = new_topic(c)
        for i in range(20):
            batch = kp.build_batch([kp.Record(value=b"%02d" % i + b"x" * 1000, timestamp=TS)])
            assert kp.produce(c, topic, 0, batch)["error_code"] == 0
        p = fetch_old(c, topic, 2, partition_max_bytes=3000)
        got = kp.decode_message_set(p["records"])
        assert 1 <= len(got) <= 4 and len(p["records"]) <= 3000 + 1100, (len(got), len(p["records"]))
        assert [m.offset for m in got] == list(range(len(got)))
        # the first batch comes whole even when it alone is over the limit
        p = fetch_old(c, topic, 2, offset=7, partition_max_bytes=10)
        assert [m.offset for m in kp.decode_message_set(p["records"])] == [7]
        # a v0 fetch with no limit still ends at the high watermark
        p = fetch_old(c, topic, 0)
        assert [m.offset for m in kp.decode_message_set(p["records"])] == list(range(20))


def test_zstd_batches_are_refused_to_old_readers(broker):
    with kp.Conn(broker.host, broker.port) as c:
        topic = new_topic(c)
        recs = [kp.Record(value=b"z%d" % i, timestamp=TS) for i in range(3)]
        assert kp.produce(c, topic, 0, kp.build_batch(recs, codec=kp.CODEC_ZSTD))["error_code"] == 0
        for v in range(4):
            assert fetch_old(c, topic, v)["error_code"] == UNSUPPORTED_COMPRESSION_TYPE
        assert len(fetch_v11(c, topic)) == 3


def test_v2_batch_in_an_old_produce_is_taken_as_it_is(broker):
    """Kafka does not check the magic of Produce v0-2 data; a v2 batch is appended as sent."""
    with kp.Conn(broker.host, broker.port) as c:
        topic = new_topic(c)
        recs = [kp.Record(value=b"v2-in-old", headers=[("h", b"1")], timestamp=TS)]
        assert produce(c, topic, 1, kp.build_batch(recs))["error_code"] == 0
        assert [(o, v) for o, _k, v, _t, _c in fetch_v11(c, topic)] == [(0, b"v2-in-old")]


UNSUPPORTED_VERSION = 35


def _metric(port, name):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    return None


@pytest.mark.parametrize("where", ["topic", "broker"])
def test_down_conversion_disabled_answers_unsupported_version(broker_factory, where):
    """message.downconversion.enable=false (topic) or log.message.downconversion.enable=false
    (broker): every partition fetched with v0-v3 is UNSUPPORTED_VERSION, stored data or not,
    as Kafka's maybeConvertFetchedData answers; v4+ and produce are unaffected."""
    overrides = {"log.message.downconversion.enable": "false"} if where == "broker" else {}
    b = broker_factory(overrides)
    with kp.Conn(b.host, b.port) as c:
        name = f"noconv-{where}-{uuid.uuid4().hex[:8]}"
        configs = {"message.downconversion.enable": "false"} if where == "topic" else None
        r = kp.decode_create_topics(c.call(kp.CREATE_TOPICS, 5, kp.create_topics_request(5, [(name, 1, 1)], configs=configs)), 5)
        assert r["topics"][0]["error_code"] == 0, r
        wait_leader(c, name, 1)
        allowed = new_topic(c) if where == "topic" else None
        for v in (0, 1, 2, 3):
            p = fetch_old(c, name, v)
            assert p["error_code"] == UNSUPPORTED_VERSION, (v, p)
        # produce in an old format still works; a v4+ reader gets the records
        assert produce(c, name, 2, kp.message_set(msgs(3, 1)))["error_code"] == 0
        for v in (0, 3):
            assert fetch_old(c, name, v)["error_code"] == UNSUPPORTED_VERSION
        assert [k for _o, k, _v, _t, _c in fetch_v11(c, name)] == [None, b"m-k1", None]
        if allowed:
            assert produce(c, allowed, 2, kp.message_set(msgs(2, 1)))["error_code"] == 0
            p = fetch_old(c, allowed, 2)
            assert p["error_code"] == 0 and len(kp.decode_message_set(p["records"])) == 2


def test_conversions_are_counted_in_metrics(broker_factory):
    port = free_port()
    b = broker_factory({"metrics.port": str(port), "metrics.host": "127.0.0.1"})
    produced = "kafka_server_brokertopicmetrics_producemessageconversions_total"
    fetched = "kafka_server_brokertopicmetrics_fetchmessageconversions_total"
    assert (_metric(port, produced), _metric(port, fetched)) == (0, 0)
    with kp.Conn(b.host, b.port) as c:
        topic = new_topic(c)
        assert produce(c, topic, 1, kp.compressed_message_set(msgs(7, 0), kp.CODEC_GZIP, 0))["error_code"] == 0
        assert produce(c, topic, 8, kp.build_batch([kp.Record(b"v", b"k")] * 4))["error_code"] == 0
        assert _metric(port, produced) == 7
        assert len(kp.decode_message_set(fetch_old(c, topic, 3)["records"])) == 11
        assert _metric(port, fetched) == 11
        fetch_v11(c, topic)
        assert _metric(port, fetched) == 11
