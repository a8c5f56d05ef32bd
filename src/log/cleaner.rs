//! The log cleaner: compaction of `cleanup.policy=compact` logs, as Kafka's LogCleaner does it.
//!
//! Each pass over one log (the "filthiest": the highest dirty ratio at or above
//! `min.cleanable.dirty.ratio`, a log whose dirty records are older than
//! `max.compaction.lag.ms`, or one whose tombstones' delete horizon has passed):
//! 1. builds an offset map, key hash -> latest offset, over the dirty section (from the
//!    `cleaner-offset-checkpoint` offset up to the first uncleanable offset: the active
//!    segment, the first segment younger than `min.compaction.lag.ms`, or the segment holding
//!    the high watermark, whichever comes first), stopping early if
//!    the map is full (`log.cleaner.dedupe.buffer.size`, 24 bytes an entry as Kafka counts);
//! 2. rewrites every segment below the map's end, in groups of consecutive segments that fit
//!    one segment, keeping a record only if no later record has its key; offsets and batch
//!    boundaries stay (base offset, last offset delta, producer id/epoch/base sequence), so
//!    gaps appear and nothing is renumbered; a batch emptied entirely is kept, as an empty
//!    batch, only if it is its producer's last (idempotent producers key their state on it);
//! 3. stamps a delete horizon (now + `delete.retention.ms`, attribute bit 6 and the base
//!    timestamp, KIP-534) on each batch where it keeps tombstones for the first time, and
//!    drops tombstones whose horizon has passed;
//! 4. swaps each cleaned group in with [`Log::replace_segments`] (`.cleaned` -> `.swap` -> live
//!    name), then records the map's end in `cleaner-offset-checkpoint`.
//!
//! All reading, filtering, compressing and writing happens without the log's lock; the lock
//! is taken to snapshot the segment list and for the renames of the swap. A batch that fails
//! its CRC or cannot be parsed marks the partition uncleanable (one log line; the broker and
//! the other logs go on). An I/O error (a full disk) abandons the pass, removes the partial
//! files and backs off.
//!
//! Transactions, as Kafka's cleaner treats them: nothing at or above the last stable offset
//! is cleaned, so records of open transactions stay; records of aborted transactions (known
//! from the `.txnindex` files) neither enter the offset map (an aborted write must not make a
//! committed older one obsolete) nor survive the rewrite; a COMMIT marker goes once no data of
//! its transaction remains before it, after a first pass stamped it with a delete horizon and
//! that horizon passed. ABORT markers are kept, with their `.txnindex` entries: the replica
//! layer's list of aborted transactions, which read_committed fetches are answered from, would
//! otherwise name transactions whose end a consumer can no longer find.

use std::collections::{HashMap, HashSet};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::batch::{
    self, BatchHeader, COMPRESSION_MASK, CRC_START, DELETE_HORIZON_BIT, HEADER_SIZE, LOG_OVERHEAD, OFF_BATCH_LENGTH,
    OFF_CRC,
};
use super::checkpoint::{read_offset_checkpoint, write_offset_checkpoint};
use super::partition_log::{CleanerView, SegmentView};
use super::segment::{HeaderScanner, LogSegment};
use super::{now_ms, Log, LogError, LogManager};
use crate::sync::MutexExt;

mod filter;

use filter::*;

/// Kafka's per-dir file: the first dirty offset of each compacted log.
pub const CLEANER_OFFSET_CHECKPOINT: &str = "cleaner-offset-checkpoint";
/// What Kafka's SkimpyOffsetMap spends per key: a 16-byte hash and an 8-byte offset.
const BYTES_PER_MAP_ENTRY: u64 = 24;

type Key = (String, i32);

/// The `log.cleaner.*` settings (Kafka's names and defaults).
#[derive(Clone, Debug, PartialEq)]
pub struct CleanerConfig {
    /// log.cleaner.enable
    pub enable: bool,
    /// log.cleaner.threads
    pub threads: usize,
    /// log.cleaner.dedupe.buffer.size: offset map memory over all threads.
    pub dedupe_buffer_size: u64,
    /// log.cleaner.io.buffer.size: read-ahead when scanning segments.
    pub io_buffer_size: usize,
    /// log.cleaner.io.buffer.load.factor: how full an offset map may get.
    pub io_buffer_load_factor: f64,
    /// log.cleaner.io.max.bytes.per.second: read plus write rate, over all threads.
    pub max_io_bytes_per_second: f64,
    /// log.cleaner.backoff.ms: sleep when no log needs cleaning.
    pub backoff_ms: u64,
    /// The most bytes one compressed batch may decompress to (socket.request.max.bytes: no
    /// batch a client could send is larger).
    pub decompress_limit: usize,
}

impl Default for CleanerConfig {
    fn default() -> Self {
        CleanerConfig {
            enable: true,
            threads: 1,
            dedupe_buffer_size: 128 << 20,
            io_buffer_size: 512 << 10,
            io_buffer_load_factor: 0.9,
            max_io_bytes_per_second: f64::MAX,
            backoff_ms: 15_000,
            decompress_limit: 100 << 20,
        }
    }
}

impl CleanerConfig {
    fn map_capacity(&self) -> usize {
        let per_thread = self.dedupe_buffer_size / self.threads.max(1) as u64;
        ((per_thread / BYTES_PER_MAP_ENTRY) as f64 * self.io_buffer_load_factor).max(1.0) as usize
    }
}

/// Test-only fault injection: with `GREGOR_TEST_CRASH_AT=<point>` the process kills itself
/// with SIGKILL (what kill -9 does) when it reaches that point, so tests can check crash
/// recovery at the exact step that matters.
pub fn crash_point(point: &str) {
    static AT: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    let at = AT.get_or_init(|| std::env::var("GREGOR_TEST_CRASH_AT").ok().filter(|v| !v.is_empty()));
    if at.as_deref() == Some(point) {
        tracing::warn!(point, "GREGOR_TEST_CRASH_AT reached; killing the process");
        // SAFETY: kill(2) on our own pid has no memory-safety preconditions.
        unsafe {
            libc::kill(libc::getpid(), libc::SIGKILL);
        }
    }
}

/// Figures for tests, metrics and the benchmark.
#[derive(Debug, Default)]
pub struct CleanerStats {
    pub passes: AtomicU64,
    pub bytes_read: AtomicU64,
    pub bytes_written: AtomicU64,
}

#[derive(Default)]
struct State {
    checkpoints: HashMap<Key, i64>,
    in_progress: HashSet<Key>,
    uncleanable: HashSet<Key>,
}

pub struct LogCleaner {
    manager: Arc<LogManager>,
    /// Replaced whole by [`LogCleaner::reconfigure`] (dynamic `log.cleaner.*` keys).
    config: Mutex<CleanerConfig>,
    /// Set by `shutdown`: no reconfiguration starts threads again.
    closed: AtomicBool,
    state: Mutex<State>,
    stop: AtomicBool,
    sleeping: Mutex<()>,
    wake: Condvar,
    threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
    pub stats: CleanerStats,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock_unpoisoned()
}

/// Why a pass ended without a swap.
#[derive(Debug)]
enum Abort {
    Stopped,
    /// The log changed under the cleaner (truncated, deleted): try again later.
    Changed,
    Failed(LogError),
}

impl From<LogError> for Abort {
    fn from(e: LogError) -> Self {
        Abort::Failed(e)
    }
}

/// A view's file, opened now: one gone since the view was taken was deleted or replaced, so
/// the log changed under the cleaner.
fn open_segment(s: &SegmentView) -> Result<std::sync::Arc<std::fs::File>, Abort> {
    s.file().map_err(|e| if e.kind() == std::io::ErrorKind::NotFound { Abort::Changed } else { e.into() })
}

impl From<std::io::Error> for Abort {
    fn from(e: std::io::Error) -> Self {
        Abort::Failed(LogError::Io(e))
    }
}

/// One candidate log and how dirty it is.
struct Candidate {
    key: Key,
    log: Arc<Mutex<Log>>,
    view: CleanerView,
    first_dirty: i64,
    first_uncleanable: i64,
    must_clean: bool,
    ratio: f64,
}

impl LogCleaner {
    /// Loads the checkpoints and, with `log.cleaner.enable`, starts `log.cleaner.threads`
    /// threads.
    pub fn start(manager: Arc<LogManager>, config: CleanerConfig) -> Arc<LogCleaner> {
        let mut checkpoints = HashMap::new();
        for (i, d) in manager.dirs().iter().enumerate() {
            if !manager.is_online(i) {
                continue;
            }
            match read_offset_checkpoint(&d.join(CLEANER_OFFSET_CHECKPOINT)) {
                Ok(m) => checkpoints.extend(m),
                Err(e) => tracing::warn!(dir = %d.display(), error = %e, "unreadable cleaner offset checkpoint"),
            }
        }
        let cleaner = Arc::new(LogCleaner {
            manager,
            config: Mutex::new(config),
            closed: AtomicBool::new(false),
            state: Mutex::new(State { checkpoints, ..State::default() }),
            stop: AtomicBool::new(false),
            sleeping: Mutex::new(()),
            wake: Condvar::new(),
            threads: Mutex::new(Vec::new()),
            stats: CleanerStats::default(),
        });
        cleaner.start_threads();
        cleaner
    }

    fn cfg(&self) -> CleanerConfig {
        lock(&self.config).clone()
    }

    fn start_threads(self: &Arc<Self>) {
        let config = self.cfg();
        if !config.enable {
            return;
        }
        let mut threads = lock(&self.threads);
        for i in 0..config.threads {
            let c = self.clone();
            let spawned =
                std::thread::Builder::new().name(format!("kafka-log-cleaner-thread-{i}")).spawn(move || c.run());
            match spawned {
                Ok(h) => threads.push(h),
                Err(e) => tracing::error!(error = %e, "cannot start a log cleaner thread"),
            }
        }
    }

    /// Applies new `log.cleaner.*` values as Kafka's LogCleaner.reconfigure does: the threads
    /// stop (passes in flight are abandoned, their files removed) and start again with the new
    /// values. Blocking: it waits for the threads to stop.
    pub fn reconfigure(self: &Arc<Self>, config: CleanerConfig) {
        if *lock(&self.config) == config || self.closed.load(Ordering::SeqCst) {
            return;
        }
        self.stop_threads();
        *lock(&self.config) = config;
        if self.closed.load(Ordering::SeqCst) {
            return;
        }
        self.stop.store(false, Ordering::SeqCst);
        self.start_threads();
        tracing::info!(threads = self.cfg().threads, "log cleaner reconfigured");
    }

    /// Stops the threads, abandoning passes in flight (their `.cleaned` files are removed).
    pub fn shutdown(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.stop_threads();
    }

    fn stop_threads(&self) {
        self.stop.store(true, Ordering::SeqCst);
        {
            let _g = lock(&self.sleeping);
            self.wake.notify_all();
        }
        let threads: Vec<_> = lock(&self.threads).drain(..).collect();
        for t in threads {
            let _ = t.join();
        }
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    fn run(self: Arc<Self>) {
        while !self.stopped() {
            let cleaned = self.clean_filthiest(now_ms());
            if cleaned || self.stopped() {
                continue;
            }
            let g = lock(&self.sleeping);
            let _ = self.wake.wait_timeout(g, Duration::from_millis(self.cfg().backoff_ms));
        }
    }

    /// Cleans the log that needs it most. Returns whether a pass completed.
    pub fn clean_filthiest(&self, now: i64) -> bool {
        let Some(c) = self.grab_filthiest(now) else {
            return false;
        };
        let key = c.key.clone();
        let result = self.clean(&c, now);
        let mut st = lock(&self.state);
        st.in_progress.remove(&key);
        match result {
            Ok(end) => {
                st.checkpoints.insert(key.clone(), end);
                drop(st);
                self.stats.passes.fetch_add(1, Ordering::Relaxed);
                if let Err(e) = self.write_checkpoints() {
                    tracing::error!(error = %e, "could not write cleaner offset checkpoints");
                }
                true
            }
            Err(Abort::Stopped) | Err(Abort::Changed) => false,
            Err(Abort::Failed(LogError::Io(e))) => {
                tracing::error!(topic = %key.0, partition = key.1, error = %e, "log cleaning failed; backing off");
                false
            }
            Err(Abort::Failed(e)) => {
                tracing::error!(topic = %key.0, partition = key.1, error = %e, "log cannot be cleaned; marking it uncleanable");
                st.uncleanable.insert(key);
                false
            }
        }
    }

    /// Partitions that met a corrupt batch and are no longer cleaned.
    pub fn uncleanable(&self) -> Vec<Key> {
        lock(&self.state).uncleanable.iter().cloned().collect()
    }

    fn grab_filthiest(&self, now: i64) -> Option<Candidate> {
        let mut best: Option<Candidate> = None;
        for (key, log) in self.manager.all() {
            {
                let st = lock(&self.state);
                if st.in_progress.contains(&key) || st.uncleanable.contains(&key) {
                    continue;
                }
            }
            // As Kafka pauses cleaning during a log dir move: the swap would leave a pass's
            // cleaned segment in the directory being deleted.
            if self.manager.is_moving(&key) {
                continue;
            }
            // Every log is looked at each pass: one that is not compacted costs a flag check,
            // not a view of its segments.
            let view = {
                let l = lock(&log);
                if !l.config().compact {
                    continue;
                }
                match l.cleaner_view() {
                    Ok(v) => v,
                    Err(_) => continue,
                }
            };
            let checkpoint = lock(&self.state).checkpoints.get(&key).copied();
            if let Some(c) = self.score(key, log, view, checkpoint, now) {
                let better = match &best {
                    None => true,
                    Some(b) => (c.must_clean, c.ratio) > (b.must_clean, b.ratio),
                };
                if better {
                    best = Some(c);
                }
            }
        }
        let c = best?;
        let mut st = lock(&self.state);
        if !st.in_progress.insert(c.key.clone()) {
            return None;
        }
        Some(c)
    }

    fn score(
        &self,
        key: Key,
        log: Arc<Mutex<Log>>,
        view: CleanerView,
        checkpoint: Option<i64>,
        now: i64,
    ) -> Option<Candidate> {
        // Kafka resets a checkpoint outside the log (truncation, DeleteRecords) to the start.
        let first_dirty = match checkpoint {
            Some(o) if o >= view.log_start_offset && o <= view.log_end_offset => o,
            _ => view.log_start_offset,
        };
        let lag = view.config.min_compaction_lag_ms;
        // Kafka's firstUncleanableDirtyOffset: the active segment, the first segment younger
        // than min.compaction.lag.ms, or the segment holding the last stable offset (records
        // from there on may be truncated by a follower or belong to an open transaction), and
        // whichever comes first. Only whole segments below it are cleaned.
        let bound = view.first_unstable_offset;
        let first_uncleanable = view
            .inactive
            .iter()
            .find(|s| s.next_offset > bound || (lag > 0 && s.largest_timestamp > now.saturating_sub(lag)))
            .map_or(view.active.base_offset, |s| s.base_offset);
        // A checkpoint above the bound (a follower truncated below it since): clean no further
        // than the bound, whatever the last pass reached.
        let first_dirty = first_dirty.min(first_uncleanable);
        let (mut clean, mut dirty) = (0u64, 0u64);
        let mut first_dirty_ts = None;
        for s in &view.inactive {
            if s.next_offset <= first_dirty {
                clean += s.size;
            } else if s.base_offset < first_uncleanable {
                dirty += s.size;
                if first_dirty_ts.is_none() {
                    first_dirty_ts = s.first_batch_timestamp.or(Some(s.largest_timestamp));
                }
            }
        }
        let ratio = if dirty == 0 { 0.0 } else { dirty as f64 / (clean + dirty) as f64 };
        let max_lag = view.config.max_compaction_lag_ms;
        let overdue = dirty > 0 && first_dirty_ts.is_some_and(|t| t >= 0 && now.saturating_sub(t) > max_lag);
        let horizon_due = view.latest_delete_horizon >= 0 && now >= view.latest_delete_horizon && clean > 0;
        let by_ratio = dirty > 0 && ratio >= view.config.min_cleanable_dirty_ratio;
        if !(by_ratio || overdue || horizon_due) {
            return None;
        }
        Some(Candidate { key, log, view, first_dirty, first_uncleanable, must_clean: overdue, ratio })
    }

    /// One pass; returns the new first dirty offset.
    fn clean(&self, c: &Candidate, now: i64) -> Result<i64, Abort> {
        let started = Instant::now();
        let view = &c.view;
        let last_batch_of_producer = self.producer_last_batches(view)?;
        let aborted = aborted_ranges(view);
        let (map, end) = self.build_offset_map(view, c.first_dirty, c.first_uncleanable, &aborted)?;
        let to_clean: Vec<&SegmentView> = view.inactive.iter().filter(|s| s.base_offset < end).collect();
        let mut latest_horizon = -1i64;
        let mut written = 0u64;
        let mut read = 0u64;
        // Producers whose transactional data was read since their last marker, over the whole
        // pass (a transaction may span groups).
        let mut txn_data_seen = HashSet::new();
        for group in group_segments(&to_clean, view) {
            let pass = PassInputs { map: &map, last_batch_of_producer: &last_batch_of_producer, aborted: &aborted };
            let (horizon, r, w) = self.clean_group(c, &group, &pass, &mut txn_data_seen, now)?;
            latest_horizon = latest_horizon.max(horizon);
            read += r;
            written += w;
        }
        lock(&c.log).set_latest_delete_horizon(latest_horizon);
        tracing::info!(
            topic = %c.key.0,
            partition = c.key.1,
            segments = to_clean.len(),
            keys = map.len(),
            first_dirty = c.first_dirty,
            end,
            mb_read = read as f64 / 1e6,
            mb_written = written as f64 / 1e6,
            ms = started.elapsed().as_millis() as u64,
            "log cleaned"
        );
        Ok(end)
    }

    /// Reads through the batches of a segment, calling `f(position, header, whole batch)`.
    fn for_each_batch(
        &self,
        s: &SegmentView,
        mut f: impl FnMut(&BatchHeader, &[u8]) -> Result<bool, Abort>,
    ) -> Result<(), Abort> {
        let file = open_segment(s)?;
        let mut sc = HeaderScanner::new(file.clone(), 0, s.size, self.cfg().io_buffer_size);
        let mut buf = Vec::new();
        while let Some((pos, h)) = sc.next_header()? {
            if self.stopped() {
                return Err(Abort::Stopped);
            }
            buf.resize(h.total_size(), 0);
            file.read_exact_at(&mut buf, pos)?;
            let h = batch::check_stored_batch(&buf)?;
            self.throttle(buf.len() as u64);
            if !f(&h, &buf)? {
                break;
            }
        }
        Ok(())
    }

    /// Per producer id, the base offset of its last batch in the whole log.
    fn producer_last_batches(&self, view: &CleanerView) -> Result<HashMap<i64, i64>, Abort> {
        let mut out = HashMap::new();
        for s in view.inactive.iter().chain(std::iter::once(&view.active)) {
            let mut sc = HeaderScanner::new(open_segment(s)?, 0, s.size, self.cfg().io_buffer_size);
            while let Some((_, h)) = sc.next_header()? {
                if h.producer_id >= 0 {
                    out.insert(h.producer_id, h.base_offset);
                }
            }
        }
        Ok(out)
    }

    /// Key hash -> latest offset over `[first_dirty, first_uncleanable)`, and where the map
    /// stops (earlier than `first_uncleanable` if it filled up).
    fn build_offset_map(
        &self,
        view: &CleanerView,
        first_dirty: i64,
        first_uncleanable: i64,
        aborted: &AbortedRanges,
    ) -> Result<(HashMap<u128, i64>, i64), Abort> {
        let capacity = self.cfg().map_capacity();
        let mut map: HashMap<u128, i64> = HashMap::new();
        let mut end = first_dirty;
        // Dirty segments end at or before first_uncleanable, which is a segment's base.
        for s in view.inactive.iter().filter(|s| s.next_offset > first_dirty && s.base_offset < first_uncleanable) {
            let mut stopped_at = None;
            self.for_each_batch(s, |h, bytes| {
                if h.last_offset() < first_dirty || h.is_control() || is_aborted(aborted, h) {
                    return Ok(true);
                }
                let section = batch::records_section(bytes, h, self.cfg().decompress_limit)?;
                for r in batch::parse_records(&section, h.records_count)? {
                    let offset = h.base_offset + i64::from(r.offset_delta);
                    let Some(k) = r.key.filter(|_| offset >= first_dirty) else { continue };
                    let hash = key_hash(k);
                    if map.len() >= capacity && !map.contains_key(&hash) {
                        // Full: the map covers the dirty records before this one.
                        stopped_at = Some(offset);
                        return Ok(false);
                    }
                    map.insert(hash, offset);
                }
                Ok(true)
            })?;
            if let Some(o) = stopped_at {
                end = end.max(o);
                return Ok((map, end));
            }
            end = end.max(s.next_offset);
        }
        Ok((map, end))
    }

    /// Rewrites one group into a `.cleaned` segment and swaps it in. Returns the latest delete
    /// horizon kept, and bytes read and written.
    fn clean_group(
        &self,
        c: &Candidate,
        group: &[&SegmentView],
        pass: &PassInputs<'_>,
        txn_data_seen: &mut HashSet<i64>,
        now: i64,
    ) -> Result<(i64, u64, u64), Abort> {
        let view = &c.view;
        let base = group[0].base_offset;
        let mut cleaned = LogSegment::create_cleaned(&view.dir, base, &view.config, now)?;
        let result = (|| -> Result<(i64, u64, u64), Abort> {
            let mut horizon = -1i64;
            let (mut read, mut written) = (0u64, 0u64);
            let ctx = FilterContext {
                map: pass.map,
                now,
                delete_retention_ms: view.config.delete_retention_ms,
                last_batch_of_producer: pass.last_batch_of_producer,
                aborted: pass.aborted,
                decompress_limit: self.cfg().decompress_limit,
            };
            for s in group {
                self.for_each_batch(s, |h, bytes| {
                    read += bytes.len() as u64;
                    let out = filter_batch(&ctx, txn_data_seen, h, bytes)?;
                    if let Some(hz) = out.horizon {
                        horizon = horizon.max(hz);
                    }
                    let kept: std::borrow::Cow<'_, [u8]> = match out.kept {
                        Kept::Original => std::borrow::Cow::Borrowed(bytes),
                        Kept::Rewritten(b) => std::borrow::Cow::Owned(b),
                        Kept::Nothing => return Ok(true),
                    };
                    let nh = BatchHeader::parse(&kept)
                        .ok_or_else(|| LogError::CorruptMessage("rewritten batch is short".into()))?;
                    cleaned.append(&kept, &[nh])?;
                    self.throttle(kept.len() as u64);
                    written += kept.len() as u64;
                    Ok(true)
                })?;
            }
            cleaned.make_inactive()?;
            cleaned.flush()?;
            Ok((horizon, read, written))
        })();
        let (horizon, read, written) = match result {
            Ok(r) => r,
            Err(e) => {
                remove_cleaned(&view.dir, base);
                return Err(e);
            }
        };
        self.stats.bytes_read.fetch_add(read, Ordering::Relaxed);
        self.stats.bytes_written.fetch_add(written, Ordering::Relaxed);
        let old: Vec<SegmentView> = group.iter().map(|s| (*s).clone()).collect();
        let swapped = lock(&c.log).replace_segments(&old, cleaned);
        match swapped {
            Ok(true) => Ok((horizon, read, written)),
            Ok(false) => {
                remove_cleaned(&view.dir, base);
                Err(Abort::Changed)
            }
            Err(e) => Err(Abort::Failed(e)),
        }
    }

    /// Sleeps as needed to keep the cleaners under log.cleaner.io.max.bytes.per.second.
    fn throttle(&self, bytes: u64) {
        let limit = self.cfg().max_io_bytes_per_second;
        if !(limit.is_finite() && limit > 0.0) || limit >= 1e15 {
            return;
        }
        std::thread::sleep(Duration::from_secs_f64(bytes as f64 / limit));
    }

    /// Writes `cleaner-offset-checkpoint` in every online dir, for the logs it holds.
    pub fn write_checkpoints(&self) -> Result<(), LogError> {
        let checkpoints = lock(&self.state).checkpoints.clone();
        let mut per_dir: Vec<Vec<(Key, i64)>> = vec![Vec::new(); self.manager.dirs().len()];
        for (k, i, _) in self.manager.all_with_dir() {
            if let Some(&o) = checkpoints.get(&k) {
                per_dir[i].push((k, o));
            }
        }
        let mut first_err = None;
        for (i, d) in self.manager.dirs().iter().enumerate() {
            if !self.manager.is_online(i) {
                continue;
            }
            per_dir[i].sort();
            if let Err(e) = write_offset_checkpoint(&d.join(CLEANER_OFFSET_CHECKPOINT), &per_dir[i]) {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }
}

fn remove_cleaned(dir: &Path, base: i64) {
    for p in LogSegment::paths(dir, base, super::segment::CLEANED_SUFFIX) {
        if let Err(e) = std::fs::remove_file(&p) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(file = %p.display(), error = %e, "could not remove a cleaned segment file");
            }
        }
    }
}

#[cfg(test)]
mod tests;
