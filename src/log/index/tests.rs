use super::*;

#[test]
fn offset_index_append_lookup() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("00000000000000000100.index");
    let mut idx = OffsetIndex::open(&p, 100, 80, true).unwrap();
    assert_eq!(std::fs::metadata(&p).unwrap().len(), 80);
    assert_eq!(idx.lookup(150).unwrap(), (100, 0));
    assert!(idx.append(110, 4000));
    assert!(idx.append(120, 8000));
    assert!(!idx.append(120, 9000), "non-increasing offset is refused");
    assert!(!idx.append(130, 8000), "non-increasing position is refused");
    assert!(!idx.append(99, 9000), "below base is refused");
    assert!(idx.append(135, 12000));
    assert_eq!(idx.lookup(99).unwrap(), (100, 0));
    assert_eq!(idx.lookup(109).unwrap(), (100, 0));
    assert_eq!(idx.lookup(110).unwrap(), (110, 4000));
    assert_eq!(idx.lookup(119).unwrap(), (110, 4000));
    assert_eq!(idx.lookup(134).unwrap(), (120, 8000));
    assert_eq!(idx.lookup(10_000).unwrap(), (135, 12000));
    assert_eq!(idx.last_entry(), Some((135, 12000)));
    idx.truncate_to(121).unwrap();
    assert_eq!(idx.entries(), 2);
    idx.truncate_to(120).unwrap();
    assert_eq!(idx.entries(), 1);
    assert!(idx.sanity_check(111, 4001).unwrap());
    assert!(!idx.sanity_check(110, 4001).unwrap());
    assert!(!idx.sanity_check(111, 4000).unwrap());
    for i in 0..9 {
        idx.append(200 + i, 20000 + i as u32);
    }
    assert!(idx.is_full());
    assert_eq!(idx.entries(), 10);
    assert!(!idx.append(500, 50000));
    idx.trim().unwrap();
    assert_eq!(std::fs::metadata(&p).unwrap().len(), 80);
    idx.truncate_to(205).unwrap();
    idx.trim().unwrap();
    assert_eq!(std::fs::metadata(&p).unwrap().len(), 6 * 8);
}

#[test]
fn offset_index_bytes_and_reopen() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("x.index");
    {
        let mut idx = OffsetIndex::open(&p, 1000, 4096, true).unwrap();
        idx.append(1003, 0x0102);
        idx.append(1000 + 0x01020304, 0x7fff_fffe);
        idx.flush().unwrap();
        // dropped without trim: crash with preallocated file
    }
    let raw = std::fs::read(&p).unwrap();
    assert_eq!(raw.len(), 4096);
    assert_eq!(&raw[..16], &[0, 0, 0, 3, 0, 0, 1, 2, 1, 2, 3, 4, 0x7f, 0xff, 0xff, 0xfe]);
    assert!(raw[16..].iter().all(|&b| b == 0));
    let mut idx = OffsetIndex::open(&p, 1000, 4096, false).unwrap();
    assert_eq!(idx.entries(), 2);
    assert_eq!(std::fs::metadata(&p).unwrap().len(), 16);
    assert_eq!(idx.entry(1).unwrap(), (1000 + 0x01020304, 0x7fff_fffe));
    idx.preallocate(4096).unwrap();
    assert_eq!(std::fs::metadata(&p).unwrap().len(), 4096);
    assert!(idx.append(1000 + 0x01020305, 0x7fff_ffff));
    assert_eq!(idx.entries(), 3);
}

#[test]
fn misaligned_index_fails_sanity() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("x.index");
    std::fs::write(&p, [0u8, 0, 0, 1, 0, 0, 0, 9, 7]).unwrap();
    let idx = OffsetIndex::open(&p, 0, 4096, false).unwrap();
    assert!(!idx.sanity_check(100, 100).unwrap());
}

#[test]
fn time_index_append_lookup() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("00000000000000000050.timeindex");
    let mut ti = TimeIndex::open(&p, 50, 60, true).unwrap();
    assert_eq!(std::fs::metadata(&p).unwrap().len(), 60);
    assert_eq!(ti.lookup(5).unwrap(), 50);
    assert!(ti.maybe_append(1000, 55));
    assert!(!ti.maybe_append(1000, 60), "same timestamp is not re-indexed");
    assert!(!ti.maybe_append(900, 60));
    assert!(ti.maybe_append(2000, 60));
    assert!(ti.maybe_append(3000, 70));
    assert_eq!(ti.lookup(999).unwrap(), 50);
    assert_eq!(ti.lookup(1000).unwrap(), 50);
    assert_eq!(ti.lookup(1001).unwrap(), 55);
    assert_eq!(ti.lookup(2500).unwrap(), 60);
    assert_eq!(ti.lookup(i64::MAX).unwrap(), 70);
    assert!(ti.maybe_append(4000, 80));
    assert!(ti.is_full(), "last slot is reserved");
    assert!(ti.maybe_append(5000, 90));
    assert!(ti.maybe_append(6000, 95), "grows for the on-roll entry");
    let raw = std::fs::read(&p).unwrap();
    let mut e0 = 1000i64.to_be_bytes().to_vec();
    e0.extend_from_slice(&5u32.to_be_bytes());
    assert_eq!(&raw[..12], &e0[..]);
    ti.truncate_to(70).unwrap();
    assert_eq!(ti.last_entry(), Some((2000, 60)));
    assert!(ti.sanity_check(61).unwrap());
    assert!(!ti.sanity_check(60).unwrap());
    ti.trim().unwrap();
    assert_eq!(std::fs::metadata(&p).unwrap().len(), 24);
    drop(ti);
    let ti = TimeIndex::open(&p, 50, 60, false).unwrap();
    assert_eq!(ti.entries(), 2);
}

#[test]
fn an_index_maps_only_on_use_and_an_evicted_mapping_comes_back() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("0.index");
    let mut idx = OffsetIndex::open(&p, 0, 4096, true).unwrap();
    assert!(!idx.is_mapped(), "an empty index maps nothing");
    assert_eq!(idx.lookup(5).unwrap(), (0, 0));
    assert!(!idx.is_mapped(), "a lookup in an empty index maps nothing");
    assert!(idx.append(10, 100));
    assert!(idx.is_mapped(), "the first entry maps it");
    // Dropped from the cache (as an eviction does): the next use maps it again and the
    // entry written through the old mapping is there.
    index_maps().remove(idx.inner.id);
    assert_eq!(idx.last_entry(), Some((10, 100)));
    assert!(!idx.is_mapped(), "the last entry is kept, not read through a mapping");
    assert!(idx.append(20, 200));
    index_maps().remove(idx.inner.id);
    assert_eq!(idx.lookup(25).unwrap(), (20, 200));
    assert_eq!(idx.lookup(15).unwrap(), (10, 100));
    idx.flush().unwrap();
    drop(idx);
    // Reopened as an old segment: trimmed, nothing mapped until a lookup.
    let idx = OffsetIndex::open(&p, 0, 4096, false).unwrap();
    assert_eq!((idx.entries(), idx.is_mapped()), (2, false));
    assert!(idx.sanity_check(21, 201).unwrap());
    assert!(!idx.is_mapped(), "the load check reads the file");
    assert_eq!(idx.lookup(30).unwrap(), (20, 200));
    assert!(idx.is_mapped());
    let id = idx.inner.id;
    drop(idx);
    assert!(!index_maps().holds(id), "a dropped index takes its mapping with it");
}

#[test]
fn a_lookup_keeps_its_mapping_through_an_eviction() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("0.timeindex");
    let mut ti = TimeIndex::open(&p, 0, 4096, true).unwrap();
    for i in 1..50 {
        assert!(ti.maybe_append(i * 10, i));
    }
    let held = ti.inner.map().unwrap();
    index_maps().remove(ti.inner.id);
    // The holder still reads the entries (the region is unmapped only when it lets go).
    assert_eq!(ti.decode(ti.inner.entry(&held, 9)), (100, 10));
    assert_eq!(ti.lookup(101).unwrap(), 10);
    drop(held);
    assert_eq!(ti.lookup(1000).unwrap(), 49);
}

#[test]
fn a_trim_or_truncation_never_serves_a_stale_mapping() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("0.index");
    let mut idx = OffsetIndex::open(&p, 0, 4096, true).unwrap();
    for i in 1..=10 {
        assert!(idx.append(i, i as u32 * 10));
    }
    assert!(idx.is_mapped());
    idx.truncate_to(6).unwrap();
    assert_eq!((idx.entries(), idx.last_entry()), (5, Some((5, 50))));
    // Zeroed through the file, seen through the mapping (one page cache).
    let map = idx.inner.map().unwrap();
    assert!(idx.inner.entry(&map, 5).iter().all(|&b| b == 0));
    drop(map);
    idx.trim().unwrap();
    assert!(!idx.is_mapped(), "a resize drops the mapping of the old length");
    assert_eq!(idx.lookup(100).unwrap(), (5, 50));
    assert_eq!(std::fs::metadata(&p).unwrap().len(), 40);
    idx.preallocate(4096).unwrap();
    assert!(idx.append(11, 110));
    idx.reset().unwrap();
    assert_eq!((idx.entries(), idx.last_entry()), (0, None));
    idx.flush().unwrap();
    drop(idx);
    assert_eq!(OffsetIndex::open(&p, 0, 4096, false).unwrap().entries(), 0, "a crash-open finds nothing");
}

#[test]
fn a_mapping_failure_is_an_error_not_a_crash() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("0.index");
    let mut idx = OffsetIndex::open(&p, 0, 4096, false).unwrap();
    idx.preallocate(4096).unwrap();
    assert!(idx.append(5, 50));
    index_maps().remove(idx.inner.id);
    // The file cut behind the index's back (as a failed disk can leave it): mapping
    // what is not there would fault on the first read, so it is refused.
    std::fs::OpenOptions::new().write(true).open(&p).unwrap().set_len(0).unwrap();
    assert!(idx.lookup(7).is_err());
    assert!(!idx.append(6, 60), "an entry that cannot be mapped is left out");
    assert_eq!(idx.last_entry(), Some((5, 50)));
    std::fs::remove_file(&p).unwrap();
    assert!(idx.lookup(7).is_err());
}

/// A preallocated index is sparse: on a full file system a store into one of its holes
/// through the mapping would kill the process with SIGBUS. Needs a small tmpfs to fill,
/// so root; without it the test says so and does nothing.
#[test]
fn a_full_file_system_leaves_entries_out_instead_of_faulting() {
    let d = tempfile::tempdir().unwrap();
    let mnt = d.path().join("small");
    std::fs::create_dir(&mnt).unwrap();
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=64k", "tmpfs"])
        .arg(&mnt)
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !mounted {
        eprintln!("skipped: cannot mount a tmpfs here (needs root)");
        return;
    }
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
    let _unmount = Unmount(mnt.clone());
    let mut offsets = OffsetIndex::open(&mnt.join("0.index"), 0, 1 << 20, true).unwrap();
    let mut times = TimeIndex::open(&mnt.join("0.timeindex"), 0, 1 << 20, true).unwrap();
    let filler = mnt.join("filler");
    {
        let mut f = File::create(&filler).unwrap();
        let chunk = [0u8; 4096];
        while std::io::Write::write(&mut f, &chunk).is_ok_and(|n| n > 0) {}
    }
    assert!(!offsets.append(1, 10), "no page to put the entry in");
    assert!(!times.maybe_append(5, 1), "no page to put the entry in");
    assert_eq!((offsets.entries(), times.entries()), (0, 0));
    std::fs::remove_file(&filler).unwrap();
    assert!(offsets.append(1, 10));
    assert!(times.maybe_append(5, 1));
    assert_eq!(offsets.lookup(1).unwrap(), (1, 10));
}
