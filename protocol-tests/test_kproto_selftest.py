"""Self-tests of the hand-written codec (no broker needed)."""
import struct

import pytest

import kproto as kp


def test_crc32c_known_vectors():
    assert kp.crc32c(b"123456789") == 0xE3069283
    assert kp.crc32c(b"") == 0
    assert kp.crc32c(b"\x00" * 32) == 0x8A9136AA


def test_crc32c_matches_package():
    crc32c = pytest.importorskip("crc32c")
    for data in (b"a", b"hello world", bytes(range(256)) * 3):
        assert kp.crc32c(data) == crc32c.crc32c(data)


@pytest.mark.parametrize("n,enc", [(0, b"\x00"), (-1, b"\x01"), (1, b"\x02"), (-64, b"\x7f"), (64, b"\x80\x01"),
                                   (300, b"\xd8\x04")])
def test_zigzag_varint(n, enc):
    assert kp.varint(n) == enc
    assert kp.R(enc).varint() == n


def test_uvarint():
    for n in (0, 1, 127, 128, 300, 2**31, 2**40):
        assert kp.R(kp.uvarint(n)).uvarint() == n


def test_batch_roundtrip():
    recs = [kp.Record(value=b"v%d" % i, key=b"k%d" % i, headers=[("h", b"x"), ("h", None), ("e", b"")],
                      timestamp=1_700_000_000_000 + i) for i in range(5)]
    recs.append(kp.Record(value=None, key=None))
    for codec in (kp.CODEC_NONE, kp.CODEC_GZIP):
        b = kp.build_batch(recs, codec=codec, base_offset=7)
        (base, blen) = struct.unpack(">qi", b[:12])
        assert base == 7 and blen == len(b) - 12
        [dec] = kp.decode_batches(b)
        assert dec.crc_ok and dec.magic == 2 and dec.last_offset_delta == 5
        assert [(r.key, r.value, r.headers, r.offset) for r in dec.records[:5]] == \
               [(r.key, r.value, r.headers, 7 + i) for i, r in enumerate(recs[:5])]
        assert dec.records[5].value is None and dec.records[5].key is None
        assert dec.max_timestamp == 1_700_000_000_004
    bad = kp.build_batch(recs, corrupt_crc=True)
    assert not kp.decode_batches(bad)[0].crc_ok


def test_request_header_flexible():
    h = kp.request_header(kp.API_VERSIONS, 3, 7, client_id="c")
    assert h == struct.pack(">hhih", 18, 3, 7, 1) + b"c" + b"\x00"
    h = kp.request_header(kp.METADATA, 1, 7, client_id=None)
    assert h == struct.pack(">hhih", 3, 1, 7, -1)


def test_api_versions_v3_body():
    assert kp.api_versions_request(3, "ab", "1") == b"\x03ab\x021\x00"


@pytest.mark.parametrize("api", sorted(kp.ENCODER_RANGES))
def test_every_request_encodes(api):
    lo, hi = kp.ENCODER_RANGES[api]
    for v in range(lo, hi + 1):
        body = build_min_request(api, v, "t")
        assert isinstance(body, bytes)


def build_min_request(api, v, topic):
    return {
        kp.API_VERSIONS: lambda: kp.api_versions_request(v),
        kp.METADATA: lambda: kp.metadata_request(v, [topic]),
        kp.PRODUCE: lambda: kp.produce_request(v, {topic: {0: kp.build_batch([kp.Record(b"x")])}}),
        kp.FETCH: lambda: kp.fetch_request(v, {(topic if v < 13 else b"\x01" * 16): {0: 0}}),
        kp.LIST_OFFSETS: lambda: kp.list_offsets_request(v, {topic: {0: -1}}),
        kp.CREATE_TOPICS: lambda: kp.create_topics_request(v, [(topic, 1, 1)]),
        kp.DELETE_TOPICS: lambda: kp.delete_topics_request(v, [topic]),
        kp.CREATE_PARTITIONS: lambda: kp.create_partitions_request(v, [(topic, 2)]),
        kp.DESCRIBE_CONFIGS: lambda: kp.describe_configs_request(v, [(kp.RESOURCE_TOPIC, topic, None)]),
        kp.INCREMENTAL_ALTER_CONFIGS: lambda: kp.incremental_alter_configs_request(
            v, [(kp.RESOURCE_TOPIC, topic, [("retention.ms", 0, "86400000")])]),
        kp.DESCRIBE_CLUSTER: lambda: kp.describe_cluster_request(v),
        kp.INIT_PRODUCER_ID: lambda: kp.init_producer_id_request(v),
        kp.DELETE_RECORDS: lambda: kp.delete_records_request(v, {topic: {0: 0}}),
    }[api]()
