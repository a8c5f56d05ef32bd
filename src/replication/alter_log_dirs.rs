//! Log dir moves (AlterReplicaLogDirs, KIP-113; Kafka's `ReplicaAlterLogDirsThread`): a
//! partition's log is copied into a future log in the destination dir, kept up with the
//! current log as it grows, then swapped in by the log manager.
//!
//! The copy reads the current log as a follower reads its leader's: file ranges taken under
//! the current log's lock (no I/O), bytes read and appended to the future log without it, so
//! producers and consumers of the partition never wait on the copy. A truncation of the
//! current log (a follower that diverged) is noted by the log and cut from the future log
//! before the copy goes on; the current log's start moving past the copy (retention,
//! DeleteRecords) restarts the copy there. One task drives every move, a chunk at a time, at
//! most `replica.alter.log.dirs.io.max.bytes.per.second`.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use super::quota::ReplicationQuota;
use super::ReplicaManager;
use crate::log::manager::SwapOutcome;
use crate::log::{BatchHeader, FileRange, Log, LogError, LogManager};

type Key = (String, i32);

/// How long the mover sleeps when no move can progress (every copy caught up, waiting for
/// the current log to stop moving, or throttled).
const IDLE_WAIT: Duration = Duration::from_millis(100);

/// Catch-up-and-swap rounds tried in a row once a copy has caught up.
const SWAP_ATTEMPTS: usize = 4;

/// Why an AlterReplicaLogDirs entry was refused; mapped to Kafka's codes by the API layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AlterDirError {
    /// The directory is not one of `log.dirs` (LOG_DIR_NOT_FOUND).
    DirNotFound,
    /// The directory, or another one while a future log would be created, is offline
    /// (KAFKA_STORAGE_ERROR).
    Storage(String),
    /// This broker has no replica of the partition yet; the dir is remembered for when it
    /// has (REPLICA_NOT_AVAILABLE).
    NoReplica,
    /// The future directory's name would be longer than a file name may be
    /// (INVALID_TOPIC_EXCEPTION).
    NameTooLong,
}

/// What one step of a move did.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// Bytes appended to the future log (0: it only had to be cut back or restarted).
    Copied(usize),
    /// The future log holds everything the current one does.
    CaughtUp,
    /// No move of this partition is in progress any more.
    Gone,
}

fn lock(l: &Mutex<Log>) -> MutexGuard<'_, Log> {
    l.lock().unwrap_or_else(|p| p.into_inner())
}

/// Copies at most `max_bytes` of the current log to the end of the future log.
pub fn copy_step(logs: &LogManager, key: &Key, max_bytes: usize) -> Result<Step, LogError> {
    let Some((current, future)) = logs.current_and_future(key) else { return Ok(Step::Gone) };
    copy_between(&current, &future, key, max_bytes)
}

fn copy_between(current: &Mutex<Log>, future: &Mutex<Log>, key: &Key, max_bytes: usize) -> Result<Step, LogError> {
    let future_end = lock(future).log_end_offset();
    let (ranges, start, end, truncated) = {
        let mut cur = lock(current);
        let truncated = cur.take_truncation_mark();
        let (start, end) = (cur.log_start_offset(), cur.log_end_offset());
        let ranges = if truncated.is_none() && future_end >= start && future_end < end {
            cur.read(future_end, max_bytes, None)?
        } else {
            Vec::new()
        };
        (ranges, start, end, truncated)
    };
    if let Some(t) = truncated.filter(|&t| t < future_end) {
        let mut fut = lock(future);
        if t <= start {
            fut.truncate_fully_and_start_at(start)?;
        } else {
            fut.truncate_to(t)?;
        }
        return Ok(Step::Copied(0));
    }
    if future_end < start {
        lock(future).truncate_fully_and_start_at(start)?;
        return Ok(Step::Copied(0));
    }
    if future_end > end {
        lock(future).truncate_to(end)?;
        return Ok(Step::Copied(0));
    }
    if future_end == end {
        return Ok(Step::CaughtUp);
    }
    let mut buf = Vec::with_capacity(ranges.iter().map(|r| r.len).sum());
    for r in &ranges {
        FileRange::read_into(r, &mut buf)?;
    }
    // The read starts at the batch holding `future_end`, which begins there unless the
    // current log was rewritten under the copy; then the copy starts over.
    let mut skip = 0;
    let mut rest = &buf[..];
    while let Some(h) = BatchHeader::parse(rest) {
        if h.next_offset() > future_end {
            if h.base_offset < future_end {
                tracing::warn!(topic = %key.0, partition = key.1, "current log changed under a log dir move; copying again");
                lock(future).truncate_fully_and_start_at(start)?;
                return Ok(Step::Copied(0));
            }
            break;
        }
        let size = h.total_size().min(rest.len());
        skip += size;
        rest = &rest[size..];
    }
    let batches = buf.split_off(skip);
    if batches.is_empty() {
        return Ok(Step::Copied(0));
    }
    let n = batches.len();
    lock(future).append_as_follower(&batches)?;
    Ok(Step::Copied(n))
}

impl ReplicaManager {
    /// AlterReplicaLogDirs for one partition, as Kafka's `ReplicaManager.alterReplicaLogDirs`:
    /// a move to another dir of a partition moving elsewhere replaces that move; a move to
    /// the dir the log is in cancels any move; a partition not hosted yet is created in the
    /// dir when it comes.
    pub fn alter_log_dir(&self, topic: &str, partition: i32, dir_idx: usize) -> Result<(), AlterDirError> {
        let logs = self.logs();
        if dir_idx >= logs.dirs().len() {
            return Err(AlterDirError::DirNotFound);
        }
        // Kafka's limit: the future directory's name must be a legal file name.
        if crate::log::manager::future_dir_name(topic, partition).len() > 255 {
            return Err(AlterDirError::NameTooLong);
        }
        if !logs.is_online(dir_idx) {
            return Err(AlterDirError::Storage(format!("Log directory {} is offline", logs.dirs()[dir_idx].display())));
        }
        let key = (topic.to_string(), partition);
        let hosted = self.hosted(topic, partition).is_some();
        let (current_dir, future_dir) = logs.dirs_of(&key);
        if hosted && future_dir.is_some_and(|d| d != dir_idx) {
            logs.remove_future(&key).map_err(|e| AlterDirError::Storage(e.to_string()))?;
        }
        let Some(current_dir) = current_dir.filter(|_| hosted) else {
            logs.set_preferred_dir(key, dir_idx);
            return Err(AlterDirError::NoReplica);
        };
        if current_dir == dir_idx {
            return Ok(());
        }
        // As Kafka: no future log while a dir is offline, which might hold another copy.
        if (0..logs.dirs().len()).any(|i| !logs.is_online(i)) {
            return Err(AlterDirError::Storage("Cannot move a replica while a log dir is offline".into()));
        }
        match logs.create_future(&key, dir_idx) {
            Ok(_) => {
                self.log_dir_moves.notify_one();
                Ok(())
            }
            Err(e) => Err(AlterDirError::Storage(e.to_string())),
        }
    }

    /// One pass over the moves in progress: a chunk copied for each, a swap for each that
    /// caught up. Blocking (disk I/O). Returns whether any made progress.
    pub fn drive_log_dir_moves(&self, max_bytes: usize, quota: &ReplicationQuota, rate: u64) -> bool {
        let logs = self.logs();
        let mut progressed = false;
        for key in logs.moving() {
            let Some(partition) = self.hosted(&key.0, key.1) else { continue };
            let Some((current, future)) = logs.current_and_future(&key) else { continue };
            if quota.exceeded(rate) {
                break;
            }
            match copy_between(&current, &future, &key, max_bytes) {
                Ok(Step::Copied(n)) => {
                    quota.record(rate, n);
                    progressed = true;
                }
                Ok(Step::CaughtUp) => match self.swap_in_future(&key, &partition, max_bytes) {
                    Ok(true) => progressed = true,
                    Ok(false) => {}
                    Err(e) => drop_move(logs, &key, &future, &e),
                },
                Ok(Step::Gone) => {}
                Err(e) => drop_move(logs, &key, &future, &e),
            }
        }
        progressed
    }

    fn swap_in_future(&self, key: &Key, partition: &super::Partition, max_bytes: usize) -> Result<bool, LogError> {
        let logs = self.logs();
        let Some((current, future)) = logs.current_and_future(key) else { return Ok(false) };
        // Before the locks: make what was copied durable and give the future log the epoch
        // checkpoint, so that the swap's own fsync is short and a crash right after it leaves
        // a log with its epochs.
        let (current_dir, future_dir) = (lock(&current).dir().to_path_buf(), {
            let mut f = lock(&future);
            f.flush()?;
            f.dir().to_path_buf()
        });
        let epochs = current_dir.join(super::leader_epoch::FILE_NAME);
        if epochs.exists() {
            std::fs::copy(&epochs, future_dir.join(super::leader_epoch::FILE_NAME))?;
        }
        // What was appended during the fsync and the copy above is caught up without the lock
        // right before the swap, so that a busy partition leaves only a short window.
        for _ in 0..SWAP_ATTEMPTS {
            match copy_between(&current, &future, key, max_bytes)? {
                Step::CaughtUp => {}
                Step::Copied(_) => continue,
                Step::Gone => return Ok(false),
            }
            match logs.replace_current_with_future(key)? {
                SwapOutcome::Swapped { old_dir, new_dir } => {
                    partition.relocate_epoch_checkpoint(&new_dir);
                    if let Err(e) = std::fs::remove_dir_all(&old_dir) {
                        tracing::warn!(dir = %old_dir.display(), error = %e, "could not remove a moved log's old directory");
                    }
                    return Ok(true);
                }
                SwapOutcome::NotCaughtUp => {}
                SwapOutcome::NoMove => return Ok(false),
            }
        }
        Ok(false)
    }
}

/// A move that failed is dropped; the current log was never touched, so nothing is lost and
/// the operator may ask again.
fn drop_move(logs: &LogManager, key: &Key, future: &crate::log::manager::SharedLog, e: &LogError) {
    tracing::error!(topic = %key.0, partition = key.1, error = %e, "log dir move failed; dropping it");
    if let Err(e) = logs.remove_future_if(key, future) {
        tracing::warn!(topic = %key.0, partition = key.1, error = %e, "could not remove a future log");
    }
}

/// The task that drives every log dir move: woken when one starts, and while any is in
/// progress, by an append to a moving partition (the copies follow the current logs), a
/// metadata change, or after a short wait.
pub async fn run(replicas: Arc<super::ReplicaManager>) {
    let quota = Arc::new(ReplicationQuota::default());
    loop {
        if replicas.logs().moving().is_empty() {
            tokio::select! {
                _ = replicas.log_dir_moves.notified() => {}
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
            continue;
        }
        // Registered before the copy step, so an append that lands during it still wakes
        // the next wait; control-plane changes (a partition deleted or reassigned) too.
        let appended = Arc::new(tokio::sync::Notify::new());
        for (topic, index) in replicas.logs().moving() {
            if let Some(p) = replicas.partition(&topic, index) {
                p.watch(&appended);
            }
        }
        let changed = replicas.changed();
        let config = replicas.handles.effective_config();
        let (max_bytes, rate) =
            (config.replica_fetch_max_bytes.max(1) as usize, config.replica_alter_log_dirs_io_max_bytes_per_second);
        let (r, q) = (replicas.clone(), quota.clone());
        let progressed =
            tokio::task::spawn_blocking(move || r.drive_log_dir_moves(max_bytes, &q, rate)).await.unwrap_or_else(|e| {
                tracing::error!(error = %e, "log dir mover failed");
                false
            });
        if !progressed {
            tokio::select! {
                _ = appended.notified() => {}
                _ = changed => {}
                _ = tokio::time::sleep(IDLE_WAIT) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::batch::simple_batch;
    use crate::log::LogConfig;

    fn cfg() -> LogConfig {
        LogConfig { segment_bytes: 4096, max_index_size: 4096, ..LogConfig::default() }
    }

    fn fill(logs: &LogManager, key: &Key, batches: usize) {
        let l = logs.get(&key.0, key.1).unwrap();
        let mut g = l.lock().unwrap();
        for _ in 0..batches {
            g.append(&mut simple_batch(3, 10, 100), 0).unwrap();
        }
    }

    fn run_to_end(logs: &LogManager, key: &Key) {
        for _ in 0..10_000 {
            match copy_step(logs, key, 1000).unwrap() {
                Step::CaughtUp => return,
                Step::Copied(_) => {}
                Step::Gone => panic!("move gone"),
            }
        }
        panic!("copy never caught up");
    }

    fn read_all(l: &Mutex<Log>) -> Vec<u8> {
        let g = l.lock().unwrap();
        let mut out = Vec::new();
        for r in g.read(g.log_start_offset(), usize::MAX, None).unwrap() {
            r.read_into(&mut out).unwrap();
        }
        out
    }

    #[test]
    fn a_move_copies_follows_truncation_and_swaps_in() {
        let root = tempfile::tempdir().unwrap();
        let dirs = vec![root.path().join("a"), root.path().join("b")];
        let logs = LogManager::open(dirs.clone(), cfg()).unwrap();
        let key: Key = ("t".into(), 0);
        let handle = logs.get_or_create("t", 0, cfg()).unwrap();
        crate::log::write_partition_metadata(handle.lock().unwrap().dir(), "AAAAAAAAAAAAAAAAAAAAAA").unwrap();
        let src = if handle.lock().unwrap().dir().starts_with(&dirs[0]) { 0 } else { 1 };
        let dst = 1 - src;
        fill(&logs, &key, 40);
        assert!(logs.create_future(&key, dst).unwrap());
        assert!(!logs.create_future(&key, dst).unwrap(), "the same move twice is one move");
        assert!(matches!(copy_step(&logs, &key, 1000).unwrap(), Step::Copied(n) if n > 0));
        run_to_end(&logs, &key);
        // The current log diverges under the copy: truncated, then written again.
        handle.lock().unwrap().truncate_to(30).unwrap();
        fill(&logs, &key, 5);
        assert_eq!(copy_step(&logs, &key, 1000).unwrap(), Step::Copied(0), "cut back first");
        run_to_end(&logs, &key);
        let before = read_all(&handle);
        let stats = handle.lock().unwrap().stats();
        match logs.replace_current_with_future(&key).unwrap() {
            SwapOutcome::Swapped { old_dir, new_dir } => {
                assert!(new_dir.starts_with(&dirs[dst]) && new_dir.ends_with("t-0"));
                assert!(old_dir.file_name().unwrap().to_str().unwrap().ends_with("-delete"));
                std::fs::remove_dir_all(old_dir).unwrap();
            }
            other => panic!("{other:?}"),
        }
        // The same handle now writes to the moved log, whose statistics are the same cell.
        assert!(handle.lock().unwrap().dir().starts_with(&dirs[dst]));
        assert_eq!(read_all(&handle), before);
        fill(&logs, &key, 1);
        assert_eq!(stats.log_end_offset(), handle.lock().unwrap().log_end_offset());
        assert_eq!(logs.dirs_of(&key), (Some(dst), None));
        assert_eq!(
            crate::log::read_partition_metadata(handle.lock().unwrap().dir()).unwrap().as_deref(),
            Some("AAAAAAAAAAAAAAAAAAAAAA")
        );
        assert!(!dirs[src].join("t-0").exists());
        logs.shutdown().unwrap();
        drop(handle);
        drop(logs);
        let logs = LogManager::open(dirs.clone(), cfg()).unwrap();
        assert_eq!(logs.dirs_of(&key), (Some(dst), None));
        assert_eq!(logs.get("t", 0).unwrap().lock().unwrap().log_end_offset(), 48);
    }

    #[test]
    fn a_stop_mid_move_resumes_and_a_stop_mid_swap_completes_it() {
        let root = tempfile::tempdir().unwrap();
        let dirs = vec![root.path().join("a"), root.path().join("b")];
        let key: Key = ("t".into(), 0);
        let (src, dst) = {
            let logs = LogManager::open(dirs.clone(), cfg()).unwrap();
            let h = logs.get_or_create("t", 0, cfg()).unwrap();
            let src = if h.lock().unwrap().dir().starts_with(&dirs[0]) { 0 } else { 1 };
            fill(&logs, &key, 20);
            logs.create_future(&key, 1 - src).unwrap();
            copy_step(&logs, &key, 500).unwrap();
            logs.checkpoint().unwrap();
            (src, 1 - src)
            // dropped without shutdown: a crash mid-copy
        };
        let logs = LogManager::open(dirs.clone(), cfg()).unwrap();
        assert_eq!(logs.dirs_of(&key), (Some(src), Some(dst)), "the move resumes");
        assert_eq!(logs.get("t", 0).unwrap().lock().unwrap().log_end_offset(), 60);
        run_to_end(&logs, &key);
        let (_, future) = logs.current_and_future(&key).unwrap();
        future.lock().unwrap().flush().unwrap();
        let future_dir = future.lock().unwrap().dir().to_path_buf();
        drop(future);
        drop(logs);
        // A crash between the swap's renames: the current log is already renamed away.
        std::fs::rename(dirs[src].join("t-0"), dirs[src].join("t-0.0123abcd-delete")).unwrap();
        let logs = LogManager::open(dirs.clone(), cfg()).unwrap();
        assert_eq!(logs.dirs_of(&key), (Some(dst), None), "the future log becomes the current one");
        assert!(!future_dir.exists() && dirs[dst].join("t-0").is_dir());
        assert!(!dirs[src].join("t-0.0123abcd-delete").exists());
        assert_eq!(logs.get("t", 0).unwrap().lock().unwrap().log_end_offset(), 60);
    }

    #[test]
    fn a_moving_partition_deleted_leaves_no_future_log() {
        let root = tempfile::tempdir().unwrap();
        let dirs = vec![root.path().join("a"), root.path().join("b")];
        let logs = LogManager::open(dirs.clone(), cfg()).unwrap();
        let key: Key = ("t".into(), 0);
        let h = logs.get_or_create("t", 0, cfg()).unwrap();
        let dst = if h.lock().unwrap().dir().starts_with(&dirs[0]) { 1 } else { 0 };
        logs.create_future(&key, dst).unwrap();
        logs.delete_log("t", 0).unwrap();
        assert_eq!(std::fs::read_dir(&dirs[dst]).unwrap().filter(|e| e.as_ref().unwrap().path().is_dir()).count(), 0);
        assert_eq!(copy_step(&logs, &key, 100).unwrap(), Step::Gone);
        assert_eq!(logs.replace_current_with_future(&key).unwrap(), SwapOutcome::NoMove);
    }
}
