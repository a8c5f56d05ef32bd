"""Idempotent-producer sequence handling by hand (KAFKA-FACTS §9)."""
import time
import uuid

import kproto as kp

OUT_OF_ORDER_SEQUENCE_NUMBER = 45
DUPLICATE_SEQUENCE_NUMBER = 46


def setup(broker):
    c = kp.Conn(broker.host, broker.port)
    name = f"idem-{uuid.uuid4().hex[:8]}"
    assert kp.create_topic(c, name, 1)["error_code"] == 0
    deadline = time.monotonic() + 30
    while kp.metadata(c, [name])["topics"][0]["partitions"][0]["leader_id"] < 0:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    r = c.call(kp.INIT_PRODUCER_ID, 4, kp.init_producer_id_request(4))
    pid = kp.decode_init_producer_id(r, 4)
    assert pid["error_code"] == 0
    return c, name, pid["producer_id"], pid["producer_epoch"]


def batch(pid, epoch, seq, n, tag):
    return kp.build_batch([kp.Record(b"%s-%d" % (tag, seq + i)) for i in range(n)], producer_id=pid,
                          producer_epoch=epoch, base_sequence=seq)


def test_sequences_in_order_accepted(broker):
    c, t, pid, ep = setup(broker)
    with c:
        for i in range(5):
            p = kp.produce(c, t, 0, batch(pid, ep, i * 3, 3, b"s"))
            assert p["error_code"] == 0 and p["base_offset"] == i * 3, p
        got = kp.fetch_all(c, t, 0)
        assert [r.value for r in got] == [b"s-%d" % i for i in range(15)]
        bs = kp.decode_batches(kp.fetch(c, t, 0, 0)["records"])
        assert [(b.producer_id, b.producer_epoch, b.base_sequence) for b in bs][:1] == [(pid, ep, 0)]


def test_duplicate_batch_not_appended(broker):
    c, t, pid, ep = setup(broker)
    with c:
        first = kp.produce(c, t, 0, batch(pid, ep, 0, 3, b"d"))
        second = kp.produce(c, t, 0, batch(pid, ep, 3, 2, b"d"))
        assert first["error_code"] == 0 and second["error_code"] == 0
        # retry of the first batch (same pid/epoch/sequence range): success, original offset, not appended
        dup = kp.produce(c, t, 0, batch(pid, ep, 0, 3, b"d"))
        assert dup["error_code"] in (0, DUPLICATE_SEQUENCE_NUMBER), dup
        assert dup["base_offset"] == first["base_offset"] or dup["error_code"] == DUPLICATE_SEQUENCE_NUMBER, \
            f"duplicate answered with base_offset {dup['base_offset']}, original {first['base_offset']}"
        assert kp.list_offset(c, t, 0, kp.LATEST)["offset"] == 5, "duplicate batch was appended"


def test_out_of_order_sequence_rejected(broker):
    c, t, pid, ep = setup(broker)
    with c:
        assert kp.produce(c, t, 0, batch(pid, ep, 0, 3, b"o"))["error_code"] == 0
        gap = kp.produce(c, t, 0, batch(pid, ep, 10, 2, b"o"))
        assert gap["error_code"] == OUT_OF_ORDER_SEQUENCE_NUMBER, f"sequence gap 3 -> 10 answered {gap}"
        assert kp.list_offset(c, t, 0, kp.LATEST)["offset"] == 3, "out-of-order batch was appended"
        # the expected next sequence still works
        ok = kp.produce(c, t, 0, batch(pid, ep, 3, 1, b"o"))
        assert ok["error_code"] == 0 and ok["base_offset"] == 3


def test_sequence_state_survives_restart(broker):
    c, t, pid, ep = setup(broker)
    with c:
        assert kp.produce(c, t, 0, batch(pid, ep, 0, 3, b"r"))["error_code"] == 0
    assert broker.restart("term") == 0
    with kp.Conn(broker.host, broker.port) as c:
        dup = kp.produce(c, t, 0, batch(pid, ep, 0, 3, b"r"))
        assert dup["error_code"] in (0, DUPLICATE_SEQUENCE_NUMBER)
        assert kp.list_offset(c, t, 0, kp.LATEST)["offset"] == 3, "duplicate appended after restart"
        nxt = kp.produce(c, t, 0, batch(pid, ep, 3, 1, b"r"))
        assert nxt["error_code"] == 0 and nxt["base_offset"] == 3
