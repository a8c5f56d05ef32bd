//! The cleaner against real segment files in a temp dir.

use std::collections::BTreeMap;
use std::path::PathBuf;

use super::*;
use crate::log::batch::{encode_batch, BatchOptions, SimpleRecord};
use crate::log::{LogConfig, LogManager};

const T0: i64 = 1_700_000_000_000;

fn compact_config() -> LogConfig {
    LogConfig {
        segment_bytes: 4096,
        max_index_size: 4096,
        index_interval_bytes: 512,
        compact: true,
        delete: false,
        min_cleanable_dirty_ratio: 0.01,
        delete_retention_ms: 1000,
        ..LogConfig::default()
    }
}

fn cleaner_config() -> CleanerConfig {
    CleanerConfig { enable: false, ..CleanerConfig::default() }
}

/// One batch of (key, value) records, compressed with `codec`, with producer fields.
fn batch_of(records: &[(&str, Option<String>)], codec: u8, ts: i64, pid: i64) -> Vec<u8> {
    let recs: Vec<SimpleRecord<'_>> = records
        .iter()
        .map(|(k, v)| SimpleRecord {
            timestamp: ts,
            key: Some(k.as_bytes()),
            value: v.as_deref().map(str::as_bytes),
            headers: vec![("h", Some(b"x".as_slice()))],
        })
        .collect();
    let opts = BatchOptions { producer_id: pid, producer_epoch: 0, base_sequence: 0, ..BatchOptions::default() };
    let mut b = encode_batch(&opts, &recs);
    if codec != 0 {
        let body = crate::log::compression::compress(codec, &b[HEADER_SIZE..]).unwrap();
        b.truncate(HEADER_SIZE);
        b.extend_from_slice(&body);
        let attrs = i16::from(codec);
        b[batch::OFF_ATTRIBUTES..batch::OFF_ATTRIBUTES + 2].copy_from_slice(&attrs.to_be_bytes());
        let len = (b.len() - LOG_OVERHEAD) as i32;
        b[OFF_BATCH_LENGTH..OFF_BATCH_LENGTH + 4].copy_from_slice(&len.to_be_bytes());
        let crc = crc32c::crc32c(&b[CRC_START..]);
        b[OFF_CRC..OFF_CRC + 4].copy_from_slice(&crc.to_be_bytes());
    }
    b
}

struct Rec {
    offset: i64,
    key: String,
    value: Option<String>,
    timestamp: i64,
}

/// Every record of the log, in order, decoded the way a consumer would.
fn read_all(log: &Log) -> (Vec<Rec>, Vec<BatchHeader>) {
    let mut buf = Vec::new();
    for r in log.read(log.log_start_offset(), usize::MAX / 2, None).unwrap() {
        r.read_into(&mut buf).unwrap();
    }
    let headers = batch::validate_replicated_batches(&buf).unwrap();
    let mut out = Vec::new();
    let mut pos = 0;
    for h in &headers {
        let bytes = &buf[pos..pos + h.total_size()];
        pos += h.total_size();
        let section = batch::records_section(bytes, h, 1 << 26).unwrap();
        for r in batch::parse_records(&section, h.records_count).unwrap() {
            out.push(Rec {
                offset: h.base_offset + i64::from(r.offset_delta),
                key: String::from_utf8(r.key.unwrap().to_vec()).unwrap(),
                value: if r.value_is_null { None } else { Some(value_of(r.raw)) },
                timestamp: h.base_timestamp + r.timestamp_delta,
            });
        }
    }
    (out, headers)
}

/// The value bytes of a raw record (parse_records only says whether it is null).
fn value_of(raw: &[u8]) -> String {
    let (_, n) = batch::read_varint(raw).unwrap();
    let rec = &raw[n..];
    let mut at = 1;
    at += batch::read_varlong(&rec[at..]).unwrap().1;
    at += batch::read_varint(&rec[at..]).unwrap().1;
    let (kl, n) = batch::read_varint(&rec[at..]).unwrap();
    at += n + kl.max(0) as usize;
    let (vl, n) = batch::read_varint(&rec[at..]).unwrap();
    at += n;
    String::from_utf8(rec[at..at + vl as usize].to_vec()).unwrap()
}

fn setup(dir: &std::path::Path) -> (Arc<LogManager>, Arc<Mutex<Log>>) {
    let m = Arc::new(LogManager::open(vec![dir.to_path_buf()], compact_config()).unwrap());
    let l = m.get_or_create("t", 0, compact_config()).unwrap();
    (m, l)
}

/// 20 keys x 30 versions in batches of 5, then tombstones for keys 0..3, then a roll.
fn fill(log: &Arc<Mutex<Log>>, codec: u8) -> BTreeMap<String, Option<String>> {
    let mut latest = BTreeMap::new();
    let mut g = log.lock().unwrap();
    for v in 0..30 {
        for chunk in 0..4 {
            let recs: Vec<(String, Option<String>)> =
                (0..5).map(|i| (format!("k{}", chunk * 5 + i), Some(format!("v{v}-{}", "x".repeat(20))))).collect();
            for (k, val) in &recs {
                latest.insert(k.clone(), val.clone());
            }
            let refs: Vec<(&str, Option<String>)> = recs.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
            g.append(&mut batch_of(&refs, codec, T0 + v, 7), 0).unwrap();
        }
    }
    let tomb: Vec<(&str, Option<String>)> = (0..3).map(|i| (["k0", "k1", "k2"][i], None)).collect();
    g.append(&mut batch_of(&tomb, codec, T0 + 100, 7), 0).unwrap();
    for k in ["k0", "k1", "k2"] {
        latest.insert(k.to_string(), None);
    }
    let leo = g.log_end_offset();
    g.roll(leo).unwrap();
    publish_hw(&g);
    latest
}

/// What the replica layer does once every replica has the records: the high watermark at the
/// log end.
fn publish_hw(log: &Log) {
    log.high_watermark_cell().store(log.log_end_offset(), std::sync::atomic::Ordering::Release);
}

fn check_latest(log: &Log, latest: &BTreeMap<String, Option<String>>, tombstones_expected: bool) {
    let (recs, _) = read_all(log);
    let mut seen = BTreeMap::new();
    let mut last = -1;
    for r in &recs {
        assert!(r.offset > last, "offsets increase");
        last = r.offset;
        assert!(seen.insert(r.key.clone(), r.value.clone()).is_none(), "one record per key: {}", r.key);
        assert!(r.timestamp >= T0, "timestamp kept: {}", r.timestamp);
    }
    for (k, v) in latest {
        match (v, tombstones_expected) {
            (None, false) => assert!(!seen.contains_key(k), "tombstoned {k} gone"),
            _ => assert_eq!(seen.get(k), Some(v), "key {k}"),
        }
    }
}

#[test]
fn keeps_the_last_record_per_key_and_drops_tombstones_after_the_horizon() {
    for codec in [0u8, 1, 2, 3, 4] {
        let d = tempfile::tempdir().unwrap();
        let (m, log) = setup(d.path());
        let latest = fill(&log, codec);
        let before = log.lock().unwrap().size_bytes();
        let segments_before = log.lock().unwrap().segment_count();
        let end_before = log.lock().unwrap().log_end_offset();
        let cleaner = LogCleaner::start(m.clone(), cleaner_config());
        let now = now_ms();
        assert!(cleaner.clean_filthiest(now), "codec {codec}: a pass ran");
        {
            let g = log.lock().unwrap();
            check_latest(&g, &latest, true);
            assert!(g.size_bytes() * 5 < before, "codec {codec}: {} -> {}", before, g.size_bytes());
            assert_eq!(g.log_end_offset(), end_before, "log end unchanged");
            let (_, headers) = read_all(&g);
            for h in &headers {
                assert_eq!(h.compression(), codec, "codec kept");
                assert_eq!(h.producer_id, 7);
                assert_eq!(h.base_sequence, 0);
            }
            let hz = g.latest_delete_horizon();
            assert!(hz >= now + 1000, "delete horizon stamped: {hz}");
        }
        // Nothing dirty and the horizon not reached: no pass.
        assert!(!cleaner.clean_filthiest(now + 10));
        // Past the horizon the tombstones go.
        assert!(cleaner.clean_filthiest(now + 2000), "codec {codec}: horizon pass");
        check_latest(&log.lock().unwrap(), &latest, false);
        // Grouping is by the old segments' sizes, so the second pass merges what the first shrank.
        let after = log.lock().unwrap().segment_count();
        assert_eq!(after, 2, "small segments grouped into one, plus the active: {segments_before} -> {after}");
        let text = std::fs::read_to_string(d.path().join(CLEANER_OFFSET_CHECKPOINT)).unwrap();
        assert_eq!(text, format!("0\n1\nt 0 {}\n", end_before), "Kafka's checkpoint format");
        // Reopen: the cleaned segments load and read the same.
        drop(log);
        m.shutdown().unwrap();
        drop(cleaner);
        drop(m);
        let (_, log) = setup(d.path());
        check_latest(&log.lock().unwrap(), &latest, false);
    }
}

#[test]
fn a_small_offset_map_cleans_in_several_passes() {
    let d = tempfile::tempdir().unwrap();
    let (m, log) = setup(d.path());
    let latest = fill(&log, 0);
    // 10 entries: each pass maps 10 keys.
    let cfg = CleanerConfig { dedupe_buffer_size: 10 * 24, io_buffer_load_factor: 1.0, ..cleaner_config() };
    let cleaner = LogCleaner::start(m.clone(), cfg);
    // One clock for every pass: passes more than delete.retention.ms apart (a loaded machine)
    // would rightly drop the tombstones this test expects to find.
    let now = now_ms();
    let mut passes = 0;
    while cleaner.clean_filthiest(now) {
        passes += 1;
        assert!(passes < 100);
    }
    assert!(passes >= 2, "{passes}");
    // Keys last written before the map filled may survive twice until a later pass sees
    // them again; the latest value of each is always there.
    let (recs, _) = read_all(&log.lock().unwrap());
    for (k, v) in &latest {
        let last = recs.iter().rev().find(|r| &r.key == k).map(|r| r.value.clone());
        assert_eq!(last.as_ref(), Some(v), "{k}");
    }
}

#[test]
fn an_emptied_batch_is_kept_only_as_its_producers_last() {
    let d = tempfile::tempdir().unwrap();
    let (m, log) = setup(d.path());
    {
        let mut g = log.lock().unwrap();
        g.append(&mut batch_of(&[("a", Some("1".into()))], 0, T0, 5), 0).unwrap();
        g.append(&mut batch_of(&[("a", Some("2".into()))], 0, T0, 6), 0).unwrap();
        g.append(&mut batch_of(&[("a", Some("3".into()))], 0, T0, 6), 0).unwrap();
        let leo = g.log_end_offset();
        g.roll(leo).unwrap();
        publish_hw(&g);
    }
    let cleaner = LogCleaner::start(m, cleaner_config());
    assert!(cleaner.clean_filthiest(now_ms()));
    let (recs, headers) = read_all(&log.lock().unwrap());
    assert_eq!(recs.len(), 1);
    assert_eq!(recs[0].offset, 2);
    // Producer 5's only batch is its last: kept empty. Producer 6's first goes.
    let shape: Vec<(i64, i32, i64)> = headers.iter().map(|h| (h.base_offset, h.records_count, h.producer_id)).collect();
    assert_eq!(shape, vec![(0, 0, 5), (2, 1, 6)]);
}

#[test]
fn a_corrupt_batch_marks_the_partition_uncleanable() {
    let d = tempfile::tempdir().unwrap();
    let (m, log) = setup(d.path());
    fill(&log, 0);
    let first = log.lock().unwrap().dir().join("00000000000000000000.log");
    let mut bytes = std::fs::read(&first).unwrap();
    bytes[HEADER_SIZE + 3] ^= 0xff;
    std::fs::write(&first, &bytes).unwrap();
    let cleaner = LogCleaner::start(m, cleaner_config());
    assert!(!cleaner.clean_filthiest(now_ms()));
    assert_eq!(cleaner.uncleanable(), vec![("t".to_string(), 0)]);
    assert!(!cleaner.clean_filthiest(now_ms()), "not tried again");
    let leftovers: Vec<PathBuf> = std::fs::read_dir(log.lock().unwrap().dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(".cleaned"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

/// The states a crash can leave a swap in, rebuilt by hand: the restart must show either
/// the old segments or the cleaned one, with the same latest value per key.
#[test]
fn an_interrupted_swap_is_finished_or_forgotten_at_restart() {
    // Clean one copy to get the cleaned segment's bytes.
    let d = tempfile::tempdir().unwrap();
    let (m, log) = setup(d.path());
    let latest = fill(&log, 0);
    let dir = log.lock().unwrap().dir().to_path_buf();
    let old_files: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".log"))
        .map(|e| (e.file_name().to_string_lossy().into_owned(), std::fs::read(e.path()).unwrap()))
        .collect();
    let (old_recs, _) = read_all(&log.lock().unwrap());
    let second_base = log.lock().unwrap().segment_base_offsets()[1];
    let cleaner = LogCleaner::start(m.clone(), cleaner_config());
    assert!(cleaner.clean_filthiest(now_ms()));
    let cleaned_first = std::fs::read(dir.join("00000000000000000000.log")).unwrap();
    let (cleaned_recs, _) = read_all(&log.lock().unwrap());
    // The first group is the first segment alone: a swap of it leaves the others old.
    let expected_after_swap: Vec<i64> = cleaned_recs
        .iter()
        .filter(|r| r.offset < second_base)
        .chain(old_recs.iter().filter(|r| r.offset >= second_base))
        .map(|r| r.offset)
        .collect();
    drop((log, cleaner, m));

    for state in ["cleaned", "swap", "swap-old-partly-deleted"] {
        let d2 = tempfile::tempdir().unwrap();
        let dir2 = d2.path().join("t-0");
        std::fs::create_dir_all(&dir2).unwrap();
        for (name, bytes) in &old_files {
            std::fs::write(dir2.join(name), bytes).unwrap();
        }
        match state {
            "cleaned" => std::fs::write(dir2.join("00000000000000000000.log.cleaned"), &cleaned_first).unwrap(),
            _ => std::fs::write(dir2.join("00000000000000000000.log.swap"), &cleaned_first).unwrap(),
        }
        if state == "swap-old-partly-deleted" {
            std::fs::remove_file(dir2.join("00000000000000000000.log")).unwrap();
        }
        let log = Log::open(dir2.clone(), compact_config(), 0, 0, false).unwrap();
        let (recs, _) = read_all(&log);
        let names: Vec<String> =
            std::fs::read_dir(&dir2).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        assert!(!names.iter().any(|n| n.ends_with(".cleaned") || n.ends_with(".swap")), "{state}: {names:?}");
        let mut per_key: BTreeMap<String, Option<String>> = BTreeMap::new();
        for r in &recs {
            per_key.insert(r.key.clone(), r.value.clone());
        }
        assert_eq!(&per_key, &latest, "{state}: same latest value per key");
        let offsets: Vec<i64> = recs.iter().map(|r| r.offset).collect();
        assert!(offsets.windows(2).all(|w| w[0] < w[1]), "{state}: no record twice");
        if state == "cleaned" {
            assert_eq!(recs.len(), 20 * 30 + 3, "old segments kept whole");
        } else {
            assert_eq!(offsets, expected_after_swap, "{state}: the cleaned segment replaced the old one");
        }
    }
}

#[test]
fn retention_leaves_compact_only_logs_alone() {
    let d = tempfile::tempdir().unwrap();
    let c = LogConfig { retention_ms: 1, retention_bytes: 1, ..compact_config() };
    let mut log = Log::open(d.path().join("t-0"), c.clone(), 0, 0, true).unwrap();
    for i in 0..50 {
        log.append(&mut batch_of(&[("k", Some(format!("{i:0200}")))], 0, T0, -1), 0).unwrap();
    }
    assert!(log.segment_count() > 2);
    assert_eq!(log.enforce_retention(now_ms()).unwrap(), 0);
    log.set_config(LogConfig { delete: true, ..c });
    assert!(log.enforce_retention(now_ms()).unwrap() > 0, "compact,delete also deletes");
}

/// Records at or above the high watermark may yet be truncated (a follower that never got
/// them becomes leader): they must not make older records obsolete, nor be rewritten.
#[test]
fn nothing_at_or_above_the_high_watermark_is_cleaned() {
    let d = tempfile::tempdir().unwrap();
    let (m, log) = setup(d.path());
    fill(&log, 0);
    let (hw, protected_base, files_before, recs_before) = {
        let g = log.lock().unwrap();
        let bases = g.segment_base_offsets();
        assert!(bases.len() >= 6, "{bases:?}");
        // Mid-segment: the segment holding the high watermark is uncleanable as a whole.
        let protected_base = bases[bases.len() / 2];
        let hw = protected_base + 3;
        g.high_watermark_cell().store(hw, std::sync::atomic::Ordering::Release);
        let files: Vec<Vec<u8>> = bases
            .iter()
            .filter(|&&b| b >= protected_base)
            .map(|&b| std::fs::read(g.dir().join(format!("{b:020}.log"))).unwrap())
            .collect();
        (hw, protected_base, files, read_all(&g).0)
    };
    let cleaner = LogCleaner::start(m.clone(), cleaner_config());
    assert!(cleaner.clean_filthiest(now_ms()), "the section below the high watermark is dirty");
    let g = log.lock().unwrap();
    let files_after: Vec<Vec<u8>> = g
        .segment_base_offsets()
        .iter()
        .filter(|&&b| b >= protected_base)
        .map(|&b| std::fs::read(g.dir().join(format!("{b:020}.log"))).unwrap())
        .collect();
    assert!(files_after == files_before, "segments from the one holding the high watermark ({hw}) are untouched");
    // Below the bound: exactly the latest record of each key written below it, whatever came
    // later; a truncation to the high watermark therefore loses no key.
    let (recs, _) = read_all(&g);
    let mut expected = BTreeMap::new();
    for r in recs_before.iter().filter(|r| r.offset < protected_base) {
        expected.insert(r.key.clone(), (r.offset, r.value.clone()));
    }
    let below: BTreeMap<String, (i64, Option<String>)> = recs
        .iter()
        .filter(|r| r.offset < protected_base)
        .map(|r| (r.key.clone(), (r.offset, r.value.clone())))
        .collect();
    assert_eq!(recs.iter().filter(|r| r.offset < protected_base).count(), below.len(), "one record per key below");
    assert_eq!(below, expected);
    let text = std::fs::read_to_string(d.path().join(CLEANER_OFFSET_CHECKPOINT)).unwrap();
    assert_eq!(text, format!("0\n1\nt 0 {protected_base}\n"), "the dirty section ended at the bound");
    drop(g);
    // Nothing more to do until the high watermark moves; then the rest is cleaned.
    assert!(!cleaner.clean_filthiest(now_ms()));
    publish_hw(&log.lock().unwrap());
    assert!(cleaner.clean_filthiest(now_ms()));
    let (recs, _) = read_all(&log.lock().unwrap());
    let keys: std::collections::BTreeSet<&str> = recs.iter().map(|r| r.key.as_str()).collect();
    assert_eq!(recs.len(), keys.len(), "one record per key once the high watermark reached the end");
}

#[test]
fn a_log_without_a_high_watermark_is_not_cleaned() {
    let d = tempfile::tempdir().unwrap();
    let (m, log) = setup(d.path());
    fill(&log, 0);
    log.lock().unwrap().high_watermark_cell().store(0, std::sync::atomic::Ordering::Release);
    let cleaner = LogCleaner::start(m, cleaner_config());
    assert!(!cleaner.clean_filthiest(now_ms()));
}

fn txn_batch(key: &str, value: &str, pid: i64) -> Vec<u8> {
    let recs =
        [SimpleRecord { timestamp: T0, key: Some(key.as_bytes()), value: Some(value.as_bytes()), headers: vec![] }];
    let opts = BatchOptions {
        attributes: batch::TRANSACTIONAL_BIT,
        producer_id: pid,
        producer_epoch: 0,
        base_sequence: 0,
        ..BatchOptions::default()
    };
    encode_batch(&opts, &recs)
}

fn marker(pid: i64, commit: bool) -> Vec<u8> {
    batch::encode_control_batch(pid, 0, commit, 0, T0)
}

fn batch_shapes(log: &Log) -> Vec<(i64, bool, bool)> {
    read_all(log).1.iter().map(|h| (h.base_offset, h.is_control(), h.attributes & DELETE_HORIZON_BIT != 0)).collect()
}

#[test]
fn transactions_aborted_data_goes_open_data_stays_and_commit_markers_go_after_their_horizon() {
    use crate::log::producer_state::AbortedTxn;
    let d = tempfile::tempdir().unwrap();
    let (m, log) = setup(d.path());
    let aborted = AbortedTxn { producer_id: 11, first_offset: 3, last_offset: 4, last_stable_offset: 5 };
    {
        let mut g = log.lock().unwrap();
        for mut b in [
            batch_of(&[("e", Some("keep".into()))], 0, T0, -1),
            txn_batch("a", "c1", 10),
            marker(10, true),
            // Aborted: must neither survive nor make e=keep obsolete.
            txn_batch("e", "aborted", 11),
            marker(11, false),
            batch_of(&[("a", Some("c2".into()))], 0, T0, -1),
            txn_batch("d", "1", 10),
            marker(10, true),
        ] {
            g.append(&mut b, 0).unwrap();
        }
        g.append_aborted_txn(&aborted).unwrap();
        let leo = g.log_end_offset();
        g.roll(leo).unwrap();
        // Still open: at the last stable offset, so never cleaned.
        g.append(&mut txn_batch("d", "open", 12), 0).unwrap();
        let leo = g.log_end_offset();
        g.roll(leo).unwrap();
        publish_hw(&g);
        g.first_unstable_offset_cell().store(8, std::sync::atomic::Ordering::Release);
    }
    let cleaner = LogCleaner::start(m, cleaner_config());
    assert!(cleaner.clean_filthiest(now_ms()));
    // Data records only (a marker's key is its binary version and type).
    let values = |log: &Log| {
        read_all(log)
            .0
            .iter()
            .filter(|r| !r.key.starts_with('\0'))
            .map(|r| (r.offset, r.value.clone().unwrap()))
            .collect::<Vec<_>>()
    };
    {
        let g = log.lock().unwrap();
        let v = values(&g);
        assert_eq!(v, vec![(0, "keep".into()), (5, "c2".into()), (6, "1".into()), (8, "open".into())]);
        // Every marker stays: the first COMMIT's transaction still had data in this pass.
        assert_eq!(
            batch_shapes(&g),
            vec![
                (0, false, false),
                (2, true, false),
                (4, true, false),
                (5, false, false),
                (6, false, false),
                (7, true, false),
                (8, false, false)
            ]
        );
        assert_eq!(
            g.aborted_txns_before(i64::MAX),
            vec![aborted],
            "the ABORT's index entry moved to the cleaned segment"
        );
    }
    // The open transaction commits; the next pass finds the first COMMIT without data and
    // stamps its delete horizon.
    {
        let mut g = log.lock().unwrap();
        g.append(&mut marker(12, true), 0).unwrap();
        let leo = g.log_end_offset();
        g.roll(leo).unwrap();
        publish_hw(&g);
        g.first_unstable_offset_cell().store(i64::MAX, std::sync::atomic::Ordering::Release);
    }
    assert!(cleaner.clean_filthiest(now_ms()));
    let shapes = batch_shapes(&log.lock().unwrap());
    assert!(shapes.contains(&(2, true, true)), "{shapes:?}");
    assert!(shapes.contains(&(7, true, false)), "the producer's last batch stays as it was: {shapes:?}");
    assert!(shapes.contains(&(9, true, false)), "its transaction's data is still there: {shapes:?}");
    // After the horizon it goes; the ABORT marker and all data stay.
    assert!(cleaner.clean_filthiest(now_ms() + 60_000));
    let g = log.lock().unwrap();
    let shapes = batch_shapes(&g);
    assert!(!shapes.iter().any(|s| s.0 == 2), "{shapes:?}");
    assert!(shapes.contains(&(4, true, false)), "{shapes:?}");
    // d=1 went once the committed d=open made it obsolete.
    assert_eq!(values(&g), vec![(0, "keep".into()), (5, "c2".into()), (8, "open".into())]);
}
