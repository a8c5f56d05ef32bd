use super::*;
use crate::log::batch::simple_batch;

fn cfg() -> LogConfig {
    LogConfig { max_index_size: 4096, ..LogConfig::default() }
}

#[test]
fn lifecycle_clean_and_unclean() {
    let root = tempfile::tempdir().unwrap();
    let dirs = vec![root.path().join("d1"), root.path().join("d2")];
    let m = LogManager::open(dirs.clone(), cfg()).unwrap();
    for (t, p) in [("a-b.c", 0), ("a-b.c", 1), ("x", 0), ("x", 1)] {
        let l = m.get_or_create(t, p, cfg()).unwrap();
        let mut g = l.lock().unwrap();
        for _ in 0..3 {
            g.append(&mut simple_batch(2, 10, 5), 0).unwrap();
        }
    }
    // balanced over the two dirs
    let n1 = fs::read_dir(&dirs[0]).unwrap().count();
    let n2 = fs::read_dir(&dirs[1]).unwrap().count();
    assert_eq!((n1, n2), (2, 2));
    assert!(m.get("a-b.c", 1).is_some());
    assert!(m.get("nope", 0).is_none());
    assert!(m.get_or_create("../evil", 0, cfg()).is_err());
    assert!(m.get_or_create("t", -1, cfg()).is_err());
    m.get("x", 0).unwrap().lock().unwrap().delete_records_before(2).unwrap();
    m.write_high_watermarks(&[(("x".into(), 0), 6), (("a-b.c".into(), 1), 4), (("gone".into(), 0), 1)]).unwrap();
    m.shutdown().unwrap();
    for d in &dirs {
        assert!(d.join(CLEAN_SHUTDOWN_FILE).exists());
        let rp = fs::read_to_string(d.join(RECOVERY_POINT_CHECKPOINT)).unwrap();
        assert!(rp.starts_with("0\n2\n"), "{rp}");
        assert!(rp.lines().skip(2).all(|l| l.ends_with(" 6")), "{rp}");
    }
    let x0_dir = (0..2).find(|&i| dirs[i].join("x-0").exists()).unwrap();
    assert_eq!(fs::read_to_string(dirs[x0_dir].join(LOG_START_OFFSET_CHECKPOINT)).unwrap(), "0\n1\nx 0 2\n");
    drop(m);

    let m = LogManager::open(dirs.clone(), cfg()).unwrap();
    for d in &dirs {
        assert!(!d.join(CLEAN_SHUTDOWN_FILE).exists(), "marker removed at startup");
    }
    assert_eq!(m.all().len(), 4);
    let x0 = m.get("x", 0).unwrap();
    assert_eq!(x0.lock().unwrap().log_start_offset(), 2);
    assert_eq!(x0.lock().unwrap().log_end_offset(), 6);
    let hw = m.read_high_watermarks();
    assert_eq!(hw.len(), 2);
    assert_eq!(hw[&("x".to_string(), 0)], 6);
    // crash: append more, checkpoint, then damage the tail; no marker
    {
        let mut g = x0.lock().unwrap();
        g.append(&mut simple_batch(1, 10, 5), 0).unwrap();
    }
    m.checkpoint().unwrap();
    drop(x0);
    drop(m);
    let seg = dirs[x0_dir].join("x-0").join("00000000000000000000.log");
    let len = fs::metadata(&seg).unwrap().len();
    fs::OpenOptions::new().write(true).open(&seg).unwrap().set_len(len - 3).unwrap();
    let m = LogManager::open(dirs.clone(), cfg()).unwrap();
    assert_eq!(m.get("x", 0).unwrap().lock().unwrap().log_end_offset(), 6);
    // deletion
    m.delete_log("x", 0).unwrap();
    assert!(m.get("x", 0).is_none());
    assert!(!dirs[x0_dir].join("x-0").exists());
    m.delete_log("x", 0).unwrap();
    // new partitions go to the emptier dir
    let _ = m.get_or_create("y", 0, cfg()).unwrap();
    assert!(dirs[x0_dir].join("y-0").exists());
}

#[test]
fn unusable_dir_is_skipped_and_junk_ignored() {
    let root = tempfile::tempdir().unwrap();
    let bad = root.path().join("file");
    fs::write(&bad, b"not a dir").unwrap();
    let good = root.path().join("good");
    fs::create_dir_all(good.join("t-0.abc-delete")).unwrap();
    fs::create_dir_all(good.join("not_a_partition")).unwrap();
    fs::write(good.join(RECOVERY_POINT_CHECKPOINT), "garbage").unwrap();
    let m = LogManager::open(vec![bad, good.clone()], cfg()).unwrap();
    assert!(m.all().is_empty());
    assert!(!good.join("t-0.abc-delete").exists());
    let l = m.get_or_create("t", 0, cfg()).unwrap();
    assert!(l.lock().unwrap().dir().starts_with(&good));
    m.shutdown().unwrap();
}

/// A segment whose writes fail with ENOSPC (its file is /dev/full): the append answers an
/// I/O error, the dir goes offline with every log in it, the other dir keeps working, and
/// the manager stops serving the failed dir's partitions without recreating them elsewhere.
#[test]
fn an_io_error_takes_the_log_dir_offline() {
    let root = tempfile::tempdir().unwrap();
    let dirs = vec![root.path().join("full"), root.path().join("ok")];
    let m = LogManager::open(dirs.clone(), cfg()).unwrap();
    let full = m.get_or_create("t", 0, cfg()).unwrap();
    let other = m.get_or_create("t", 1, cfg()).unwrap();
    let neighbour = m.get_or_create("t", 2, cfg()).unwrap();
    assert!(full.lock().unwrap().dir().starts_with(&dirs[0]));
    assert!(neighbour.lock().unwrap().dir().starts_with(&dirs[0]));
    assert!(other.lock().unwrap().dir().starts_with(&dirs[1]));
    full.lock().unwrap().append(&mut simple_batch(2, 10, 5), 0).unwrap();
    // The next segment's file is /dev/full: every write to it fails with ENOSPC.
    let next = full.lock().unwrap().dir().join("00000000000000000002.log");
    std::os::unix::fs::symlink("/dev/full", next).unwrap();
    full.lock().unwrap().roll(2).unwrap();
    assert!(m.is_online(0) && m.is_online(1));

    let err = full.lock().unwrap().append(&mut simple_batch(2, 10, 5), 0).unwrap_err();
    assert!(matches!(err, LogError::Io(_)), "{err}");
    assert_eq!(err.kafka_code(), crate::protocol::ErrorCode::KafkaStorageError.code());
    assert!(!m.is_online(0) && m.is_online(1));
    // Every log of the dir refuses work from now on, not only the one that failed.
    let err = neighbour.lock().unwrap().append(&mut simple_batch(1, 10, 5), 0).unwrap_err();
    assert!(matches!(err, LogError::StorageUnavailable(_)), "{err}");
    assert!(neighbour.lock().unwrap().read(0, 1024, None).is_err());
    other.lock().unwrap().append(&mut simple_batch(2, 10, 5), 0).unwrap();

    assert_eq!(m.failure_channel().take(), vec![0]);
    let mut gone = m.handle_log_dir_failure(0);
    gone.sort();
    assert_eq!(gone, vec![("t".to_string(), 0), ("t".to_string(), 2)]);
    assert!(m.get("t", 0).is_none() && m.is_offline_partition("t", 0));
    assert!(matches!(m.get_or_create("t", 0, cfg()), Err(LogError::StorageUnavailable(_))));
    // New partitions go to the dir that is left.
    let fresh = m.get_or_create("u", 0, cfg()).unwrap();
    assert!(fresh.lock().unwrap().dir().starts_with(&dirs[1]));
    let placement = m.placement();
    assert!(!placement[0].1 && placement[0].2.is_empty() && placement[1].1);
    m.shutdown().unwrap();
    // No clean shutdown marker for the failed dir: its logs are recovered at the next start.
    assert!(!dirs[0].join(CLEAN_SHUTDOWN_FILE).exists());
    assert!(dirs[1].join(CLEAN_SHUTDOWN_FILE).exists());
}

#[test]
fn logs_created_at_once_are_created_once_each_and_spread_over_the_dirs() {
    let root = tempfile::tempdir().unwrap();
    let dirs = vec![root.path().join("d1"), root.path().join("d2")];
    let m = LogManager::open(dirs.clone(), cfg()).unwrap();
    // Eight threads ask for the same eight partitions: each is created once, and every
    // caller gets that one log.
    let logs: Vec<Vec<Arc<Mutex<Log>>>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..8)
            .map(|_| s.spawn(|| (0..8).map(|p| m.get_or_create("t", p, cfg()).unwrap()).collect::<Vec<_>>()))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for p in 0..8 {
        assert!(logs.iter().all(|l| Arc::ptr_eq(&l[p], &logs[0][p])), "t-{p} created twice");
    }
    let n1 = fs::read_dir(&dirs[0]).unwrap().count();
    let n2 = fs::read_dir(&dirs[1]).unwrap().count();
    assert_eq!((n1, n2), (4, 4), "placed by count, those in creation included");
}
