//! Removing from either end: truncation (a follower's divergent suffix), DeleteRecords and
//! retention, each keeping the log's invariants.

use super::*;

impl Log {
    /// Replication truncation: drops every batch that holds an offset >=
    /// `offset` (whole batches, so the new log end may be below `offset` if
    /// a batch straddled it).
    pub fn truncate_to(&mut self, offset: i64) -> Result<(), LogError> {
        let r = self.truncate_to_unwatched(offset);
        self.watch_io(r)
    }

    pub(super) fn truncate_to_unwatched(&mut self, offset: i64) -> Result<(), LogError> {
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

    /// Drops the whole log and restarts it empty at `offset` (a follower whose leader no
    /// longer has its offsets).
    pub fn truncate_fully_and_start_at(&mut self, offset: i64) -> Result<(), LogError> {
        self.check_live()?;
        let r = self.truncate_fully_unwatched(offset);
        self.watch_io(r)
    }

    pub(super) fn truncate_fully_unwatched(&mut self, offset: i64) -> Result<(), LogError> {
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
    pub(super) fn delete_oldest(&mut self, n: usize) -> Result<usize, LogError> {
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

    pub(super) fn note_truncation(&mut self, offset: i64) {
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
}
