use super::*;
use crate::log::batch::{encode_batch, simple_batch, BatchOptions, SimpleRecord};

fn cfg() -> LogConfig {
    LogConfig { segment_bytes: 1 << 20, max_index_size: 4096, ..LogConfig::default() }
}

fn open(dir: &Path, c: LogConfig) -> Log {
    Log::open(dir.to_path_buf(), c, 0, 0, true).unwrap()
}

/// Reads everything from `from` and returns the batch headers found.
fn read_headers(log: &Log, from: i64, max_bytes: usize, max_offset: Option<i64>) -> Vec<BatchHeader> {
    let mut buf = Vec::new();
    for r in log.read(from, max_bytes, max_offset).unwrap() {
        r.read_into(&mut buf).unwrap();
    }
    batch::validate_replicated_batches(&buf).unwrap()
}

fn bases(hs: &[BatchHeader]) -> Vec<i64> {
    hs.iter().map(|h| h.base_offset).collect()
}

#[test]
fn append_assigns_offsets_and_reads_back() {
    let d = tempfile::tempdir().unwrap();
    let mut log = open(d.path(), cfg());
    let mut b1 = simple_batch(2, 10, 100);
    let mut b2 = simple_batch(3, 10, 200);
    let mut b3 = simple_batch(1, 10, 150);
    let i1 = log.append(&mut b1, 7).unwrap();
    let i2 = log.append(&mut b2, 7).unwrap();
    let i3 = log.append(&mut b3, 8).unwrap();
    assert_eq!((i1.first_offset, i1.last_offset, i1.record_count), (0, 1, 2));
    assert_eq!((i2.first_offset, i2.last_offset), (2, 4));
    assert_eq!((i3.first_offset, i3.last_offset, i3.max_timestamp), (5, 5, 150));
    assert_eq!(log.log_end_offset(), 6);
    assert_eq!(log.size_bytes() as usize, b1.len() + b2.len() + b3.len());
    // the caller's buffers were patched in place
    assert_eq!(&b2[0..8], &2i64.to_be_bytes());
    assert_eq!(&b3[12..16], &8i32.to_be_bytes());

    let all = read_headers(&log, 0, 1 << 20, None);
    assert_eq!(bases(&all), vec![0, 2, 5]);
    assert_eq!(all[2].partition_leader_epoch, 8);
    let mut raw = Vec::new();
    for r in log.read(0, 1 << 20, None).unwrap() {
        r.read_into(&mut raw).unwrap();
    }
    assert_eq!(raw, [b1.clone(), b2.clone(), b3.clone()].concat());
    // starts at the batch containing the offset
    assert_eq!(bases(&read_headers(&log, 3, 1 << 20, None)), vec![2, 5]);
    assert_eq!(bases(&read_headers(&log, 4, 1 << 20, None)), vec![2, 5]);
    assert_eq!(bases(&read_headers(&log, 5, 1 << 20, None)), vec![5]);
    // log end: empty; beyond: out of range
    assert!(log.read(6, 100, None).unwrap().is_empty());
    assert_eq!(log.read(7, 100, None).unwrap_err().kafka_code(), crate::protocol::ErrorCode::OffsetOutOfRange.code());
    assert_eq!(log.read(-1, 100, None).unwrap_err().kafka_code(), crate::protocol::ErrorCode::OffsetOutOfRange.code());
    // max_bytes: at least one whole batch, then only whole batches that fit
    assert_eq!(bases(&read_headers(&log, 0, 1, None)), vec![0]);
    assert_eq!(bases(&read_headers(&log, 0, b1.len(), None)), vec![0]);
    assert_eq!(bases(&read_headers(&log, 0, b1.len() + b2.len() - 1, None)), vec![0]);
    assert_eq!(bases(&read_headers(&log, 0, b1.len() + b2.len(), None)), vec![0, 2]);
    // max_offset (high watermark): stop before batches based at/after it
    assert_eq!(bases(&read_headers(&log, 0, 1 << 20, Some(5))), vec![0, 2]);
    assert_eq!(bases(&read_headers(&log, 0, 1 << 20, Some(2))), vec![0]);
    assert!(log.read(2, 1 << 20, Some(2)).unwrap().is_empty());
    // contiguous batches in one segment come back as one range
    assert_eq!(log.read(0, 1 << 20, None).unwrap().len(), 1);
}

#[test]
fn a_shared_append_stores_what_an_in_place_append_does() {
    let (d1, d2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (mut patched, mut shared) = (open(d1.path(), cfg()), open(d2.path(), cfg()));
    // Two batches in one request, then one more: offsets and epochs assigned alike.
    let request = [simple_batch(2, 10, 100), simple_batch(3, 10, 200)].concat();
    let later = simple_batch(1, 10, 150);
    for (records, epoch) in [(&request, 7), (&later, 8)] {
        let headers = batch::validate_batches(records, u32::MAX).unwrap();
        let a = patched.append_validated_batches(&mut records.clone(), headers.clone(), epoch).unwrap();
        let b = shared.append_validated_shared(records, headers, epoch).unwrap();
        assert_eq!(a, b);
    }
    assert_eq!(request, [simple_batch(2, 10, 100), simple_batch(3, 10, 200)].concat(), "left as it was");
    let stored = |log: &Log| {
        let mut raw = Vec::new();
        for r in log.read(0, 1 << 20, None).unwrap() {
            r.read_into(&mut raw).unwrap();
        }
        raw
    };
    assert_eq!(stored(&shared), stored(&patched));
    assert_eq!(bases(&read_headers(&shared, 0, 1 << 20, None)), vec![0, 2, 5]);
    assert_eq!(shared.log_end_offset(), 6);
    // The index was built from the assigned offsets: a read from the middle starts there.
    assert_eq!(bases(&read_headers(&shared, 5, 1 << 20, None)), vec![5]);
}

#[test]
fn invalid_append_writes_nothing() {
    let d = tempfile::tempdir().unwrap();
    let mut log = open(d.path(), cfg());
    let mut good = simple_batch(1, 10, 1);
    log.append(&mut good, 0).unwrap();
    let mut two = simple_batch(1, 10, 1);
    let mut bad = simple_batch(1, 10, 1);
    let n = bad.len();
    bad[n - 1] ^= 1;
    two.extend_from_slice(&bad);
    let before = two.clone();
    assert_eq!(log.append(&mut two, 0).unwrap_err().kafka_code(), crate::protocol::ErrorCode::CorruptMessage.code());
    assert_eq!(two, before, "buffer untouched when validation fails");
    assert_eq!(log.log_end_offset(), 1);
    assert_eq!(log.size_bytes() as usize, good.len());
    let mut big = simple_batch(1, 2_000_000, 1);
    assert_eq!(log.append(&mut big, 0).unwrap_err().kafka_code(), crate::protocol::ErrorCode::MessageTooLarge.code());
    let info = log.append(&mut [], 0).unwrap();
    assert_eq!(info.record_count, 0);
    assert_eq!(log.log_end_offset(), 1);
}

#[test]
fn files_match_kafka_formats_byte_for_byte() {
    let d = tempfile::tempdir().unwrap();
    let c = LogConfig { index_interval_bytes: 0, ..cfg() };
    let mut log = open(d.path(), c.clone());
    let mut b1 = simple_batch(2, 5, 1000);
    let mut b2 = simple_batch(3, 5, 3000);
    let mut b3 = simple_batch(1, 5, 2000);
    log.append(&mut b1, 4).unwrap();
    log.append(&mut b2, 4).unwrap();
    log.append(&mut b3, 4).unwrap();
    // preallocated while active
    assert_eq!(fs::metadata(d.path().join("00000000000000000000.index")).unwrap().len(), 4096);
    assert_eq!(fs::metadata(d.path().join("00000000000000000000.timeindex")).unwrap().len(), 4092);
    log.close().unwrap();

    let mut names: Vec<String> =
        fs::read_dir(d.path()).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    assert_eq!(names, vec!["00000000000000000000.index", "00000000000000000000.log", "00000000000000000000.timeindex"]);
    // .log: batches with baseOffset and partitionLeaderEpoch patched
    let mut expect_log = Vec::new();
    for (b, base) in [(&b1, 0i64), (&b2, 2), (&b3, 5)] {
        let mut x = b.to_vec();
        x[0..8].copy_from_slice(&base.to_be_bytes());
        x[12..16].copy_from_slice(&4i32.to_be_bytes());
        expect_log.extend_from_slice(&x);
    }
    assert_eq!(fs::read(d.path().join("00000000000000000000.log")).unwrap(), expect_log);
    // .index: (last offset of batch - base) u32 BE, batch position u32 BE;
    // first batch never indexed
    let mut expect_idx = Vec::new();
    expect_idx.extend_from_slice(&4u32.to_be_bytes());
    expect_idx.extend_from_slice(&(b1.len() as u32).to_be_bytes());
    expect_idx.extend_from_slice(&5u32.to_be_bytes());
    expect_idx.extend_from_slice(&((b1.len() + b2.len()) as u32).to_be_bytes());
    assert_eq!(fs::read(d.path().join("00000000000000000000.index")).unwrap(), expect_idx);
    // .timeindex: max timestamp so far i64 BE + its offset u32 BE, only
    // when it grows; trimmed on close
    let mut expect_ti = Vec::new();
    expect_ti.extend_from_slice(&3000i64.to_be_bytes());
    expect_ti.extend_from_slice(&4u32.to_be_bytes());
    assert_eq!(fs::read(d.path().join("00000000000000000000.timeindex")).unwrap(), expect_ti);

    // a roll names the new segment after its base offset
    log.roll(6).unwrap();
    assert!(d.path().join("00000000000000000006.log").exists());
    assert!(d.path().join("00000000000000000006.index").exists());
    assert!(d.path().join("00000000000000000006.timeindex").exists());
}

#[test]
fn sparse_index_follows_interval() {
    let d = tempfile::tempdir().unwrap();
    let c = LogConfig { index_interval_bytes: 1000, ..cfg() };
    let mut log = open(d.path(), c);
    let mut positions = Vec::new();
    let mut pos = 0u32;
    for _ in 0..20 {
        let mut b = simple_batch(1, 300, 5);
        positions.push(pos);
        pos += b.len() as u32;
        log.append(&mut b, 0).unwrap();
    }
    let seg = log.segments().next().unwrap();
    let idx = seg.offset_index();
    // batch size is 300 + ~70 bytes: an entry every 3rd batch after the first
    let sz = simple_batch(1, 300, 5).len() as u32;
    let per = 1000 / sz + 1;
    assert!(idx.entries() >= 5);
    let (o, p) = idx.entry(0).unwrap();
    assert_eq!(o, i64::from(per));
    assert_eq!(p, positions[per as usize]);
    for off in 0..20 {
        assert_eq!(bases(&read_headers(&log, off, 1, None)), vec![off]);
    }
}

#[test]
fn rolls_on_size_time_and_index_full() {
    let d = tempfile::tempdir().unwrap();
    let one = simple_batch(1, 200, 0).len() as u64;
    let c = LogConfig { segment_bytes: one * 3, ..cfg() };
    let mut log = open(d.path(), c.clone());
    for _ in 0..7 {
        log.append(&mut simple_batch(1, 200, 0), 0).unwrap();
    }
    assert_eq!(log.segment_base_offsets(), vec![0, 3, 6]);
    assert_eq!(log.recovery_point(), 6, "roll fsyncs and advances the recovery point");
    assert_eq!(bases(&read_headers(&log, 0, 1 << 20, None)), (0..7).collect::<Vec<_>>());
    assert_eq!(bases(&read_headers(&log, 4, 1 << 20, None)), vec![4, 5, 6]);
    // the rolled segments' indexes were trimmed
    assert_eq!(fs::metadata(d.path().join("00000000000000000000.index")).unwrap().len(), 0);
    drop(log);

    // time: measured from the first batch's timestamp
    let d = tempfile::tempdir().unwrap();
    let c = LogConfig { segment_ms: 1000, ..cfg() };
    let mut log = open(d.path(), c);
    log.append(&mut simple_batch(1, 10, 10_000), 0).unwrap();
    log.append(&mut simple_batch(1, 10, 11_000), 0).unwrap();
    assert_eq!(log.segment_count(), 1);
    log.append(&mut simple_batch(1, 10, 11_001), 0).unwrap();
    assert_eq!(log.segment_base_offsets(), vec![0, 2]);

    // index full: 2-entry offset index, interval 0
    let d = tempfile::tempdir().unwrap();
    let c = LogConfig { index_interval_bytes: 0, max_index_size: 16, ..cfg() };
    let mut log = open(d.path(), c);
    for _ in 0..10 {
        log.append(&mut simple_batch(1, 10, 5), 0).unwrap();
    }
    assert!(log.segment_count() >= 3);
    for off in 0..10 {
        assert_eq!(bases(&read_headers(&log, off, 1, None)), vec![off]);
    }
    log.close().unwrap();
    drop(log);
    let log = Log::open(
        d.path().to_path_buf(),
        LogConfig { index_interval_bytes: 0, max_index_size: 16, ..cfg() },
        0,
        0,
        true,
    )
    .unwrap();
    assert_eq!(log.log_end_offset(), 10);
    assert_eq!(bases(&read_headers(&log, 0, 1 << 20, None)), (0..10).collect::<Vec<_>>());
}

/// A log with 3 segments (10 batches of 1..=3 records each); returns
/// the directory and every batch's (base offset, position, size) in the
/// last segment.
fn build_crash_log(dir: &Path) -> (i64, Vec<(i64, u64, usize)>) {
    let c = LogConfig { segment_bytes: 1500, index_interval_bytes: 100, ..cfg() };
    let mut log = open(dir, c);
    let batches_in_last = |log: &Log| {
        let seg = log.segments().last().unwrap();
        let mut sc = seg.scanner(0, 4096).unwrap();
        let mut n = 0;
        while sc.next_header().unwrap().is_some() {
            n += 1;
        }
        n
    };
    let mut i = 0;
    while log.segment_count() < 3 || batches_in_last(&log) < 3 {
        log.append(&mut simple_batch(1 + i % 3, 100, 1000 + i as i64), 0).unwrap();
        i += 1;
    }
    let last_base = *log.segment_base_offsets().last().unwrap();
    let mut sc_batches = Vec::new();
    let seg = log.segments().last().unwrap();
    let mut sc = seg.scanner(0, 4096).unwrap();
    while let Some((p, h)) = sc.next_header().unwrap() {
        sc_batches.push((h.base_offset, p, h.total_size()));
    }
    assert!(log.segment_count() >= 3);
    // crash: no close, indexes stay preallocated
    drop(log);
    (last_base, sc_batches)
}

fn copy_dir(from: &Path, to: &Path) {
    for e in fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

#[test]
fn recovery_cuts_torn_last_batch_at_every_byte() {
    let orig = tempfile::tempdir().unwrap();
    let (last_base, batches) = build_crash_log(orig.path());
    let &(lb_base, lb_pos, lb_size) = batches.last().unwrap();
    let all_before: Vec<i64> = {
        let log = Log::open(orig.path().to_path_buf(), cfg(), 0, 0, true).unwrap();
        let v = bases(&read_headers(&log, 0, 1 << 20, None));
        v.into_iter().filter(|&b| b < lb_base).collect()
    };
    let seg_name = format!("{}.log", crate::log::file_prefix(last_base));
    for cut in lb_pos..lb_pos + lb_size as u64 {
        let d = tempfile::tempdir().unwrap();
        copy_dir(orig.path(), d.path());
        let f = fs::OpenOptions::new().write(true).open(d.path().join(&seg_name)).unwrap();
        f.set_len(cut).unwrap();
        drop(f);
        for rp in [0, last_base] {
            let dd = tempfile::tempdir().unwrap();
            copy_dir(d.path(), dd.path());
            let log = Log::open(dd.path().to_path_buf(), cfg(), rp, 0, false).unwrap();
            assert_eq!(log.log_end_offset(), lb_base, "cut at {cut}");
            assert_eq!(bases(&read_headers(&log, 0, 1 << 20, None)), all_before, "cut at {cut}");
            assert_eq!(fs::metadata(dd.path().join(&seg_name)).unwrap().len(), lb_pos);
            assert_eq!(log.recovery_point(), lb_base);
            drop(log);
            // and it stays that way, also across a clean reopen
            let log = Log::open(dd.path().to_path_buf(), cfg(), lb_base, 0, true).unwrap();
            assert_eq!(log.log_end_offset(), lb_base);
        }
    }
}

#[test]
fn recovery_cuts_at_flipped_byte_and_drops_later_segments() {
    let orig = tempfile::tempdir().unwrap();
    let (last_base, batches) = build_crash_log(orig.path());
    // a flip inside the 2nd batch of the last segment
    let (b_base, b_pos, b_size) = batches[1];
    let seg_name = format!("{}.log", crate::log::file_prefix(last_base));
    for at in [b_pos + 20, b_pos + 61, b_pos + b_size as u64 - 1, b_pos + 9] {
        let d = tempfile::tempdir().unwrap();
        copy_dir(orig.path(), d.path());
        let p = d.path().join(&seg_name);
        let mut bytes = fs::read(&p).unwrap();
        bytes[at as usize] ^= 0x10;
        fs::write(&p, &bytes).unwrap();
        let log = Log::open(d.path().to_path_buf(), cfg(), last_base, 0, false).unwrap();
        assert_eq!(log.log_end_offset(), b_base, "flip at {at}");
        let hs = read_headers(&log, 0, 1 << 20, None);
        assert_eq!(hs.last().unwrap().next_offset(), b_base);
    }
    // a flip in the first segment with recovery point 0: later segments go
    let d = tempfile::tempdir().unwrap();
    copy_dir(orig.path(), d.path());
    let p = d.path().join("00000000000000000000.log");
    let mut bytes = fs::read(&p).unwrap();
    let first_size = BatchHeader::parse(&bytes).unwrap().total_size();
    bytes[first_size + 70] ^= 1;
    fs::write(&p, &bytes).unwrap();
    let log = Log::open(d.path().to_path_buf(), cfg(), 0, 0, false).unwrap();
    assert_eq!(log.segment_count(), 1);
    assert_eq!(log.log_end_offset(), 1);
    assert!(!d.path().join(&seg_name).exists());
    drop(log);
    // segments below the recovery point are trusted (not rescanned)
    let d = tempfile::tempdir().unwrap();
    copy_dir(orig.path(), d.path());
    let p = d.path().join("00000000000000000000.log");
    fs::write(&p, &bytes).unwrap();
    let log = Log::open(d.path().to_path_buf(), cfg(), last_base, 0, false).unwrap();
    assert_eq!(log.segment_count(), 3);
}

#[test]
fn damaged_indexes_are_rebuilt() {
    let orig = tempfile::tempdir().unwrap();
    let c = LogConfig { index_interval_bytes: 200, ..cfg() };
    {
        let mut log = open(orig.path(), c.clone());
        for i in 0..40 {
            log.append(&mut simple_batch(1 + i % 4, 50, 1000 + i as i64 * 10), 0).unwrap();
        }
        log.close().unwrap();
    }
    let expected: Vec<i64> = {
        let log = Log::open(orig.path().to_path_buf(), c.clone(), 0, 0, true).unwrap();
        bases(&read_headers(&log, 0, 1 << 20, None))
    };
    let idx = "00000000000000000000.index";
    let tix = "00000000000000000000.timeindex";
    type Damage = Box<dyn Fn(&Path)>;
    let damages: Vec<(&str, Damage)> = vec![
        ("delete index", Box::new(move |d: &Path| fs::remove_file(d.join(idx)).unwrap())),
        ("delete timeindex", Box::new(move |d: &Path| fs::remove_file(d.join(tix)).unwrap())),
        (
            "garble index",
            Box::new(move |d: &Path| {
                let n = fs::metadata(d.join(idx)).unwrap().len() as usize;
                fs::write(d.join(idx), (0..n).map(|i| (i * 37 % 251) as u8).collect::<Vec<_>>()).unwrap()
            }),
        ),
        (
            "garble timeindex",
            Box::new(move |d: &Path| {
                let n = fs::metadata(d.join(tix)).unwrap().len() as usize;
                fs::write(d.join(tix), (0..n).map(|i| (i * 91 % 253) as u8).collect::<Vec<_>>()).unwrap()
            }),
        ),
        (
            "shorten index",
            Box::new(move |d: &Path| {
                let f = fs::OpenOptions::new().write(true).open(d.join(idx)).unwrap();
                f.set_len(13).unwrap();
            }),
        ),
        (
            "index cut to two whole entries",
            Box::new(move |d: &Path| {
                let f = fs::OpenOptions::new().write(true).open(d.join(idx)).unwrap();
                f.set_len(16).unwrap();
            }),
        ),
        (
            "shorten timeindex",
            Box::new(move |d: &Path| {
                let f = fs::OpenOptions::new().write(true).open(d.join(tix)).unwrap();
                f.set_len(5).unwrap();
            }),
        ),
        (
            "plausible but wrong positions",
            Box::new(move |d: &Path| {
                let mut e = Vec::new();
                e.extend_from_slice(&3u32.to_be_bytes());
                e.extend_from_slice(&999_999u32.to_be_bytes());
                fs::write(d.join(idx), e).unwrap()
            }),
        ),
        (
            "entry pointing at the wrong batch",
            Box::new(move |d: &Path| {
                let mut e = Vec::new();
                e.extend_from_slice(&3u32.to_be_bytes());
                e.extend_from_slice(&0u32.to_be_bytes());
                fs::write(d.join(idx), e).unwrap()
            }),
        ),
    ];
    for (name, damage) in &damages {
        for clean in [true, false] {
            let d = tempfile::tempdir().unwrap();
            copy_dir(orig.path(), d.path());
            damage(d.path());
            let log = Log::open(d.path().to_path_buf(), c.clone(), 1000, 0, clean).unwrap();
            assert_eq!(bases(&read_headers(&log, 0, 1 << 20, None)), expected, "{name}");
            let seg = log.segments().next().unwrap();
            assert!(seg.offset_index().entries() > 3, "{name}: index rebuilt");
            assert!(seg.time_index().entries() > 3, "{name}: time index rebuilt");
            for &b in &expected {
                assert_eq!(read_headers(&log, b, 1, None)[0].base_offset, b, "{name}");
            }
            assert_eq!(log.offset_for_timestamp(1195).unwrap().map(|x| x.1), Some(1200), "{name}");
        }
    }
}

#[test]
fn crash_with_preallocated_index_keeps_entries() {
    let d = tempfile::tempdir().unwrap();
    let c = LogConfig { index_interval_bytes: 100, ..cfg() };
    let mut log = open(d.path(), c.clone());
    for _ in 0..30 {
        log.append(&mut simple_batch(2, 60, 77), 0).unwrap();
    }
    log.flush().unwrap();
    let entries = log.segments().next().unwrap().offset_index().entries();
    drop(log); // crash after flush: recovery point == log end
    assert_eq!(fs::metadata(d.path().join("00000000000000000000.index")).unwrap().len(), 4096);
    let log = Log::open(d.path().to_path_buf(), c, 60, 0, false).unwrap();
    assert_eq!(log.segments().next().unwrap().offset_index().entries(), entries);
    assert_eq!(log.log_end_offset(), 60);
    assert_eq!(bases(&read_headers(&log, 31, 1, None)), vec![30]);
}

/// Indexes written through mappings the cache has since dropped, then a crash: the entries
/// are in the files, loading finds them without mapping anything, and lookups map again.
#[test]
fn a_crash_with_the_indexes_unmapped_keeps_their_entries() {
    for flushed in [true, false] {
        let d = tempfile::tempdir().unwrap();
        let c = LogConfig { index_interval_bytes: 100, segment_bytes: 2000, ..cfg() };
        let mut log = open(d.path(), c.clone());
        for i in 0..60 {
            log.append(&mut simple_batch(2, 60, 1000 + i), 0).unwrap();
        }
        let expect = bases(&read_headers(&log, 0, 1 << 20, None));
        let entries: Vec<_> = log.segments().map(|s| (s.offset_index().entries(), s.time_index().entries())).collect();
        assert!(entries.len() > 2 && entries.iter().all(|e| e.0 > 0), "{entries:?}");
        for s in log.segments() {
            s.offset_index().unmap();
            s.time_index().unmap();
        }
        let leo = log.log_end_offset();
        if flushed {
            log.flush().unwrap();
        }
        drop(log);
        let recovery_point = if flushed { leo } else { 0 };
        let log = Log::open(d.path().to_path_buf(), c, recovery_point, 0, false).unwrap();
        let now: Vec<_> = log.segments().map(|s| (s.offset_index().entries(), s.time_index().entries())).collect();
        assert_eq!(now, entries, "flushed {flushed}");
        if flushed {
            // The segment holding the recovery point is validated again (and its indexes
            // rebuilt through a mapping, as appends write them); the older ones are trusted
            // from their files.
            let n = log.segments().count();
            assert!(
                log.segments().take(n - 1).all(|s| !s.offset_index().is_mapped() && !s.time_index().is_mapped()),
                "loading maps no old segment's index"
            );
        }
        for (i, &base) in expect.iter().enumerate() {
            assert_eq!(bases(&read_headers(&log, base + 1, 1, None)), vec![base], "flushed {flushed}");
            assert_eq!(log.offset_for_timestamp(1000 + i as i64).unwrap().map(|x| x.0), Some(base));
        }
    }
}

#[test]
fn clean_reopen_keeps_everything() {
    let d = tempfile::tempdir().unwrap();
    let c = LogConfig { segment_bytes: 2000, ..cfg() };
    let mut log = open(d.path(), c.clone());
    for i in 0..25 {
        log.append(&mut simple_batch(1 + i % 2, 100, 500 + i as i64), 3).unwrap();
    }
    let leo = log.log_end_offset();
    let segs = log.segment_base_offsets();
    let expect = bases(&read_headers(&log, 0, 1 << 20, None));
    log.close().unwrap();
    drop(log);
    let mut log = Log::open(d.path().to_path_buf(), c.clone(), leo, 0, true).unwrap();
    assert_eq!(log.log_end_offset(), leo);
    assert_eq!(log.recovery_point(), leo);
    assert_eq!(log.segment_base_offsets(), segs);
    assert_eq!(bases(&read_headers(&log, 0, 1 << 20, None)), expect);
    assert_eq!(log.offset_for_timestamp(524).unwrap().map(|x| x.1), Some(524));
    // appends continue after close and reopen without an extra roll
    log.close().unwrap();
    log.append(&mut simple_batch(1, 100, 599), 3).unwrap();
    assert_eq!(log.segment_base_offsets(), segs);
    let leo = log.log_end_offset();
    let info = log.append(&mut simple_batch(1, 100, 600), 3).unwrap();
    assert_eq!(info.first_offset, leo);
    assert_eq!(bases(&read_headers(&log, leo, 1 << 20, None)), vec![leo]);
}

#[test]
fn retention_by_time_and_size() {
    let d = tempfile::tempdir().unwrap();
    let one = simple_batch(1, 100, 0).len() as u64;
    let c = LogConfig { segment_bytes: one * 2, retention_ms: 1000, ..cfg() };
    let mut log = open(d.path(), c.clone());
    // segments: [0,1] ts 1000/1100, [2,3] ts 2000/2100, [4,5] ts 3000/3100, [6] ts 4000
    for ts in [1000, 1100, 2000, 2100, 3000, 3100, 4000] {
        log.append(&mut simple_batch(1, 100, ts), 0).unwrap();
    }
    assert_eq!(log.segment_base_offsets(), vec![0, 2, 4, 6]);
    assert_eq!(log.enforce_retention(2100).unwrap(), 0, "1100 is not older than 1000 ms");
    assert_eq!(log.enforce_retention(2101).unwrap(), 1);
    assert_eq!(log.log_start_offset(), 2);
    assert!(!d.path().join("00000000000000000000.log").exists());
    assert_eq!(log.read(1, 100, None).unwrap_err().kafka_code(), crate::protocol::ErrorCode::OffsetOutOfRange.code());
    assert_eq!(bases(&read_headers(&log, 2, 1 << 20, None)), vec![2, 3, 4, 5, 6]);
    // everything expired: the active segment is rolled, then deleted
    assert_eq!(log.enforce_retention(10_000).unwrap(), 3);
    assert_eq!(log.segment_base_offsets(), vec![7]);
    assert_eq!((log.log_start_offset(), log.log_end_offset()), (7, 7));
    assert!(log.read(7, 100, None).unwrap().is_empty());
    assert_eq!(log.enforce_retention(20_000).unwrap(), 0, "empty active segment stays");
    log.append(&mut simple_batch(1, 100, 20_000), 0).unwrap();
    assert_eq!(log.log_end_offset(), 8);

    // size
    let d = tempfile::tempdir().unwrap();
    let c = LogConfig { segment_bytes: one * 2, retention_bytes: (one * 3) as i64, retention_ms: -1, ..cfg() };
    let mut log = open(d.path(), c);
    for _ in 0..7 {
        log.append(&mut simple_batch(1, 100, 0), 0).unwrap();
    }
    // 7 batches = 7*one; must drop to <= 3*one without going below: 2 segments
    assert_eq!(log.enforce_retention(0).unwrap(), 2);
    assert_eq!(log.segment_base_offsets(), vec![4, 6]);
    assert_eq!(log.size_bytes(), one * 3);
    assert_eq!(log.log_start_offset(), 4);
    assert_eq!(log.enforce_retention(0).unwrap(), 0);
}

#[test]
fn an_append_may_block_when_a_roll_or_an_fsync_is_due() {
    let d = tempfile::tempdir().unwrap();
    let one = simple_batch(1, 100, 0).len();
    let now = now_ms();
    let c = LogConfig { segment_bytes: (one * 2) as u64, segment_ms: 60_000, ..cfg() };
    let mut log = open(d.path(), c);
    assert!(!log.append_may_block(one, 1, now), "an empty segment takes any batch");
    log.append(&mut simple_batch(1, 100, now), 0).unwrap();
    assert!(!log.append_may_block(one, 1, now));
    assert!(log.append_may_block(one, 1, now + 60_001), "the segment is older than segment.ms");
    log.append(&mut simple_batch(1, 100, now), 0).unwrap();
    assert!(log.append_may_block(one, 1, now), "the segment is full: the next append rolls");

    let d = tempfile::tempdir().unwrap();
    let mut log = open(d.path(), LogConfig { flush_interval_messages: 3, ..cfg() });
    log.append(&mut simple_batch(1, 100, now), 0).unwrap();
    assert!(!log.append_may_block(one, 1, now));
    assert!(log.append_may_block(one, 2, now), "the third message is due an fsync");
    let d = tempfile::tempdir().unwrap();
    let log = open(d.path(), LogConfig { flush_interval_ms: 1000, ..cfg() });
    assert!(log.append_may_block(one, 1, now_ms() + 1000), "flush.ms has passed");
}

#[test]
fn published_stats_follow_every_change() {
    let d = tempfile::tempdir().unwrap();
    let one = simple_batch(1, 100, 0).len() as u64;
    let c = LogConfig { segment_bytes: one * 2, retention_bytes: (one * 3) as i64, retention_ms: -1, ..cfg() };
    let mut log = open(d.path(), c.clone());
    let stats = log.stats();
    let agree = |log: &Log| {
        assert_eq!(stats.size_bytes(), log.size_bytes());
        assert_eq!(stats.log_start_offset(), log.log_start_offset());
        assert_eq!(stats.log_end_offset(), log.log_end_offset());
        assert_eq!(stats.segments(), log.segment_count() as u64);
        assert_eq!(Some(stats.active_segment_base()), log.segments.keys().next_back().copied());
    };
    agree(&log);
    for _ in 0..7 {
        log.append(&mut simple_batch(1, 100, 0), 0).unwrap();
        agree(&log);
    }
    assert_eq!(stats.segments(), 4, "appends rolled segments");
    log.enforce_retention(0).unwrap();
    agree(&log);
    log.delete_records_before(5).unwrap();
    agree(&log);
    log.truncate_to(6).unwrap();
    agree(&log);
    assert_eq!((stats.log_start_offset(), stats.log_end_offset()), (5, 6));
    log.truncate_fully_and_start_at(40).unwrap();
    agree(&log);
    let mut follower = simple_batch(2, 100, 0);
    follower[0..8].copy_from_slice(&40i64.to_be_bytes());
    log.append_as_follower(&follower).unwrap();
    agree(&log);
    drop(log);
    // Reopened: counted from what is on disk.
    let log = open(d.path(), c);
    assert_eq!((log.stats().size_bytes(), log.stats().log_end_offset()), (log.size_bytes(), 42));
}

#[test]
fn delete_records_before_moves_start() {
    let d = tempfile::tempdir().unwrap();
    let one = simple_batch(1, 100, 0).len() as u64;
    let c = LogConfig { segment_bytes: one * 2, ..cfg() };
    let mut log = open(d.path(), c.clone());
    for _ in 0..5 {
        log.append(&mut simple_batch(1, 100, 0), 0).unwrap();
    }
    assert_eq!(log.segment_base_offsets(), vec![0, 2, 4]);
    assert_eq!(log.delete_records_before(1).unwrap(), 1);
    assert_eq!(log.segment_count(), 3);
    assert_eq!(log.read(0, 10, None).unwrap_err().kafka_code(), crate::protocol::ErrorCode::OffsetOutOfRange.code());
    assert_eq!(bases(&read_headers(&log, 1, 1 << 20, None)), vec![1, 2, 3, 4]);
    assert_eq!(log.delete_records_before(0).unwrap(), 1, "never moves back");
    assert_eq!(log.delete_records_before(3).unwrap(), 3);
    assert_eq!(log.segment_base_offsets(), vec![2, 4]);
    assert_eq!(log.delete_records_before(5).unwrap(), 5);
    assert_eq!(log.segment_base_offsets(), vec![4], "active segment stays");
    assert!(log.read(5, 10, None).unwrap().is_empty());
    assert_eq!(
        log.delete_records_before(6).unwrap_err().kafka_code(),
        crate::protocol::ErrorCode::OffsetOutOfRange.code()
    );
    log.close().unwrap();
    drop(log);
    // the start offset survives a reopen through the checkpoint value
    let log = Log::open(d.path().to_path_buf(), c, 5, 5, true).unwrap();
    assert_eq!(log.log_start_offset(), 5);
}

#[test]
fn truncate_to_drops_suffix() {
    let d = tempfile::tempdir().unwrap();
    let one = simple_batch(2, 100, 0).len() as u64;
    let c = LogConfig { segment_bytes: one * 3, ..cfg() };
    let mut log = open(d.path(), c.clone());
    for _ in 0..8 {
        log.append(&mut simple_batch(2, 100, 0), 0).unwrap();
    }
    // batches at 0,2,4 | 6,8,10 | 12,14
    assert_eq!(log.segment_base_offsets(), vec![0, 6, 12]);
    log.truncate_to(20).unwrap();
    assert_eq!(log.log_end_offset(), 16);
    log.truncate_to(10).unwrap();
    assert_eq!(log.log_end_offset(), 10);
    assert_eq!(log.segment_base_offsets(), vec![0, 6]);
    assert_eq!(bases(&read_headers(&log, 0, 1 << 20, None)), vec![0, 2, 4, 6, 8]);
    // a straddled batch goes entirely
    log.truncate_to(7).unwrap();
    assert_eq!(log.log_end_offset(), 6);
    assert_eq!(log.segment_base_offsets(), vec![0, 6]);
    let info = log.append(&mut simple_batch(2, 100, 0), 0).unwrap();
    assert_eq!(info.first_offset, 6);
    // to a segment boundary
    log.truncate_to(6).unwrap();
    assert_eq!(log.segment_base_offsets(), vec![0]);
    assert_eq!(log.log_end_offset(), 6);
    log.append(&mut simple_batch(1, 100, 0), 0).unwrap();
    assert_eq!(bases(&read_headers(&log, 0, 1 << 20, None)), vec![0, 2, 4, 6]);
    log.close().unwrap();
    drop(log);
    let mut log = Log::open(d.path().to_path_buf(), c, 0, 0, false).unwrap();
    assert_eq!(log.log_end_offset(), 7);
    // fully
    log.truncate_to(0).unwrap();
    assert_eq!((log.log_start_offset(), log.log_end_offset()), (0, 0));
    assert_eq!(log.size_bytes(), 0);
    log.append(&mut simple_batch(1, 100, 0), 0).unwrap();
    assert_eq!(log.log_end_offset(), 1);
}

#[test]
fn offset_for_timestamp_batch_granularity() {
    let d = tempfile::tempdir().unwrap();
    let one = simple_batch(2, 100, 0).len() as u64;
    let c = LogConfig { segment_bytes: one * 2, index_interval_bytes: 0, ..cfg() };
    let mut log = open(d.path(), c);
    for ts in [100, 200, 150, 300, 250] {
        log.append(&mut simple_batch(2, 100, ts), 0).unwrap();
    }
    let q = |log: &Log, t| log.offset_for_timestamp(t).unwrap();
    assert_eq!(q(&log, 0), Some((0, 100)));
    assert_eq!(q(&log, 100), Some((0, 100)));
    assert_eq!(q(&log, 101), Some((2, 200)));
    assert_eq!(q(&log, 150), Some((2, 200)));
    assert_eq!(q(&log, 201), Some((6, 300)));
    assert_eq!(q(&log, 300), Some((6, 300)));
    assert_eq!(q(&log, 301), None);
    assert_eq!(q(&log, -2), Some((0, -1)));
    assert_eq!(q(&log, -1), Some((10, -1)));
    log.delete_records_before(7).unwrap();
    assert_eq!(q(&log, 0), Some((7, 300)));
    assert_eq!(q(&log, 260), Some((7, 300)));
}

#[test]
fn follower_append_keeps_offsets() {
    let d = tempfile::tempdir().unwrap();
    let mut log = open(d.path(), cfg());
    let b = encode_batch(
        &BatchOptions { base_offset: 5, partition_leader_epoch: 3, ..BatchOptions::default() },
        &[SimpleRecord::default(), SimpleRecord::default()],
    );
    let info = log.append_as_follower(&b).unwrap();
    assert_eq!((info.first_offset, info.last_offset), (5, 6));
    assert_eq!(log.log_end_offset(), 7);
    // like Kafka, a segment's first batch may start above its base
    assert_eq!(log.segment_base_offsets(), vec![0]);
    assert_eq!(bases(&read_headers(&log, 0, 1 << 20, None)), vec![5]);
    let again = b.clone();
    assert_eq!(
        log.append_as_follower(&again).unwrap_err().kafka_code(),
        crate::protocol::ErrorCode::InvalidRecord.code()
    );
    let hs = read_headers(&log, 5, 1 << 20, None);
    assert_eq!(hs[0].partition_leader_epoch, 3);
    // a leader append continues from there
    assert_eq!(log.append(&mut simple_batch(1, 1, 1), 4).unwrap().first_offset, 7);
}

#[test]
fn flush_policy_and_delete() {
    let d = tempfile::tempdir().unwrap();
    let c = LogConfig { flush_interval_messages: 3, ..cfg() };
    let pdir = d.path().join("t-0");
    let mut log = Log::open(pdir.clone(), c, 0, 0, false).unwrap();
    log.append(&mut simple_batch(2, 1, 1), 0).unwrap();
    assert_eq!(log.recovery_point(), 0);
    log.append(&mut simple_batch(1, 1, 1), 0).unwrap();
    assert_eq!(log.recovery_point(), 3, "flush.messages reached");
    log.append(&mut simple_batch(1, 1, 1), 0).unwrap();
    assert!(!log.maybe_flush(now_ms()).unwrap());
    log.set_config(LogConfig { flush_interval_ms: 10, ..cfg() });
    assert!(log.maybe_flush(now_ms() + 1000).unwrap());
    assert_eq!(log.recovery_point(), 4);
    log.delete().unwrap();
    assert!(!pdir.exists());
    assert_eq!(fs::read_dir(d.path()).unwrap().count(), 0);
}

#[test]
fn read_survives_segment_deletion() {
    let d = tempfile::tempdir().unwrap();
    let one = simple_batch(1, 100, 0).len() as u64;
    let mut log = open(d.path(), LogConfig { segment_bytes: one, ..cfg() });
    for _ in 0..3 {
        log.append(&mut simple_batch(1, 100, 0), 0).unwrap();
    }
    let ranges = log.read(0, 1 << 20, None).unwrap();
    assert_eq!(ranges.len(), 3, "one range per segment");
    log.delete_records_before(2).unwrap();
    let mut buf = Vec::new();
    ranges[0].read_into(&mut buf).unwrap();
    assert_eq!(buf.len() as u64, one);
}
