//! Kafka's `LogDirFailureChannel` (KIP-112): a log that meets an I/O error (ENOSPC, EIO)
//! reports its log dir here. From that moment the dir is offline: every log in it refuses
//! reads and writes with `StorageUnavailable` (KAFKA_STORAGE_ERROR), so nothing more is
//! written to a disk that already failed a write. The handler (the replica manager's) takes
//! the dir from the queue later, outside any log lock, stops serving its partitions and tells
//! the controller. Reporting never blocks: it sets a flag and queues the dir under a lock
//! held only for the push.
//!
//! A dir offline at runtime stays offline until the broker restarts, as in Kafka.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use crate::sync::MutexExt;

pub struct LogDirFailureChannel {
    offline: Vec<AtomicBool>,
    /// Dirs gone offline and not yet taken by the handler.
    pending: Mutex<Vec<usize>>,
    /// A stored permit wakes the handler even if the report came before it waited.
    wake: Notify,
}

impl LogDirFailureChannel {
    /// One slot per log dir; those in `offline_at_start` could not be loaded and are offline
    /// without being reported (there is nothing of theirs to stop serving).
    pub fn new(dirs: usize, offline_at_start: &[usize]) -> LogDirFailureChannel {
        let offline = (0..dirs).map(|i| AtomicBool::new(offline_at_start.contains(&i))).collect();
        LogDirFailureChannel { offline, pending: Mutex::new(Vec::new()), wake: Notify::new() }
    }

    pub fn is_offline(&self, dir: usize) -> bool {
        self.offline.get(dir).is_none_or(|o| o.load(Ordering::Acquire))
    }

    /// Marks `dir` offline. Returns true for the first report of the dir, which queues it for
    /// the handler; later reports only log.
    pub fn report(&self, dir: usize, error: &dyn std::fmt::Display) -> bool {
        let Some(flag) = self.offline.get(dir) else { return false };
        if flag.swap(true, Ordering::AcqRel) {
            tracing::debug!(dir, %error, "another I/O error in an offline log dir");
            return false;
        }
        tracing::error!(dir, %error, "I/O error in a log dir; taking it offline");
        self.pending.lock_unpoisoned().push(dir);
        self.wake.notify_one();
        true
    }

    /// The dirs reported since the last call.
    pub fn take(&self) -> Vec<usize> {
        std::mem::take(&mut *self.pending.lock_unpoisoned())
    }

    /// Completes once a dir was reported since the last wait (or before the first).
    pub async fn reported(&self) {
        self.wake.notified().await
    }
}

/// Whether an I/O error is the disk's: one a system call returned, or a write that made no
/// progress. The ones the log module makes up (a segment that already exists, batches that do
/// not match their headers) are its own inconsistencies and leave the dir online.
pub fn is_disk_failure(e: &std::io::Error) -> bool {
    e.raw_os_error().is_some() || e.kind() == std::io::ErrorKind::WriteZero
}

/// What a log holds to learn whether its dir is offline and to report an I/O error in it.
#[derive(Clone)]
pub struct DirHealth {
    dir: usize,
    channel: Arc<LogDirFailureChannel>,
}

impl DirHealth {
    pub fn new(dir: usize, channel: Arc<LogDirFailureChannel>) -> DirHealth {
        DirHealth { dir, channel }
    }
    pub fn is_offline(&self) -> bool {
        self.channel.is_offline(self.dir)
    }
    pub fn report(&self, error: &dyn std::fmt::Display) {
        self.channel.report(self.dir, error);
    }
}

impl std::fmt::Debug for DirHealth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirHealth").field("dir", &self.dir).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dir_is_queued_once_and_stays_offline() {
        let ch = LogDirFailureChannel::new(3, &[2]);
        assert!(!ch.is_offline(0) && !ch.is_offline(1) && ch.is_offline(2));
        assert!(ch.report(1, &"No space left on device"));
        assert!(!ch.report(1, &"again"));
        assert!(ch.is_offline(1) && !ch.is_offline(0));
        assert_eq!(ch.take(), vec![1]);
        assert!(ch.take().is_empty());
        // Out of range is never online.
        assert!(ch.is_offline(7));
    }
}
