"""The I/O pool (num.io.threads, Kafka's request handler pool): an append that rolls a segment
or is due an fsync, and a read from below the active segment, run there, one job per request
(counted in gregor_io_pool_jobs_total), and what goes through it is what the network workers'
path writes and reads. A fetch that finds nothing new does not go there. (A value below 1 is
refused at start: test_config.)"""
import uuid

import kproto as kp
from gregor_harness import free_port
from test_apis import wait_leader
from test_request_limits import metric

JOBS = "gregor_io_pool_jobs_total"


def fetch(c: kp.Conn, topic: str, offset: int) -> dict:
    r = c.call(kp.FETCH, 11, kp.fetch_request(11, {topic: {0: offset}}, max_wait_ms=0))
    p = kp.decode_fetch(r, 11)["responses"][0]["partitions"][0]
    assert p["error_code"] == 0, p
    return p


def test_rolls_fsyncs_and_reads_below_the_active_segment_go_through_the_pool(broker_factory):
    mport = free_port()
    b = broker_factory({"num.io.threads": "1", "log.segment.bytes": "4096", "log.flush.interval.messages": "50",
                        "metrics.port": str(mport), "metrics.host": "127.0.0.1"})
    with kp.Conn(b.host, b.port) as c:
        topic = f"io-{uuid.uuid4().hex[:8]}"
        assert kp.create_topic(c, topic)["error_code"] == 0
        wait_leader(c, topic, 1)
        sent = []
        start = metric(mport, JOBS)
        for i in range(60):
            recs = [kp.Record(b"value-%03d-%d-" % (i, j) + b"x" * 100, b"k%d" % j) for j in range(3)]
            assert kp.produce(c, topic, 0, kp.build_batch(recs))["error_code"] == 0
            sent += [(r.key, r.value) for r in recs]
        produced = metric(mport, JOBS)
        # 60 batches of ~400 B roll a 4 KiB segment about six times and pass 50 messages three
        # times; every other append only writes to the page cache.
        assert start < produced < start + 60, (start, produced)

        got, offset = [], 0
        while offset < len(sent):
            p = fetch(c, topic, offset)
            batches = kp.decode_batches(p["records"])
            assert batches and all(bt.crc_ok for bt in batches)
            recs = [r for bt in batches for r in bt.records if r.offset >= offset]
            got += [(r.key, r.value) for r in recs]
            offset = recs[-1].offset + 1
        assert got == sent
        read = metric(mport, JOBS)
        assert read > produced, "reads of rolled segments did not go through the pool"

        p = fetch(c, topic, len(sent))
        assert p["high_watermark"] == len(sent) and not p["records"]
        assert metric(mport, JOBS) == read, "a fetch that found nothing new went through the pool"
