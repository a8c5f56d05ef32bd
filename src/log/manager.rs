//! `LogManager`: owns the `log.dirs`, loads every partition at startup,
//! places new partitions, and writes the per-dir checkpoint files.
//!
//! Startup per dir: read `recovery-point-offset-checkpoint` and
//! `log-start-offset-checkpoint`; if `.kafka_cleanshutdown` exists the dir
//! shut down cleanly, so its logs are trusted (the marker is removed once
//! they are loaded, so a crash from now on is seen as unclean). A dir that
//! cannot be read is logged and left offline; a partition that fails to
//! load is logged and refused (never silently recreated elsewhere).
//!
//! A log dir move (AlterReplicaLogDirs) copies a partition into a *future* log,
//! `<topic>-<partition>.<id>-future` in the destination dir, then swaps it in
//! ([`LogManager::replace_current_with_future`]): the current directory is renamed
//! `-delete` first, then the future one takes the partition's name. A crash before
//! the first rename leaves the current log untouched (the future one is loaded
//! again and the move resumes); a crash between the two leaves a complete, fsynced
//! future log and no current one, and startup finishes the swap. Kafka renames in
//! the other order and refuses to start on the two current copies a crash there
//! leaves.
//!
//! Locking: the manager's map lock is never held while waiting on a log
//! lock, nor during disk I/O. Log locks are taken one at a time, except by
//! the swap, which holds the current log's and then the future log's.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use super::checkpoint::{
    read_offset_checkpoint, sync_dir, sync_file_system, write_atomic, write_offset_checkpoint, CLEAN_SHUTDOWN_FILE,
    LOG_START_OFFSET_CHECKPOINT, RECOVERY_POINT_CHECKPOINT, REPLICATION_OFFSET_CHECKPOINT,
};
use super::dir_failure::{DirHealth, LogDirFailureChannel};
use super::partition_log::{Log, LogStats};
use super::{parse_partition_dir_name, partition_dir_name, validate_topic_name, LogConfig, LogError};
use crate::sync::MutexExt;

type Key = (String, i32);
/// A log shared between the replica layer, the cleaner and the manager.
pub type SharedLog = Arc<Mutex<Log>>;

struct Entry {
    dir_idx: usize,
    log: Arc<Mutex<Log>>,
}

struct FutureEntry {
    dir_idx: usize,
    log: Arc<Mutex<Log>>,
    /// Read by DescribeLogDirs without the log's lock.
    stats: Arc<LogStats>,
}

struct State {
    logs: HashMap<Key, Entry>,
    /// Partitions whose directory exists but cannot be served: it failed to load, or its log
    /// dir went offline. Never created again elsewhere: the copy there may be the only one.
    failed: HashSet<Key>,
    /// Copies being made for log dir moves, at most one per partition.
    futures: HashMap<Key, FutureEntry>,
    /// Where a partition not hosted yet is to be created (AlterReplicaLogDirs before the
    /// replica exists, as Kafka's preferred log dirs).
    preferred: HashMap<Key, usize>,
    /// Logs being created outside the lock, with their dirs: another caller for the same
    /// partition waits for `LogManager::created` rather than creating it a second time.
    creating: HashMap<Key, usize>,
}

/// A future log directory found at startup, opened once every dir is read.
struct FoundFuture {
    key: Key,
    dir_idx: usize,
    path: PathBuf,
    recovery_point: i64,
    log_start_offset: i64,
    clean: bool,
}

/// The suffix of a future log's directory (Kafka's `-future`).
pub const FUTURE_DIR_SUFFIX: &str = "-future";

/// `<topic>-<partition>.<32 hex digits>-future`, as Kafka names it.
pub fn future_dir_name(topic: &str, partition: i32) -> String {
    format!("{}.{}{FUTURE_DIR_SUFFIX}", partition_dir_name(topic, partition), uuid::Uuid::new_v4().simple())
}

/// The partition a future log directory belongs to.
pub fn parse_future_dir_name(name: &str) -> Option<Key> {
    let stem = name.strip_suffix(FUTURE_DIR_SUFFIX)?;
    let (partition_dir, id) = stem.rsplit_once('.')?;
    if id.is_empty() || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    parse_partition_dir_name(partition_dir).filter(|k| validate_topic_name(&k.0).is_ok())
}

/// What a swap found when it looked at the two logs under their locks.
#[derive(Debug, PartialEq, Eq)]
pub enum SwapOutcome {
    /// The future log replaced the current one; the old directory (renamed) is returned for
    /// the caller to remove without any lock.
    Swapped { old_dir: PathBuf, new_dir: PathBuf },
    /// The current log moved on (or was truncated) since the copy caught up.
    NotCaughtUp,
    /// No move of this partition is in progress any more.
    NoMove,
}

pub struct LogManager {
    dirs: Vec<PathBuf>,
    /// Which dirs are offline (unreadable at start, or an I/O error since).
    failures: Arc<LogDirFailureChannel>,
    default_config: LogConfig,
    state: Mutex<State>,
    created: std::sync::Condvar,
}

fn lock_log(l: &Mutex<Log>) -> MutexGuard<'_, Log> {
    // A panic while holding a log lock is a bug, but the data on disk is
    // still consistent up to the log's in-memory size, so keep serving.
    l.lock_unpoisoned()
}

impl LogManager {
    pub fn open(dirs: Vec<PathBuf>, default_config: LogConfig) -> Result<LogManager, LogError> {
        let mut offline = Vec::new();
        let mut logs: HashMap<Key, Entry> = HashMap::new();
        let mut failed = HashSet::new();
        let mut found = Vec::new();
        for (i, dir) in dirs.iter().enumerate() {
            if let Err(e) = Self::load_dir(i, dir, &default_config, &mut logs, &mut failed, &mut found) {
                tracing::error!(dir = %dir.display(), error = %e, "log dir is unusable; leaving it offline");
                offline.push(i);
            }
        }
        if !dirs.is_empty() && offline.len() == dirs.len() {
            tracing::error!("no log dir is usable");
        }
        let all_online = offline.is_empty();
        let failures = Arc::new(LogDirFailureChannel::new(dirs.len(), &offline));
        let mut futures = Self::load_futures(&dirs, all_online, &default_config, found, &mut logs, &failed);
        for e in logs.values() {
            lock_log(&e.log).set_dir_health(DirHealth::new(e.dir_idx, failures.clone()));
        }
        for f in futures.values_mut() {
            lock_log(&f.log).set_dir_health(DirHealth::new(f.dir_idx, failures.clone()));
        }
        let state = State { logs, failed, futures, preferred: HashMap::new(), creating: HashMap::new() };
        Ok(LogManager { dirs, failures, default_config, state: Mutex::new(state), created: Default::default() })
    }

    /// Where logs report I/O errors, and where the replica manager learns of them.
    pub fn failure_channel(&self) -> &Arc<LogDirFailureChannel> {
        &self.failures
    }

    fn health(&self, dir_idx: usize) -> DirHealth {
        DirHealth::new(dir_idx, self.failures.clone())
    }

    /// Kafka's `LogManager.handleLogDirFailure`, for a dir the failure channel reported: its
    /// logs leave the manager (no checkpoint, flush or retention touches them again, and
    /// nothing recreates them in another dir), moves into or out of it are dropped without
    /// touching its files. Returns the partitions that were there.
    pub fn handle_log_dir_failure(&self, dir_idx: usize) -> Vec<Key> {
        let mut st = self.state();
        let gone: Vec<Key> = st.logs.iter().filter(|(_, e)| e.dir_idx == dir_idx).map(|(k, _)| k.clone()).collect();
        for k in &gone {
            st.logs.remove(k);
            st.failed.insert(k.clone());
        }
        let failed = st.failed.clone();
        st.futures.retain(|k, f| f.dir_idx != dir_idx && !failed.contains(k));
        st.preferred.retain(|_, d| *d != dir_idx);
        gone
    }

    /// Whether the partition's log cannot be served here: in an offline dir, or failed to load.
    pub fn is_offline_partition(&self, topic: &str, partition: i32) -> bool {
        self.state().failed.contains(&(topic.to_string(), partition))
    }

    /// Whether any log dir is still online.
    pub fn any_online(&self) -> bool {
        (0..self.dirs.len()).any(|i| self.is_online(i))
    }

    /// Opens the future logs found at startup. One whose current log is loaded from another
    /// dir resumes its move. One without a current log is what a crash between the swap's two
    /// renames leaves: complete and fsynced, so it becomes the current log, unless a dir is
    /// offline (the current log may be there) or the partition failed to load.
    fn load_futures(
        dirs: &[PathBuf],
        all_online: bool,
        config: &LogConfig,
        found: Vec<FoundFuture>,
        logs: &mut HashMap<Key, Entry>,
        failed: &HashSet<Key>,
    ) -> HashMap<Key, FutureEntry> {
        let mut futures = HashMap::new();
        for f in found {
            let name = partition_dir_name(&f.key.0, f.key.1);
            let current_dir = logs.get(&f.key).map(|e| e.dir_idx);
            if current_dir == Some(f.dir_idx) || futures.contains_key(&f.key) {
                tracing::warn!(dir = %f.path.display(), "redundant future log; removing it");
                if let Err(e) = fs::remove_dir_all(&f.path) {
                    tracing::warn!(dir = %f.path.display(), error = %e, "could not remove a future log");
                }
                continue;
            }
            if current_dir.is_some() {
                match Log::open(f.path.clone(), config.clone(), f.recovery_point, f.log_start_offset, f.clean) {
                    Ok(log) => {
                        tracing::info!(partition = %name, dir = %dirs[f.dir_idx].display(), "resuming a log dir move");
                        let stats = log.stats();
                        futures
                            .insert(f.key, FutureEntry { dir_idx: f.dir_idx, log: Arc::new(Mutex::new(log)), stats });
                    }
                    // The current log is intact: the move is dropped, the operator may ask again.
                    Err(e) => tracing::error!(dir = %f.path.display(), error = %e, "could not load a future log"),
                }
                continue;
            }
            if !all_online || failed.contains(&f.key) {
                tracing::warn!(dir = %f.path.display(), "future log without a loadable current log; leaving it alone");
                continue;
            }
            let target = dirs[f.dir_idx].join(&name);
            let promoted = fs::rename(&f.path, &target)
                .map_err(LogError::from)
                .and_then(|_| sync_dir(&dirs[f.dir_idx]))
                .and_then(|_| Log::open(target.clone(), config.clone(), f.recovery_point, f.log_start_offset, f.clean));
            match promoted {
                Ok(log) => {
                    tracing::warn!(partition = %name, dir = %dirs[f.dir_idx].display(), "completed a log dir move interrupted by a stop");
                    logs.insert(f.key, Entry { dir_idx: f.dir_idx, log: Arc::new(Mutex::new(log)) });
                }
                Err(e) => {
                    tracing::error!(dir = %f.path.display(), error = %e, "could not complete an interrupted log dir move")
                }
            }
        }
        futures
    }

    fn load_dir(
        idx: usize,
        dir: &Path,
        config: &LogConfig,
        logs: &mut HashMap<Key, Entry>,
        failed: &mut HashSet<Key>,
        found: &mut Vec<FoundFuture>,
    ) -> Result<(), LogError> {
        fs::create_dir_all(dir)?;
        let marker = dir.join(CLEAN_SHUTDOWN_FILE);
        let clean = marker.exists();
        let recovery_points = read_offset_checkpoint(&dir.join(RECOVERY_POINT_CHECKPOINT)).unwrap_or_else(|e| {
            tracing::warn!(dir = %dir.display(), error = %e, "unreadable recovery point checkpoint; recovering every log in full");
            HashMap::new()
        });
        let start_offsets = read_offset_checkpoint(&dir.join(LOG_START_OFFSET_CHECKPOINT)).unwrap_or_else(|e| {
            tracing::warn!(dir = %dir.display(), error = %e, "unreadable log start offset checkpoint");
            HashMap::new()
        });
        let mut loaded = 0usize;
        let mut recovered = Vec::new();
        for entry in fs::read_dir(dir)? {
            let entry = entry?;
            if !entry.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                continue;
            }
            let name = match entry.file_name().into_string() {
                Ok(n) => n,
                Err(_) => continue,
            };
            if name.ends_with("-delete") {
                // A topic deletion that did not finish before a stop.
                if let Err(e) = fs::remove_dir_all(entry.path()) {
                    tracing::warn!(dir = %entry.path().display(), error = %e, "could not remove deleted log");
                }
                continue;
            }
            if let Some(key) = parse_future_dir_name(&name) {
                found.push(FoundFuture {
                    recovery_point: recovery_points.get(&key).copied().unwrap_or(0),
                    log_start_offset: start_offsets.get(&key).copied().unwrap_or(0),
                    key,
                    dir_idx: idx,
                    path: entry.path(),
                    clean,
                });
                continue;
            }
            let key = match parse_partition_dir_name(&name) {
                Some(k) if validate_topic_name(&k.0).is_ok() => k,
                _ => continue,
            };
            if logs.contains_key(&key) {
                tracing::error!(partition = %name, dir = %dir.display(), "partition exists in two log dirs; ignoring this copy");
                continue;
            }
            // Kafka's default when a log is missing from the checkpoint.
            let rp = recovery_points.get(&key).copied().unwrap_or(0);
            let lso = start_offsets.get(&key).copied().unwrap_or(0);
            match Log::open_deferring_sync(entry.path(), config.clone(), rp, lso, clean) {
                Ok((log, owes_sync)) => {
                    if owes_sync {
                        recovered.push(key.clone());
                    }
                    logs.insert(key, Entry { dir_idx: idx, log: Arc::new(Mutex::new(log)) });
                    loaded += 1;
                }
                Err(e) => {
                    tracing::error!(partition = %name, dir = %dir.display(), error = %e, "could not load log");
                    failed.insert(key);
                }
            }
        }
        Self::sync_recovered(dir, &recovered, logs, failed);
        if clean {
            fs::remove_file(&marker)?;
        }
        tracing::info!(dir = %dir.display(), logs = loaded, recovered = recovered.len(), clean_shutdown = clean, "loaded log dir");
        Ok(())
    }

    /// Makes what recovery wrote in `dir` durable before any of it is served or checkpointed:
    /// one syncfs for the dir, or (if that fails) an fsync of each recovered log's segments,
    /// a log that cannot be synced failing to load like one that cannot be read.
    fn sync_recovered(dir: &Path, recovered: &[Key], logs: &mut HashMap<Key, Entry>, failed: &mut HashSet<Key>) {
        if recovered.is_empty() {
            return;
        }
        let Err(e) = sync_file_system(dir) else { return };
        tracing::warn!(dir = %dir.display(), error = %e, "could not sync the log dir after recovery; syncing each recovered log");
        for key in recovered {
            let synced = logs.get(key).map(|e| lock_log(&e.log).sync_all_segments());
            if let Some(Err(e)) = synced {
                tracing::error!(topic = %key.0, partition = key.1, error = %e, "could not sync recovered log");
                logs.remove(key);
                failed.insert(key.clone());
            }
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock_unpoisoned()
    }

    pub fn dirs(&self) -> &[PathBuf] {
        &self.dirs
    }
    pub fn is_online(&self, dir_idx: usize) -> bool {
        !self.failures.is_offline(dir_idx)
    }
    pub fn default_config(&self) -> &LogConfig {
        &self.default_config
    }

    pub fn get(&self, topic: &str, partition: i32) -> Option<Arc<Mutex<Log>>> {
        self.state().logs.get(&(topic.to_string(), partition)).map(|e| e.log.clone())
    }

    /// Returns the log, creating it in the online dir with the fewest
    /// partitions if it does not exist. An existing log keeps its config
    /// (use `Log::set_config`).
    pub fn get_or_create(&self, topic: &str, partition: i32, config: LogConfig) -> Result<Arc<Mutex<Log>>, LogError> {
        validate_topic_name(topic)?;
        if partition < 0 {
            return Err(LogError::InvalidTopic(format!("{topic} partition {partition}")));
        }
        let key = (topic.to_string(), partition);
        let mut st = self.state();
        loop {
            if let Some(e) = st.logs.get(&key) {
                return Ok(e.log.clone());
            }
            if st.failed.contains(&key) {
                return Err(LogError::StorageUnavailable(format!(
                    "{topic}-{partition} is in an offline log dir or failed to load"
                )));
            }
            if !st.creating.contains_key(&key) {
                break;
            }
            st = self.created.wait(st).unwrap_or_else(std::sync::PoisonError::into_inner);
        }
        let mut counts = vec![0usize; self.dirs.len()];
        for i in st.logs.values().map(|e| e.dir_idx).chain(st.creating.values().copied()) {
            counts[i] += 1;
        }
        let preferred = st.preferred.remove(&key).filter(|&i| self.is_online(i));
        let idx = preferred
            .or_else(|| (0..self.dirs.len()).filter(|&i| self.is_online(i)).min_by_key(|&i| (counts[i], i)))
            .ok_or_else(|| LogError::StorageUnavailable("no online log dir".into()))?;
        st.creating.insert(key.clone(), idx);
        drop(st);
        // Created without the manager's lock: a broker told of a hundred new partitions
        // creates their logs side by side, and nothing else waits for the disk meanwhile.
        let path = self.dirs[idx].join(partition_dir_name(topic, partition));
        // A fresh directory has nothing to recover; an existing one (not
        // loaded at startup) gets a full check.
        let opened = Log::open(path, config, 0, 0, false).map(|mut log| {
            log.set_dir_health(self.health(idx));
            Arc::new(Mutex::new(log))
        });
        let mut st = self.state();
        st.creating.remove(&key);
        self.created.notify_all();
        match opened {
            Ok(log) => {
                st.logs.insert(key, Entry { dir_idx: idx, log: log.clone() });
                Ok(log)
            }
            Err(e) => {
                drop(st);
                if let LogError::Io(io) = &e {
                    if super::dir_failure::is_disk_failure(io) {
                        self.failures.report(idx, &io);
                    }
                }
                Err(e)
            }
        }
    }

    /// Removes the partition and its directory. Other holders of the
    /// `Arc<Mutex<Log>>` get `StorageUnavailable` from then on.
    pub fn delete_log(&self, topic: &str, partition: i32) -> Result<(), LogError> {
        let key = (topic.to_string(), partition);
        // The future copy goes first: one left behind without its current log would be taken
        // for an interrupted swap at the next start.
        self.remove_future(&key)?;
        let entry = {
            let mut st = self.state();
            st.failed.remove(&key);
            st.logs.remove(&key)
        };
        match entry {
            Some(e) => lock_log(&e.log).delete_in_place(),
            None => {
                if validate_topic_name(topic).is_err() {
                    return Ok(());
                }
                for (i, d) in self.dirs.iter().enumerate() {
                    let p = d.join(partition_dir_name(topic, partition));
                    if self.is_online(i) && p.is_dir() {
                        fs::remove_dir_all(&p)?;
                    }
                }
                Ok(())
            }
        }
    }

    /// Each log dir with whether it is online and the partitions placed in it (what
    /// DescribeLogDirs reports), read without touching any log's lock.
    pub fn placement(&self) -> Vec<(&Path, bool, Vec<Key>)> {
        let st = self.state();
        let mut out: Vec<(&Path, bool, Vec<Key>)> =
            self.dirs.iter().enumerate().map(|(i, d)| (d.as_path(), self.is_online(i), Vec::new())).collect();
        for (k, e) in &st.logs {
            if let Some(slot) = out.get_mut(e.dir_idx) {
                slot.2.push(k.clone());
            }
        }
        for slot in &mut out {
            slot.2.sort();
        }
        out
    }

    /// The log dir index of each partition moving there, with its future log's statistics.
    pub fn future_placement(&self) -> Vec<(usize, Key, Arc<LogStats>)> {
        let st = self.state();
        let mut out: Vec<_> = st.futures.iter().map(|(k, f)| (f.dir_idx, k.clone(), f.stats.clone())).collect();
        out.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
        out
    }

    /// The partitions with a log dir move in progress.
    pub fn moving(&self) -> Vec<Key> {
        self.state().futures.keys().cloned().collect()
    }

    pub fn is_moving(&self, key: &Key) -> bool {
        self.state().futures.contains_key(key)
    }

    /// The log dir index of a partition's current log and of its future log, if any.
    pub fn dirs_of(&self, key: &Key) -> (Option<usize>, Option<usize>) {
        let st = self.state();
        (st.logs.get(key).map(|e| e.dir_idx), st.futures.get(key).map(|f| f.dir_idx))
    }

    /// The current and the future log of a partition being moved.
    pub fn current_and_future(&self, key: &Key) -> Option<(SharedLog, SharedLog)> {
        let st = self.state();
        Some((st.logs.get(key)?.log.clone(), st.futures.get(key)?.log.clone()))
    }

    /// Remembers where a partition not hosted yet is to be created.
    pub fn set_preferred_dir(&self, key: Key, dir_idx: usize) {
        self.state().preferred.insert(key, dir_idx);
    }

    /// Starts a move of a partition's log to `dir_idx`: creates its empty future log there,
    /// starting at the current log's start, with the topic id of the current one. Returns
    /// false if that move is already in progress. The directory is created without the
    /// manager's lock.
    pub fn create_future(&self, key: &Key, dir_idx: usize) -> Result<bool, LogError> {
        let current = {
            let st = self.state();
            if let Some(f) = st.futures.get(key) {
                if f.dir_idx == dir_idx {
                    return Ok(false);
                }
                return Err(LogError::StorageUnavailable(format!("{}-{} is moving to another log dir", key.0, key.1)));
            }
            st.logs.get(key).map(|e| e.log.clone())
        };
        let current = current.ok_or_else(|| LogError::StorageUnavailable(format!("no log for {}-{}", key.0, key.1)))?;
        if !self.is_online(dir_idx) {
            return Err(LogError::StorageUnavailable(format!("log dir {} is offline", self.dirs[dir_idx].display())));
        }
        let (config, start, current_dir) = {
            let g = lock_log(&current);
            (g.config().clone(), g.log_start_offset(), g.dir().to_path_buf())
        };
        let path = self.dirs[dir_idx].join(future_dir_name(&key.0, key.1));
        let mut log = Log::open(path.clone(), config, 0, start, false)?;
        log.set_dir_health(self.health(dir_idx));
        if let Ok(Some(id)) = super::read_partition_metadata(&current_dir) {
            super::write_partition_metadata(&path, &id)?;
        }
        sync_dir(&self.dirs[dir_idx])?;
        let stats = log.stats();
        let log = Arc::new(Mutex::new(log));
        let raced = {
            let mut st = self.state();
            if st.futures.contains_key(key) || !st.logs.contains_key(key) {
                true
            } else {
                st.futures.insert(key.clone(), FutureEntry { dir_idx, log: log.clone(), stats });
                false
            }
        };
        if raced {
            lock_log(&log).delete_in_place()?;
            return Ok(false);
        }
        tracing::info!(topic = %key.0, partition = key.1, dir = %self.dirs[dir_idx].display(), "log dir move started");
        Ok(true)
    }

    /// Abandons a partition's move and deletes its future log (the current log is untouched).
    pub fn remove_future(&self, key: &Key) -> Result<(), LogError> {
        self.remove_future_matching(key, None)
    }

    /// Like `remove_future`, only if the move in progress is still the one whose future log
    /// is `which` (a failed copy step must not drop a move the operator started since).
    pub fn remove_future_if(&self, key: &Key, which: &SharedLog) -> Result<(), LogError> {
        self.remove_future_matching(key, Some(which))
    }

    fn remove_future_matching(&self, key: &Key, which: Option<&SharedLog>) -> Result<(), LogError> {
        let removed = {
            let mut st = self.state();
            match (st.futures.get(key), which) {
                (Some(f), Some(w)) if !Arc::ptr_eq(&f.log, w) => None,
                _ => st.futures.remove(key),
            }
        };
        match removed {
            Some(f) => {
                tracing::info!(topic = %key.0, partition = key.1, dir = %self.dirs[f.dir_idx].display(), "log dir move dropped");
                lock_log(&f.log).delete_in_place()
            }
            None => Ok(()),
        }
    }

    /// Swaps a caught-up future log in for the current one, Kafka's
    /// `replaceCurrentWithFutureLog`. Under the current log's lock (so no append can slip in)
    /// and then the future's: check both end at the same offset, bring the future's start up
    /// to the current's, fsync the future, rename the current directory `-delete`, rename the
    /// future to the partition's name, and swap the two logs inside their locks, so every
    /// holder of the partition's log handle writes to the new directory from then on. Only
    /// renames and the fsync of what was appended since the caller's last flush happen under
    /// the locks.
    pub fn replace_current_with_future(&self, key: &Key) -> Result<SwapOutcome, LogError> {
        let (current, future, dest_idx) = {
            let st = self.state();
            match (st.logs.get(key), st.futures.get(key)) {
                (Some(c), Some(f)) => (c.log.clone(), f.log.clone(), f.dir_idx),
                _ => return Ok(SwapOutcome::NoMove),
            }
        };
        let mut cur = lock_log(&current);
        let mut fut = lock_log(&future);
        if cur.truncation_mark().is_some()
            || fut.log_end_offset() != cur.log_end_offset()
            || fut.log_start_offset() > cur.log_start_offset()
        {
            return Ok(SwapOutcome::NotCaughtUp);
        }
        if fut.log_start_offset() < cur.log_start_offset() {
            fut.delete_records_before(cur.log_start_offset())?;
        }
        fut.flush()?;
        let name = partition_dir_name(&key.0, key.1);
        let old_dir = cur.dir().to_path_buf();
        let old_parent = old_dir.parent().map(Path::to_path_buf).unwrap_or_default();
        let doomed = old_dir.with_file_name(format!("{name}.{}-delete", uuid::Uuid::new_v4().simple()));
        let new_dir = self.dirs[dest_idx].join(&name);
        fs::rename(&old_dir, &doomed)?;
        let moved = sync_dir(&old_parent)
            .and_then(|_| fs::rename(fut.dir(), &new_dir).map_err(LogError::from))
            .and_then(|_| sync_dir(&self.dirs[dest_idx]));
        if let Err(e) = moved {
            // Put the current log back where it was; the move can be tried again.
            if !new_dir.exists() {
                if let Err(e2) = fs::rename(&doomed, &old_dir) {
                    tracing::error!(dir = %doomed.display(), error = %e2, "could not restore a log after a failed move");
                }
            }
            return Err(e);
        }
        fut.moved_to(new_dir.clone());
        fut.adopt_shared_state(&cur);
        std::mem::swap(&mut *cur, &mut *fut);
        fut.forget_moved_away();
        {
            // The map follows under both log locks, so that no checkpoint lists the partition
            // in the dir it left.
            let mut st = self.state();
            st.futures.remove(key);
            if let Some(e) = st.logs.get_mut(key) {
                e.dir_idx = dest_idx;
            }
        }
        drop(fut);
        drop(cur);
        tracing::info!(topic = %key.0, partition = key.1, dir = %self.dirs[dest_idx].display(), "log dir move completed");
        Ok(SwapOutcome::Swapped { old_dir: doomed, new_dir })
    }

    /// A checkpoint the disk refused takes its dir offline, as a log's I/O error does.
    fn report_io(&self, dir_idx: usize, e: &LogError) {
        if let LogError::Io(io) = e {
            if !super::dir_failure::is_disk_failure(io) {
                return;
            }
            self.failures.report(dir_idx, &format_args!("{}: {io}", self.dirs[dir_idx].display()));
        }
    }

    pub fn all(&self) -> Vec<(Key, Arc<Mutex<Log>>)> {
        self.state().logs.iter().map(|(k, e)| (k.clone(), e.log.clone())).collect()
    }

    fn futures_with_dir(&self) -> Vec<(Key, usize, Arc<Mutex<Log>>)> {
        self.state().futures.iter().map(|(k, f)| (k.clone(), f.dir_idx, f.log.clone())).collect()
    }

    /// Every log with the index (in `dirs()`) of the log dir holding it.
    pub fn all_with_dir(&self) -> Vec<(Key, usize, Arc<Mutex<Log>>)> {
        self.state().logs.iter().map(|(k, e)| (k.clone(), e.dir_idx, e.log.clone())).collect()
    }

    /// Writes `recovery-point-offset-checkpoint` and
    /// `log-start-offset-checkpoint` in every online dir. Like Kafka, the
    /// latter lists only logs whose start is above their first segment.
    pub fn checkpoint(&self) -> Result<(), LogError> {
        let mut rps: Vec<Vec<(Key, i64)>> = vec![Vec::new(); self.dirs.len()];
        let mut lsos: Vec<Vec<(Key, i64)>> = vec![Vec::new(); self.dirs.len()];
        for (k, i, l) in self.all_with_dir().into_iter().chain(self.futures_with_dir()) {
            let log = lock_log(&l);
            rps[i].push((k.clone(), log.recovery_point()));
            if log.log_start_offset() > log.first_segment_base() {
                lsos[i].push((k, log.log_start_offset()));
            }
        }
        let mut first_err = None;
        for (i, d) in self.dirs.iter().enumerate() {
            if !self.is_online(i) {
                continue;
            }
            let r = write_offset_checkpoint(&d.join(RECOVERY_POINT_CHECKPOINT), &rps[i])
                .and_then(|_| write_offset_checkpoint(&d.join(LOG_START_OFFSET_CHECKPOINT), &lsos[i]));
            if let Err(e) = r {
                tracing::error!(dir = %d.display(), error = %e, "could not write checkpoints");
                self.report_io(i, &e);
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Writes `replication-offset-checkpoint` (high watermarks) in every
    /// online dir, each listing the given partitions that live there.
    pub fn write_high_watermarks(&self, hw: &[(Key, i64)]) -> Result<(), LogError> {
        let dir_of: HashMap<Key, usize> = self.state().logs.iter().map(|(k, e)| (k.clone(), e.dir_idx)).collect();
        let mut per_dir: Vec<Vec<(Key, i64)>> = vec![Vec::new(); self.dirs.len()];
        for (k, o) in hw {
            if let Some(&i) = dir_of.get(k) {
                per_dir[i].push((k.clone(), *o));
            }
        }
        let mut first_err = None;
        for (i, d) in self.dirs.iter().enumerate() {
            if !self.is_online(i) {
                continue;
            }
            if let Err(e) = write_offset_checkpoint(&d.join(REPLICATION_OFFSET_CHECKPOINT), &per_dir[i]) {
                tracing::error!(dir = %d.display(), error = %e, "could not write high watermarks");
                self.report_io(i, &e);
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// High watermarks from every online dir (unreadable files are logged
    /// and skipped).
    pub fn read_high_watermarks(&self) -> HashMap<Key, i64> {
        let mut out = HashMap::new();
        for (i, d) in self.dirs.iter().enumerate() {
            if !self.is_online(i) {
                continue;
            }
            match read_offset_checkpoint(&d.join(REPLICATION_OFFSET_CHECKPOINT)) {
                Ok(m) => out.extend(m),
                Err(e) => {
                    tracing::warn!(dir = %d.display(), error = %e, "unreadable high watermark checkpoint")
                }
            }
        }
        out
    }

    /// Applies retention to every log; errors are logged per log. Returns the logs whose
    /// start moved.
    pub fn run_retention(&self, now_ms: i64) -> Vec<Key> {
        let mut moved = Vec::new();
        for (k, l) in self.all() {
            match lock_log(&l).enforce_retention(now_ms) {
                Ok(0) => {}
                Ok(_) => moved.push(k),
                Err(e) => tracing::error!(topic = %k.0, partition = k.1, error = %e, "retention failed"),
            }
        }
        moved
    }

    /// Applies flush.messages / flush.ms to every log; errors are logged.
    pub fn run_flush(&self, now_ms: i64) {
        for (k, l) in self.all() {
            if let Err(e) = lock_log(&l).maybe_flush(now_ms) {
                tracing::error!(topic = %k.0, partition = k.1, error = %e, "flush failed");
            }
        }
    }

    /// Flushes and closes every log, writes the checkpoints, then marks each
    /// dir whose logs all closed cleanly with `.kafka_cleanshutdown`.
    pub fn shutdown(&self) -> Result<(), LogError> {
        let mut dirty = vec![false; self.dirs.len()];
        let mut first_err = None;
        let logs: Vec<_> = self.all_with_dir().into_iter().chain(self.futures_with_dir()).collect();
        let mut closed = vec![false; logs.len()];
        for ((k, i, l), closed) in logs.iter().zip(closed.iter_mut()) {
            match lock_log(l).close_unsynced() {
                Ok(()) => *closed = true,
                Err(e) => {
                    tracing::error!(topic = %k.0, partition = k.1, error = %e, "could not close log");
                    dirty[*i] = true;
                    first_err.get_or_insert(e);
                }
            }
        }
        // One syncfs per dir rather than fsyncs of every partition's files, one after another.
        let mut synced = vec![false; self.dirs.len()];
        for (i, d) in self.dirs.iter().enumerate() {
            if !self.is_online(i) || dirty[i] {
                continue;
            }
            match sync_file_system(d) {
                Ok(()) => synced[i] = true,
                Err(e) => {
                    tracing::warn!(dir = %d.display(), error = %e, "could not sync the log dir; syncing each log")
                }
            }
        }
        for ((k, i, l), _) in logs.iter().zip(&closed).filter(|(_, closed)| **closed) {
            let mut log = lock_log(l);
            if synced[*i] {
                log.mark_synced();
            } else if let Err(e) = log.close() {
                tracing::error!(topic = %k.0, partition = k.1, error = %e, "could not close log");
                dirty[*i] = true;
                first_err.get_or_insert(e);
            }
        }
        if let Err(e) = self.checkpoint() {
            dirty.iter_mut().for_each(|d| *d = true);
            first_err.get_or_insert(e);
        }
        for (i, d) in self.dirs.iter().enumerate() {
            if !self.is_online(i) || dirty[i] {
                continue;
            }
            if let Err(e) = write_atomic(&d.join(CLEAN_SHUTDOWN_FILE), b"{\"version\":0,\"brokerEpoch\":-1}") {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }
}

#[cfg(test)]
mod tests;
