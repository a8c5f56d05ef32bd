"""Stalls and crashes the fuzzers found (scripts/wire-fuzz, fuzz/), each with the request
that caused it.

DeleteTopics stall (wire fuzzer, standalone, seed 11): a mutated CreatePartitions had grown
a recorded topic to thousands of partitions; the recorded DeleteTopics of it then removed
every partition's log on an async worker, and for 16 s no new connection got an answer. With
the deletion moved off the async workers the stall came back (8 s, same seed): the recorded
clients' Metadata requests auto-create topics, and each waited on an async worker for the
admin lock the deletion held, until no worker was left to answer anyone."""
import os
import struct
import time

import kproto as kp
from gregor_harness import api_versions_probe


def test_a_new_connection_is_answered_while_a_large_topic_is_deleted(broker):
    n = 3000
    c = kp.Conn(broker.host, broker.port, timeout=300)
    r = kp.decode_create_topics(c.call(kp.CREATE_TOPICS, 4, kp.create_topics_request(4, [("doomed", n, 1)])), 4)
    assert r["topics"][0]["error_code"] == 0, r

    def left() -> int:
        return sum(1 for p in broker.data_dir.iterdir() if p.name.startswith("doomed-") and p.is_dir())

    assert left() == n
    corr = c.send(kp.DELETE_TOPICS, 4, kp.delete_topics_request(4, ["doomed"]))
    # Once the logs are being removed, a new client must still be served at once: answered
    # while most of the topic's partition directories are still there, even with more
    # Metadata requests waiting to auto-create topics than the broker has async workers.
    deadline = time.monotonic() + 120
    while left() == n:
        assert time.monotonic() < deadline, "the topic's logs were never removed"
        time.sleep(0.01)
    creators = []
    for i in range((os.cpu_count() or 2) + 2):
        m = kp.Conn(broker.host, broker.port, timeout=300)
        m.send(kp.METADATA, 4, kp.metadata_request(4, [f"auto-{i}"], allow_auto=True))
        creators.append(m)
    api_versions_probe(broker.host, broker.port, timeout=60)
    remaining = left()
    assert remaining > 0, "ApiVersions was answered only after the whole topic was deleted"
    c.sock.settimeout(300)
    (size,) = struct.unpack(">i", kp.recv_exact(c.sock, 4))
    payload = kp.recv_exact(c.sock, size)
    assert struct.unpack(">i", payload[:4])[0] == corr
    assert left() == 0
    c.close()
    for m in creators:
        kp.recv_frame(m.sock)
        m.close()
