//! What the cleaner sees of a log and how its output replaces segments: a view of the
//! cleanable segments, the swap of cleaned segments in, and the delete horizon.

use super::*;

impl Log {
    /// A snapshot for the log cleaner (cheap: no I/O).
    pub fn cleaner_view(&self) -> Result<CleanerView, LogError> {
        self.check_live()?;
        let view = |s: &LogSegment| SegmentView {
            base_offset: s.base_offset(),
            id: s.id(),
            path: s.log_path().to_path_buf(),
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
                    && self.segments.get(&o.base_offset).is_some_and(|s| s.id() == o.id && s.size() == o.size)
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
        crate::log::cleaner::crash_point("swap");
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
}
