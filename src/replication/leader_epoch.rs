//! The leader epoch cache of one partition (Kafka's `LeaderEpochFileCache`): for each leader
//! epoch, the first offset written in it, kept in `leader-epoch-checkpoint` in Kafka's
//! checkpoint format. It answers "where does epoch E end?", which is how a returning replica
//! finds the point where its log diverged from the leader's and truncates there (KIP-101).

use std::io::Write;
use std::path::{Path, PathBuf};

pub const FILE_NAME: &str = "leader-epoch-checkpoint";

#[derive(Debug)]
pub struct LeaderEpochCache {
    path: PathBuf,
    /// (epoch, start offset), both strictly increasing.
    entries: Vec<(i32, i64)>,
    /// Written but not yet fsynced: see [`sync_checkpoint`].
    unsynced: bool,
}

impl LeaderEpochCache {
    /// Loads the checkpoint; a missing or unreadable file gives an empty cache (the cache is
    /// then rebuilt from the epochs stamped in batches as they are appended).
    pub fn load(dir: &Path) -> LeaderEpochCache {
        let path = dir.join(FILE_NAME);
        let entries = std::fs::read_to_string(&path).ok().and_then(|t| parse(&t)).unwrap_or_default();
        LeaderEpochCache { path, entries, unsynced: false }
    }

    /// The partition's log now lives in `dir` (a log dir move): the checkpoint is written
    /// there from now on, at once in full.
    pub fn relocate(&mut self, dir: &Path) {
        self.path = dir.join(FILE_NAME);
        self.persist();
    }

    pub fn latest_epoch(&self) -> Option<i32> {
        self.entries.last().map(|e| e.0)
    }

    pub fn entries(&self) -> &[(i32, i64)] {
        &self.entries
    }

    /// Records that `epoch` starts at `start_offset` (ignored unless it is newer than the
    /// latest epoch).
    pub fn assign(&mut self, epoch: i32, start_offset: i64) {
        if epoch < 0 || self.latest_epoch().is_some_and(|e| epoch <= e) {
            return;
        }
        // Epochs in which nothing was written end where the new one starts: drop them, as
        // Kafka does, so start offsets stay strictly increasing.
        self.entries.retain(|&(_, start)| start < start_offset);
        self.entries.push((epoch, start_offset));
        self.persist();
    }

    /// The largest epoch <= `epoch` and the offset where it ends (the next epoch's start, or
    /// `log_end_offset` for the latest), as OffsetForLeaderEpoch answers. (-1, -1) if `epoch`
    /// is older than everything cached.
    pub fn end_offset_for(&self, epoch: i32, log_end_offset: i64) -> (i32, i64) {
        let Some(i) = self.entries.iter().rposition(|&(e, _)| e <= epoch) else {
            // Older than every epoch here: as Kafka answers, the requested epoch ends where
            // the first known one starts. A follower that led at that older epoch learns
            // where to truncate to, instead of hearing "no such epoch" forever.
            return match self.entries.first() {
                Some(&(_, start)) if epoch >= 0 => (epoch, start),
                _ => (-1, -1),
            };
        };
        let end = self.entries.get(i + 1).map(|&(_, start)| start).unwrap_or(log_end_offset);
        (self.entries[i].0, end)
    }

    /// The epoch in which `offset` was written (-1 if before everything cached).
    pub fn epoch_for_offset(&self, offset: i64) -> i32 {
        self.entries.iter().rev().find(|&&(_, start)| start <= offset).map(|&(e, _)| e).unwrap_or(-1)
    }

    /// After the log was truncated to `offset`: drops epochs that start at or after it.
    pub fn truncate_from_end(&mut self, offset: i64) {
        let before = self.entries.len();
        self.entries.retain(|&(_, start)| start < offset);
        if self.entries.len() != before {
            self.persist();
        }
    }

    /// Writes the checkpoint (temp file, rename) without waiting for the disk: a leader
    /// election changes the epoch of every partition it moves, and an fsync each would make
    /// failover of thousands of partitions take minutes (Kafka made the same change,
    /// KAFKA-15046). The file survives a process crash as written; [`sync_checkpoint`]
    /// makes it durable against power loss on the periodic checkpoint and at shutdown.
    fn persist(&mut self) {
        let mut text = format!("0\n{}\n", self.entries.len());
        for (e, o) in &self.entries {
            text.push_str(&format!("{e} {o}\n"));
        }
        let tmp = self.path.with_extension("tmp");
        let written = std::fs::File::create(&tmp)
            .and_then(|mut f| f.write_all(text.as_bytes()))
            .and_then(|_| std::fs::rename(&tmp, &self.path));
        match written {
            Ok(()) => self.unsynced = true,
            // The cache in memory stays right; a restart rebuilds what the file lacks.
            Err(e) => tracing::warn!(path = %self.path.display(), error = %e, "cannot write leader epoch checkpoint"),
        }
    }

    /// The checkpoint's path if a write has not been synced yet, for the caller to fsync with
    /// [`sync_checkpoint`] once it no longer holds the lock around this cache.
    pub fn take_unsynced(&mut self) -> Option<PathBuf> {
        std::mem::take(&mut self.unsynced).then(|| self.path.clone())
    }
}

/// Makes a checkpoint written by [`LeaderEpochCache`] durable (file and directory entry).
pub fn sync_checkpoint(path: &Path) -> std::io::Result<()> {
    std::fs::File::open(path)?.sync_all()?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

fn parse(text: &str) -> Option<Vec<(i32, i64)>> {
    let mut lines = text.lines();
    if lines.next()?.trim() != "0" {
        return None;
    }
    let count: usize = lines.next()?.trim().parse().ok()?;
    let mut out = Vec::with_capacity(count.min(1024));
    for line in lines.take(count) {
        let mut parts = line.split_whitespace();
        let epoch: i32 = parts.next()?.parse().ok()?;
        let offset: i64 = parts.next()?.parse().ok()?;
        if out.last().is_some_and(|&(e, o)| epoch <= e || offset < o) {
            return None;
        }
        out.push((epoch, offset));
    }
    (out.len() == count).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn end_offsets_and_truncation() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = LeaderEpochCache::load(dir.path());
        assert_eq!(c.end_offset_for(0, 10), (-1, -1));
        c.assign(0, 0);
        c.assign(2, 50);
        c.assign(1, 60); // older epoch: ignored
        c.assign(5, 80);
        assert_eq!(c.end_offset_for(0, 100), (0, 50));
        assert_eq!(c.end_offset_for(1, 100), (0, 50));
        assert_eq!(c.end_offset_for(2, 100), (2, 80));
        assert_eq!(c.end_offset_for(9, 100), (5, 100));
        let later_dir = tempfile::tempdir().unwrap();
        let mut later = LeaderEpochCache::load(later_dir.path());
        later.assign(3, 40);
        assert_eq!(later.end_offset_for(1, 100), (1, 40));
        assert_eq!(later.end_offset_for(-1, 100), (-1, -1));
        let text = std::fs::read_to_string(dir.path().join(FILE_NAME)).unwrap();
        assert_eq!(text, "0\n3\n0 0\n2 50\n5 80\n");
        c.truncate_from_end(60);
        assert_eq!(c.entries(), &[(0, 0), (2, 50)]);
        let back = LeaderEpochCache::load(dir.path());
        assert_eq!(back.entries(), &[(0, 0), (2, 50)]);
    }

    #[test]
    fn garbage_file_is_ignored() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(FILE_NAME), "0\n2\n5 10\n3 20\n").unwrap();
        assert!(LeaderEpochCache::load(dir.path()).entries().is_empty());
    }
}
