"""Fetch sessions (KIP-227) for consumers, in raw frames: a full fetch with epoch 0 opens a
session; incremental fetches name only what changed and are answered with only the partitions
that have something new; a wrong epoch or an unknown id is refused with its own error."""
import kproto as kp
from test_apis import new_topic

V = 12
FETCH_SESSION_ID_NOT_FOUND = 70
INVALID_FETCH_SESSION_EPOCH = 71


def fetch(c, topics, **kw):
    r = c.call(kp.FETCH, V, kp.fetch_request(V, topics, max_wait_ms=0, **kw))
    return kp.decode_fetch(r, V)


def answered(resp):
    """{partition: (high watermark, [record values])} of a one-topic answer."""
    out = {}
    for t in resp["responses"]:
        for p in t["partitions"]:
            assert p["error_code"] == 0, p
            out[p["partition_index"]] = (p["high_watermark"],
                                         [r.value for b in kp.decode_batches(p["records"]) for r in b.records])
    return out


def produce(c, topic, partition, *values):
    batch = kp.build_batch([kp.Record(v) for v in values])
    assert kp.produce(c, topic, partition, batch)["error_code"] == 0


def test_incremental_fetches_answer_only_what_changed(broker):
    with kp.Conn(broker.host, broker.port) as c:
        topic = new_topic(c, partitions=3)
        produce(c, topic, 0, b"a", b"b")
        full = fetch(c, {topic: {0: 0, 1: 0, 2: 0}}, session_epoch=0)
        sid = full["session_id"]
        assert full["error_code"] == 0 and sid != 0, full
        assert answered(full) == {0: (2, [b"a", b"b"]), 1: (0, []), 2: (0, [])}

        # p0's position moved: named; nothing new anywhere, so no partition in the answer.
        inc = fetch(c, {topic: {0: 2}}, session_id=sid, session_epoch=1)
        assert inc["error_code"] == 0 and inc["session_id"] == sid, inc
        assert answered(inc) == {}

        # Data on p2, which the request does not name: the session knows where it reads.
        produce(c, topic, 2, b"c")
        inc = fetch(c, {}, session_id=sid, session_epoch=2)
        assert answered(inc) == {2: (1, [b"c"])}

        # p2 forgotten: its news no longer comes; p1's does.
        produce(c, topic, 2, b"d")
        produce(c, topic, 1, b"e")
        inc = fetch(c, {}, session_id=sid, session_epoch=3, forgotten={topic: [2]})
        assert answered(inc) == {1: (1, [b"e"])}

        # The same epoch again (a retried request) is refused; the session stays usable.
        again = fetch(c, {}, session_id=sid, session_epoch=3)
        assert again["error_code"] == INVALID_FETCH_SESSION_EPOCH and again["responses"] == [], again
        assert fetch(c, {}, session_id=sid, session_epoch=4)["error_code"] == 0

        # An unknown id, and the id of a session closed by a full fetch with epoch -1.
        assert fetch(c, {}, session_id=sid + 1000, session_epoch=1)["error_code"] == FETCH_SESSION_ID_NOT_FOUND
        closing = fetch(c, {topic: {0: 2}}, session_id=sid, session_epoch=-1)
        assert closing["error_code"] == 0 and closing["session_id"] == 0, closing
        gone = fetch(c, {}, session_id=sid, session_epoch=5)
        assert gone["error_code"] == FETCH_SESSION_ID_NOT_FOUND, gone


def test_a_full_fetch_replaces_the_session_it_names(broker):
    with kp.Conn(broker.host, broker.port) as c:
        topic = new_topic(c)
        first = fetch(c, {topic: {0: 0}}, session_epoch=0)["session_id"]
        second = fetch(c, {topic: {0: 0}}, session_id=first, session_epoch=0)
        assert second["session_id"] not in (0, first), second
        assert fetch(c, {}, session_id=first, session_epoch=1)["error_code"] == FETCH_SESSION_ID_NOT_FOUND
        assert fetch(c, {}, session_id=second["session_id"], session_epoch=1)["error_code"] == 0


def test_no_session_slots_means_full_fetches_without_sessions(broker_factory):
    b = broker_factory({"max.incremental.fetch.session.cache.slots": "1"})
    with kp.Conn(b.host, b.port) as c:
        topic = new_topic(c)
        produce(c, topic, 0, b"x")
        held = fetch(c, {topic: {0: 0}}, session_epoch=0)["session_id"]
        assert held != 0
        # The one slot holds a session younger than Kafka's eviction age, as large as this
        # one: this consumer is answered in full, without a session.
        other = fetch(c, {topic: {0: 0}}, session_epoch=0)
        assert other["error_code"] == 0 and other["session_id"] == 0, other
        assert answered(other) == {0: (1, [b"x"])}
        assert fetch(c, {}, session_id=held, session_epoch=1)["error_code"] == 0


def test_a_partition_left_out_of_a_full_response_comes_in_the_next_incremental_one(broker):
    # The consumer names only partitions whose position moved: one that had records but got
    # none (the response was full) must still be read by the next incremental fetch.
    with kp.Conn(broker.host, broker.port) as c:
        topic = new_topic(c, partitions=2)
        produce(c, topic, 0, b"x" * 2000)
        produce(c, topic, 1, b"y" * 2000)
        full = fetch(c, {topic: {0: 0, 1: 0}}, session_epoch=0, max_bytes=1)
        sid = full["session_id"]
        assert sid != 0 and answered(full) == {0: (1, [b"x" * 2000]), 1: (1, [])}, full
        inc = fetch(c, {topic: {0: 1}}, session_id=sid, session_epoch=1)
        assert answered(inc) == {1: (1, [b"y" * 2000])}


def test_records_deleted_below_a_consumer_come_as_a_new_log_start_offset(broker):
    """DeleteRecords moves the log start of a partition the consumer is caught up on: the next
    incremental answer names it with the new log start offset, as Kafka's does."""
    with kp.Conn(broker.host, broker.port) as c:
        topic = new_topic(c, partitions=2)
        produce(c, topic, 0, b"a", b"b", b"c")
        full = fetch(c, {topic: {0: 3, 1: 0}}, session_epoch=0)
        sid = full["session_id"]
        assert sid != 0 and fetch(c, {}, session_id=sid, session_epoch=1)["responses"] == []

        r = kp.decode_delete_records(c.call(kp.DELETE_RECORDS, 2, kp.delete_records_request(2, {topic: {0: 2}})), 2)
        assert r["topics"][0]["partitions"][0]["error_code"] == 0, r

        inc = fetch(c, {}, session_id=sid, session_epoch=2)
        parts = [p for t in inc["responses"] for p in t["partitions"]]
        assert [(p["partition_index"], p["log_start_offset"]) for p in parts] == [(0, 2)], inc
