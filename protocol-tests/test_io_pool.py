"""The I/O pool (num.io.threads, Kafka's request handler pool): an append that rolls a segment
or is due an fsync, and a read from below the active segment, run there, one job per request
(counted in gregor_io_pool_jobs_total), and what goes through it is what the network workers'
path writes and reads. A fetch that finds nothing new does not go there. (A value below 1 is
refused at start: test_config.) num.io.threads is a dynamic broker config: the pool's size
(gregor_io_pool_threads) follows it."""
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


def read_records(c: kp.Conn, topic: str, count: int) -> list:
    """The first `count` records of partition 0, fetched batch by batch from offset 0."""
    got, offset = [], 0
    while offset < count:
        batches = kp.decode_batches(fetch(c, topic, offset)["records"])
        assert batches and all(bt.crc_ok for bt in batches)
        recs = [r for bt in batches for r in bt.records if r.offset >= offset]
        got += recs
        offset = recs[-1].offset + 1
    return got


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

        got = [(r.key, r.value) for r in read_records(c, topic, len(sent))]
        assert got == sent
        read = metric(mport, JOBS)
        assert read > produced, "reads of rolled segments did not go through the pool"

        p = fetch(c, topic, len(sent))
        assert p["high_watermark"] == len(sent) and not p["records"]
        assert metric(mport, JOBS) == read, "a fetch that found nothing new went through the pool"


THREADS = "gregor_io_pool_threads"
SET, DELETE = 0, 1


def test_num_io_threads_is_dynamic_per_broker_and_cluster_wide(broker_factory):
    """num.io.threads (Kafka's DynamicThreadPool key) through IncrementalAlterConfigs and
    AlterConfigs: this broker's value over the cluster default over the static one, the pool
    resized each time (gregor_io_pool_threads), Kafka's bounds enforced, and appends that each
    go through the pool (log.flush.interval.messages=1) kept going and kept whole throughout."""
    import threading
    import kproto_admin as ka
    from gregor_harness import wait_until
    from test_admin_apis import _synonyms, broker_view

    mport = free_port()
    b = broker_factory({"num.io.threads": "2", "log.flush.interval.messages": "1",
                        "metrics.port": str(mport), "metrics.host": "127.0.0.1"})
    ver = b.api_versions[kp.INCREMENTAL_ALTER_CONFIGS][1]
    av = b.api_versions[ka.ALTER_CONFIGS][1]

    def incremental(name, ops, validate_only=False):
        r = c.call(kp.INCREMENTAL_ALTER_CONFIGS, ver, kp.incremental_alter_configs_request(
            ver, [(kp.RESOURCE_BROKER, name, ops)], validate_only))
        [res] = kp.decode_incremental_alter_configs(r, ver)["responses"]
        return res["error_code"], res["error_message"] or None

    def alter(name, configs):
        r = c.call(ka.ALTER_CONFIGS, av, ka.alter_configs_request(av, [(kp.RESOURCE_BROKER, name, configs)]))
        [res] = ka.decode_alter_configs(r, av)["responses"]
        return res["error_code"], res.get("error_message") or None

    def pool_is(n, value, source):
        wait_until(lambda: metric(mport, THREADS) == n, 10, f"an I/O pool of {n}")
        assert broker_view(c, "0", ["num.io.threads"])["num.io.threads"] == (value, source, False)

    def refused(result, *words):
        code, msg = result
        assert code == kp.INVALID_REQUEST and "num.io.threads" in msg, result
        assert all(w in msg for w in words), result

    with kp.Conn(b.host, b.port) as c, kp.Conn(b.host, b.port) as pc:
        topic = f"io-{uuid.uuid4().hex[:8]}"
        assert kp.create_topic(c, topic)["error_code"] == 0
        wait_leader(c, topic, 1)
        pool_is(2, "2", 4)

        # A producer on its own connection appends without pause while the pool is resized.
        stop, sent, errors = threading.Event(), [], []

        def produce():
            i = 0
            while not stop.is_set():
                value = b"v-%06d" % i
                code = kp.produce(pc, topic, 0, kp.build_batch([kp.Record(value)]))["error_code"]
                if code:
                    errors.append(code)
                    return
                sent.append(value)
                i += 1

        producer = threading.Thread(target=produce)
        producer.start()
        try:
            jobs = metric(mport, JOBS)
            assert incremental("0", [("num.io.threads", SET, "4")], validate_only=True) == (0, None)
            pool_is(2, "2", 4)
            assert incremental("0", [("num.io.threads", SET, "4")]) == (0, None)
            pool_is(4, "4", 2)
            # the cluster default does not beat this broker's own value, until that is deleted
            assert incremental("", [("num.io.threads", SET, "3")]) == (0, None)
            pool_is(4, "4", 2)
            assert _synonyms(c, "0", "num.io.threads") == ("4", 2, [
                ("num.io.threads", "4", 2), ("num.io.threads", "3", 3), ("num.io.threads", "2", 4),
                ("num.io.threads", "8", 5)])
            assert incremental("0", [("num.io.threads", DELETE, None)]) == (0, None)
            pool_is(3, "3", 3)

            # Kafka's DynamicThreadPool bounds, against the 3 in force; nothing changes
            refused(incremental("0", [("num.io.threads", SET, "0")]))
            refused(incremental("", [("num.io.threads", SET, "7")]),
                    "should not be greater than double the current value 3")
            refused(alter("0", {"num.io.threads": "many"}))
            pool_is(3, "3", 3)
            assert broker_view(c, "", ["num.io.threads"])["num.io.threads"] == ("3", 3, False)

            # AlterConfigs replaces the cluster entity: to 6, and back to the static 2 by way of 3
            assert alter("", {"num.io.threads": "6"}) == (0, None)
            pool_is(6, "6", 3)
            refused(alter("", {}), "should be at least half the current value 6")
            pool_is(6, "6", 3)
            assert alter("", {"num.io.threads": "3"}) == (0, None)
            pool_is(3, "3", 3)
            assert alter("", {}) == (0, None)
            pool_is(2, "2", 4)
            assert broker_view(c, "", ["num.io.threads"]) == {}
            wait_until(lambda: len(sent) > 20 or errors, 30, "appends after the resizes")
        finally:
            stop.set()
            producer.join(30)
        assert not errors, errors
        assert metric(mport, JOBS) > jobs, "the appends did not go through the pool"

        got = [r.value for r in read_records(c, topic, len(sent))]
        assert got == sent


def commit(c: kp.Conn, group: str, topic: str, offset: int) -> None:
    import kproto_groups as kg
    r = kg.call(c, kg.OFFSET_COMMIT, 8, kg.offset_commit_request(8, group, {topic: {0: offset}}))
    assert r["errors"] == {(topic, 0): 0}, r


def committed(c: kp.Conn, group: str, topic: str) -> int:
    import kproto_groups as kg
    r = kg.call(c, kg.OFFSET_FETCH, 7, kg.offset_fetch_request(7, group, {topic: [0]}))
    assert r["error_code"] == 0, r
    return r["offsets"][(topic, 0)][0]


def test_coordinator_appends_take_the_pool_only_when_the_disk_may_block(broker_factory):
    """Offset commits and a transaction's state records and markers follow the produce path's
    rule: page-cache appends on the network worker (no pool job), and through the pool when an
    fsync is due (log.flush.interval.messages=1), with the same result either way."""
    from confluent_kafka import Producer
    from test_group_apis import find_coordinator

    for flush_each, expect_jobs in ((False, False), (True, True)):
        mport = free_port()
        overrides = {"metrics.port": str(mport), "metrics.host": "127.0.0.1",
                     "offsets.topic.replication.factor": "1", "transaction.state.log.replication.factor": "1",
                     "transaction.state.log.min.isr": "1"}
        if flush_each:
            overrides["log.flush.interval.messages"] = "1"
        b = broker_factory(overrides)
        with kp.Conn(b.host, b.port) as c:
            topic, group = f"io-{uuid.uuid4().hex[:8]}", f"io-g-{uuid.uuid4().hex[:8]}"
            assert kp.create_topic(c, topic)["error_code"] == 0
            wait_leader(c, topic, 1)
            find_coordinator(c, 3, group)
            commit(c, group, topic, 1)
            before = metric(mport, JOBS)
            for offset in range(2, 12):
                commit(c, group, topic, offset)
            assert committed(c, group, topic) == 11
            jobs = metric(mport, JOBS) - before
            assert (jobs >= 10) if expect_jobs else (jobs == 0), f"{jobs} pool jobs for 10 offset commits"

            p = Producer({"bootstrap.servers": b.bootstrap, "transactional.id": f"io-t-{uuid.uuid4().hex[:8]}",
                          "log_level": 2})
            p.init_transactions(30)
            # A first transaction, so that what creating the topics costs is not counted.
            p.begin_transaction()
            p.produce(topic, b"warm-up", partition=0)
            p.commit_transaction(30)
            before = metric(mport, JOBS)
            for i in range(5):
                p.begin_transaction()
                p.produce(topic, b"txn-%d" % i, partition=0)
                p.commit_transaction(30)
            jobs = metric(mport, JOBS) - before
            # Each transaction: AddPartitionsToTxn, PrepareCommit and CompleteCommit records, a
            # marker, and the produce itself (5 appends).
            assert (jobs >= 20) if expect_jobs else (jobs == 0), f"{jobs} pool jobs for 5 transactions"
        b.stop()
