"""Compressed batches pass through byte for byte: what the producer sent (from the CRC on) is
what the segment file holds and what a Fetch returns; only base offset and leader epoch, which
the CRC does not cover, are the broker's.  Every codec Kafka has."""
import pytest

import kproto as kp
from test_apis import new_topic, sample_records

CODECS = {"gzip": kp.CODEC_GZIP, "snappy": kp.CODEC_SNAPPY, "lz4": kp.CODEC_LZ4, "zstd": kp.CODEC_ZSTD}


@pytest.mark.parametrize("codec", sorted(CODECS))
def test_compressed_batch_passes_through_byte_for_byte(broker, codec):
    with kp.Conn(broker.host, broker.port) as c:
        topic = new_topic(c)
        sent = []
        for n, tag in ((50, b"a"), (30, b"b")):
            recs = sample_records(n, tag + codec.encode())
            batch = kp.build_batch(recs, codec=CODECS[codec])
            assert kp.decode_batches(batch)[0].crc_ok
            p = kp.produce(c, topic, 0, batch)
            assert p["error_code"] == 0, p
            sent.append((batch, recs, p["base_offset"]))
        assert [b for _, _, b in sent] == [0, 50]
        got = kp.decode_batches(kp.fetch(c, topic, 0, 0)["records"])
    assert [g.base_offset for g in got] == [0, 50], [g.base_offset for g in got]
    for (batch, recs, base), g in zip(sent, got):
        assert g.raw[17:] == batch[17:], f"{codec} batch at {base} changed between produce and fetch"
        assert g.crc_ok and g.attributes & 7 == CODECS[codec]
        assert [(r.offset, r.key, r.value, r.headers, r.timestamp) for r in g.records] == \
            [(base + i, r.key, r.value, r.headers, r.timestamp) for i, r in enumerate(recs)]
    # on disk too: the segment holds the client's bytes
    seg = (broker.data_dir / f"{topic}-0" / "00000000000000000000.log").read_bytes()
    for batch, _, _ in sent:
        assert batch[17:] in seg, f"{codec}: the segment file does not hold the produced batch bytes"
