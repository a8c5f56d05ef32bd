"""One transaction by raw frames, at the lowest and at the highest advertised version of each
transaction API: FindCoordinator (key type 1) -> InitProducerId -> AddPartitionsToTxn ->
transactional Produce -> AddOffsetsToTxn -> TxnOffsetCommit -> DescribeTransactions /
ListTransactions -> EndTxn, with ListOffsets read_committed showing the last stable offset held
back by the open transaction and released by its marker; then WriteTxnMarkers as
`kafka-transactions abort` sends it ends a second transaction."""
import time
import uuid

import pytest

import kproto as kp
import kproto_groups as kg
import kproto_txn as kt
from test_apis import advertised, new_topic

WAIT = 30
LATEST = -1
UNSTABLE_OFFSET_COMMIT = 88


def retry(what, fn, retriable=(kt.COORDINATOR_LOAD_IN_PROGRESS, kt.COORDINATOR_NOT_AVAILABLE,
                               kt.CONCURRENT_TRANSACTIONS, kt.NOT_COORDINATOR)):
    """Calls fn() -> (error code, value) until the code is not a retriable coordinator error."""
    deadline = time.monotonic() + WAIT
    while True:
        code, value = fn()
        if code not in retriable:
            return code, value
        assert time.monotonic() < deadline, f"{what}: still error {code} after {WAIT}s"
        time.sleep(0.1)


def committed_latest(c, topic):
    r = c.call(kp.LIST_OFFSETS, 5, kp.list_offsets_request(5, {topic: {0: LATEST}}, isolation_level=1))
    return kp.decode_list_offsets(r, 5)["topics"][0]["partitions"][0]["offset"]


def uncommitted_latest(c, topic):
    return kp.list_offset(c, topic, 0, LATEST)["offset"]


def wait_for(what, cond):
    deadline = time.monotonic() + WAIT
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.mark.parametrize("which", ["min", "max"])
def test_transaction_by_raw_frames(broker, which):
    apis = [kt.ADD_PARTITIONS_TO_TXN, kt.ADD_OFFSETS_TO_TXN, kt.END_TXN, kt.TXN_OFFSET_COMMIT,
            kt.WRITE_TXN_MARKERS, kt.DESCRIBE_TRANSACTIONS, kt.LIST_TRANSACTIONS]
    v = {}
    for api in apis:
        lo, hi = advertised(broker, api)
        v[api] = lo if which == "min" else hi
    txn_id = f"tx-{uuid.uuid4().hex[:8]}"
    group = f"g-{uuid.uuid4().hex[:8]}"
    with kp.Conn(broker.host, broker.port) as c:
        topic = new_topic(c)
        for key, key_type in ((group, 0), (txn_id, 1)):
            fv = 4 if which == "max" else 1

            def find():
                out = kg.decode_find_coordinator(c.call(kg.FIND_COORDINATOR, fv,
                                                        kg.find_coordinator_request(fv, key, key_type)), fv)
                return out["coordinators"][0]["error_code"], out["coordinators"][0]
            code, coord = retry(f"FindCoordinator {key_type}", find)
            assert code == 0 and coord["port"] == broker.port, coord

        def init():
            out = kp.decode_init_producer_id(c.call(kp.INIT_PRODUCER_ID, 4,
                                                    kp.init_producer_id_request(4, txn_id, 60000)), 4)
            return out["error_code"], out
        code, ids = retry("InitProducerId", init)
        assert code == 0, ids
        pid, epoch = ids["producer_id"], ids["producer_epoch"]
        # Over transaction.max.timeout.ms: refused.
        out = kp.decode_init_producer_id(c.call(kp.INIT_PRODUCER_ID, 4,
                                                kp.init_producer_id_request(4, txn_id, 900_001)), 4)
        assert out["error_code"] == kt.INVALID_TRANSACTION_TIMEOUT

        # A transactional produce before the partition was added is refused.
        batch = kp.build_batch([kp.Record(value=b"early")], producer_id=pid, producer_epoch=epoch,
                               base_sequence=0, transactional=True)
        r = c.call(kp.PRODUCE, 8, kp.produce_request(8, {topic: {0: batch}}, transactional_id=txn_id))
        assert kp.decode_produce(r, 8)["responses"][0]["partitions"][0]["error_code"] == kt.INVALID_TXN_STATE

        va = v[kt.ADD_PARTITIONS_TO_TXN]
        r = c.call(kt.ADD_PARTITIONS_TO_TXN, va, kt.add_partitions_to_txn_request(va, txn_id, pid, epoch, {topic: [0]}))
        assert kt.decode_add_partitions_to_txn(r, va)["errors"] == {(topic, 0): 0}
        # A producer id the coordinator does not know for the id is refused.
        r = c.call(kt.ADD_PARTITIONS_TO_TXN, va,
                   kt.add_partitions_to_txn_request(va, txn_id, pid + 1, epoch, {topic: [0]}))
        assert kt.decode_add_partitions_to_txn(r, va)["errors"] == {(topic, 0): kt.INVALID_PRODUCER_ID_MAPPING}

        before = uncommitted_latest(c, topic)
        batch = kp.build_batch([kp.Record(value=b"a"), kp.Record(value=b"b")], producer_id=pid,
                               producer_epoch=epoch, base_sequence=0, transactional=True)
        r = c.call(kp.PRODUCE, 8, kp.produce_request(8, {topic: {0: batch}}, transactional_id=txn_id))
        assert kp.decode_produce(r, 8)["responses"][0]["partitions"][0]["error_code"] == 0
        assert uncommitted_latest(c, topic) == before + 2
        assert committed_latest(c, topic) == before, "the open transaction holds back the LSO"

        vo = v[kt.ADD_OFFSETS_TO_TXN]
        r = c.call(kt.ADD_OFFSETS_TO_TXN, vo, kt.add_offsets_to_txn_request(vo, txn_id, pid, epoch, group))
        assert kt.decode_error_only(r, vo)["error_code"] == 0
        vc = v[kt.TXN_OFFSET_COMMIT]
        r = c.call(kt.TXN_OFFSET_COMMIT, vc,
                   kt.txn_offset_commit_request(vc, txn_id, group, pid, epoch, {topic: {0: 2}}))
        assert kt.decode_txn_offset_commit(r, vc)["errors"] == {(topic, 0): 0}
        # KIP-447: with require_stable the open transaction's offset is UNSTABLE_OFFSET_COMMIT
        # (v7 and the per-group v8+ layout); without it, the last committed one (none yet).
        for fv in (7, 8):
            r = c.call(kg.OFFSET_FETCH, fv, kg.offset_fetch_request(fv, group, {topic: [0]}, require_stable=True))
            assert kg.decode_offset_fetch(r, fv)["offsets"][(topic, 0)][::3] == (-1, UNSTABLE_OFFSET_COMMIT)
            r = c.call(kg.OFFSET_FETCH, fv, kg.offset_fetch_request(fv, group, {topic: [0]}))
            assert kg.decode_offset_fetch(r, fv)["offsets"][(topic, 0)][::3] == (-1, 0)

        vd = v[kt.DESCRIBE_TRANSACTIONS]
        r = c.call(kt.DESCRIBE_TRANSACTIONS, vd, kt.describe_transactions_request(vd, [txn_id, "no-such-id"]))
        states = kt.decode_describe_transactions(r, vd)["states"]
        assert states[0]["error_code"] == 0 and states[0]["state"] == "Ongoing", states
        assert states[0]["producer_id"] == pid and states[0]["topics"][topic] == [0]
        assert "__consumer_offsets" in states[0]["topics"]
        assert states[1]["error_code"] == 105  # TRANSACTIONAL_ID_NOT_FOUND
        vl = v[kt.LIST_TRANSACTIONS]
        r = c.call(kt.LIST_TRANSACTIONS, vl, kt.list_transactions_request(vl, states=["Ongoing", "Bogus"]))
        listed = kt.decode_list_transactions(r, vl)
        assert listed["unknown_state_filters"] == ["Bogus"]
        assert [s["transactional_id"] for s in listed["states"]] == [txn_id]

        ve = v[kt.END_TXN]
        r = c.call(kt.END_TXN, ve, kt.end_txn_request(ve, txn_id, pid, epoch, True))
        assert kt.decode_error_only(r, ve)["error_code"] == 0
        wait_for("the COMMIT marker", lambda: committed_latest(c, topic) == before + 3)
        assert uncommitted_latest(c, topic) == before + 3
        # A retried commit succeeds; an abort of a committed transaction is refused.
        code, _ = retry("EndTxn retry", lambda: (kt.decode_error_only(
            c.call(kt.END_TXN, ve, kt.end_txn_request(ve, txn_id, pid, epoch, True)), ve)["error_code"], None))
        assert code == 0
        r = c.call(kt.END_TXN, ve, kt.end_txn_request(ve, txn_id, pid, epoch, False))
        assert kt.decode_error_only(r, ve)["error_code"] == kt.INVALID_TXN_STATE
        # The group's offset is committed.
        r = c.call(kg.OFFSET_FETCH, 5, kg.offset_fetch_request(5, group, {topic: [0]}))
        fetched = kg.decode_offset_fetch(r, 5)
        assert fetched["offsets"][(topic, 0)][0] == 2, fetched
        r = c.call(kg.OFFSET_FETCH, 8, kg.offset_fetch_request(8, group, {topic: [0]}, require_stable=True))
        assert kg.decode_offset_fetch(r, 8)["offsets"][(topic, 0)][::3] == (2, 0), "stable once committed"

        # A second transaction, ended by WriteTxnMarkers straight to the leader.
        def add():
            r = c.call(kt.ADD_PARTITIONS_TO_TXN, va,
                       kt.add_partitions_to_txn_request(va, txn_id, pid, epoch, {topic: [0]}))
            return kt.decode_add_partitions_to_txn(r, va)["errors"][(topic, 0)], None
        assert retry("AddPartitionsToTxn", add)[0] == 0
        batch = kp.build_batch([kp.Record(value=b"c")], producer_id=pid, producer_epoch=epoch,
                               base_sequence=2, transactional=True)
        r = c.call(kp.PRODUCE, 8, kp.produce_request(8, {topic: {0: batch}}, transactional_id=txn_id))
        assert kp.decode_produce(r, 8)["responses"][0]["partitions"][0]["error_code"] == 0
        assert committed_latest(c, topic) == before + 3
        vm = v[kt.WRITE_TXN_MARKERS]
        r = c.call(kt.WRITE_TXN_MARKERS, vm,
                   kt.write_txn_markers_request(vm, [(pid, epoch, False, {topic: [0]}, 0)]))
        markers = kt.decode_write_txn_markers(r, vm)["markers"]
        assert markers == [{"producer_id": pid, "errors": {(topic, 0): 0}}]
        assert committed_latest(c, topic) == uncommitted_latest(c, topic) == before + 5


def test_describe_producers_reports_the_coordinator_epoch_of_the_last_marker(broker):
    """Kafka keeps, per producer, the coordinator epoch of its last transaction marker (read
    from the marker's value), reports it in DescribeProducers, and keeps it across restarts:
    in the `.snapshot` a clean shutdown writes, and in the log a rescan reads."""
    import kproto_admin as ka
    with kp.Conn(broker.host, broker.port) as c:
        topic = new_topic(c, 1)
        batch = kp.build_batch([kp.Record(value=b"a"), kp.Record(value=b"b")], producer_id=4343,
                               producer_epoch=2, base_sequence=0)
        assert kp.produce(c, topic, 0, batch)["error_code"] == 0

        def described():
            r = ka.decode_describe_producers(c.call(ka.DESCRIBE_PRODUCERS, 0,
                                             ka.describe_producers_request(0, {topic: [0]})), 0)
            code, prods = r["partitions"][(topic, 0)]
            assert code == 0
            return prods
        assert [p["coordinator_epoch"] for p in described()] == [-1], "no marker yet"
        # An ABORT marker as `kafka-transactions abort` has the coordinator write it.
        vm = advertised(broker, kt.WRITE_TXN_MARKERS)[1]
        r = c.call(kt.WRITE_TXN_MARKERS, vm, kt.write_txn_markers_request(vm, [(4343, 2, False, {topic: [0]}, 7)]))
        assert kt.decode_write_txn_markers(r, vm)["markers"] == [{"producer_id": 4343, "errors": {(topic, 0): 0}}]
        [p] = described()
        assert (p["producer_id"], p["producer_epoch"], p["last_sequence"], p["coordinator_epoch"]) == (4343, 2, 1, 7), p
        assert p["current_txn_start_offset"] == -1, p
    before = p

    def after_restart():
        with kp.Conn(broker.host, broker.port) as c:
            r = ka.decode_describe_producers(c.call(ka.DESCRIBE_PRODUCERS, 0,
                                             ka.describe_producers_request(0, {topic: [0]})), 0)
        return r["partitions"][(topic, 0)]

    broker.restart()
    snapshots = list(broker.data_dir.glob(f"{topic}-0/*.snapshot"))
    assert snapshots, "a clean shutdown writes a producer snapshot"
    assert after_restart() == (0, [before]), "read back from the snapshot"
    # Without snapshots the state is rebuilt from the log, the marker's value included.
    broker.stop()
    for s in broker.data_dir.glob(f"{topic}-0/*.snapshot"):
        s.unlink()
    broker.restart()
    assert after_restart() == (0, [before]), "rebuilt from the log"


INVALID_REQUEST = 42


def test_init_producer_id_with_the_held_epoch_bumps_once_and_fences_stale_epochs(broker):
    """KIP-360 as librdkafka uses it after an abortable error: InitProducerId naming the producer
    id and epoch the client holds. A retried bump (its answer lost) gets the same epoch again, an
    epoch the client no longer holds is fenced (INVALID_PRODUCER_EPOCH before v4), a half-given
    producer is malformed, and an idempotent producer gets a new id as from Kafka 3.9."""
    txn_id = f"tx-{uuid.uuid4().hex[:8]}"
    with kp.Conn(broker.host, broker.port) as c:
        def find():
            out = kg.decode_find_coordinator(c.call(kg.FIND_COORDINATOR, 4,
                                                    kg.find_coordinator_request(4, txn_id, 1)), 4)
            return out["coordinators"][0]["error_code"], out["coordinators"][0]
        code, coord = retry("FindCoordinator", find)
        assert code == 0 and coord["port"] == broker.port, coord

        def init(v, held=(-1, -1), tid=txn_id):
            def call():
                req = kp.init_producer_id_request(v, tid, 60000, producer_id=held[0], producer_epoch=held[1])
                out = kp.decode_init_producer_id(c.call(kp.INIT_PRODUCER_ID, v, req), v)
                return out["error_code"], (out["producer_id"], out["producer_epoch"])
            return retry(f"InitProducerId v{v} {held}", call)

        code, (pid, epoch) = init(4)
        assert code == 0
        assert init(4, (pid, epoch)) == (0, (pid, epoch + 1))
        assert init(4, (pid, epoch)) == (0, (pid, epoch + 1)), "a retried bump is answered, not bumped again"
        assert init(4, (pid, epoch + 1)) == (0, (pid, epoch + 2))
        assert init(4, (pid, epoch))[0] == kt.PRODUCER_FENCED
        assert init(3, (pid, epoch))[0] == kt.INVALID_PRODUCER_EPOCH
        assert init(4, (pid + 1, epoch + 2))[0] == kt.PRODUCER_FENCED, "another producer id"
        assert init(4, (pid, -1))[0] == INVALID_REQUEST
        # The fenced attempts changed nothing: the holder of the current epoch still bumps.
        assert init(4, (pid, epoch + 2)) == (0, (pid, epoch + 3))

        code, (ipid, iepoch) = init(4, (pid, epoch + 3), tid=None)
        assert code == 0 and ipid != pid and iepoch == 0, (ipid, iepoch)
        # An empty transactional id is neither a transaction's nor an idempotent producer's.
        assert init(4, tid="")[0] == INVALID_REQUEST
