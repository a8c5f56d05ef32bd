//! `Log`: one partition directory, an ordered set of segments of which the
//! last is the active (appendable) one.
//!
//! Invariants: there is always at least one segment; segment base offsets
//! increase and each segment's offsets stay below the next segment's base;
//! `log_start_offset <= log_end_offset`, and `log_start_offset >=` the first
//! segment's base; `recovery_point <= log_end_offset` and everything below
//! it has been fsynced (it only advances at `flush` and at roll, which
//! fsyncs the segment it closes).
//!
//! Deletion (retention, DeleteRecords, truncation) renames files to
//! `*.deleted` and removes them at once; `file.delete.delay.ms` is not
//! honoured because fetches keep their own open file handle (`FileRange`),
//! which is what the delay protects in Kafka.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;

use super::batch::{self, BatchHeader, HEADER_SIZE, OFF_BASE_OFFSET, OFF_LEADER_EPOCH};
use super::checkpoint::{sync_dir, write_atomic};
use super::dir_failure::DirHealth;
use super::segment::{LogSegment, PATCHED_HEAD, SWAP_SUFFIX};
use super::{
    index_file_path, log_file_path, now_ms, time_index_file_path, txn_index_file_path, AppendInfo, FileRange,
    LogConfig, LogError,
};
use crate::log::producer_state::AbortedTxn;

/// One `.txnindex` entry, as Kafka writes it: version i16 (0), producer id i64, first offset
/// i64, last offset i64, last stable offset i64.
pub(super) const TXN_INDEX_ENTRY_SIZE: usize = 34;

fn encode_txn_entry(entry: &AbortedTxn) -> [u8; TXN_INDEX_ENTRY_SIZE] {
    let mut buf = [0u8; TXN_INDEX_ENTRY_SIZE];
    buf[0..2].copy_from_slice(&0i16.to_be_bytes());
    buf[2..10].copy_from_slice(&entry.producer_id.to_be_bytes());
    buf[10..18].copy_from_slice(&entry.first_offset.to_be_bytes());
    buf[18..26].copy_from_slice(&entry.last_offset.to_be_bytes());
    buf[26..34].copy_from_slice(&entry.last_stable_offset.to_be_bytes());
    buf
}

/// `e` is one whole entry (callers walk `chunks_exact`).
pub(super) fn decode_txn_entry(e: &[u8]) -> AbortedTxn {
    let i64_at = |o: usize| e.get(o..o + 8).and_then(|b| b.try_into().ok()).map_or(-1, i64::from_be_bytes);
    AbortedTxn {
        producer_id: i64_at(2),
        first_offset: i64_at(10),
        last_offset: i64_at(18),
        last_stable_offset: i64_at(26),
    }
}

/// One partition's log.
#[derive(Debug)]
pub struct Log {
    dir: PathBuf,
    config: LogConfig,
    segments: BTreeMap<i64, LogSegment>,
    log_start_offset: i64,
    log_end_offset: i64,
    recovery_point: i64,
    unflushed_messages: u64,
    last_flush_ms: i64,
    deleted: bool,
    stats: Arc<LogStats>,
    /// The latest delete horizon the cleaner stamped on a batch it kept tombstones in (-1:
    /// none known): once it passes, the log is worth cleaning again to drop them.
    latest_delete_horizon: i64,
    /// The high watermark, kept by the replica layer (`replication::Partition`) and read here
    /// by the cleaner: records at or above it may still be truncated away by a follower, so
    /// they are never cleaned nor allowed to make older records obsolete. 0 until a replica
    /// publishes one, so a log no replica owns is never cleaned.
    high_watermark: Arc<AtomicI64>,
    /// The first offset of the oldest transaction still open (i64::MAX: none), kept by the
    /// replica layer's producer state: the cleaner must not pass it either.
    first_unstable_offset: Arc<AtomicI64>,
    /// The lowest offset this log was truncated to since a log dir move last looked: the copy
    /// being made for the move holds records from there on that are no longer this log's.
    truncated_to: Option<i64>,
    /// The base of the segment the last roll started, until the replica layer takes it to
    /// write a producer-state snapshot there.
    rolled_at: Option<i64>,
    /// Whether this log's dir went offline, and where to report an I/O error in it (None for a
    /// log outside a log manager).
    health: Option<DirHealth>,
}

/// What the log cleaner needs of one segment, taken under the log lock and used without it.
/// The open file keeps the bytes readable whatever happens to the log meanwhile; `file` and
/// `size` identify the segment when the cleaner comes back to swap.
#[derive(Clone, Debug)]
pub struct SegmentView {
    pub base_offset: i64,
    pub file: Arc<std::fs::File>,
    pub size: u64,
    pub next_offset: i64,
    pub largest_timestamp: i64,
    pub first_batch_timestamp: Option<i64>,
    pub index_entries: usize,
}

/// A log as the cleaner sees it: every inactive segment, and the active one (read only for
/// producer state).
#[derive(Clone, Debug)]
pub struct CleanerView {
    pub dir: PathBuf,
    pub config: LogConfig,
    pub log_start_offset: i64,
    pub log_end_offset: i64,
    pub inactive: Vec<SegmentView>,
    pub active: SegmentView,
    pub latest_delete_horizon: i64,
    /// The first offset the cleaner must leave alone: [`Log::last_stable_offset`].
    pub first_unstable_offset: i64,
}

/// A log's figures as of its last change, readable without its lock: a metrics scrape reads
/// thousands of these and must neither wait for an append nor make one wait.
///
/// Appends add to them; every other change (roll, truncation, retention, deletion) recounts
/// them from the segments, as does each retention check, so a change that failed half way
/// is corrected by the next.
#[derive(Debug, Default)]
pub struct LogStats {
    size_bytes: AtomicU64,
    log_start_offset: AtomicI64,
    log_end_offset: AtomicI64,
    segments: AtomicU64,
    active_segment_base: AtomicI64,
}

impl LogStats {
    pub fn size_bytes(&self) -> u64 {
        self.size_bytes.load(Ordering::Relaxed)
    }
    pub fn log_start_offset(&self) -> i64 {
        self.log_start_offset.load(Ordering::Relaxed)
    }
    pub fn log_end_offset(&self) -> i64 {
        self.log_end_offset.load(Ordering::Relaxed)
    }
    pub fn segments(&self) -> u64 {
        self.segments.load(Ordering::Relaxed)
    }
    /// The base offset of the segment appends go to.
    pub fn active_segment_base(&self) -> i64 {
        self.active_segment_base.load(Ordering::Relaxed)
    }
}

/// Kafka's temporary suffixes that a restart simply removes: leftovers of an interrupted
/// delete, of a cleaning that had not reached its swap, or of a checkpoint write. `.swap` is
/// different: see [`Log::open`].
const TEMP_SUFFIXES: [&str; 3] = [".deleted", ".cleaned", ".tmp"];

fn parse_segment_name(name: &str, ext: &str) -> Option<i64> {
    let stem = name.strip_suffix(ext)?;
    if stem.len() != 20 || !stem.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    stem.parse().ok()
}

/// Finishes a cleaner swap that a crash interrupted (Kafka's rule): the `.swap` segment was
/// complete and fsynced before it got that name, so it replaces every segment whose base
/// offset falls in its offset range, and then takes its live name. `bases` (sorted) is
/// updated to match.
fn complete_swap(dir: &Path, base: i64, bases: &mut Vec<i64>) -> Result<(), LogError> {
    let [log, _, _] = LogSegment::paths(dir, base, SWAP_SUFFIX);
    let file = fs::File::open(&log)?;
    let len = file.metadata()?.len();
    let mut next = base;
    let mut sc = super::segment::HeaderScanner::new(&file, 0, len, 64 * 1024);
    while let Ok(Some((_, h))) = sc.next_header() {
        next = h.next_offset();
    }
    let replaced: Vec<i64> = bases.iter().copied().filter(|&b| b >= base && b < next.max(base + 1)).collect();
    for &b in &replaced {
        remove_segment_files(dir, b);
    }
    // Stale index files under the live name would describe the old segment.
    remove_segment_files(dir, base);
    fs::rename(&log, log_file_path(dir, base))?;
    sync_dir(dir)?;
    bases.retain(|b| !replaced.contains(b));
    bases.push(base);
    bases.sort_unstable();
    tracing::warn!(dir = %dir.display(), base, replaced = ?replaced, "completed an interrupted cleaner swap");
    Ok(())
}

fn remove_segment_files(dir: &Path, base: i64) {
    for p in [
        log_file_path(dir, base),
        index_file_path(dir, base),
        time_index_file_path(dir, base),
        txn_index_file_path(dir, base),
    ] {
        if let Err(e) = fs::remove_file(&p) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(file = %p.display(), error = %e, "could not remove segment file");
            }
        }
    }
}

impl Log {
    /// Opens (creating if missing) the partition directory and loads its
    /// segments. With `had_clean_shutdown` everything is trusted after cheap
    /// index sanity checks; otherwise every segment from the one holding
    /// `recovery_point` onwards is re-validated batch by batch and cut at
    /// the first invalid byte (later segments are deleted).
    pub fn open(
        dir: PathBuf,
        config: LogConfig,
        recovery_point: i64,
        log_start_offset: i64,
        had_clean_shutdown: bool,
    ) -> Result<Log, LogError> {
        fs::create_dir_all(&dir)?;
        let now = now_ms();
        let mut bases = Vec::new();
        let mut index_bases = Vec::new();
        let mut swaps = Vec::new();
        for entry in fs::read_dir(&dir)? {
            let entry = entry?;
            let name = match entry.file_name().into_string() {
                Ok(n) => n,
                Err(_) => continue,
            };
            if let Some(stem) = name.strip_suffix(SWAP_SUFFIX) {
                match parse_segment_name(stem, ".log") {
                    Some(b) => swaps.push(b),
                    // A swapped segment's indexes are rebuilt from its log, like Kafka does.
                    None => {
                        if let Err(e) = fs::remove_file(entry.path()) {
                            tracing::warn!(file = %entry.path().display(), error = %e, "could not remove swap index");
                        }
                    }
                }
                continue;
            }
            if TEMP_SUFFIXES.iter().any(|s| name.ends_with(s)) {
                if let Err(e) = fs::remove_file(entry.path()) {
                    tracing::warn!(file = %entry.path().display(), error = %e, "could not remove temporary file");
                }
                continue;
            }
            if let Some(b) = parse_segment_name(&name, ".log") {
                bases.push(b);
            } else if let Some(b) = parse_segment_name(&name, ".index")
                .or_else(|| parse_segment_name(&name, ".timeindex"))
                .or_else(|| parse_segment_name(&name, ".txnindex"))
            {
                index_bases.push(b);
            }
        }
        bases.sort_unstable();
        swaps.sort_unstable();
        for b in swaps {
            complete_swap(&dir, b, &mut bases)?;
        }
        for b in index_bases {
            if bases.binary_search(&b).is_err() {
                remove_segment_files(&dir, b);
            }
        }

        let recover_from = if had_clean_shutdown {
            None
        } else {
            Some(bases.iter().rev().find(|&&b| b <= recovery_point).or(bases.first()).copied().unwrap_or(0))
        };
        let mut segments = BTreeMap::new();
        let mut recovered_any = false;
        let mut stop_after: Option<usize> = None;
        for (i, &base) in bases.iter().enumerate() {
            let is_last = i + 1 == bases.len();
            let upper = bases.get(i + 1).copied().unwrap_or(i64::MAX);
            let mut seg = LogSegment::open(&dir, base, &config, is_last, now)?;
            let must_recover = recover_from.is_some_and(|rf| base >= rf);
            let mut cut = 0;
            if must_recover {
                cut = seg.recover()?;
                recovered_any = true;
            } else if !seg.load_trusted(upper)? {
                tracing::warn!(dir = %dir.display(), base, "segment failed sanity checks; rebuilding it from the log");
                cut = seg.recover()?;
                recovered_any = true;
            }
            let overlaps = seg.next_offset() > upper;
            segments.insert(base, seg);
            if cut > 0 || overlaps {
                tracing::warn!(
                    dir = %dir.display(),
                    base,
                    bytes_cut = cut,
                    later_segments_deleted = bases.len() - i - 1,
                    "log recovery truncated the log at the first invalid batch"
                );
                stop_after = Some(i);
                break;
            }
        }
        if let Some(i) = stop_after {
            for &b in &bases[i + 1..] {
                remove_segment_files(&dir, b);
            }
        }

        let mut log = Log {
            dir,
            config,
            segments,
            log_start_offset: 0,
            log_end_offset: 0,
            recovery_point: 0,
            unflushed_messages: 0,
            last_flush_ms: now,
            deleted: false,
            health: None,
            stats: Arc::default(),
            latest_delete_horizon: -1,
            high_watermark: Arc::new(AtomicI64::new(0)),
            first_unstable_offset: Arc::new(AtomicI64::new(i64::MAX)),
            truncated_to: None,
            rolled_at: None,
        };
        if log.segments.is_empty() {
            let base = log_start_offset.max(0);
            let seg = LogSegment::create(&log.dir, base, &log.config, now)?;
            log.segments.insert(base, seg);
        }
        log.refresh_end_offset();
        let first_base = log.first_segment_base();
        log.log_start_offset = log_start_offset.max(first_base);
        if log.log_start_offset > log.log_end_offset {
            // The checkpointed start is beyond the data (e.g. recovery cut
            // it): everything below the start offset is deleted by
            // definition, so start an empty log there.
            let start = log.log_start_offset;
            log.truncate_fully_and_start_at(start)?;
        }
        if let Some(active) = log.segments.values_mut().next_back() {
            active.ensure_active()?;
        }
        if recovered_any {
            // Recovered data may only be in the page cache; make it durable
            // before claiming it as recovered.
            for seg in log.segments.values() {
                seg.flush()?;
            }
        }
        log.recovery_point = if had_clean_shutdown || recovered_any {
            log.log_end_offset
        } else {
            recovery_point.clamp(0, log.log_end_offset)
        };
        log.publish_stats();
        Ok(log)
    }

    pub fn stats(&self) -> Arc<LogStats> {
        self.stats.clone()
    }

    fn publish_stats(&self) {
        let s = &self.stats;
        s.size_bytes.store(self.size_bytes(), Ordering::Relaxed);
        s.log_start_offset.store(self.log_start_offset, Ordering::Relaxed);
        s.log_end_offset.store(self.log_end_offset, Ordering::Relaxed);
        s.segments.store(self.segments.len() as u64, Ordering::Relaxed);
        s.active_segment_base.store(self.segments.keys().next_back().copied().unwrap_or(0), Ordering::Relaxed);
    }

    fn refresh_end_offset(&mut self) {
        self.log_end_offset = self.segments.values().next_back().map(|s| s.next_offset()).unwrap_or(0);
    }

    fn check_live(&self) -> Result<(), LogError> {
        if self.deleted {
            return Err(LogError::StorageUnavailable(format!("log {} was deleted", self.dir.display())));
        }
        if self.health.as_ref().is_some_and(DirHealth::is_offline) {
            return Err(LogError::StorageUnavailable(format!("the log dir of {} is offline", self.dir.display())));
        }
        Ok(())
    }

    /// Ties this log to its log dir's health: from then on an I/O error takes the dir offline.
    pub fn set_dir_health(&mut self, health: DirHealth) {
        self.health = Some(health);
    }

    /// An I/O error means the disk under this log failed a read or a write (ENOSPC, EIO): the
    /// dir goes offline, so no later write lands after what may be a hole. Other errors are
    /// the request's or the data's, not the disk's.
    fn watch_io<T>(&self, r: Result<T, LogError>) -> Result<T, LogError> {
        if let (Err(LogError::Io(e)), Some(h)) = (&r, &self.health) {
            if super::dir_failure::is_disk_failure(e) {
                h.report(&format_args!("{}: {e}", self.dir.display()));
            }
        }
        r
    }

    /// Whether this log was deleted or replaced by its copy in another log dir.
    pub fn is_deleted(&self) -> bool {
        self.deleted
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
    pub fn config(&self) -> &LogConfig {
        &self.config
    }
    pub fn log_start_offset(&self) -> i64 {
        self.log_start_offset
    }
    pub fn log_end_offset(&self) -> i64 {
        self.log_end_offset
    }
    pub fn recovery_point(&self) -> i64 {
        self.recovery_point
    }
    pub fn size_bytes(&self) -> u64 {
        self.segments.values().map(|s| s.size()).sum()
    }
    pub fn segment_count(&self) -> usize {
        self.segments.len()
    }
    pub fn segment_base_offsets(&self) -> Vec<i64> {
        self.segments.keys().copied().collect()
    }
    pub fn first_segment_base(&self) -> i64 {
        self.segments.keys().next().copied().unwrap_or(0)
    }
    pub fn segments(&self) -> impl Iterator<Item = &LogSegment> {
        self.segments.values()
    }

    /// A snapshot for the log cleaner (cheap: no I/O).
    pub fn cleaner_view(&self) -> Result<CleanerView, LogError> {
        self.check_live()?;
        let view = |s: &LogSegment| SegmentView {
            base_offset: s.base_offset(),
            file: s.log_file().clone(),
            size: s.size(),
            next_offset: s.next_offset(),
            largest_timestamp: s.largest_timestamp(),
            first_batch_timestamp: s.first_batch_timestamp(),
            index_entries: s.offset_index().entries(),
        };
        let all: Vec<SegmentView> = self.segments.values().map(view).collect();
        let Some((active, inactive)) = all.split_last() else {
            return Err(LogError::StorageUnavailable("log has no segments".into()));
        };
        Ok(CleanerView {
            dir: self.dir.clone(),
            config: self.config.clone(),
            log_start_offset: self.log_start_offset,
            log_end_offset: self.log_end_offset,
            inactive: inactive.to_vec(),
            active: active.clone(),
            latest_delete_horizon: self.latest_delete_horizon,
            first_unstable_offset: self.last_stable_offset(),
        })
    }

    /// The cell the replica layer keeps this log's high watermark in (shared, so the cleaner
    /// reads it without the replica's locks).
    pub fn high_watermark_cell(&self) -> Arc<AtomicI64> {
        self.high_watermark.clone()
    }

    /// The cell the replica layer keeps the first offset of the oldest open transaction in.
    pub fn first_unstable_offset_cell(&self) -> Arc<AtomicI64> {
        self.first_unstable_offset.clone()
    }

    /// Kafka's last stable offset: the first offset of a transaction still open, else the high
    /// watermark.
    pub fn last_stable_offset(&self) -> i64 {
        self.high_watermark
            .load(Ordering::Acquire)
            .min(self.first_unstable_offset.load(Ordering::Acquire))
            .min(self.log_end_offset)
    }

    /// Records an aborted transaction in the `.txnindex` of the segment holding its marker,
    /// so read_committed fetches can still be told of it after a restart.
    pub fn append_aborted_txn(&mut self, entry: &AbortedTxn) -> Result<(), LogError> {
        use std::io::Write;
        self.check_live()?;
        let base = self.segments.range(..=entry.last_offset).next_back().map(|(b, _)| *b).unwrap_or(0);
        let buf = encode_txn_entry(entry);
        let mut f = fs::OpenOptions::new().create(true).append(true).open(txn_index_file_path(&self.dir, base))?;
        f.write_all(&buf)?;
        Ok(())
    }

    /// Every aborted transaction in the segments' `.txnindex` files whose marker is below
    /// `before`, oldest first. A torn last entry (a crash mid-write) is ignored.
    pub fn aborted_txns_before(&self, before: i64) -> Vec<AbortedTxn> {
        let mut out = Vec::new();
        for &base in self.segments.keys() {
            if base >= before {
                break;
            }
            let Ok(bytes) = fs::read(txn_index_file_path(&self.dir, base)) else { continue };
            for e in bytes.chunks_exact(TXN_INDEX_ENTRY_SIZE) {
                let entry = decode_txn_entry(e);
                if entry.last_offset < before && entry.last_offset >= self.log_start_offset {
                    out.push(entry);
                }
            }
        }
        out.sort_by_key(|a| a.last_offset);
        out
    }

    pub fn latest_delete_horizon(&self) -> i64 {
        self.latest_delete_horizon
    }

    pub fn set_latest_delete_horizon(&mut self, horizon: i64) {
        self.latest_delete_horizon = horizon;
    }

    /// Swaps a cleaned segment (complete, fsynced, named `.cleaned`) in for the segments it
    /// was made from, Kafka's way: rename it to `.swap`, delete the old ones, drop the suffix.
    /// A crash at any point leaves either the old segments or the cleaned one (see
    /// [`complete_swap`]). Only renames happen here; the copying was done without the lock.
    /// Returns false, changing nothing, if any old segment changed meanwhile (truncated,
    /// deleted, or become active); the caller then removes the cleaned files.
    pub fn replace_segments(&mut self, old: &[SegmentView], mut cleaned: LogSegment) -> Result<bool, LogError> {
        self.check_live()?;
        let active_base = self.segments.keys().next_back().copied();
        let unchanged = !old.is_empty()
            && old.iter().all(|o| {
                Some(o.base_offset) != active_base
                    && self
                        .segments
                        .get(&o.base_offset)
                        .is_some_and(|s| Arc::ptr_eq(s.log_file(), &o.file) && s.size() == o.size)
            });
        if !unchanged {
            return Ok(false);
        }
        // The cleaner keeps every ABORT marker, so the old segments' aborted-transaction
        // entries all belong to the cleaned one (which replaces them under the first one's name).
        let mut txn_entries = Vec::new();
        for o in old {
            match fs::read(txn_index_file_path(&self.dir, o.base_offset)) {
                Ok(b) => txn_entries.extend(b.chunks_exact(TXN_INDEX_ENTRY_SIZE).flatten().copied()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e.into()),
            }
        }
        cleaned.rename_suffix(&self.dir, SWAP_SUFFIX)?;
        sync_dir(&self.dir)?;
        super::cleaner::crash_point("swap");
        for o in old {
            if let Some(seg) = self.segments.remove(&o.base_offset) {
                if let Err(e) = seg.delete_files() {
                    // The swap file wins at the next start whatever is left here.
                    tracing::warn!(dir = %self.dir.display(), base = o.base_offset, error = %e, "could not delete a cleaned-away segment");
                }
            }
        }
        let rename = cleaned.rename_suffix(&self.dir, "");
        let base = cleaned.base_offset();
        self.segments.insert(base, cleaned);
        self.publish_stats();
        rename?;
        if !txn_entries.is_empty() {
            // A crash before this leaves the cleaned segment without its entries; their data
            // is gone with the cleaning, so read_committed readers lose nothing.
            // Durable before the rename: an empty index after a power loss would look valid
            // (a multiple of its entry size) and let aborted records pass as committed.
            write_atomic(&txn_index_file_path(&self.dir, base), &txn_entries)?;
        }
        sync_dir(&self.dir)?;
        Ok(true)
    }

    pub fn set_config(&mut self, config: LogConfig) {
        for s in self.segments.values_mut() {
            s.set_config(&config);
        }
        self.config = config;
    }

    fn active(&mut self) -> Result<&mut LogSegment, LogError> {
        self.segments.values_mut().next_back().ok_or_else(|| LogError::StorageUnavailable("log has no segments".into()))
    }

    /// Leader append: validates (nothing is written if that fails), assigns
    /// offsets from the log end and stamps `leader_epoch` into each batch
    /// (both outside the CRC), then writes.
    pub fn append(&mut self, records: &mut [u8], leader_epoch: i32) -> Result<AppendInfo, LogError> {
        self.check_live()?;
        let headers = batch::validate_batches(records, self.config.max_message_bytes)?;
        self.append_validated_batches(records, headers, leader_epoch)
    }

    /// [`Log::append`] for a caller that already ran [`batch::validate_batches`] on exactly
    /// these bytes (the replica manager does, to check producer sequences first), so the CRC
    /// and record walk are not paid twice.
    pub fn append_validated_batches(
        &mut self,
        records: &mut [u8],
        mut headers: Vec<BatchHeader>,
        leader_epoch: i32,
    ) -> Result<AppendInfo, LogError> {
        self.check_live()?;
        let now = now_ms();
        let log_append_time = self.config.log_append_time;
        let mut next = self.log_end_offset;
        let mut pos = 0usize;
        for h in headers.iter_mut() {
            records[pos + OFF_BASE_OFFSET..pos + OFF_BASE_OFFSET + 8].copy_from_slice(&next.to_be_bytes());
            records[pos + OFF_LEADER_EPOCH..pos + OFF_LEADER_EPOCH + 4].copy_from_slice(&leader_epoch.to_be_bytes());
            h.base_offset = next;
            h.partition_leader_epoch = leader_epoch;
            if log_append_time {
                // Inside the CRC, unlike the two fields above: the batch is checksummed again.
                let end = pos + h.total_size();
                batch::stamp_log_append_time(&mut records[pos..end], now);
                h.attributes |= batch::TIMESTAMP_TYPE_BIT;
                h.max_timestamp = now;
            }
            next = h.next_offset();
            pos += h.total_size();
        }
        let mut info = self.append_validated(records, &headers, now)?;
        if log_append_time {
            info.log_append_time = now;
        }
        Ok(info)
    }

    /// [`Log::append_validated_batches`] for batches in a buffer shared with others (the
    /// request's): the assigned base offsets and leader epoch go to the file without `records`
    /// being copied first. A LogAppendTime topic changes bytes inside the CRC, so there the
    /// batches are copied and stamped.
    pub fn append_validated_shared(
        &mut self,
        records: &[u8],
        mut headers: Vec<BatchHeader>,
        leader_epoch: i32,
    ) -> Result<AppendInfo, LogError> {
        if self.config.log_append_time {
            return self.append_validated_batches(&mut records.to_vec(), headers, leader_epoch);
        }
        self.check_live()?;
        let mut next = self.log_end_offset;
        let mut pos = 0usize;
        let mut heads = Vec::with_capacity(headers.len());
        for h in headers.iter_mut() {
            let mut head = [0u8; PATCHED_HEAD];
            let original = records
                .get(pos..pos + PATCHED_HEAD)
                .ok_or_else(|| LogError::InvalidRecord(format!("batch at byte {pos} shorter than its header")))?;
            head.copy_from_slice(original);
            head[OFF_BASE_OFFSET..OFF_BASE_OFFSET + 8].copy_from_slice(&next.to_be_bytes());
            head[OFF_LEADER_EPOCH..OFF_LEADER_EPOCH + 4].copy_from_slice(&leader_epoch.to_be_bytes());
            heads.push(head);
            h.base_offset = next;
            h.partition_leader_epoch = leader_epoch;
            next = h.next_offset();
            pos += h.total_size();
        }
        self.append_pieces(records, &headers, &heads, now_ms())
    }

    /// Follower append: batches keep their offsets, which must start at or
    /// after the log end and increase.
    pub fn append_as_follower(&mut self, records: &[u8]) -> Result<AppendInfo, LogError> {
        self.check_live()?;
        let headers = batch::validate_replicated_batches(records)?;
        let mut expected = self.log_end_offset;
        for h in &headers {
            if h.base_offset < expected {
                return Err(LogError::InvalidRecord(format!(
                    "replicated batch at offset {} is below the expected offset {expected}",
                    h.base_offset
                )));
            }
            expected = h.next_offset();
        }
        self.append_validated(records, &headers, now_ms())
    }

    fn append_validated(&mut self, records: &[u8], headers: &[BatchHeader], now: i64) -> Result<AppendInfo, LogError> {
        self.append_pieces(records, headers, &[], now)
    }

    /// Appends `records`, each batch's head replaced by `heads[i]` if there are heads. A
    /// failed write is cut back by the segment, so the log never holds part of a batch.
    fn append_pieces(
        &mut self,
        records: &[u8],
        headers: &[BatchHeader],
        heads: &[[u8; PATCHED_HEAD]],
        now: i64,
    ) -> Result<AppendInfo, LogError> {
        let r = self.append_pieces_unwatched(records, headers, heads, now);
        self.watch_io(r)
    }

    fn append_pieces_unwatched(
        &mut self,
        records: &[u8],
        headers: &[BatchHeader],
        heads: &[[u8; PATCHED_HEAD]],
        now: i64,
    ) -> Result<AppendInfo, LogError> {
        let (first, last) = match (headers.first(), headers.last()) {
            (Some(f), Some(l)) => (f.base_offset, l.last_offset()),
            _ => {
                return Ok(AppendInfo {
                    first_offset: self.log_end_offset,
                    last_offset: self.log_end_offset - 1,
                    max_timestamp: -1,
                    offset_of_max_timestamp: -1,
                    record_count: 0,
                    log_append_time: -1,
                })
            }
        };
        if records.len() as u64 > self.config.segment_bytes.min(i32::MAX as u64) {
            return Err(LogError::RecordListTooLarge);
        }
        let mut max_ts = -1i64;
        let mut offset_of_max = first;
        let mut count = 0u64;
        for h in headers {
            if h.max_timestamp > max_ts {
                max_ts = h.max_timestamp;
                offset_of_max = h.last_offset();
            }
            count += h.records_count.max(0) as u64;
        }
        let config = self.config.clone();
        // A closed log's indexes are trimmed and would look full.
        self.active()?.ensure_active()?;
        if self.active()?.should_roll(&config, records.len(), first, last, max_ts, now) {
            self.roll(first)?;
        }
        self.active()?.append_patched(records, headers, heads)?;
        self.log_end_offset = last + 1;
        // Not a recount: that is linear in the segments, and appends are the hot path.
        self.stats.size_bytes.fetch_add(records.len() as u64, Ordering::Relaxed);
        self.stats.log_end_offset.store(self.log_end_offset, Ordering::Relaxed);
        self.unflushed_messages = self.unflushed_messages.saturating_add(count);
        if self.unflushed_messages >= self.config.flush_interval_messages {
            self.flush()?;
        }
        Ok(AppendInfo {
            first_offset: first,
            last_offset: last,
            max_timestamp: max_ts,
            offset_of_max_timestamp: offset_of_max,
            record_count: count,
            log_append_time: -1,
        })
    }

    /// Starts a new active segment at `new_base` (>= log end). The old one
    /// is trimmed and fsynced here, synchronously, which is what lets the
    /// recovery point advance without a flush policy.
    pub fn roll(&mut self, new_base: i64) -> Result<(), LogError> {
        let r = self.roll_unwatched(new_base);
        self.watch_io(r)
    }

    fn roll_unwatched(&mut self, new_base: i64) -> Result<(), LogError> {
        self.check_live()?;
        let new_base = new_base.max(self.log_end_offset);
        let now = now_ms();
        let (active_base, active_empty) = {
            let a = self.active()?;
            (a.base_offset(), a.is_empty())
        };
        if active_empty {
            if active_base == new_base {
                return Ok(());
            }
            if let Some(seg) = self.segments.remove(&active_base) {
                seg.delete_files()?;
            }
        } else {
            let a = self.active()?;
            a.make_inactive()?;
            a.flush()?;
            let durable = a.next_offset();
            // Every older segment was fsynced at its own roll.
            self.recovery_point = self.recovery_point.max(durable);
        }
        let seg = LogSegment::create(&self.dir, new_base, &self.config, now)?;
        self.segments.insert(new_base, seg);
        self.rolled_at = Some(new_base);
        self.log_start_offset = self.log_start_offset.max(self.first_segment_base());
        self.publish_stats();
        sync_dir(&self.dir)?;
        Ok(())
    }

    /// Whole batches starting at the batch containing `offset`: at least one
    /// batch even if larger than `max_bytes`, then as many as fit, never one
    /// whose base offset is >= `max_offset` (the high watermark). May span
    /// segments (one `FileRange` per segment). `offset == log end` gives an
    /// empty result; outside `[log_start, log_end]` is `OffsetOutOfRange`.
    pub fn read(&self, offset: i64, max_bytes: usize, max_offset: Option<i64>) -> Result<Vec<FileRange>, LogError> {
        self.watch_io(self.read_unwatched(offset, max_bytes, max_offset))
    }

    fn read_unwatched(
        &self,
        offset: i64,
        max_bytes: usize,
        max_offset: Option<i64>,
    ) -> Result<Vec<FileRange>, LogError> {
        self.check_live()?;
        if offset < self.log_start_offset || offset > self.log_end_offset {
            return Err(LogError::OffsetOutOfRange {
                offset,
                log_start_offset: self.log_start_offset,
                log_end_offset: self.log_end_offset,
            });
        }
        let mut out = Vec::new();
        if offset == self.log_end_offset {
            return Ok(out);
        }
        let start_key = match self.segments.range(..=offset).next_back() {
            Some((k, _)) => *k,
            None => self.first_segment_base(),
        };
        let cap = max_bytes.saturating_add(HEADER_SIZE).clamp(4096, 64 * 1024);
        let mut budget = max_bytes;
        let mut took_any = false;
        let mut first_segment = true;
        'segments: for seg in self.segments.range(start_key..).map(|(_, s)| s) {
            let start_pos = if first_segment {
                first_segment = false;
                match seg.find_batch(offset)? {
                    Some((p, _)) => p,
                    None => continue,
                }
            } else {
                0
            };
            let mut range: Option<(u64, usize)> = None;
            let mut end_offset = 0;
            let mut sc = seg.scanner(start_pos, cap);
            let mut done = false;
            while let Some((p, h)) = sc.next_header()? {
                if max_offset.is_some_and(|m| h.base_offset >= m) {
                    done = true;
                    break;
                }
                let sz = h.total_size();
                if took_any && sz > budget {
                    done = true;
                    break;
                }
                took_any = true;
                end_offset = h.next_offset();
                range = Some(match range {
                    Some((s, l)) => (s, l + sz),
                    None => (p, sz),
                });
                budget = budget.saturating_sub(sz);
                if budget == 0 {
                    done = true;
                    break;
                }
            }
            if let Some((position, len)) = range {
                out.push(FileRange { file: seg.log_file().clone(), position, len, end_offset });
            }
            if done {
                break 'segments;
            }
        }
        Ok(out)
    }

    /// ListOffsets by timestamp: the first batch whose maxTimestamp >= `ts`,
    /// as (base offset clamped to the log start, batch maxTimestamp). Batch
    /// granularity: Kafka returns the exact record, which may be later in the
    /// same batch. `-2` (earliest) and `-1` (latest) give the log start / end
    /// with timestamp -1.
    pub fn offset_for_timestamp(&self, ts: i64) -> Result<Option<(i64, i64)>, LogError> {
        self.check_live()?;
        match ts {
            -2 => return Ok(Some((self.log_start_offset, -1))),
            -1 => return Ok(Some((self.log_end_offset, -1))),
            _ => {}
        }
        for seg in self.segments.values() {
            if seg.max_timestamp() < ts || seg.next_offset() <= self.log_start_offset {
                continue;
            }
            if let Some(h) = seg.find_by_timestamp(ts, self.log_start_offset)? {
                return Ok(Some((h.base_offset.max(self.log_start_offset), h.max_timestamp)));
            }
        }
        Ok(None)
    }

    /// The base offset of the segment the last roll started, once: where the replica layer
    /// writes a producer-state snapshot (its state then covers exactly the offsets below).
    pub fn take_rolled_at(&mut self) -> Option<i64> {
        self.rolled_at.take()
    }

    /// Headers of the batches written by idempotent or transactional producers from `offset`
    /// on, oldest first, for rebuilding producer state above a snapshot; with each transaction
    /// marker, what it says.
    pub fn producer_batches_from(
        &self,
        offset: i64,
    ) -> Result<Vec<(BatchHeader, Option<batch::EndTxnMarker>)>, LogError> {
        use std::os::unix::fs::FileExt;
        self.check_live()?;
        let mut out = Vec::new();
        // A snapshot at the log end (every clean start) needs no read at all.
        if offset >= self.log_end_offset() {
            return Ok(out);
        }
        let first = self.segments.range(..=offset).next_back().map(|(b, _)| *b).unwrap_or(i64::MIN);
        for seg in self.segments.range(first..).map(|(_, s)| s) {
            // The offset index finds where `offset` starts in its segment (a lower bound).
            let from = if seg.base_offset() == first { u64::from(seg.offset_index().lookup(offset).1) } else { 0 };
            let mut sc = seg.scanner(from, 64 * 1024);
            while let Some((pos, h)) = sc.next_header()? {
                if h.producer_id < 0 || h.base_offset < self.log_start_offset || h.base_offset < offset {
                    continue;
                }
                if h.is_control() {
                    // A marker is one small record: read it to learn which way it went and which
                    // coordinator epoch wrote it.
                    let mut buf = vec![0u8; h.total_size().min(HEADER_SIZE + 64)];
                    seg.log_file().read_exact_at(&mut buf, pos)?;
                    out.push((h, batch::end_txn_marker(&buf)));
                } else if h.base_sequence >= 0 || h.is_transactional() {
                    out.push((h, None));
                }
            }
        }
        Ok(out)
    }

    /// The base of the first segment whose `.txnindex` is damaged: torn, of an unknown
    /// version, or holding an entry that is not this segment's. Its entries (and everything
    /// after) can only be trusted again once rebuilt from the log.
    pub fn first_damaged_txn_index(&self) -> Option<i64> {
        let bases: Vec<i64> = self.segments.keys().copied().collect();
        for (i, &base) in bases.iter().enumerate() {
            let upper = bases.get(i + 1).copied().unwrap_or(i64::MAX);
            let bytes = match fs::read(txn_index_file_path(&self.dir, base)) {
                Ok(b) => b,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(_) => return Some(base),
            };
            if bytes.len() % TXN_INDEX_ENTRY_SIZE != 0 {
                return Some(base);
            }
            let mut prev_last = i64::MIN;
            for e in bytes.chunks_exact(TXN_INDEX_ENTRY_SIZE) {
                let a = decode_txn_entry(e);
                let version = i16::from_be_bytes([e[0], e[1]]);
                if version != 0
                    || a.last_offset < base
                    || a.last_offset >= upper
                    || a.first_offset > a.last_offset
                    || a.last_offset < prev_last
                {
                    return Some(base);
                }
                prev_last = a.last_offset;
            }
        }
        None
    }

    /// Makes the `.txnindex` files from the segment holding `from` on list exactly the
    /// aborted transactions a rescan of the log from `from` found (`found`, in marker order),
    /// keeping the entries below `from`: a file that is missing, torn, or lists aborts the log
    /// no longer holds (a truncation, a recovery cut) is rewritten. Files that already agree
    /// are left alone, so a normal start writes nothing.
    pub fn sync_aborted_txns(&mut self, from: i64, found: &[AbortedTxn]) -> Result<(), LogError> {
        self.check_live()?;
        let first = self.segments.range(..=from).next_back().map(|(b, _)| *b).unwrap_or(i64::MIN);
        let bases: Vec<i64> = self.segments.range(first..).map(|(b, _)| *b).collect();
        for (i, &base) in bases.iter().enumerate() {
            let upper = bases.get(i + 1).copied().unwrap_or(i64::MAX);
            let path = txn_index_file_path(&self.dir, base);
            let existing = match fs::read(&path) {
                Ok(b) => b,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
                Err(e) => return Err(e.into()),
            };
            let old: Vec<AbortedTxn> = existing.chunks_exact(TXN_INDEX_ENTRY_SIZE).map(decode_txn_entry).collect();
            let mut want: Vec<AbortedTxn> = old.iter().filter(|a| a.last_offset < from).copied().collect();
            for f in found.iter().filter(|a| a.last_offset >= base && a.last_offset < upper) {
                // The stable offset recorded when the abort happened is kept: a rescan cannot
                // know the high watermark of that moment.
                let same = old.iter().find(|o| {
                    (o.producer_id, o.first_offset, o.last_offset) == (f.producer_id, f.first_offset, f.last_offset)
                });
                want.push(*same.unwrap_or(f));
            }
            let mut bytes = Vec::with_capacity(want.len() * TXN_INDEX_ENTRY_SIZE);
            for a in &want {
                bytes.extend_from_slice(&encode_txn_entry(a));
            }
            if bytes == existing {
                continue;
            }
            tracing::info!(
                dir = %self.dir.display(),
                base,
                entries_before = old.len(),
                entries_after = want.len(),
                "rebuilt the aborted-transaction index from the log"
            );
            if want.is_empty() {
                fs::remove_file(&path)?;
            } else {
                write_atomic(&path, &bytes)?;
            }
        }
        Ok(())
    }

    /// Replication truncation: drops every batch that holds an offset >=
    /// `offset` (whole batches, so the new log end may be below `offset` if
    /// a batch straddled it).
    pub fn truncate_to(&mut self, offset: i64) -> Result<(), LogError> {
        let r = self.truncate_to_unwatched(offset);
        self.watch_io(r)
    }

    fn truncate_to_unwatched(&mut self, offset: i64) -> Result<(), LogError> {
        self.check_live()?;
        if offset >= self.log_end_offset {
            return Ok(());
        }
        if offset <= self.first_segment_base() {
            return self.truncate_fully_and_start_at(offset.max(0));
        }
        self.note_truncation(offset);
        let doomed: Vec<i64> = self.segments.range(offset..).map(|(k, _)| *k).collect();
        for b in doomed {
            if let Some(seg) = self.segments.remove(&b) {
                seg.delete_files()?;
            }
        }
        let removed = {
            let a = self.active()?;
            let r = a.truncate_to(offset)?;
            a.ensure_active()?;
            r
        };
        tracing::info!(dir = %self.dir.display(), offset, bytes = removed, "log truncated");
        self.refresh_end_offset();
        self.trim_txn_index()?;
        self.recovery_point = self.recovery_point.min(self.log_end_offset);
        self.log_start_offset = self.log_start_offset.min(self.log_end_offset);
        self.publish_stats();
        Ok(())
    }

    /// Drops the active segment's `.txnindex` entries whose markers are no longer in the log
    /// (later segments' files went with them).
    fn trim_txn_index(&mut self) -> Result<(), LogError> {
        let Some(base) = self.segments.keys().next_back().copied() else { return Ok(()) };
        let path = txn_index_file_path(&self.dir, base);
        let bytes = match fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        let end = self.log_end_offset;
        let keep: Vec<u8> = bytes
            .chunks_exact(TXN_INDEX_ENTRY_SIZE)
            .filter(|e| decode_txn_entry(e).last_offset < end)
            .flatten()
            .copied()
            .collect();
        if keep.len() == bytes.len() {
            return Ok(());
        }
        if keep.is_empty() {
            fs::remove_file(&path)?;
        } else {
            write_atomic(&path, &keep)?;
        }
        Ok(())
    }

    /// Drops the whole log and restarts it empty at `offset` (a follower whose leader no
    /// longer has its offsets).
    pub fn truncate_fully_and_start_at(&mut self, offset: i64) -> Result<(), LogError> {
        self.check_live()?;
        let r = self.truncate_fully_unwatched(offset);
        self.watch_io(r)
    }

    fn truncate_fully_unwatched(&mut self, offset: i64) -> Result<(), LogError> {
        self.note_truncation(i64::MIN);
        let all = std::mem::take(&mut self.segments);
        for (_, seg) in all {
            seg.delete_files()?;
        }
        let seg = LogSegment::create(&self.dir, offset, &self.config, now_ms())?;
        self.segments.insert(offset, seg);
        self.log_start_offset = offset;
        self.log_end_offset = offset;
        self.recovery_point = offset;
        self.publish_stats();
        sync_dir(&self.dir)?;
        Ok(())
    }

    /// DeleteRecords: moves the log start offset to `offset` (<= log end)
    /// and deletes whole segments below it (never the active one). Returns
    /// the new log start offset.
    pub fn delete_records_before(&mut self, offset: i64) -> Result<i64, LogError> {
        self.check_live()?;
        if offset > self.log_end_offset || offset < 0 {
            return Err(LogError::OffsetOutOfRange {
                offset,
                log_start_offset: self.log_start_offset,
                log_end_offset: self.log_end_offset,
            });
        }
        if offset <= self.log_start_offset {
            return Ok(self.log_start_offset);
        }
        self.log_start_offset = offset;
        let bases: Vec<i64> = self.segments.keys().copied().collect();
        let mut n = 0;
        for w in bases.windows(2) {
            if w[1] <= offset {
                n += 1;
            } else {
                break;
            }
        }
        let deleted = self.delete_oldest(n);
        self.publish_stats();
        deleted?;
        Ok(self.log_start_offset)
    }

    /// Deletes the `n` oldest segments. If that includes the active segment,
    /// a new empty one is rolled first so the log always has one.
    fn delete_oldest(&mut self, n: usize) -> Result<usize, LogError> {
        if n == 0 {
            return Ok(0);
        }
        if n >= self.segments.len() {
            let leo = self.log_end_offset;
            self.roll(leo)?;
        }
        // The roll is a no-op when the active segment is already empty at
        // the log end; that one must survive.
        let n = n.min(self.segments.len().saturating_sub(1));
        let doomed: Vec<i64> = self.segments.keys().take(n).copied().collect();
        for b in &doomed {
            if let Some(seg) = self.segments.remove(b) {
                seg.delete_files()?;
            }
        }
        self.log_start_offset = self.log_start_offset.max(self.first_segment_base());
        Ok(doomed.len())
    }

    /// retention.ms then retention.bytes, oldest segments first, whole
    /// segments only. An expired non-empty active segment is rolled and
    /// deleted like Kafka does; an empty active segment is never deleted.
    /// Returns the number of segments deleted.
    pub fn enforce_retention(&mut self, now_ms: i64) -> Result<usize, LogError> {
        self.check_live()?;
        let mut deleted = 0;
        // A compact-only log (__consumer_offsets, changelogs) is never shortened by age or
        // size: the cleaner alone decides what goes.
        if !self.config.delete {
            self.publish_stats();
            return Ok(0);
        }
        if self.config.retention_ms >= 0 {
            let limit = self.config.retention_ms;
            let active_base = self.segments.keys().next_back().copied();
            // Cleaning can leave an inactive segment empty; only the active one must stay.
            let n = self
                .segments
                .values()
                .take_while(|s| {
                    (!s.is_empty() || Some(s.base_offset()) != active_base)
                        && now_ms.saturating_sub(s.largest_timestamp()) > limit
                })
                .count();
            deleted += self.delete_oldest(n)?;
        }
        if self.config.retention_bytes >= 0 {
            let mut diff = self.size_bytes() as i64 - self.config.retention_bytes;
            let mut n = 0;
            let active_base = self.segments.keys().next_back().copied();
            for s in self.segments.values() {
                if (s.is_empty() && Some(s.base_offset()) == active_base) || diff - (s.size() as i64) < 0 {
                    break;
                }
                diff -= s.size() as i64;
                n += 1;
            }
            deleted += self.delete_oldest(n)?;
        }
        self.publish_stats();
        if deleted > 0 {
            tracing::info!(dir = %self.dir.display(), segments = deleted, log_start = self.log_start_offset, "retention deleted segments");
        }
        Ok(deleted)
    }

    /// fsyncs every segment holding data at or above the recovery point
    /// (data and both indexes) and advances the recovery point to the log end.
    pub fn flush(&mut self) -> Result<(), LogError> {
        let r = self.flush_unwatched();
        self.watch_io(r)
    }

    fn flush_unwatched(&mut self) -> Result<(), LogError> {
        self.check_live()?;
        let rp = self.recovery_point;
        let from = self.segments.range(..=rp).next_back().map(|(k, _)| *k).unwrap_or(i64::MIN);
        for seg in self.segments.range(from..).map(|(_, s)| s) {
            seg.flush()?;
        }
        self.recovery_point = self.log_end_offset;
        self.unflushed_messages = 0;
        self.last_flush_ms = now_ms();
        Ok(())
    }

    /// Whether appending `len` bytes holding `records` records at `now_ms` could do more than
    /// write to the page cache: roll the segment (fsync, new files, a producer snapshot) or
    /// fsync for flush.messages or flush.ms. Errs towards yes.
    pub fn append_may_block(&self, len: usize, records: u64, now_ms: i64) -> bool {
        let Some(active) = self.segments.values().next_back() else { return true };
        let by_count = self.unflushed_messages.saturating_add(records) >= self.config.flush_interval_messages;
        let by_time = self.config.flush_interval_ms != u64::MAX
            && now_ms.saturating_sub(self.last_flush_ms) >= self.config.flush_interval_ms.min(i64::MAX as u64) as i64;
        by_count || by_time || active.may_roll(&self.config, len, now_ms)
    }

    /// Flushes when flush.messages or flush.ms says so. Returns whether it did.
    pub fn maybe_flush(&mut self, now_ms: i64) -> Result<bool, LogError> {
        let by_count = self.unflushed_messages > 0 && self.unflushed_messages >= self.config.flush_interval_messages;
        let by_time = self.config.flush_interval_ms != u64::MAX
            && self.recovery_point < self.log_end_offset
            && now_ms.saturating_sub(self.last_flush_ms) >= self.config.flush_interval_ms.min(i64::MAX as u64) as i64;
        if by_count || by_time {
            self.flush()?;
            return Ok(true);
        }
        Ok(false)
    }

    /// Records the active segment's max timestamp in its time index, trims
    /// the indexes and fsyncs everything. The log stays usable (the next
    /// append re-grows the indexes).
    pub fn close(&mut self) -> Result<(), LogError> {
        if self.deleted {
            return Ok(());
        }
        self.active()?.make_inactive()?;
        let from = self.segments.range(..=self.recovery_point).next_back().map(|(k, _)| *k).unwrap_or(i64::MIN);
        for seg in self.segments.range(from..).map(|(_, s)| s) {
            seg.flush()?;
        }
        // The trim changed the active index files' length.
        if let Some(a) = self.segments.values().next_back() {
            a.flush()?;
        }
        self.recovery_point = self.log_end_offset;
        self.unflushed_messages = 0;
        Ok(())
    }

    fn note_truncation(&mut self, offset: i64) {
        self.truncated_to = Some(self.truncated_to.map_or(offset, |t| t.min(offset)));
    }

    /// The lowest offset truncated to since the last call (`i64::MIN`: the whole log went),
    /// and forgets it: what a log dir move's copy must drop from its own end.
    pub fn take_truncation_mark(&mut self) -> Option<i64> {
        self.truncated_to.take()
    }

    pub fn truncation_mark(&self) -> Option<i64> {
        self.truncated_to
    }

    /// The partition directory was renamed to `dir` as a whole (a log dir move): every path
    /// follows, nothing on disk is touched.
    pub fn moved_to(&mut self, dir: PathBuf) {
        for seg in self.segments.values_mut() {
            seg.moved_to(&dir);
        }
        self.dir = dir;
    }

    /// Takes over what the replica layer and the cleaner share with `current`, the log this one
    /// replaces (a log dir move): the statistics, the high watermark cell, the topic's config.
    pub fn adopt_shared_state(&mut self, current: &Log) {
        self.stats = current.stats.clone();
        self.high_watermark = current.high_watermark.clone();
        self.first_unstable_offset = current.first_unstable_offset.clone();
        self.latest_delete_horizon = current.latest_delete_horizon;
        if self.config != current.config {
            self.set_config(current.config.clone());
        }
        self.publish_stats();
    }

    /// This log was replaced by its copy in another log dir and its directory renamed for
    /// deletion: holders of the old handle get `StorageUnavailable`. Its shared statistics
    /// are the replacement's now, so they are left alone.
    pub fn forget_moved_away(&mut self) {
        self.deleted = true;
        self.segments.clear();
    }

    /// Removes the partition directory (topic deletion).
    pub fn delete(mut self) -> Result<(), LogError> {
        self.delete_in_place()
    }

    /// Like `delete` for a log shared behind a lock: the directory is
    /// renamed to `<name>.<nanos>-delete` (so a crash mid-way leaves a dir
    /// the manager cleans up, not a half-deleted partition) and removed;
    /// later calls on this `Log` fail with `StorageUnavailable`.
    pub fn delete_in_place(&mut self) -> Result<(), LogError> {
        if self.deleted {
            return Ok(());
        }
        self.deleted = true;
        self.segments.clear();
        self.publish_stats();
        let name = self.dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let nanos =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
        let doomed = self.dir.with_file_name(format!("{name}.{nanos:x}-delete"));
        let target = match fs::rename(&self.dir, &doomed) {
            Ok(()) => doomed,
            Err(_) => self.dir.clone(),
        };
        match fs::remove_dir_all(&target) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
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
        assert_eq!(
            log.read(7, 100, None).unwrap_err().kafka_code(),
            crate::protocol::ErrorCode::OffsetOutOfRange.code()
        );
        assert_eq!(
            log.read(-1, 100, None).unwrap_err().kafka_code(),
            crate::protocol::ErrorCode::OffsetOutOfRange.code()
        );
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
        assert_eq!(
            log.append(&mut two, 0).unwrap_err().kafka_code(),
            crate::protocol::ErrorCode::CorruptMessage.code()
        );
        assert_eq!(two, before, "buffer untouched when validation fails");
        assert_eq!(log.log_end_offset(), 1);
        assert_eq!(log.size_bytes() as usize, good.len());
        let mut big = simple_batch(1, 2_000_000, 1);
        assert_eq!(
            log.append(&mut big, 0).unwrap_err().kafka_code(),
            crate::protocol::ErrorCode::MessageTooLarge.code()
        );
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
        assert_eq!(
            names,
            vec!["00000000000000000000.index", "00000000000000000000.log", "00000000000000000000.timeindex"]
        );
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
        let (o, p) = idx.entry(0);
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
            let mut sc = seg.scanner(0, 4096);
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
        let mut sc = seg.scanner(0, 4096);
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
        assert_eq!(
            log.read(1, 100, None).unwrap_err().kafka_code(),
            crate::protocol::ErrorCode::OffsetOutOfRange.code()
        );
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
        assert_eq!(
            log.read(0, 10, None).unwrap_err().kafka_code(),
            crate::protocol::ErrorCode::OffsetOutOfRange.code()
        );
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
}
