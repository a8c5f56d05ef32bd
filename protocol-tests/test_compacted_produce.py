"""Produce to a compacted topic at the wire: keyless records get INVALID_RECORD (87) with
Kafka's per-record errors (Produce v8+ record_errors, error_message), and nothing of the batch
is written."""
import uuid

import pytest

import kproto as kp
from test_apis import wait_leader

INVALID_RECORD = 87


def compacted_topic(c):
    name = f"compacted-{uuid.uuid4().hex[:8]}"
    r = c.call(kp.CREATE_TOPICS, 5, kp.create_topics_request(5, [(name, 1, 1)], configs={"cleanup.policy": "compact"}))
    assert kp.decode_create_topics(r, 5)["topics"][0]["error_code"] == 0
    wait_leader(c, name, 1)
    return name


@pytest.mark.parametrize("codec", [kp.CODEC_NONE, kp.CODEC_GZIP])
def test_keyless_records_are_named_in_record_errors(broker, codec):
    with kp.Conn(broker.host, broker.port) as c:
        t = compacted_topic(c)
        batch = kp.build_batch([kp.Record(b"v", key=b"a"), kp.Record(b"v"), kp.Record(b"v", key=b"c"),
                                kp.Record(None)], codec=codec)
        p = kp.produce(c, t, 0, batch, version=8)
        assert p["error_code"] == INVALID_RECORD
        assert [e["batch_index"] for e in p["record_errors"]] == [1, 3]
        for e in p["record_errors"]:
            assert e["message"] == f"Compacted topic cannot accept message without key in topic partition {t}-0"
        assert p["error_message"].startswith("One or more records have been rejected due to 2 record errors")
        # Before v8 there is no room for the details; the code is the same.
        assert kp.produce(c, t, 0, batch, version=7)["error_code"] == INVALID_RECORD
        keyed = kp.build_batch([kp.Record(b"v", key=b"a"), kp.Record(None, key=b"b")], codec=codec)
        p = kp.produce(c, t, 0, keyed, version=8)
        assert p["error_code"] == 0 and p["base_offset"] == 0, "nothing of the refused batches was written"
        assert p["record_errors"] == [] and p["error_message"] is None
