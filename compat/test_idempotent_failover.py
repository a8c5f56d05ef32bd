"""A retried batch after a leader failover gets its original offsets, as Kafka answers any of
a producer's last five batches: the new leader answers from the producer state it kept while
following, not from what its newest snapshot remembers (one batch per producer).

Raw frames (protocol-tests/kproto), so the retry is exactly the batch that was acknowledged."""
import sys
import time
import uuid
from pathlib import Path

import pytest

from cluster_harness import Cluster
from gregor_fixtures import _failed, _register
from gregor_harness import wait_until

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "protocol-tests"))
import kproto as kp  # noqa: E402

OUT_OF_ORDER_SEQUENCE_NUMBER, DUPLICATE_SEQUENCE_NUMBER = 45, 46


@pytest.fixture
def cluster(request, zookeeper):
    c = Cluster(zookeeper, 3, session_timeout_ms=6000, on_new_broker=lambda b: _register(request, b))
    try:
        c.start()
        yield c
    finally:
        c.cleanup(keep=_failed(request))


def batch(pid, epoch, seq):
    # One record of 600 bytes: with segment.bytes 1000 every batch ends in a roll, and every
    # roll writes a producer snapshot.
    return kp.build_batch([kp.Record(b"v%d-" % seq + b"x" * 600)], producer_id=pid, producer_epoch=epoch,
                          base_sequence=seq)


def produce_to_leader(c, topic, data, timeout=60):
    deadline = time.monotonic() + timeout
    while True:
        leader = c.partition_state(topic, 0)["leader"]
        b = c.brokers.get(leader)
        if b is not None and b.alive():
            try:
                with kp.Conn(b.host, b.port, timeout=10) as conn:
                    p = kp.produce(conn, topic, 0, data)
                # Answers about the batch itself end the retries; leadership errors do not.
                if p["error_code"] in (0, OUT_OF_ORDER_SEQUENCE_NUMBER, DUPLICATE_SEQUENCE_NUMBER):
                    return p
            except (ConnectionError, OSError):
                pass
        assert time.monotonic() < deadline, f"no leader of {topic} took the batch"
        time.sleep(0.1)


def test_retried_batches_after_failover_get_their_original_offsets(cluster):
    c = cluster
    topic = f"idemfo-{uuid.uuid4().hex[:8]}"
    admin = c.admin(1)
    from confluent_kafka.admin import NewTopic
    admin.create_topics([NewTopic(topic, 1, 3, config={"segment.bytes": "1000", "min.insync.replicas": "2"})])[
        topic].result(60)
    c.wait_topic_online(topic, 1)
    wait_until(lambda: sorted(c.partition_state(topic, 0)["isr"]) == [1, 2, 3], 60, "a full ISR", interval=0.2)
    with kp.Conn(c.brokers[1].host, c.brokers[1].port) as conn:
        r = kp.decode_init_producer_id(conn.call(kp.INIT_PRODUCER_ID, 4, kp.init_producer_id_request(4)), 4)
    assert r["error_code"] == 0, r
    pid, epoch = r["producer_id"], r["producer_epoch"]
    offsets = [produce_to_leader(c, topic, batch(pid, epoch, seq))["base_offset"] for seq in range(6)]
    assert offsets == list(range(6)), offsets
    old = c.partition_state(topic, 0)["leader"]
    # acks=all with the whole ISR: every follower has every batch before the leader goes.
    c.brokers[old].kill()
    wait_until(lambda: c.partition_state(topic, 0)["leader"] not in (old, -1), c.failover_timeout,
               "a new leader", interval=0.2)
    # The client's retries of its last batches, as after a lost acknowledgement.
    for seq in range(1, 6):
        p = produce_to_leader(c, topic, batch(pid, epoch, seq))
        assert (p["error_code"], p["base_offset"]) == (0, offsets[seq]), f"retry of batch {seq}: {p}"
    new = c.brokers[c.partition_state(topic, 0)["leader"]]
    with kp.Conn(new.host, new.port) as conn:
        assert kp.list_offset(conn, topic, 0, kp.LATEST)["offset"] == 6, "a retry was written again"
