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

use super::batch::{self, BatchHeader, HEADER_SIZE, OFF_BASE_OFFSET, OFF_LEADER_EPOCH};
use super::checkpoint::sync_dir;
use super::segment::LogSegment;
use super::{index_file_path, log_file_path, now_ms, time_index_file_path, AppendInfo, FileRange, LogConfig, LogError};

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
}

/// Kafka's temporary suffixes: leftovers of an interrupted delete, compaction
/// or checkpoint write. Nothing here produces `.cleaned`/`.swap`, so they are
/// simply removed.
const TEMP_SUFFIXES: [&str; 4] = [".deleted", ".cleaned", ".swap", ".tmp"];

fn parse_segment_name(name: &str, ext: &str) -> Option<i64> {
    let stem = name.strip_suffix(ext)?;
    if stem.len() != 20 || !stem.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    stem.parse().ok()
}

fn remove_segment_files(dir: &Path, base: i64) {
    for p in [log_file_path(dir, base), index_file_path(dir, base), time_index_file_path(dir, base)] {
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
        for entry in fs::read_dir(&dir)? {
            let entry = entry?;
            let name = match entry.file_name().into_string() {
                Ok(n) => n,
                Err(_) => continue,
            };
            if TEMP_SUFFIXES.iter().any(|s| name.ends_with(s)) {
                if let Err(e) = fs::remove_file(entry.path()) {
                    tracing::warn!(file = %entry.path().display(), error = %e, "could not remove temporary file");
                }
                continue;
            }
            if let Some(b) = parse_segment_name(&name, ".log") {
                bases.push(b);
            } else if let Some(b) =
                parse_segment_name(&name, ".index").or_else(|| parse_segment_name(&name, ".timeindex"))
            {
                index_bases.push(b);
            }
        }
        bases.sort_unstable();
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
        Ok(log)
    }

    fn refresh_end_offset(&mut self) {
        self.log_end_offset = self.segments.values().next_back().map(|s| s.next_offset()).unwrap_or(0);
    }

    fn check_live(&self) -> Result<(), LogError> {
        if self.deleted {
            return Err(LogError::StorageUnavailable(format!("log {} was deleted", self.dir.display())));
        }
        Ok(())
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
        let mut headers = batch::validate_batches(records, self.config.max_message_bytes)?;
        let mut next = self.log_end_offset;
        let mut pos = 0usize;
        for h in headers.iter_mut() {
            records[pos + OFF_BASE_OFFSET..pos + OFF_BASE_OFFSET + 8].copy_from_slice(&next.to_be_bytes());
            records[pos + OFF_LEADER_EPOCH..pos + OFF_LEADER_EPOCH + 4].copy_from_slice(&leader_epoch.to_be_bytes());
            h.base_offset = next;
            h.partition_leader_epoch = leader_epoch;
            next = h.next_offset();
            pos += h.total_size();
        }
        self.append_validated(records, &headers, now_ms())
    }

    /// Follower append: batches keep their offsets, which must start at or
    /// after the log end and increase.
    pub fn append_as_follower(&mut self, records: &mut [u8]) -> Result<AppendInfo, LogError> {
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
        let (first, last) = match (headers.first(), headers.last()) {
            (Some(f), Some(l)) => (f.base_offset, l.last_offset()),
            _ => {
                return Ok(AppendInfo {
                    first_offset: self.log_end_offset,
                    last_offset: self.log_end_offset - 1,
                    max_timestamp: -1,
                    offset_of_max_timestamp: -1,
                    record_count: 0,
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
        if self.active()?.should_roll(&config, records.len(), first, last, max_ts, now) {
            self.roll(first)?;
        }
        self.active()?.append(records, headers)?;
        self.log_end_offset = last + 1;
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
        })
    }

    /// Starts a new active segment at `new_base` (>= log end). The old one
    /// is trimmed and fsynced here, synchronously, which is what lets the
    /// recovery point advance without a flush policy.
    pub fn roll(&mut self, new_base: i64) -> Result<(), LogError> {
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
        sync_dir(&self.dir)?;
        self.log_start_offset = self.log_start_offset.max(self.first_segment_base());
        Ok(())
    }

    /// Whole batches starting at the batch containing `offset`: at least one
    /// batch even if larger than `max_bytes`, then as many as fit, never one
    /// whose base offset is >= `max_offset` (the high watermark). May span
    /// segments (one `FileRange` per segment). `offset == log end` gives an
    /// empty result; outside `[log_start, log_end]` is `OffsetOutOfRange`.
    pub fn read(&self, offset: i64, max_bytes: usize, max_offset: Option<i64>) -> Result<Vec<FileRange>, LogError> {
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
                out.push(FileRange { file: seg.log_file().clone(), position, len });
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

    /// Replication truncation: drops every batch that holds an offset >=
    /// `offset` (whole batches, so the new log end may be below `offset` if
    /// a batch straddled it).
    pub fn truncate_to(&mut self, offset: i64) -> Result<(), LogError> {
        self.check_live()?;
        if offset >= self.log_end_offset {
            return Ok(());
        }
        if offset <= self.first_segment_base() {
            return self.truncate_fully_and_start_at(offset.max(0));
        }
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
        self.recovery_point = self.recovery_point.min(self.log_end_offset);
        self.log_start_offset = self.log_start_offset.min(self.log_end_offset);
        Ok(())
    }

    fn truncate_fully_and_start_at(&mut self, offset: i64) -> Result<(), LogError> {
        let all = std::mem::take(&mut self.segments);
        for (_, seg) in all {
            seg.delete_files()?;
        }
        let seg = LogSegment::create(&self.dir, offset, &self.config, now_ms())?;
        self.segments.insert(offset, seg);
        sync_dir(&self.dir)?;
        self.log_start_offset = offset;
        self.log_end_offset = offset;
        self.recovery_point = offset;
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
        self.delete_oldest(n)?;
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
        if self.config.retention_ms >= 0 {
            let limit = self.config.retention_ms;
            let n = self
                .segments
                .values()
                .take_while(|s| !s.is_empty() && now_ms.saturating_sub(s.largest_timestamp()) > limit)
                .count();
            deleted += self.delete_oldest(n)?;
        }
        if self.config.retention_bytes >= 0 {
            let mut diff = self.size_bytes() as i64 - self.config.retention_bytes;
            let mut n = 0;
            for s in self.segments.values() {
                if s.is_empty() || diff - (s.size() as i64) < 0 {
                    break;
                }
                diff -= s.size() as i64;
                n += 1;
            }
            deleted += self.delete_oldest(n)?;
        }
        if deleted > 0 {
            tracing::info!(dir = %self.dir.display(), segments = deleted, log_start = self.log_start_offset, "retention deleted segments");
        }
        Ok(deleted)
    }

    /// fsyncs every segment holding data at or above the recovery point
    /// (data and both indexes) and advances the recovery point to the log end.
    pub fn flush(&mut self) -> Result<(), LogError> {
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
