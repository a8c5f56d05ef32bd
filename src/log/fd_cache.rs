//! The open `.log` files of every segment in the process, bounded
//! (`gregor.log.segment.fd.cache.size`).
//!
//! A segment holds no descriptor of its own: it asks this cache for its file each time it
//! reads, writes or hands a range to a fetch, and the cache reopens it by path after an
//! eviction. The least recently used files are closed once more than the cache's capacity are
//! open, so a broker's descriptors are bounded by the capacity, its sockets, and the handles in
//! use at that moment, whatever its replica and segment counts. A caller gets an `Arc<File>`:
//! an eviction drops only the cache's reference, so a sendfile or a cleaner pass that holds the
//! file keeps reading it, and the descriptor closes when the last holder lets go.
//!
//! One cache per process, like the descriptor table it stands guard over. Entries are keyed by
//! segment id (given out once per `LogSegment`), not path: a segment's files are renamed (the
//! cleaner's `.cleaned`/`.swap`, a log dir move) while the open file stays valid, and a new
//! segment at an old path (after a truncation) must never be served the old one's file.
//!
//! The lock is held for map updates only: an open() (a miss) and a close() (an eviction) run
//! outside it, so one slow disk never stalls lookups for the others.

use std::fs::{File, OpenOptions};
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use super::lru::BoundedLru;

/// Default of `gregor.log.segment.fd.cache.size`: a tenth of this machine class's 20,000-file
/// limit would do; this leaves the rest for connections and is still far more than the
/// segments a broker reads or writes at once.
pub const DEFAULT_CAPACITY: usize = 4096;

/// Counters for the metrics endpoint.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SegmentFileStats {
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
    /// Files the cache holds open now (handles still in use after an eviction not counted).
    pub open: u64,
    pub capacity: u64,
}

pub struct SegmentFileCache {
    lru: BoundedLru<Arc<File>>,
}

impl SegmentFileCache {
    pub fn new(capacity: usize) -> Self {
        SegmentFileCache { lru: BoundedLru::new(capacity) }
    }

    /// Sets the bound (at start, from the config), closing what no longer fits.
    pub fn set_capacity(&self, capacity: usize) {
        self.lru.set_capacity(capacity);
    }

    /// Segment `id`'s file, opened (read and write) from `path` if the cache does not hold it.
    pub fn get(&self, id: u64, path: &Path) -> io::Result<Arc<File>> {
        if let Some(f) = self.lru.lock().touch(id) {
            self.lru.hit();
            return Ok(f);
        }
        self.lru.miss();
        let file = OpenOptions::new().read(true).write(true).open(path)?;
        Ok(self.insert(id, file))
    }

    /// Hands the cache a file just opened for segment `id`; returns the handle to use (an
    /// entry another thread put in meanwhile wins, and `file` is closed).
    pub fn insert(&self, id: u64, file: File) -> Arc<File> {
        let capacity = self.lru.capacity();
        let (out, shed) = {
            let mut inner = self.lru.lock();
            if let Some(f) = inner.touch(id) {
                (f, Vec::new())
            } else {
                let file = Arc::new(file);
                let shed = inner.insert(id, file.clone(), capacity);
                (file, shed)
            }
        };
        self.lru.evicted(shed.len());
        drop(shed);
        out
    }

    /// Forgets segment `id` (deleted or dropped): its descriptor closes once no reader holds it.
    pub fn remove(&self, id: u64) {
        let gone = self.lru.lock().remove(id);
        drop(gone);
    }

    /// Whether segment `id`'s file is open in the cache.
    pub fn holds(&self, id: u64) -> bool {
        self.lru.lock().contains(id)
    }

    pub fn stats(&self) -> SegmentFileStats {
        self.lru.stats()
    }
}

/// The process's cache.
pub fn segment_files() -> &'static SegmentFileCache {
    static CACHE: OnceLock<SegmentFileCache> = OnceLock::new();
    CACHE.get_or_init(|| SegmentFileCache::new(DEFAULT_CAPACITY))
}

/// Bounds of the size taken from the open-file limit: below 64 a broker rereads its busiest
/// segments' files over and over; above 10,000 open files buy no speed (only the segments read
/// or written now need one).
const AUTO_MIN: usize = 64;
const AUTO_MAX: usize = 10_000;

/// The cache's size for `gregor.log.segment.fd.cache.size` (None: from the limit) under an
/// open-file limit of `limit` (None: unlimited) less `reserved`. A configured size that does
/// not fit is an error naming the keys: the broker would run out of descriptors for
/// connections and say so only when a client could no longer connect.
pub fn size_for(configured: Option<usize>, reserved: u64, limit: Option<u64>) -> Result<usize, String> {
    let room = limit.map(|l| l.saturating_sub(reserved));
    match (configured, room) {
        (Some(n), Some(room)) if n as u64 > room => Err(format!(
            "gregor.log.segment.fd.cache.size ({n}) plus gregor.open.files.reserved ({reserved}) exceed the \
             open-file limit ({}); lower either or raise the limit (ulimit -n)",
            limit.unwrap_or(0)
        )),
        (Some(n), _) => Ok(n),
        (None, Some(room)) => Ok((room.min(AUTO_MAX as u64) as usize).max(AUTO_MIN)),
        (None, None) => Ok(AUTO_MAX),
    }
}

/// The process's soft open-file limit; None when unlimited or unknown.
pub fn open_file_limit() -> Option<u64> {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes the struct it is given and nothing else.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) };
    (rc == 0 && lim.rlim_cur != libc::RLIM_INFINITY).then_some(lim.rlim_cur)
}

/// Sizes the process's cache at start from the config and the open-file limit.
pub fn configure(configured: Option<usize>, reserved: u64) -> Result<usize, String> {
    let limit = open_file_limit();
    let size = size_for(configured, reserved, limit)?;
    if let Some(l) = limit {
        if (size as u64).saturating_add(reserved) > l {
            // Only a size taken from a very low limit gets here: still run (a broker that
            // refused to start under ulimit -n 256 helps nobody), but say what will pinch.
            tracing::warn!(
                limit = l,
                segment_files = size,
                reserved,
                "open-file limit leaves little for connections: raise ulimit -n or lower gregor.open.files.reserved"
            );
        }
    }
    segment_files().set_capacity(size);
    tracing::info!(size, limit = ?limit, "segment file cache sized (gregor.log.segment.fd.cache.size)");
    Ok(size)
}

/// A fresh segment id: ids are never reused, so an entry left by a dropped segment can never
/// be mistaken for a new one's.
pub fn next_segment_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::fs::FileExt;

    fn files(n: usize) -> (tempfile::TempDir, Vec<std::path::PathBuf>) {
        let d = tempfile::tempdir().unwrap();
        let paths = (0..n)
            .map(|i| {
                let p = d.path().join(format!("{i}.log"));
                File::create(&p).unwrap().write_all(&[i as u8; 4]).unwrap();
                p
            })
            .collect();
        (d, paths)
    }

    fn byte(f: &File) -> u8 {
        let mut b = [0u8; 1];
        f.read_exact_at(&mut b, 0).unwrap();
        b[0]
    }

    #[test]
    fn least_recently_used_is_evicted_and_reopened_on_demand() {
        let (_d, p) = files(3);
        let c = SegmentFileCache::new(2);
        c.get(10, &p[0]).unwrap();
        c.get(11, &p[1]).unwrap();
        c.get(10, &p[0]).unwrap(); // 11 is now the oldest
        c.get(12, &p[2]).unwrap();
        let s = c.stats();
        assert_eq!((s.hits, s.misses, s.evictions, s.open, s.capacity), (1, 3, 1, 2, 2));
        // 10 stayed, 11 went and comes back from its path.
        assert_eq!(byte(&c.get(10, &p[0]).unwrap()), 0);
        assert_eq!(c.stats().hits, 2);
        assert_eq!(byte(&c.get(11, &p[1]).unwrap()), 1);
        let s = c.stats();
        assert_eq!((s.misses, s.evictions, s.open), (4, 2, 2));
    }

    #[test]
    fn a_handle_in_use_survives_eviction() {
        let (d, p) = files(2);
        let c = SegmentFileCache::new(1);
        let held = c.get(1, &p[0]).unwrap();
        c.get(2, &p[1]).unwrap();
        assert_eq!(c.stats().evictions, 1);
        // Even with the file gone from its directory, the holder reads it.
        std::fs::remove_file(&p[0]).unwrap();
        assert_eq!(byte(&held), 0);
        // A miss on the deleted file is an error, not a panic nor a stale handle.
        assert_eq!(c.get(1, &p[0]).unwrap_err().kind(), io::ErrorKind::NotFound);
        drop(d);
    }

    #[test]
    fn a_removed_segment_is_forgotten_and_ids_are_not_paths() {
        let (_d, p) = files(2);
        let c = SegmentFileCache::new(4);
        let a = c.get(1, &p[0]).unwrap();
        c.remove(1);
        assert_eq!(c.stats().open, 0);
        // The same path under a new id is opened afresh, not served the old handle.
        let b = c.get(2, &p[0]).unwrap();
        assert!(!Arc::ptr_eq(&a, &b));
        // A lookup by id ignores the path once cached (the file may have been renamed).
        assert!(Arc::ptr_eq(&b, &c.get(2, &p[1]).unwrap()));
        c.remove(99); // unknown ids are fine
    }

    #[test]
    fn a_segment_takes_its_entry_with_it_when_deleted_or_dropped() {
        use crate::log::{LogConfig, LogSegment};
        let d = tempfile::tempdir().unwrap();
        let c = LogConfig::default();
        let seg = LogSegment::create(d.path(), 0, &c, 0).unwrap();
        let (id, held) = (seg.id(), seg.log_file().unwrap());
        assert!(segment_files().holds(id));
        seg.delete_files().unwrap();
        assert!(!segment_files().holds(id));
        assert!(!d.path().join("00000000000000000000.log").exists());
        // A reader's handle outlives the segment.
        held.metadata().unwrap();
        let seg = LogSegment::create(d.path(), 5, &c, 0).unwrap();
        let id = seg.id();
        drop(seg);
        assert!(!segment_files().holds(id));
    }

    #[test]
    fn size_from_the_config_and_the_limit() {
        assert_eq!(size_for(None, 1024, Some(20_000)), Ok(AUTO_MAX));
        assert_eq!(size_for(None, 1024, Some(4096)), Ok(3072));
        assert_eq!(size_for(None, 1024, Some(1024)), Ok(AUTO_MIN));
        assert_eq!(size_for(None, 0, None), Ok(AUTO_MAX));
        assert_eq!(size_for(Some(128), 256, Some(512)), Ok(128));
        assert_eq!(size_for(Some(100_000), 0, None), Ok(100_000));
        let e = size_for(Some(300), 256, Some(512)).unwrap_err();
        assert!(e.contains("gregor.log.segment.fd.cache.size") && e.contains("gregor.open.files.reserved"), "{e}");
    }

    #[test]
    fn shrinking_the_capacity_closes_what_no_longer_fits() {
        let (_d, p) = files(3);
        let c = SegmentFileCache::new(3);
        for (i, path) in p.iter().enumerate() {
            c.get(i as u64, path).unwrap();
        }
        c.set_capacity(1);
        let s = c.stats();
        assert_eq!((s.open, s.evictions), (1, 2));
        // The most recent one stayed.
        c.get(2, &p[2]).unwrap();
        assert_eq!(c.stats().hits, 1);
    }
}
