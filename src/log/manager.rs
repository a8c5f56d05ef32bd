//! `LogManager`: owns the `log.dirs`, loads every partition at startup,
//! places new partitions, and writes the per-dir checkpoint files.
//!
//! Startup per dir: read `recovery-point-offset-checkpoint` and
//! `log-start-offset-checkpoint`; if `.kafka_cleanshutdown` exists the dir
//! shut down cleanly, so its logs are trusted (the marker is removed once
//! they are loaded, so a crash from now on is seen as unclean). A dir that
//! cannot be read is logged and left offline; a partition that fails to
//! load is logged and refused (never silently recreated elsewhere).
//! Locking: the manager's map lock is never held while waiting on a log
//! lock except in `delete_log`, and log locks are only taken one at a time.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use super::checkpoint::{
    read_offset_checkpoint, write_atomic, write_offset_checkpoint, CLEAN_SHUTDOWN_FILE, LOG_START_OFFSET_CHECKPOINT,
    RECOVERY_POINT_CHECKPOINT, REPLICATION_OFFSET_CHECKPOINT,
};
use super::partition_log::Log;
use super::{parse_partition_dir_name, partition_dir_name, validate_topic_name, LogConfig, LogError};

type Key = (String, i32);

struct Entry {
    dir_idx: usize,
    log: Arc<Mutex<Log>>,
}

struct State {
    logs: HashMap<Key, Entry>,
    /// Partitions whose directory exists but failed to load.
    failed: HashSet<Key>,
}

pub struct LogManager {
    dirs: Vec<PathBuf>,
    online: Vec<bool>,
    default_config: LogConfig,
    state: Mutex<State>,
}

fn lock_log(l: &Mutex<Log>) -> MutexGuard<'_, Log> {
    // A panic while holding a log lock is a bug, but the data on disk is
    // still consistent up to the log's in-memory size, so keep serving.
    l.lock().unwrap_or_else(|e| e.into_inner())
}

impl LogManager {
    pub fn open(dirs: Vec<PathBuf>, default_config: LogConfig) -> Result<LogManager, LogError> {
        let mut online = vec![false; dirs.len()];
        let mut logs: HashMap<Key, Entry> = HashMap::new();
        let mut failed = HashSet::new();
        for (i, dir) in dirs.iter().enumerate() {
            match Self::load_dir(i, dir, &default_config, &mut logs, &mut failed) {
                Ok(()) => online[i] = true,
                Err(e) => {
                    tracing::error!(dir = %dir.display(), error = %e, "log dir is unusable; leaving it offline")
                }
            }
        }
        if !dirs.is_empty() && !online.iter().any(|&o| o) {
            tracing::error!("no log dir is usable");
        }
        Ok(LogManager { dirs, online, default_config, state: Mutex::new(State { logs, failed }) })
    }

    fn load_dir(
        idx: usize,
        dir: &Path,
        config: &LogConfig,
        logs: &mut HashMap<Key, Entry>,
        failed: &mut HashSet<Key>,
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
            match Log::open(entry.path(), config.clone(), rp, lso, clean) {
                Ok(log) => {
                    logs.insert(key, Entry { dir_idx: idx, log: Arc::new(Mutex::new(log)) });
                    loaded += 1;
                }
                Err(e) => {
                    tracing::error!(partition = %name, dir = %dir.display(), error = %e, "could not load log");
                    failed.insert(key);
                }
            }
        }
        if clean {
            fs::remove_file(&marker)?;
        }
        tracing::info!(dir = %dir.display(), logs = loaded, clean_shutdown = clean, "loaded log dir");
        Ok(())
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn dirs(&self) -> &[PathBuf] {
        &self.dirs
    }
    pub fn is_online(&self, dir_idx: usize) -> bool {
        self.online.get(dir_idx).copied().unwrap_or(false)
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
        if let Some(e) = st.logs.get(&key) {
            return Ok(e.log.clone());
        }
        if st.failed.contains(&key) {
            return Err(LogError::StorageUnavailable(format!("{topic}-{partition} failed to load at startup")));
        }
        let mut counts = vec![0usize; self.dirs.len()];
        for e in st.logs.values() {
            counts[e.dir_idx] += 1;
        }
        let idx = (0..self.dirs.len())
            .filter(|&i| self.online[i])
            .min_by_key(|&i| (counts[i], i))
            .ok_or_else(|| LogError::StorageUnavailable("no online log dir".into()))?;
        let path = self.dirs[idx].join(partition_dir_name(topic, partition));
        // A fresh directory has nothing to recover; an existing one (not
        // loaded at startup) gets a full check.
        let log = Log::open(path, config, 0, 0, false)?;
        let log = Arc::new(Mutex::new(log));
        st.logs.insert(key, Entry { dir_idx: idx, log: log.clone() });
        Ok(log)
    }

    /// Removes the partition and its directory. Other holders of the
    /// `Arc<Mutex<Log>>` get `StorageUnavailable` from then on.
    pub fn delete_log(&self, topic: &str, partition: i32) -> Result<(), LogError> {
        let key = (topic.to_string(), partition);
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
                    if self.online[i] && p.is_dir() {
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
            self.dirs.iter().zip(&self.online).map(|(d, &on)| (d.as_path(), on, Vec::new())).collect();
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

    pub fn all(&self) -> Vec<(Key, Arc<Mutex<Log>>)> {
        self.state().logs.iter().map(|(k, e)| (k.clone(), e.log.clone())).collect()
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
        for (k, i, l) in self.all_with_dir() {
            let log = lock_log(&l);
            rps[i].push((k.clone(), log.recovery_point()));
            if log.log_start_offset() > log.first_segment_base() {
                lsos[i].push((k, log.log_start_offset()));
            }
        }
        let mut first_err = None;
        for (i, d) in self.dirs.iter().enumerate() {
            if !self.online[i] {
                continue;
            }
            let r = write_offset_checkpoint(&d.join(RECOVERY_POINT_CHECKPOINT), &rps[i])
                .and_then(|_| write_offset_checkpoint(&d.join(LOG_START_OFFSET_CHECKPOINT), &lsos[i]));
            if let Err(e) = r {
                tracing::error!(dir = %d.display(), error = %e, "could not write checkpoints");
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
            if !self.online[i] {
                continue;
            }
            if let Err(e) = write_offset_checkpoint(&d.join(REPLICATION_OFFSET_CHECKPOINT), &per_dir[i]) {
                tracing::error!(dir = %d.display(), error = %e, "could not write high watermarks");
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
            if !self.online[i] {
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

    /// Applies retention to every log; errors are logged per log.
    pub fn run_retention(&self, now_ms: i64) {
        for (k, l) in self.all() {
            if let Err(e) = lock_log(&l).enforce_retention(now_ms) {
                tracing::error!(topic = %k.0, partition = k.1, error = %e, "retention failed");
            }
        }
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
        for (k, i, l) in self.all_with_dir() {
            if let Err(e) = lock_log(&l).close() {
                tracing::error!(topic = %k.0, partition = k.1, error = %e, "could not close log");
                dirty[i] = true;
                first_err.get_or_insert(e);
            }
        }
        if let Err(e) = self.checkpoint() {
            dirty.iter_mut().for_each(|d| *d = true);
            first_err.get_or_insert(e);
        }
        for (i, d) in self.dirs.iter().enumerate() {
            if !self.online[i] || dirty[i] {
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
mod tests {
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
}
