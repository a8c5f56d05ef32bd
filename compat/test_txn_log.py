"""The log side of transactions across a restart, with a real client (confluent-kafka):
producer-state snapshots (`<offset>.snapshot`) let a restarted broker know of a transaction
opened many segments before the end of its log, so the last stable offset stays on it until
the transaction ends, and its commit or abort then gives the right read_committed view.
"""
from __future__ import annotations

import pytest

ck = pytest.importorskip("confluent_kafka")
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

from gregor_harness import wait_until  # noqa: E402
from test_transactions import WAIT, read_all, txn_producer, uniq, values_of  # noqa: E402


def committed_end(bootstrap: str, topic: str) -> tuple[int, list]:
    """Where a read_committed reader stops (the last stable offset) and what it read."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": uniq("lso"), "isolation.level": "read_committed",
                  "enable.partition.eof": True, "enable.auto.commit": False})
    c.assign([TopicPartition(topic, 0, 0)])
    got = []
    try:
        while True:
            m = c.poll(WAIT)
            assert m is not None, "no partition EOF within the wait"
            if m.error():
                if m.error().code() == KafkaError._PARTITION_EOF:
                    return m.offset(), got
                raise KafkaException(m.error())
            got.append(m.value().decode())
    finally:
        c.close()


@pytest.mark.parametrize("mode", ["kill", "term"])
def test_a_transaction_open_segments_ago_holds_the_stable_offset_across_a_restart(broker_factory, mode):
    b = broker_factory()
    topic = uniq("txnlog")
    a = AdminClient({"bootstrap.servers": b.bootstrap})
    a.create_topics([NewTopic(topic, 1, 1, config={"segment.bytes": "16384"})])[topic].result(WAIT)
    committing = txn_producer(b.bootstrap, uniq("tx-c"))
    aborting = txn_producer(b.bootstrap, uniq("tx-a"))
    firsts = {}
    for name, p in (("committing", committing), ("aborting", aborting)):
        p.begin_transaction()
        p.produce(topic, value=f"{name}-1".encode(), partition=0,
                  on_delivery=lambda err, m, n=name: firsts.setdefault(n, m.offset()))
        p.flush(WAIT)
    # Other data rolls the log several times past the two open transactions.
    other = Producer({"bootstrap.servers": b.bootstrap, "enable.idempotence": True, "linger.ms": 5})
    part_dir = b.data_dir / f"{topic}-0"
    n = 0
    failed = []
    while len(list(part_dir.glob("*.log"))) < 6:
        for _ in range(50):
            other.produce(topic, value=b"o" * 100, partition=0,
                          on_delivery=lambda err, m: err is not None and failed.append(err))
            n += 1
        assert other.flush(WAIT) == 0 and not failed, failed[:1]
    assert len(list(part_dir.glob("*.snapshot"))) >= 1, "a roll writes a producer snapshot"
    first = min(firsts.values())
    assert committed_end(b.bootstrap, topic) == (first, [])

    b.restart(mode)
    # The oldest open transaction is older than the newest two segments: only a snapshot knows it.
    assert committed_end(b.bootstrap, topic) == (first, []), \
        "after the restart the stable offset must still stop at the open transaction"
    for p in (committing, aborting):
        p.produce(topic, value=b"late", partition=0)
        p.flush(WAIT)
    committing.commit_transaction(WAIT)
    # The aborting producer's transaction still holds the stable offset at its first record.
    wait_until(lambda: committed_end(b.bootstrap, topic)[0] == firsts["aborting"], WAIT,
               "the commit moved the stable offset up to the other open transaction")
    aborting.abort_transaction(WAIT)
    expect = ["committing-1", "late"] + ["o" * 100] * n
    got = read_all(b.bootstrap, topic, 1, "read_committed", len(expect))
    assert values_of(got) == sorted(expect)
    other.flush(WAIT)
