//! Recovery of a log directory from arbitrary bytes: the input is cut into the files of one
//! partition (two segments with their offset and time indexes, the leader-epoch checkpoint,
//! partition.metadata) and the log dir's checkpoints, then the dir is opened as at a start
//! after a crash or after a clean stop. Opening may refuse a partition; it must not panic,
//! and a log it opens must serve reads and take an append.
#![no_main]
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use gregor::log::{batch, checkpoint, LogConfig, LogManager};
use libfuzzer_sys::fuzz_target;

const FILES: &[&str] = &[
    "t-0/00000000000000000000.log",
    "t-0/00000000000000000000.index",
    "t-0/00000000000000000000.timeindex",
    "t-0/00000000000000000005.log",
    "t-0/00000000000000000005.index",
    "t-0/00000000000000000005.timeindex",
    "t-0/leader-epoch-checkpoint",
    "t-0/partition.metadata",
    checkpoint::RECOVERY_POINT_CHECKPOINT,
    checkpoint::LOG_START_OFFSET_CHECKPOINT,
];

fn root() -> &'static Path {
    static ROOT: OnceLock<PathBuf> = OnceLock::new();
    ROOT.get_or_init(|| {
        // tmpfs where there is one: each run writes and removes a dozen files.
        let base = if Path::new("/dev/shm").is_dir() { PathBuf::from("/dev/shm") } else { std::env::temp_dir() };
        tempfile::Builder::new().prefix("gregor-fuzz-log").tempdir_in(base).expect("temp dir").keep()
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&flags, mut rest)) = data.split_first() else { return };
    let dir = root().join("d");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("t-0")).expect("create dir");
    // Each file: a 16-bit length, then its bytes; a file the input does not reach is absent.
    for name in FILES {
        if rest.len() < 2 {
            break;
        }
        let len = (u16::from_be_bytes([rest[0], rest[1]]) as usize).min(rest.len() - 2);
        std::fs::write(dir.join(name), &rest[2..2 + len]).expect("write file");
        rest = &rest[2 + len..];
    }
    if flags & 1 != 0 {
        std::fs::write(dir.join(checkpoint::CLEAN_SHUTDOWN_FILE), b"").expect("write marker");
    }
    let _ = gregor::replication::leader_epoch::LeaderEpochCache::load(&dir.join("t-0"));
    let _ = checkpoint::read_partition_metadata(&dir.join("t-0"));
    let config = LogConfig { segment_bytes: 4096, ..LogConfig::default() };
    let Ok(manager) = LogManager::open(vec![dir.clone()], config) else { return };
    if let Some(log) = manager.get("t", 0) {
        let mut log = log.lock().unwrap_or_else(|p| p.into_inner());
        let (start, end) = (log.log_start_offset(), log.log_end_offset());
        assert!(start <= end, "log start {start} after log end {end}");
        if let Ok(ranges) = log.read(start, 1 << 16, None) {
            let mut bytes = Vec::new();
            for r in &ranges {
                r.read_into(&mut bytes).expect("read a range the log handed out");
            }
            // What recovery kept is whole, valid batches. After a clean shutdown the log is
            // trusted without reading it, as Kafka does, so only a fully recovered log is checked.
            let mut pos = 0;
            // And a recovery-point checkpoint makes the segments below it trusted, as in Kafka.
            let trusted = flags & 1 != 0 || dir.join(checkpoint::RECOVERY_POINT_CHECKPOINT).exists();
            while !trusted && pos < bytes.len() {
                let h = batch::BatchHeader::parse(&bytes[pos..]).expect("recovered log serves a torn header");
                let end = pos + h.total_size();
                assert!(end <= bytes.len(), "recovered log serves a torn batch");
                batch::check_stored_batch(&bytes[pos..end]).expect("recovered log serves a bad batch");
                pos = end;
            }
        }
        let mut records = batch::simple_batch(2, 10, 0);
        let appended = log.append(&mut records, 0).expect("append to a recovered log");
        let _ = appended;
        assert_eq!(log.log_end_offset(), end + 2);
    }
    let _ = manager.shutdown();
});
