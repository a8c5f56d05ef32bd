"""Fetch long-polling: with min_bytes=1 and nothing to return, a Fetch waits up to max_wait_ms;
a record arriving meanwhile answers it early.  Bounds are generous (a loaded CI machine must
not fail them): a wait must last at least half of max_wait, an early answer must come well
before max_wait."""
import select
import time

import kproto as kp
from test_apis import new_topic

V = 11


def test_fetch_waits_for_max_wait_when_nothing_arrives(broker):
    max_wait = 2000
    with kp.Conn(broker.host, broker.port) as c:
        topic = new_topic(c)
        assert kp.produce(c, topic, 0, kp.build_batch([kp.Record(b"one")]))["error_code"] == 0
        t0 = time.monotonic()
        p = kp.fetch(c, topic, 0, 1, version=V, max_wait_ms=max_wait, min_bytes=1)
        waited = time.monotonic() - t0
    assert p["error_code"] == 0 and p["high_watermark"] == 1, p
    assert not kp.decode_batches(p["records"]), "records past the log end?"
    assert waited >= 0.5 * max_wait / 1000, f"a Fetch at the log end with max_wait {max_wait} ms returned after {waited:.3f}s"
    # and max_wait_ms=0 does not wait at all (well under the 2 s above)
    with kp.Conn(broker.host, broker.port) as c:
        t0 = time.monotonic()
        p = kp.fetch(c, topic, 0, 1, version=V, max_wait_ms=0, min_bytes=1)
        assert p["error_code"] == 0
        assert time.monotonic() - t0 < 0.5 * max_wait / 1000


def test_parked_fetch_returns_early_when_a_record_arrives(broker):
    max_wait = 20000
    with kp.Conn(broker.host, broker.port) as c, kp.Conn(broker.host, broker.port) as prod:
        topic = new_topic(c)
        corr = c.send(kp.FETCH, V, kp.fetch_request(V, {topic: {0: 0}}, max_wait_ms=max_wait, min_bytes=1))
        # the Fetch is parked: nothing comes back for a while (max_wait is 20 s)
        readable, _, _ = select.select([c.sock], [], [], 1.0)
        assert not readable, "a Fetch on an empty partition with max_wait 20 s was answered within 1 s"
        t0 = time.monotonic()
        assert kp.produce(prod, topic, 0, kp.build_batch([kp.Record(b"wake-up")]))["error_code"] == 0
        p = kp.decode_fetch(c.recv(kp.FETCH, V, corr), V)["responses"][0]["partitions"][0]
        took = time.monotonic() - t0
    assert p["error_code"] == 0, p
    assert [r.value for b in kp.decode_batches(p["records"]) for r in b.records] == [b"wake-up"], p
    assert took < 0.5 * max_wait / 1000, f"the parked Fetch answered {took:.3f}s after the produce (max_wait 20 s)"
