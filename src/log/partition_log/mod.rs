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

mod cleaning;
mod recovery;
mod truncation;
mod txn_index;

pub(super) use txn_index::{decode_txn_entry, TXN_INDEX_ENTRY_SIZE};

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
/// The file is opened when the cleaner reads it (through the segment file cache, outside the
/// log lock); a segment deleted meanwhile fails that pass, and `id` and `size` identify the
/// segment when the cleaner comes back to swap.
#[derive(Clone, Debug)]
pub struct SegmentView {
    pub base_offset: i64,
    pub id: u64,
    pub path: PathBuf,
    pub size: u64,
    pub next_offset: i64,
    pub largest_timestamp: i64,
    pub first_batch_timestamp: Option<i64>,
    pub index_entries: usize,
}

impl SegmentView {
    /// The segment's `.log` file; hold it for one read pass.
    pub fn file(&self) -> std::io::Result<Arc<std::fs::File>> {
        crate::log::fd_cache::segment_files().get(self.id, &self.path)
    }
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

impl Log {
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
            let mut sc = seg.scanner(start_pos, cap)?;
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
                out.push(FileRange { file: seg.log_file()?, position, len, end_offset });
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
            let from = if seg.base_offset() == first { u64::from(seg.offset_index().lookup(offset)?.1) } else { 0 };
            let mut sc = seg.scanner(from, 64 * 1024)?;
            while let Some((pos, h)) = sc.next_header()? {
                if h.producer_id < 0 || h.base_offset < self.log_start_offset || h.base_offset < offset {
                    continue;
                }
                if h.is_control() {
                    // A marker is one small record: read it to learn which way it went and which
                    // coordinator epoch wrote it.
                    let mut buf = vec![0u8; h.total_size().min(HEADER_SIZE + 64)];
                    seg.log_file()?.read_exact_at(&mut buf, pos)?;
                    out.push((h, batch::end_txn_marker(&buf)));
                } else if h.base_sequence >= 0 || h.is_transactional() {
                    out.push((h, None));
                }
            }
        }
        Ok(out)
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
        self.close_unsynced()?;
        let from = self.segments.range(..=self.recovery_point).next_back().map(|(k, _)| *k).unwrap_or(i64::MIN);
        for seg in self.segments.range(from..).map(|(_, s)| s) {
            seg.flush()?;
        }
        // The trim changed the active index files' length.
        if let Some(a) = self.segments.values().next_back() {
            a.flush()?;
        }
        self.mark_synced();
        Ok(())
    }

    /// [`Log::close`] without the fsyncs: for a caller that makes the whole log dir durable
    /// at once (one syncfs at shutdown instead of three fsyncs per partition) and then calls
    /// [`Log::mark_synced`].
    pub fn close_unsynced(&mut self) -> Result<(), LogError> {
        if self.deleted {
            return Ok(());
        }
        self.active()?.make_inactive()
    }

    /// Everything written so far is durable (the caller synced it): the recovery point moves
    /// to the log end.
    pub fn mark_synced(&mut self) {
        self.recovery_point = self.log_end_offset;
        self.unflushed_messages = 0;
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
mod tests;
