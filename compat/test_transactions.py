"""Transactions (KIP-98) with a real client (confluent-kafka / librdkafka): the coordinator
(FindCoordinator key type 1, InitProducerId with a transactional id, AddPartitionsToTxn,
AddOffsetsToTxn, EndTxn, TxnOffsetCommit), the markers partition leaders write, and what
read_committed consumers see (the last stable offset and the aborted-transaction list).

Every check polls for its condition; a consumer's view is complete when it has reached the
end of each partition it reads (partition EOF, which for read_committed is the last stable
offset), so "nothing more arrives" is observed, not assumed after a sleep.
"""
from __future__ import annotations

import subprocess
import threading
import sys
import time
import uuid

import pytest

ck = pytest.importorskip("confluent_kafka")
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

from gregor_fixtures import _failed, _register  # noqa: E402
from gregor_harness import WaitAborted, wait_until  # noqa: E402

WAIT = 60
NOT_ENOUGH_REPLICAS = 19


def uniq(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def create_topic(bootstrap: str, topic: str, partitions: int = 1, rf: int = 1) -> None:
    a = AdminClient({"bootstrap.servers": bootstrap})
    a.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=rf)])[topic].result(timeout=WAIT)

    def led():
        md = a.list_topics(topic, timeout=10).topics[topic]
        return md.error is None and len(md.partitions) == partitions and all(
            p.leader >= 0 for p in md.partitions.values())

    wait_until(led, WAIT, f"{topic} led")


def txn_producer(bootstrap: str, txn_id: str, **extra) -> Producer:
    conf = {"bootstrap.servers": bootstrap, "transactional.id": txn_id, "linger.ms": 5}
    conf.update(extra)
    p = Producer(conf)
    p.init_transactions(WAIT)
    return p


def produce_txn(p: Producer, topic: str, values, partition=None, commit=True) -> None:
    p.begin_transaction()
    for v in values:
        if partition is None:
            p.produce(topic, value=v.encode())
        else:
            p.produce(topic, value=v.encode(), partition=partition)
    p.flush(WAIT)
    if commit:
        p.commit_transaction(WAIT)
    else:
        p.abort_transaction(WAIT)


def read_all(bootstrap: str, topic: str, partitions: int, isolation: str, expect: int, timeout: float = WAIT):
    """Every value in `topic` as a consumer with `isolation` sees it: polls until `expect`
    values arrived and every partition reported EOF after its last value (its end: the last
    stable offset for read_committed)."""
    c = Consumer({
        "bootstrap.servers": bootstrap,
        "group.id": uniq("reader"),
        "isolation.level": isolation,
        "enable.partition.eof": True,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
    })
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    got = []
    # The partitions at their end since their last value. librdkafka reports a partition's EOF
    # once per arrival at its end: one that got there before the others delivered their last
    # values is not told again, so its EOF is kept until a value of its own arrives.
    eof = set()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                continue
            if m.error():
                if m.error().code() == KafkaError._PARTITION_EOF:
                    eof.add(m.partition())
                    if len(got) >= expect and len(eof) == partitions:
                        break
                    continue
                raise KafkaException(m.error())
            eof.discard(m.partition())
            got.append((m.partition(), m.value().decode()))
        else:
            raise AssertionError(f"{isolation} reader got {len(got)} of {expect} values before the timeout")
    finally:
        c.close()
    return got


def values_of(got):
    return sorted(v for _, v in got)


@pytest.fixture
def txn_broker(broker_factory):
    # A short abort interval so the timeout test need not wait the default ten seconds.
    return broker_factory(overrides={"transaction.abort.timed.out.transaction.cleanup.interval.ms": "500"})


def test_committed_visible_aborted_hidden_from_read_committed(txn_broker):
    bootstrap = txn_broker.bootstrap
    topic = uniq("txn")
    create_topic(bootstrap, topic, partitions=2)
    p = txn_producer(bootstrap, uniq("tx"))
    committed = [f"c1-{i}" for i in range(100)]
    aborted = [f"a-{i}" for i in range(50)]
    later = [f"c2-{i}" for i in range(10)]
    produce_txn(p, topic, committed)
    produce_txn(p, topic, aborted, commit=False)
    produce_txn(p, topic, later)
    p.flush(WAIT)

    rc = read_all(bootstrap, topic, 2, "read_committed", len(committed) + len(later))
    assert values_of(rc) == sorted(committed + later), "read_committed must see exactly the committed records"
    ru = read_all(bootstrap, topic, 2, "read_uncommitted", len(committed) + len(aborted) + len(later))
    # Control records (the markers) are never handed to the application: the count is exact.
    assert values_of(ru) == sorted(committed + aborted + later)


def test_send_offsets_to_transaction_commits_offsets_only_on_commit(txn_broker):
    bootstrap = txn_broker.bootstrap
    src, dst = uniq("src"), uniq("dst")
    create_topic(bootstrap, src)
    create_topic(bootstrap, dst)
    group = uniq("g")
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
                  "auto.offset.reset": "earliest", "isolation.level": "read_committed"})
    # A read_committed consumer asks with require_stable (KIP-447) and is kept waiting while a
    # transaction holds an offset of the group; a read_uncommitted one gets the last committed.
    peek = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
                     "isolation.level": "read_uncommitted"})
    tp = TopicPartition(src, 0)

    def committed(consumer=c):
        return consumer.committed([TopicPartition(src, 0)], timeout=10)[0].offset

    try:
        c.assign([TopicPartition(src, 0, 0)])
        p = txn_producer(bootstrap, uniq("tx"))
        # An aborted transaction's offsets never reach the group.
        p.begin_transaction()
        p.produce(dst, value=b"x")
        p.send_offsets_to_transaction([TopicPartition(src, 0, 7)], c.consumer_group_metadata(), WAIT)
        p.abort_transaction(WAIT)
        # The committed one's do, once the transaction commits and not before.
        p.begin_transaction()
        p.produce(dst, value=b"y")
        p.send_offsets_to_transaction([TopicPartition(src, 0, 42)], c.consumer_group_metadata(), WAIT)
        assert committed(peek) < 0, "offsets of an open transaction must not be visible"
        p.commit_transaction(WAIT)
        wait_until(lambda: committed() == 42, WAIT, "the transaction's offset committed")
        assert tp.topic == src
    finally:
        c.close()
        peek.close()
    assert values_of(read_all(bootstrap, dst, 1, "read_committed", 1)) == ["y"]


def test_second_producer_fences_the_first(txn_broker):
    bootstrap = txn_broker.bootstrap
    topic = uniq("fence")
    create_topic(bootstrap, topic)
    txn_id = uniq("tx")
    zombie = txn_producer(bootstrap, txn_id)
    zombie.begin_transaction()
    zombie.produce(topic, value=b"zombie-1")
    zombie.flush(WAIT)

    successor = txn_producer(bootstrap, txn_id)
    # The zombie's open transaction was aborted and its epoch fenced.
    with pytest.raises(KafkaException) as e:
        zombie.produce(topic, value=b"zombie-2")
        zombie.flush(WAIT)
        zombie.commit_transaction(WAIT)
    err = e.value.args[0]
    assert err.fatal() or err.code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED,
                                         KafkaError.INVALID_PRODUCER_EPOCH), err
    produce_txn(successor, topic, ["successor"])
    assert values_of(read_all(bootstrap, topic, 1, "read_committed", 1)) == ["successor"]


ABANDON = r"""
import os, sys
from confluent_kafka import Producer
p = Producer({"bootstrap.servers": sys.argv[1], "transactional.id": sys.argv[2],
              "transaction.timeout.ms": 3000})
p.init_transactions(60)
p.begin_transaction()
for i in range(5):
    p.produce(sys.argv[3], value=b"abandoned")
p.flush(60)
print("produced", flush=True)
os.kill(os.getpid(), 9)
"""


def test_abandoned_transaction_is_aborted_at_its_timeout(txn_broker):
    bootstrap = txn_broker.bootstrap
    topic = uniq("abandon")
    create_topic(bootstrap, topic)
    run = subprocess.run([sys.executable, "-c", ABANDON, bootstrap, uniq("tx-dead"), topic],
                         capture_output=True, text=True, timeout=WAIT)
    assert "produced" in run.stdout, run.stderr
    # Written after the open transaction: read_committed readers reach it only once the
    # coordinator has aborted the dead producer's transaction and the LSO moved past it.
    p = txn_producer(bootstrap, uniq("tx-live"))
    produce_txn(p, topic, ["after"])
    assert values_of(read_all(bootstrap, topic, 1, "read_committed", 1)) == ["after"]
    assert sorted(values_of(read_all(bootstrap, topic, 1, "read_uncommitted", 6))) == ["abandoned"] * 5 + ["after"]


def test_state_and_markers_survive_a_restart(txn_broker):
    bootstrap = txn_broker.bootstrap
    topic = uniq("restart")
    create_topic(bootstrap, topic)
    txn_id = uniq("tx")
    p = txn_producer(bootstrap, txn_id)
    produce_txn(p, topic, [f"c-{i}" for i in range(20)])
    produce_txn(p, topic, [f"a-{i}" for i in range(20)], commit=False)
    # Both transactions are complete before the kill (Complete* in the coordinator's log).
    wait_until(lambda: values_of(read_all(bootstrap, topic, 1, "read_committed", 20)) ==
               sorted(f"c-{i}" for i in range(20)), WAIT, "first transaction committed")
    p.flush(WAIT)
    del p
    txn_broker.restart("kill")
    bootstrap = txn_broker.bootstrap
    rc = read_all(bootstrap, topic, 1, "read_committed", 20)
    assert values_of(rc) == sorted(f"c-{i}" for i in range(20))
    # The transactional id's state came back: a new incarnation gets a working epoch.
    p2 = txn_producer(bootstrap, txn_id)
    produce_txn(p2, topic, ["after-restart"])
    rc = read_all(bootstrap, topic, 1, "read_committed", 21)
    assert values_of(rc) == sorted([f"c-{i}" for i in range(20)] + ["after-restart"])


# ---------------------------------------------------------------------------
# three brokers
# ---------------------------------------------------------------------------

@pytest.fixture
def cluster_factory(request, zookeeper):
    from cluster_harness import Cluster
    clusters = []

    def make(n: int = 3, overrides=None):
        c = Cluster(zookeeper, n, overrides=overrides, on_new_broker=lambda b: _register(request, b))
        clusters.append(c)
        c.start()
        return c

    yield make
    failed = _failed(request)
    for c in clusters:
        c.cleanup(keep=failed)


def java_hash(s: str) -> int:
    h = 0
    for unit in s.encode("utf-16-be").hex(" ", 2).split():
        h = (31 * h + int(unit, 16)) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def txn_state_partition(txn_id: str, partitions: int = 50) -> int:
    h = java_hash(txn_id)
    return (0 if h == -(1 << 31) else abs(h)) % partitions


def test_transaction_over_partitions_led_by_three_brokers(cluster_factory):
    c = cluster_factory(3, overrides={
        "transaction.state.log.replication.factor": "3",
        "transaction.state.log.min.isr": "2",
        "offsets.topic.replication.factor": "3",
    })
    bootstrap = c.bootstrap()
    topic = uniq("txn3")
    create_topic(bootstrap, topic, partitions=3, rf=3)
    leaders = {s["leader"] for s in c.wait_topic_online(topic, 3).values()}
    assert len(leaders) == 3, f"partitions should be led by three brokers: {leaders}"
    txn_id = uniq("tx")
    p = txn_producer(bootstrap, txn_id)
    for round_ in range(3):
        p.begin_transaction()
        for part in range(3):
            for i in range(10):
                p.produce(topic, value=f"r{round_}-p{part}-{i}".encode(), partition=part)
        p.flush(WAIT)
        if round_ == 1:
            p.abort_transaction(WAIT)
        else:
            p.commit_transaction(WAIT)
    want = sorted(f"r{r}-p{part}-{i}" for r in (0, 2) for part in range(3) for i in range(10))
    got = read_all(bootstrap, topic, 3, "read_committed", len(want))
    assert values_of(got) == want
    assert {part for part, _ in got} == {0, 1, 2}

    # kill -9 of the coordinator in the middle of a transaction: the broker that takes its
    # __transaction_state partition over loads the open transaction, and the producer's
    # commit (sent to the new coordinator) completes it on every partition.
    coordinator = c.partition_state("__transaction_state", txn_state_partition(txn_id))["leader"]
    p.begin_transaction()
    for part in range(3):
        for i in range(10):
            p.produce(topic, value=f"r3-p{part}-{i}".encode(), partition=part)
    p.flush(WAIT)
    c.brokers[coordinator].kill()
    p.commit_transaction(WAIT)
    survivors = c.bootstrap([i for i in c.brokers if i != coordinator])
    want += [f"r3-p{part}-{i}" for part in range(3) for i in range(10)]
    got = read_all(survivors, topic, 3, "read_committed", len(want))
    assert values_of(got) == sorted(want)


# ---------------------------------------------------------------------------
# exactly-once under faults
# ---------------------------------------------------------------------------

class TransformLoop:
    """A consume-transform-produce loop in the manner of confluent-kafka's EOS example: a
    read_committed consumer in a group, one transactional producer, and per small batch
    begin / produce / send_offsets_to_transaction / commit. An abortable error aborts and
    rewinds the consumer to the group's committed offsets; a fatal one (fencing) recreates
    the producer. It never processes past `limit` input records, so the test decides when
    the run may end (after its faults)."""

    BATCH = 20

    def __init__(self, bootstrap: str, src: str, dst: str, group: str, txn_id: str, total: int):
        self.bootstrap, self.src, self.dst, self.group, self.txn_id = bootstrap, src, dst, group, txn_id
        self.total = total
        self.limit = 0
        self.done_records = 0  # input records whose transaction committed
        self.commits = 0
        self.aborts = 0
        self.recreated = 0
        self.error = None
        self.finished = threading.Event()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _producer(self) -> Producer:
        p = Producer({"bootstrap.servers": self.bootstrap, "transactional.id": self.txn_id, "linger.ms": 5,
                      "transaction.timeout.ms": 30000, "log_level": 2})
        p.init_transactions(WAIT)
        return p

    def _rewind(self, c: Consumer) -> None:
        for tp in c.committed(c.assignment(), timeout=WAIT):
            c.seek(TopicPartition(tp.topic, tp.partition, tp.offset if tp.offset >= 0 else -2))

    def _commit(self, p: Producer, c: Consumer) -> None:
        while True:
            try:
                p.commit_transaction(WAIT)
                return
            except KafkaException as e:
                if e.args[0].retriable():
                    continue
                raise

    def _run(self) -> None:
        c = Consumer({"bootstrap.servers": self.bootstrap, "group.id": self.group, "enable.auto.commit": False,
                      "auto.offset.reset": "earliest", "isolation.level": "read_committed", "log_level": 2})
        try:
            c.subscribe([self.src])
            p = self._producer()
            while not self.stop.is_set() and self.done_records < self.total:
                room = min(self.BATCH, self.limit - self.done_records)
                if room <= 0:
                    time.sleep(0.01)  # the test has not raised the limit yet
                    continue
                msgs = [m for m in c.consume(num_messages=room, timeout=0.5) if m.error() is None]
                if not msgs or not c.assignment():
                    continue
                try:
                    p.begin_transaction()
                    for i, m in enumerate(msgs):
                        # every transaction touches all three output partitions
                        p.produce(self.dst, value=m.value(), partition=i % 3)
                    p.send_offsets_to_transaction(c.position(c.assignment()), c.consumer_group_metadata(), WAIT)
                    self._commit(p, c)
                    self.commits += 1
                    self.done_records += len(msgs)
                except KafkaException as e:
                    err = e.args[0]
                    if err.txn_requires_abort():
                        p.abort_transaction(WAIT)
                        self.aborts += 1
                    elif err.fatal():
                        p = self._producer()
                        self.recreated += 1
                    else:
                        raise
                    self._rewind(c)
                    # what counted as done is what the group committed
                    self.done_records = sum(max(tp.offset, 0) for tp in c.committed(c.assignment(), timeout=WAIT))
        except BaseException as e:  # noqa: BLE001 - handed to the test thread
            self.error = e
        finally:
            c.close()
            self.finished.set()


def test_exactly_once_across_coordinator_and_leader_kills(cluster_factory):
    c = cluster_factory(3, overrides={
        "transaction.state.log.replication.factor": "3",
        "transaction.state.log.min.isr": "2",
        "offsets.topic.replication.factor": "3",
        "group.initial.rebalance.delay.ms": "0",
    })
    bootstrap = c.bootstrap()
    src, dst, group, txn_id = uniq("eos-in"), uniq("eos-out"), uniq("eos-g"), uniq("eos-tx")
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.create_topics([NewTopic(t, num_partitions=3, replication_factor=3,
                                           config={"min.insync.replicas": "2"}) for t in (src, dst)]).values():
        f.result(timeout=WAIT)
    c.wait_topic_online(src, 3)
    c.wait_topic_online(dst, 3)

    total = 3000
    want = [f"rec-{i:05d}" for i in range(total)]
    pre = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 20})
    for i, v in enumerate(want):
        pre.produce(src, value=v.encode(), partition=i % 3)
        if i % 500 == 0:
            pre.poll(0)
    assert pre.flush(WAIT) == 0
    ends = {p: total // 3 for p in range(3)}

    # The faults hit the transaction coordinator and a partition leader, never the group's
    # coordinator: librdkafka's send_offsets_to_transaction can wait forever for a group
    # coordinator that vanished from Metadata (librdkafka issues #5511 and #5456, a client
    # bug), whatever the broker does. So the internal topics are created first and the group
    # is named so that its __consumer_offsets partition is led by a broker not killed first.
    txn_producer(bootstrap, txn_id)
    probe = Consumer({"bootstrap.servers": bootstrap, "group.id": uniq("probe")})

    def offsets_topic_served():
        # Only a means to create __consumer_offsets: while its leaders are being elected the
        # client may be told COORDINATOR_NOT_AVAILABLE, which it does not retry by itself.
        try:
            probe.committed([TopicPartition(src, 0)], timeout=10)
            return True
        except KafkaException as e:
            if e.args[0].code() != KafkaError.COORDINATOR_NOT_AVAILABLE:
                raise
            return False

    try:
        wait_until(offsets_topic_served, WAIT, "a committed-offsets lookup to be served")
    finally:
        probe.close()
    c.wait_topic_online("__transaction_state", 50)
    c.wait_topic_online("__consumer_offsets", 50)
    txn_partition = txn_state_partition(txn_id)
    coordinator = c.partition_state("__transaction_state", txn_partition)["leader"]
    while c.partition_state("__consumer_offsets", txn_state_partition(group))["leader"] == coordinator:
        group = uniq("eos-g")
    group_coordinator = c.partition_state("__consumer_offsets", txn_state_partition(group))["leader"]

    loop = TransformLoop(bootstrap, src, dst, group, txn_id, total)
    started = time.monotonic()
    loop.thread.start()

    def progressed(n):
        def ok():
            if loop.error is not None:
                raise WaitAborted(f"the transform loop failed: {loop.error!r}")
            return loop.done_records >= n
        return ok

    def kill_until_failed_over(broker_id, topic, partition):
        """kill -9, then restart once another broker leads `partition` of `topic`. Restarting
        (rather than waiting for the loop's progress first) matters to librdkafka: a producer
        whose cached group coordinator vanished from Metadata can wait for that broker's return
        in send_offsets_to_transaction (librdkafka issues #5511, #5456)."""
        c.brokers[broker_id].kill()
        wait_until(lambda: c.partition_state(topic, partition)["leader"] not in (broker_id, -1),
                   c.failover_timeout, f"{topic}-{partition} to fail over from broker {broker_id}")
        b = c.brokers[broker_id]
        b._fixed_port = True
        b.start()
        c.wait_registered(c.brokers)

    try:
        # fault 1: the transaction coordinator, while transactions are running
        loop.limit = total // 3
        wait_until(progressed(total // 6), WAIT, "the loop to get going")
        kill_until_failed_over(coordinator, "__transaction_state", txn_partition)
        loop.limit = 2 * total // 3
        wait_until(progressed(total // 3 + 1), 2 * WAIT, "progress after the coordinator's kill")

        # fault 2: the leader of an output partition (after the ISR is whole again)
        wait_until(lambda: all(len(s["isr"]) == 3 for s in c.partition_states(dst).values()), 2 * WAIT,
                   "the output's ISR to recover")
        victim, leader = next((p, st["leader"]) for p, st in c.partition_states(dst).items()
                              if st["leader"] != group_coordinator)
        kill_until_failed_over(leader, dst, victim)
        loop.limit = total
        wait_until(progressed(2 * total // 3 + 1), 2 * WAIT, "progress after the leader's kill")
        wait_until(progressed(total), 2 * WAIT, "the loop to finish the input")
        assert loop.finished.wait(WAIT)
    finally:
        loop.stop.set()
        loop.thread.join(WAIT)
    assert loop.error is None, repr(loop.error)
    elapsed = time.monotonic() - started
    print(f"exactly-once run: {elapsed:.1f}s, {loop.commits} commits, {loop.aborts} aborts, "
          f"{loop.recreated} producer re-creations")

    got = read_all(c.bootstrap(), dst, 3, "read_committed", total)
    values = [v for _, v in got]
    dupes = len(values) - len(set(values))
    missing = set(want) - set(values)
    assert dupes == 0 and not missing and len(values) == total, \
        f"{dupes} duplicates, {len(missing)} missing, {len(values)} read"

    check = Consumer({"bootstrap.servers": c.bootstrap(), "group.id": group, "enable.auto.commit": False})
    try:
        committed = check.committed([TopicPartition(src, p) for p in range(3)], timeout=WAIT)
    finally:
        check.close()
    assert {tp.partition: tp.offset for tp in committed} == ends


def test_leader_verifies_a_transactional_produce_with_a_remote_coordinator(cluster_factory):
    """KIP-890 part 1 across brokers: a partition leader that does not coordinate the
    transaction asks the coordinator (AddPartitionsToTxn v4, verify_only) before appending a
    transactional batch, refuses it with INVALID_TXN_STATE until the transaction added the
    partition, and asks again once the transaction's marker ended it there."""
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "protocol-tests"))
    import kproto as kp
    import kproto_groups as kg
    import kproto_txn as kt

    c = cluster_factory(3, overrides={
        "transaction.state.log.replication.factor": "3",
        "transaction.state.log.min.isr": "2",
    })
    topic = uniq("verify")
    create_topic(c.bootstrap(), topic, partitions=3, rf=1)
    txn_id = uniq("tx")
    any_broker = c.brokers[1]

    def find():
        with kp.Conn(any_broker.host, any_broker.port) as conn:
            out = kg.decode_find_coordinator(conn.call(kg.FIND_COORDINATOR, 4,
                                                       kg.find_coordinator_request(4, txn_id, 1)), 4)
        coord = out["coordinators"][0]
        return coord if coord["error_code"] == 0 else None
    coordinator = wait_until(find, WAIT, "the transaction coordinator")["node_id"]
    coord_b = c.brokers[coordinator]
    leaders = {p: s["leader"] for p, s in c.wait_topic_online(topic, 3).items()}
    part = next(p for p, leader in leaders.items() if leader != coordinator)
    other = next(p for p in leaders if p != part)
    leader_b = c.brokers[leaders[part]]

    with kp.Conn(coord_b.host, coord_b.port) as cc, kp.Conn(leader_b.host, leader_b.port) as lc:
        def init():
            out = kp.decode_init_producer_id(cc.call(kp.INIT_PRODUCER_ID, 4,
                                                     kp.init_producer_id_request(4, txn_id, 60000)), 4)
            return out if out["error_code"] == 0 else None
        ids = wait_until(init, WAIT, "InitProducerId")
        pid, epoch = ids["producer_id"], ids["producer_epoch"]

        def produce_once(seq, value):
            batch = kp.build_batch([kp.Record(value=value)], producer_id=pid, producer_epoch=epoch,
                                   base_sequence=seq, transactional=True)
            r = lc.call(kp.PRODUCE, 9, kp.produce_request(9, {topic: {part: batch}}, transactional_id=txn_id))
            return kp.decode_produce(r, 9)["responses"][0]["partitions"][0]["error_code"]

        def produce(seq, value):
            # NOT_ENOUGH_REPLICAS is the leader's "cannot verify now" (say, it has not yet
            # learnt where the coordinator is): retried, as a producer retries it.
            code = wait_until(lambda: (c := produce_once(seq, value)) != NOT_ENOUGH_REPLICAS and (c,),
                              WAIT, "a verified or refused produce")
            return code[0]

        def verify_only(parts):
            r = cc.call(kt.ADD_PARTITIONS_TO_TXN, 4,
                        kt.add_partitions_to_txn_request(4, txn_id, pid, epoch, {topic: parts}, verify_only=True))
            out = kt.decode_add_partitions_to_txn(r, 4)
            assert out["error_code"] == 0, out
            return out["by_txn"][txn_id]

        assert produce(0, b"unverified") == kt.INVALID_TXN_STATE
        r = cc.call(kt.ADD_PARTITIONS_TO_TXN, 3, kt.add_partitions_to_txn_request(3, txn_id, pid, epoch, {topic: [part]}))
        assert kt.decode_add_partitions_to_txn(r, 3)["errors"] == {(topic, part): 0}
        # What the leader asks, asked directly: only the added partition is in the transaction.
        assert verify_only([part, other]) == {(topic, part): 0, (topic, other): kt.INVALID_TXN_STATE}
        assert produce(0, b"verified") == 0
        assert produce(1, b"verified-again") == 0

        r = cc.call(kt.END_TXN, 3, kt.end_txn_request(3, txn_id, pid, epoch, True))
        assert kt.decode_error_only(r, 3)["error_code"] == 0

        def lso():
            r = lc.call(kp.LIST_OFFSETS, 5, kp.list_offsets_request(5, {topic: {part: -1}}, isolation_level=1))
            return kp.decode_list_offsets(r, 5)["topics"][0]["partitions"][0]["offset"]
        wait_until(lambda: lso() == 3, WAIT, "the commit marker on the leader")
        # The transaction ended there: a new write of the same epoch must be verified again.
        assert produce(2, b"after-commit") == kt.INVALID_TXN_STATE


def test_every_replica_describes_its_producers_with_their_coordinator_epoch(cluster_factory):
    """DescribeProducers (what `kafka-transactions find-hanging --broker-id` sends) is answered
    by every replica of a partition, followers too, from the producer state it keeps as it
    appends replicated batches; a transactional producer is reported with the coordinator
    epoch of its last marker, and a restarted replica still knows it (the `.snapshot`)."""
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "protocol-tests"))
    import kproto as kp
    import kproto_admin as ka

    c = cluster_factory(3, overrides={
        "transaction.state.log.replication.factor": "3",
        "transaction.state.log.min.isr": "2",
    })
    bootstrap = c.bootstrap()
    topic = uniq("producers")
    create_topic(bootstrap, topic, partitions=1, rf=3)
    state = c.wait_topic_online(topic, 1)[0]
    leader = state["leader"]
    followers = [i for i in c.zk_assignment(topic)[0] if i != leader]
    assert len(followers) == 2

    p = txn_producer(bootstrap, uniq("tx"))
    produce_txn(p, topic, [f"v{i}" for i in range(5)], partition=0)

    def producers_on(broker_id):
        b = c.brokers[broker_id]
        with kp.Conn(b.host, b.port) as conn:
            r = ka.decode_describe_producers(conn.call(ka.DESCRIBE_PRODUCERS, 0,
                                             ka.describe_producers_request(0, {topic: [0]})), 0)
        return r["partitions"][(topic, 0)]

    def committed_on(broker_id):
        # A follower has the producer once it has fetched the batch and the COMMIT marker.
        code, prods = producers_on(broker_id)
        assert code == 0, f"broker {broker_id} answered error {code}"
        return prods if prods and prods[0]["current_txn_start_offset"] == -1 else None

    seen = {}
    for b in [leader] + followers:
        prods = wait_until(lambda: committed_on(b), WAIT, f"broker {b} to describe the committed producer")
        assert len(prods) == 1, prods
        seen[b] = prods[0]
    on_leader = seen[leader]
    assert on_leader["coordinator_epoch"] >= 0, on_leader
    assert on_leader["last_sequence"] == 4 and on_leader["producer_epoch"] >= 0, on_leader
    for b in followers:
        assert seen[b] == on_leader, (b, seen[b], on_leader)

    # An open transaction is what find-hanging looks for: followers report where it starts.
    p.begin_transaction()
    p.produce(topic, value=b"open", partition=0)
    p.flush(WAIT)

    def open_on(broker_id):
        code, prods = producers_on(broker_id)
        return code == 0 and prods and prods[0]["current_txn_start_offset"] == 6 and prods[0]
    for b in followers:
        wait_until(lambda: open_on(b), WAIT, f"broker {b} to report the open transaction")
    p.commit_transaction(WAIT)
    for b in [leader] + followers:
        seen[b] = wait_until(lambda: committed_on(b), WAIT, f"broker {b} to see the second commit")[0]
        assert seen[b]["last_sequence"] == 5 and seen[b]["coordinator_epoch"] == on_leader["coordinator_epoch"]

    # A restarted follower reads the coordinator epoch back from its producer snapshot.
    f = followers[0]
    c.brokers[f].restart()
    wait_until(lambda: committed_on(f) == [seen[f]], WAIT, f"restarted broker {f} to describe the producer again")


def test_kafka_python_transactional_producer_and_read_committed_consumer(txn_broker):
    """kafka-python (2.1+) has its own transactional producer and read_committed consumer:
    a commit, an abort and a second commit, read back by it and by librdkafka."""
    kp = pytest.importorskip("kafka")
    bootstrap = txn_broker.bootstrap
    topic = uniq("kp-txn")
    create_topic(bootstrap, topic, partitions=2)
    producer = kp.KafkaProducer(bootstrap_servers=bootstrap, transactional_id=uniq("kp-tx"))
    batches = {"c1": True, "a": False, "c2": True}
    try:
        producer.init_transactions()
        for name, commit in batches.items():
            producer.begin_transaction()
            for i in range(30):
                producer.send(topic, value=f"{name}-{i}".encode(), partition=i % 2)
            producer.flush()
            if commit:
                producer.commit_transaction()
            else:
                producer.abort_transaction()
    finally:
        producer.close()
    committed = sorted(f"{n}-{i}" for n, c in batches.items() if c for i in range(30))
    everything = sorted(f"{n}-{i}" for n in batches for i in range(30))

    consumer = kp.KafkaConsumer(bootstrap_servers=bootstrap, isolation_level="read_committed",
                                enable_auto_commit=False, auto_offset_reset="earliest")
    tps = [kp.TopicPartition(topic, p) for p in range(2)]
    got = []
    try:
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        ends = consumer.end_offsets(tps)

        def caught_up():
            for records in consumer.poll(timeout_ms=500).values():
                got.extend(r.value.decode() for r in records)
            return all(consumer.position(tp) >= ends[tp] for tp in tps)

        # The end is the last stable offset, past the last commit marker: every committed record
        # has been delivered once the position reaches it, and no aborted one may have been.
        wait_until(caught_up, WAIT, "kafka-python read_committed consumer at the end")
    finally:
        consumer.close()
    assert sorted(got) == committed
    assert values_of(read_all(bootstrap, topic, 2, "read_uncommitted", len(everything))) == everything


def test_commit_across_coordinator_move(cluster_factory):
    """A commit whose coordinator is cut off (SIGSTOP) after it wrote PrepareCommit but before it
    could answer EndTxn: the client, retrying commit_transaction on retriable errors as
    librdkafka documents, meets the coordinator that took the `__transaction_state` partition
    over. That one loaded PrepareCommit, so (as Kafka's) it finishes the commit: while a marker
    cannot be written (its partition lives only on the stopped broker) it answers a retried
    EndTxn(commit) CONCURRENT_TRANSACTIONS and an abort INVALID_TXN_STATE, and once the markers
    and CompleteCommit are written it answers the retry NONE. The commit succeeds and
    read_committed sees every record exactly once."""
    from pathlib import Path
    from replication_tools import partition_dir, sigcont, sigstop
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "protocol-tests"))
    import kproto as kp
    import kproto_txn as kt

    c = cluster_factory(3, overrides={
        "transaction.state.log.replication.factor": "3",
        "transaction.state.log.min.isr": "2",
    })
    bootstrap = c.bootstrap()
    txn_id = uniq("move-tx")
    # A short request timeout: the retried EndTxn must not wait out the default minute on the
    # stopped coordinator.
    p = txn_producer(bootstrap, txn_id, **{"socket.timeout.ms": 8000, "transaction.timeout.ms": 120000})
    c.wait_topic_online("__transaction_state", 50)
    tp = txn_state_partition(txn_id)
    coordinator = c.partition_state("__transaction_state", tp)["leader"]
    others = [b for b in c.zk_assignment("__transaction_state")[tp] if b != coordinator]
    # The controller elects the first live replica of the ISR in assignment order: `successor`
    # takes over, after fetching the PrepareCommit; `lagging` is stopped meanwhile so the
    # PrepareCommit cannot reach the high watermark (and EndTxn stays unanswered).
    successor, lagging = others
    # Every replica in the ISR: the PrepareCommit waits for the stopped one.
    wait_until(lambda: len(c.partition_state("__transaction_state", tp)["isr"]) == 3, WAIT,
               f"__transaction_state-{tp}'s ISR to be full")

    # One partition on the successor, one only on the coordinator's broker: its marker waits
    # for that broker's return.
    topic = uniq("move")
    a = AdminClient({"bootstrap.servers": bootstrap})
    a.create_topics([NewTopic(topic, 2, replica_assignment=[[successor], [coordinator]])])[topic].result(timeout=WAIT)
    c.wait_topic_online(topic, 2)

    want = [f"m-{i}" for i in range(20)]
    p.begin_transaction()
    for i, v in enumerate(want):
        p.produce(topic, value=v.encode(), partition=i % 2)
    assert p.flush(WAIT) == 0

    def state_log(broker_id):
        d = partition_dir(c.brokers[broker_id], "__transaction_state", tp)
        return sum(f.stat().st_size for f in d.glob("*.log"))

    def describe(broker_id):
        b = c.brokers[broker_id]
        with kp.Conn(b.host, b.port) as conn:
            out = kt.decode_describe_transactions(
                conn.call(kt.DESCRIBE_TRANSACTIONS, 0, kt.describe_transactions_request(0, [txn_id])), 0)
        return out["states"][0]

    def end_txn(broker_id, pid, epoch, commit):
        b = c.brokers[broker_id]
        with kp.Conn(b.host, b.port) as conn:
            r = conn.call(kt.END_TXN, 3, kt.end_txn_request(3, txn_id, pid, epoch, commit))
        return kt.decode_error_only(r, 3)["error_code"]

    before = state_log(coordinator)
    outcome = {}

    def commit():
        # librdkafka's documented pattern: retry a retriable failure, abort an abortable one.
        deadline = time.monotonic() + 120
        try:
            while True:
                try:
                    p.commit_transaction(10)
                    outcome["result"] = "committed"
                    return
                except KafkaException as e:
                    err = e.args[0]
                    outcome.setdefault("errors", []).append(f"{err.name()}: {err.str()}")
                    if err.retriable() and time.monotonic() < deadline:
                        continue
                    if err.txn_requires_abort():
                        p.abort_transaction(WAIT)
                        outcome["result"] = "aborted"
                        return
                    raise
        except BaseException as e:  # noqa: BLE001 - handed to the test thread
            outcome["result"] = f"failed: {e!r}"

    stopped = []
    try:
        sigstop(c.brokers[lagging])
        stopped.append(lagging)
        committer = threading.Thread(target=commit, daemon=True)
        committer.start()
        # The PrepareCommit is in the coordinator's log and the successor fetched it: the
        # coordinator waits for the stopped replica to have it before answering EndTxn.
        wait_until(lambda: state_log(coordinator) > before and state_log(successor) == state_log(coordinator),
                   WAIT, "the PrepareCommit on the coordinator and its successor")
        assert "result" not in outcome, outcome
        sigstop(c.brokers[coordinator])
        stopped.append(coordinator)
        sigcont(c.brokers[lagging])
        stopped.remove(lagging)
        wait_until(lambda: c.partition_state("__transaction_state", tp)["leader"] == successor,
                   c.failover_timeout, f"broker {successor} to coordinate {txn_id}")

        # The successor loaded the PrepareCommit and cannot finish it yet.
        def loaded():
            s = describe(successor)
            return s if s["error_code"] == 0 else None
        st = wait_until(loaded, WAIT, f"broker {successor} to load {txn_id}")
        assert st["state"] == "PrepareCommit", st
        pid, epoch = st["producer_id"], st["producer_epoch"]
        assert end_txn(successor, pid, epoch, True) == kt.CONCURRENT_TRANSACTIONS
        assert end_txn(successor, pid, epoch, False) == kt.INVALID_TXN_STATE
        assert "result" not in outcome, outcome

        sigcont(c.brokers[coordinator])
        stopped.remove(coordinator)
        committer.join(150)
        assert not committer.is_alive(), f"commit_transaction still retrying: {outcome}"
    finally:
        for b in stopped:
            sigcont(c.brokers[b])
    print(f"commit across the coordinator move: {outcome}")
    assert outcome.get("result") == "committed", outcome

    # Once complete, a retried commit succeeds and an abort is refused.
    now = c.partition_state("__transaction_state", tp)["leader"]
    # EndTxn is answered once PrepareCommit is in the log: the completion may still be on its way.
    wait_until(lambda: describe(now)["state"] == "CompleteCommit", WAIT, f"{txn_id} to complete its commit")
    assert end_txn(now, pid, epoch, True) == 0
    assert end_txn(now, pid, epoch, False) == kt.INVALID_TXN_STATE

    got = read_all(c.bootstrap(), topic, 2, "read_committed", len(want))
    assert values_of(got) == sorted(want)

    # The producer goes on with its next transaction.
    produce_txn(p, topic, ["after-move"], partition=0)
    got = read_all(c.bootstrap(), topic, 2, "read_committed", len(want) + 1)
    assert values_of(got) == sorted(want + ["after-move"])
