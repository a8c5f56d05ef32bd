use super::*;
use crate::log::batch::simple_batch;

/// A partition of broker 1 over a fresh log in `dir`.
fn partition(dir: &std::path::Path) -> Partition {
    let config = LogConfig { segment_bytes: 1 << 20, max_index_size: 4096, ..LogConfig::default() };
    let log = Log::open(dir.join("t-0"), config, 0, 0, true).unwrap();
    Partition::open("t", 0, 1, Arc::new(Mutex::new(log)), None, TopicMetrics::detached(), IsrMetrics::detached())
}

fn append(p: &Partition, records: usize) -> ProduceResult {
    let r = p.append(Bytes::from(simple_batch(records, 10, 1)), 1 << 20);
    assert_eq!(r.error_code, 0);
    r
}

#[test]
fn markers_end_transactions_and_bound_the_stable_offset() {
    use crate::log::batch::{encode_batch, BatchOptions, SimpleRecord, TRANSACTIONAL_BIT};
    let dir = tempfile::tempdir().unwrap();
    let p = partition(dir.path());
    p.become_leader(0, &[1], &[1]);
    let opts = BatchOptions {
        attributes: TRANSACTIONAL_BIT,
        producer_id: 7,
        producer_epoch: 0,
        base_sequence: 0,
        ..BatchOptions::default()
    };
    let recs: Vec<SimpleRecord<'_>> =
        (0..3).map(|_| SimpleRecord { timestamp: 1, key: None, value: Some(b"x"), headers: vec![] }).collect();
    assert_eq!(p.append(Bytes::from(encode_batch(&opts, &recs)), 1 << 20).error_code, 0);
    append(&p, 2);
    assert_eq!(p.high_watermark(), 5);
    assert_eq!(p.last_stable_offset(), 0, "the open transaction holds the LSO at its first offset");
    let r = p.read(0, 1 << 20, -1, true);
    assert!(r.records.is_empty());
    assert_eq!(r.last_stable_offset, 0);
    assert!(!p.read(0, 1 << 20, -1, false).records.is_empty());
    // A client may not write markers.
    let marker = crate::log::batch::encode_control_batch(7, 0, true, 0, 1);
    assert_eq!(p.append(Bytes::from(marker), 1 << 20).error_code, ErrorCode::InvalidRecord.code());
    assert_eq!(p.write_marker(7, 0, false, 3), (0, 5));
    assert_eq!(p.high_watermark(), 6);
    assert_eq!(p.last_stable_offset(), 6);
    let r = p.read(0, 1 << 20, -1, true);
    assert_eq!(r.aborted, Some(vec![(7, 0)]));
    assert!(p.read(6, 1 << 20, -1, true).aborted.unwrap_or_default().is_empty());
    // The producer's older epoch is fenced by a newer marker.
    assert_eq!(p.write_marker(7, 1, false, 3).0, 0);
    assert_eq!(p.write_marker(7, 0, true, 3).0, ErrorCode::InvalidProducerEpoch.code());
    drop(p);
    // The records are stamped 1 ms after the epoch and the marker now: segment.ms rolled
    // the log at the marker, and the entry is in the index of the segment holding it.
    let txnindex = std::fs::read(dir.path().join("t-0/00000000000000000005.txnindex")).unwrap();
    assert_eq!(txnindex.len(), 34, "one aborted transaction, one Kafka .txnindex entry");
    assert_eq!(&txnindex[2..10], &7i64.to_be_bytes());
    // Reopened, the partition knows the abort again.
    let p = partition(dir.path());
    p.become_leader(1, &[1], &[1]);
    assert_eq!(p.last_stable_offset(), p.high_watermark());
    assert_eq!(p.read(0, 1 << 20, -1, true).aborted, Some(vec![(7, 0)]));
}

/// A partition over `dir/t-0` with small segments, opened as after a crash (or cleanly).
fn small_segment_partition(dir: &std::path::Path, clean: bool) -> Partition {
    let config = LogConfig { segment_bytes: 1024, max_index_size: 4096, ..LogConfig::default() };
    let log = Log::open(dir.join("t-0"), config, 0, 0, clean).unwrap();
    let p =
        Partition::open("t", 0, 1, Arc::new(Mutex::new(log)), None, TopicMetrics::detached(), IsrMetrics::detached());
    p.become_leader(0, &[1], &[1]);
    p
}

/// Records stamped now, so that segment.ms does not roll the log at the next marker.
fn txn_batch(producer_id: i64, seq: i32, n: usize) -> Bytes {
    txn_batch_at(producer_id, seq, n, crate::log::now_ms())
}

fn txn_batch_at(producer_id: i64, seq: i32, n: usize, timestamp: i64) -> Bytes {
    use crate::log::batch::{encode_batch, BatchOptions, SimpleRecord, TRANSACTIONAL_BIT};
    let opts = BatchOptions {
        attributes: TRANSACTIONAL_BIT,
        producer_id,
        producer_epoch: 0,
        base_sequence: seq,
        ..BatchOptions::default()
    };
    let recs: Vec<SimpleRecord<'_>> =
        (0..n).map(|_| SimpleRecord { timestamp, key: None, value: Some(b"t"), headers: vec![] }).collect();
    Bytes::from(encode_batch(&opts, &recs))
}

#[test]
fn a_write_verified_before_its_transactions_marker_is_refused_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let p = small_segment_partition(dir.path(), true);
    // First transaction: verified, written, then ended by its marker.
    let before = p.txn_markers_of(9);
    assert_eq!(p.append_verified(txn_batch(9, 0, 2), 1 << 20, Some(before)).error_code, 0);
    assert_eq!(p.write_marker(9, 0, true, 1).0, 0);
    // A late write of that transaction, verified before the marker: refused, so it cannot
    // open a transaction behind the marker that nothing would end.
    let r = p.append_verified(txn_batch(9, 2, 1), 1 << 20, Some(before));
    assert_eq!(r.error_code, ErrorCode::InvalidTxnState.code());
    assert_eq!(p.last_stable_offset(), p.high_watermark());
    // The next transaction, verified after the marker, is written; so is its second
    // write, even after another producer's marker.
    let now = p.txn_markers_of(9);
    assert_eq!(p.append_verified(txn_batch(9, 2, 1), 1 << 20, Some(now)).error_code, 0);
    assert_eq!(p.write_marker(4, 0, false, 1).0, 0);
    assert_eq!(p.append_verified(txn_batch(9, 3, 1), 1 << 20, Some(now)).error_code, 0);
    assert!(p.last_stable_offset() < p.high_watermark(), "its transaction is open");
}

fn snapshots(dir: &std::path::Path) -> Vec<i64> {
    snapshot::list(&dir.join("t-0")).into_iter().map(|(o, _)| o).collect()
}

#[test]
fn a_transaction_opened_segments_ago_survives_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let p = small_segment_partition(dir.path(), true);
    assert_eq!(p.append(txn_batch(7, 0, 3), 1 << 20).error_code, 0);
    while p.lock_log().segment_count() < 6 {
        append(&p, 5);
    }
    let (hw, taken) = (p.high_watermark(), snapshots(dir.path()));
    assert_eq!(p.last_stable_offset(), 0);
    assert_eq!(taken.len(), snapshot::SNAPSHOTS_KEPT, "a snapshot per roll, the newest few kept: {taken:?}");
    assert!(taken.iter().all(|&o| o > 3 && p.lock_log().segment_base_offsets().contains(&o)));
    drop(p);
    // No clean shutdown: the newest snapshot plus the active segment tell of the transaction.
    let p = small_segment_partition(dir.path(), false);
    assert_eq!(p.high_watermark(), hw);
    assert_eq!(p.last_stable_offset(), 0, "the open transaction still holds back the stable offset");
    assert!(p.read(0, 1 << 20, -1, true).records.is_empty());
    // Its sequence continues where it was: the snapshot kept the producer's last batch.
    assert_eq!(p.append(txn_batch(7, 3, 1), 1 << 20).error_code, 0);
    let (code, marker) = p.write_marker(7, 0, false, 0);
    assert_eq!(code, 0);
    assert_eq!(p.last_stable_offset(), marker + 1);
    assert_eq!(p.read(0, 1 << 20, -1, true).aborted, Some(vec![(7, 0)]));
}

#[test]
fn a_snapshot_is_what_a_restart_reads_and_a_bad_one_is_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let p = small_segment_partition(dir.path(), true);
    for _ in 0..4 {
        append(&p, 5);
    }
    let leo = p.log_end_offset();
    drop(p);
    let logdir = dir.path().join("t-0");
    // A snapshot the log itself does not back: producer 99 with a transaction open at 2.
    // Trusting it shows the restart read it rather than rescanning the log.
    let entry = snapshot::SnapshotEntry {
        producer_id: 99,
        epoch: 0,
        last_sequence: 0,
        last_offset: 2,
        offset_delta: 0,
        timestamp: 1,
        coordinator_epoch: -1,
        current_txn_first_offset: 2,
    };
    snapshot::write(&logdir, leo, &snapshot::encode(&[entry])).unwrap();
    // One from beyond the log end (a crash lost what it described) is deleted unread.
    snapshot::write(&logdir, leo + 100, &snapshot::encode(&[])).unwrap();
    let p = small_segment_partition(dir.path(), false);
    assert_eq!(p.last_stable_offset(), 2);
    assert_eq!(snapshots(dir.path()), vec![leo]);
    drop(p);
    // Torn: ignored with a warning, deleted, and the log rescanned (which knows no
    // transaction).
    let path = snapshot::snapshot_path(&logdir, leo);
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() - 3]).unwrap();
    let p = small_segment_partition(dir.path(), false);
    assert_eq!(p.last_stable_offset(), p.high_watermark());
    assert_eq!(p.high_watermark(), leo);
    // The rescan left a snapshot at the end for the next rebuild.
    assert_eq!(snapshots(dir.path()), vec![leo]);
    assert!(snapshot::decode(&std::fs::read(&path).unwrap()).unwrap().is_empty());
}

#[test]
fn a_shutdown_snapshot_is_kafkas_format_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    let p = partition(dir.path());
    p.become_leader(0, &[1], &[1]);
    append(&p, 2);
    assert_eq!(p.append(txn_batch_at(7, 0, 3, 1), 1 << 20).error_code, 0);
    p.snapshot_producer_state();
    let b = std::fs::read(dir.path().join("t-0/00000000000000000005.snapshot")).unwrap();
    let i16_at = |o: usize| i16::from_be_bytes(b[o..o + 2].try_into().unwrap());
    let i32_at = |o: usize| i32::from_be_bytes(b[o..o + 4].try_into().unwrap());
    let i64_at = |o: usize| i64::from_be_bytes(b[o..o + 8].try_into().unwrap());
    assert_eq!(i16_at(0), 1, "version");
    assert_eq!(u32::from_be_bytes(b[2..6].try_into().unwrap()), crc32c::crc32c(&b[6..]), "CRC32C of the rest");
    assert_eq!(i32_at(6), 1, "one producer entry");
    assert_eq!(b.len(), 10 + 46);
    assert_eq!(i64_at(10), 7, "producer id");
    assert_eq!(i16_at(18), 0, "epoch");
    assert_eq!(i32_at(20), 2, "last sequence");
    assert_eq!(i64_at(24), 4, "last offset");
    assert_eq!(i32_at(32), 2, "offset delta");
    assert_eq!(i64_at(36), 1, "timestamp");
    assert_eq!(i32_at(44), -1, "coordinator epoch");
    assert_eq!(i64_at(48), 2, "first offset of the open transaction");
}

#[test]
fn truncation_drops_aborts_and_snapshots_above_the_new_end() {
    let dir = tempfile::tempdir().unwrap();
    let p = partition(dir.path());
    p.become_leader(0, &[1], &[1]);
    assert_eq!(p.append(txn_batch(7, 0, 3), 1 << 20).error_code, 0);
    assert_eq!(p.write_marker(7, 0, false, 0), (0, 3));
    assert_eq!(p.append(txn_batch(8, 0, 2), 1 << 20).error_code, 0);
    assert_eq!(p.write_marker(8, 0, true, 0), (0, 6));
    p.snapshot_producer_state();
    let txnindex = dir.path().join("t-0/00000000000000000000.txnindex");
    assert_eq!(std::fs::read(&txnindex).unwrap().len(), 34);
    assert_eq!(snapshots(dir.path()), vec![7]);
    p.become_follower(2, 1, &[1, 2], &[1, 2]);
    // The commit marker goes: producer 8's transaction is open again.
    p.truncate_to(6).unwrap();
    assert_eq!(snapshots(dir.path()), vec![6], "the one above the new end went; a rebuilt one is at it");
    assert_eq!(std::fs::read(&txnindex).unwrap().len(), 34, "the abort below the new end stays");
    assert_eq!(p.last_stable_offset(), 4);
    // The abort marker goes too: both transactions are open, nothing is aborted.
    p.truncate_to(3).unwrap();
    assert!(!txnindex.exists(), "the abort above the new end left the index");
    assert_eq!(p.last_stable_offset(), 0);
    p.become_leader(3, &[1], &[1]);
    assert_eq!(p.read(0, 1 << 20, -1, false).aborted, None);
    assert_eq!(p.write_marker(7, 0, true, 0), (0, 3));
    assert_eq!(p.read(0, 1 << 20, -1, true).aborted, Some(vec![]));
}

#[test]
fn a_missing_or_torn_txnindex_is_rebuilt_from_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let p = small_segment_partition(dir.path(), true);
    assert_eq!(p.append(txn_batch(7, 0, 3), 1 << 20).error_code, 0);
    assert_eq!(p.write_marker(7, 0, false, 0), (0, 3));
    while p.lock_log().segment_count() < 4 {
        let now = crate::log::now_ms();
        assert_eq!(p.append(Bytes::from(simple_batch(5, 10, now)), 1 << 20).error_code, 0);
    }
    drop(p);
    let txnindex = dir.path().join("t-0/00000000000000000000.txnindex");
    let original = std::fs::read(&txnindex).unwrap();
    assert_eq!(original.len(), 34);
    // Torn (a crash while appending an entry): rebuilt from the log, below every snapshot.
    std::fs::write(&txnindex, &original[..20]).unwrap();
    let p = small_segment_partition(dir.path(), false);
    let rebuilt = std::fs::read(&txnindex).unwrap();
    assert_eq!(rebuilt[..26], original[..26], "version, producer id, first and last offset");
    assert_eq!(p.read(0, 1 << 20, -1, true).aborted, Some(vec![(7, 0)]));
    drop(p);
    // An entry whose marker is not in its segment: damage, rebuilt the same way.
    let mut alien = original.clone();
    alien[18..26].copy_from_slice(&1_000_000i64.to_be_bytes());
    std::fs::write(&txnindex, &alien).unwrap();
    let p = small_segment_partition(dir.path(), false);
    assert_eq!(std::fs::read(&txnindex).unwrap()[..26], original[..26]);
    // Missing where the restart rescans (the active segment, above the newest snapshot,
    // where a crash can lose an entry written after its marker): rebuilt too.
    assert_eq!(p.append(txn_batch(8, 0, 1), 1 << 20).error_code, 0);
    let (_, marker) = p.write_marker(8, 0, false, 0);
    let active = p.lock_log().segment_base_offsets().last().copied().unwrap();
    let newest = dir.path().join(format!("t-0/{}.txnindex", crate::log::file_prefix(active)));
    let written = std::fs::read(&newest).unwrap();
    drop(p);
    std::fs::remove_file(&newest).unwrap();
    let p = small_segment_partition(dir.path(), false);
    assert_eq!(std::fs::read(&newest).unwrap()[..26], written[..26]);
    assert_eq!(p.read(0, 1 << 20, -1, true).aborted, Some(vec![(7, 0), (8, marker - 1)]));
}

#[test]
fn a_leaders_isr_changes_are_counted_once_and_appends_by_records() {
    let dir = tempfile::tempdir().unwrap();
    let m = crate::metrics::BrokerMetrics::new().unwrap();
    let config = LogConfig { segment_bytes: 1 << 20, max_index_size: 4096, ..LogConfig::default() };
    let log = Log::open(dir.path().join("t-0"), config, 0, 0, true).unwrap();
    let p = Partition::open("t", 0, 1, Arc::new(Mutex::new(log)), None, m.topics.topic("t"), m.isr.clone());
    p.become_leader(0, &[1, 2, 3], &[1, 2, 3]);
    assert_eq!(m.isr.counts(), (0, 0), "a new leader's ISR is not a change");
    p.set_isr(vec![1, 2]);
    // The controller's LeaderAndIsr carrying the ISR just applied changes nothing.
    p.become_leader(0, &[1, 2, 3], &[1, 2]);
    assert_eq!(m.isr.counts(), (1, 0));
    // Here LeaderAndIsr came first and the AlterPartition answer second.
    p.become_leader(0, &[1, 2, 3], &[1, 2, 3]);
    p.set_isr(vec![1, 2, 3]);
    assert_eq!(m.isr.counts(), (1, 1));
    // A follower's ISR, or a new epoch's, is not this broker's change.
    p.become_follower(2, 1, &[1, 2, 3], &[2, 3]);
    p.set_isr(vec![2]);
    p.become_leader(2, &[1, 2, 3], &[1]);
    assert_eq!(m.isr.counts(), (1, 1));

    let batch = simple_batch(5, 10, 1);
    let bytes = batch.len();
    assert_eq!(p.append(Bytes::from(batch), 1 << 20).error_code, 0);
    let text = m.render(&Default::default());
    assert!(text.contains("kafka_server_brokertopicmetrics_messagesin_total{topic=\"t\"} 5\n"), "{text}");
    assert!(text.contains(&format!("kafka_server_brokertopicmetrics_bytesin_total{{topic=\"t\"}} {bytes}\n")));
    assert_eq!(p.log_stats().size_bytes(), bytes as u64);
}

/// Whether `waiter` holds a wake-up: a permit makes `notified()` ready at its first poll.
fn woken(waiter: &Notify) -> bool {
    let n = waiter.notified();
    tokio::pin!(n);
    n.enable()
}

#[test]
fn an_append_wakes_the_waiters_of_its_partition_only() {
    let (d1, d2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (a, b) = (partition(d1.path()), partition(d2.path()));
    a.become_leader(0, &[1], &[1]);
    b.become_leader(0, &[1], &[1]);
    let (on_a, on_b) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    a.watch(&on_a);
    b.watch(&on_b);
    // Listed once however often it registers (a fetch re-registers after each wake-up).
    b.watch(&on_b);
    append(&a, 2);
    assert!(woken(&on_a), "an append wakes its own partition's waiter");
    assert!(!woken(&on_b), "and no other partition's");
    // One-shot: a second append needs a second registration.
    append(&a, 1);
    assert!(!woken(&on_a));
    append(&b, 1);
    assert!(woken(&on_b));
    assert!(!woken(&on_b), "registered twice, woken once");

    // acks=all: a follower's fetch that moves the high watermark wakes the producer.
    let d3 = tempfile::tempdir().unwrap();
    let c = partition(d3.path());
    c.become_leader(0, &[1, 2], &[1, 2]);
    append(&c, 3);
    let producer = Arc::new(Notify::new());
    c.watch(&producer);
    c.follower_fetch(2, 0, -1, 0, 1 << 20);
    assert!(!woken(&producer), "the follower has nothing yet: the high watermark stays");
    c.follower_fetch(2, 3, -1, 0, 1 << 20);
    assert!(woken(&producer));
    // A waiter that went away leaves nothing behind to wake.
    c.watch(&Arc::new(Notify::new()));
    c.become_follower(2, 1, &[1, 2], &[1, 2]);
}

#[test]
fn a_followers_fetch_is_woken_by_records_and_role_changes_not_by_the_high_watermark() {
    let d = tempfile::tempdir().unwrap();
    let p = partition(d.path());
    p.become_leader(0, &[1, 2, 3], &[1, 2, 3]);
    append(&p, 3);
    let (follower, producer) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    p.watch_log_end(&follower);
    p.watch(&producer);
    // Follower 2 caught up; follower 3 too: the high watermark moves to 3.
    p.follower_fetch(2, 3, -1, 0, 1 << 20);
    p.follower_fetch(3, 3, -1, 0, 1 << 20);
    assert_eq!(p.high_watermark(), 3);
    assert!(woken(&producer), "acks=all waits for the high watermark");
    assert!(!woken(&follower), "a follower parked at the log end has nothing new to read");
    append(&p, 1);
    assert!(woken(&follower), "records past the log end answer it");
    p.watch_log_end(&follower);
    p.become_follower(2, 1, &[1, 2, 3], &[1, 2, 3]);
    assert!(woken(&follower), "so does the end of this broker's leadership");
}

#[test]
fn high_watermark_is_the_smallest_isr_end_and_never_moves_back() {
    let dir = tempfile::tempdir().unwrap();
    let p = partition(dir.path());
    p.become_leader(3, &[1, 2, 3], &[1, 2, 3]);
    append(&p, 5);
    // No follower has fetched: nothing is committed.
    assert!(!p.maybe_advance_high_watermark());
    assert_eq!(p.high_watermark(), 0);
    p.follower_fetch(2, 5, 3, 3, 1 << 20);
    assert_eq!(p.high_watermark(), 0, "follower 3 has not fetched yet");
    let (_, _, moved) = p.follower_fetch(3, 4, 3, 3, 1 << 20);
    assert!(moved);
    assert_eq!(p.high_watermark(), 4);
    // A follower reporting less (it truncated) does not pull the high watermark back.
    p.follower_fetch(3, 2, 3, 3, 1 << 20);
    assert_eq!(p.high_watermark(), 4);
    // Dropping the slow follower from the ISR lets the rest commit.
    p.set_isr(vec![1, 2]);
    assert_eq!(p.high_watermark(), 5);
}

#[test]
fn a_follower_rejoins_the_isr_only_when_caught_up_to_the_high_watermark() {
    let dir = tempfile::tempdir().unwrap();
    let p = partition(dir.path());
    p.become_leader(0, &[1, 2, 3], &[1, 2]);
    append(&p, 10);
    p.follower_fetch(2, 10, 0, 0, 1 << 20);
    assert_eq!(p.high_watermark(), 10);
    let (_, expand, _) = p.follower_fetch(3, 6, 0, 0, 1 << 20);
    assert_eq!(expand, None, "below the high watermark");
    let (_, expand, _) = p.follower_fetch(3, 10, 0, 0, 1 << 20);
    assert_eq!(expand, Some(vec![1, 2, 3]));
    // An ISR member is never proposed again.
    p.set_isr(vec![1, 2, 3]);
    let (_, expand, _) = p.follower_fetch(3, 10, 0, 0, 1 << 20);
    assert_eq!(expand, None);
}

#[test]
fn lagging_followers_are_proposed_for_removal() {
    let dir = tempfile::tempdir().unwrap();
    let p = partition(dir.path());
    p.become_leader(0, &[1, 2, 3], &[1, 2, 3]);
    p.follower_fetch(2, 0, -1, 0, 1 << 20);
    p.follower_fetch(3, 0, -1, 0, 1 << 20);
    append(&p, 4);
    // Both were caught up a moment ago: within a generous lag nobody is dropped.
    assert_eq!(p.isr_to_shrink(Duration::from_secs(60)), None);
    p.follower_fetch(2, 4, 0, 0, 1 << 20);
    // With no lag allowed, the one still behind the log end goes, the caught-up one stays.
    assert_eq!(p.isr_to_shrink(Duration::ZERO), Some(vec![1, 2]));
    // A follower never shrinks anything.
    p.become_follower(2, 1, &[1, 2, 3], &[2, 3]);
    assert_eq!(p.isr_to_shrink(Duration::ZERO), None);
}

#[test]
fn follower_fetches_are_fenced_and_told_where_logs_diverge() {
    let dir = tempfile::tempdir().unwrap();
    let p = partition(dir.path());
    p.become_leader(2, &[1, 2], &[1, 2]);
    append(&p, 3);
    let (r, _, _) = p.follower_fetch(2, 0, -1, 1, 1 << 20);
    assert_eq!(r.error_code, ErrorCode::FencedLeaderEpoch.code());
    let (r, _, _) = p.follower_fetch(2, 0, -1, 5, 1 << 20);
    assert_eq!(r.error_code, ErrorCode::UnknownLeaderEpoch.code());
    // The follower led at epoch 1 (before any epoch this leader knows) and wrote 7
    // records: it must cut back to where epoch 2 begins here.
    let (r, _, _) = p.follower_fetch(2, 7, 1, 2, 1 << 20);
    assert_eq!((r.error_code, r.diverging), (0, Some((1, 0))));
    // Same epoch, but further than this leader's log goes in it.
    let (r, _, _) = p.follower_fetch(2, 9, 2, 2, 1 << 20);
    assert_eq!(r.diverging, Some((2, 3)));
    // In agreement: records, no divergence.
    let (r, _, _) = p.follower_fetch(2, 0, -1, 2, 1 << 20);
    assert_eq!(r.diverging, None);
    assert!(!r.records.is_empty());
    // Not the leader any more: the follower must look elsewhere.
    p.become_follower(2, 3, &[1, 2], &[1, 2]);
    let (r, _, _) = p.follower_fetch(2, 0, -1, 3, 1 << 20);
    assert_eq!(r.error_code, ErrorCode::NotLeaderOrFollower.code());
}
