//! The memory mappings of every segment index in the process, bounded
//! (`gregor.log.index.mmap.cache.size`).
//!
//! Each mapping is one entry in the process's map table, and the kernel caps that table at
//! `vm.max_map_count` (65,530 by default): an mmap past it fails with ENOMEM, and so would a
//! thread's stack or the allocator's next arena. Two indexes per segment would reach it near
//! 30,000 replicas. So an index maps its file only when it is read or written, through this
//! cache, and the least recently used mappings are dropped once more than the capacity are
//! held. An index with no entries (most idle partitions' active segments) never maps at all.
//!
//! A caller gets an `Arc<IndexMap>` for one operation and lets go of it when the operation
//! ends: an eviction drops only the cache's reference, so a lookup that runs meanwhile keeps
//! a valid mapping, and the region is unmapped when its last holder lets go. Entries are keyed
//! by an id given out once per index (files are renamed, and a new index at an old path must
//! not be served the old one's mapping).
//!
//! The lock is held for map updates only: mmap (a miss) and munmap (an eviction) run outside.

use std::fs::OpenOptions;
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use memmap2::MmapRaw;

use super::fd_cache::SegmentFileStats;
use super::lru::BoundedLru;

/// One index file mapped shared, read and write, over its whole length.
#[derive(Debug)]
pub struct IndexMap {
    raw: MmapRaw,
}

impl IndexMap {
    pub fn len(&self) -> usize {
        self.raw.len()
    }

    pub fn is_empty(&self) -> bool {
        self.raw.len() == 0
    }

    /// Bytes `[at, at + n)`; None past the end of the mapping.
    pub fn bytes(&self, at: usize, n: usize) -> Option<&[u8]> {
        if at.checked_add(n)? > self.raw.len() {
            return None;
        }
        // SAFETY: the range lies inside the mapping, which lives as long as `self`. The only
        // writer is the index that owns the file, through `write` under its `&mut self`, so
        // no write runs while that index hands out reads; the cache itself never reads.
        Some(unsafe { std::slice::from_raw_parts(self.raw.as_ptr().add(at), n) })
    }

    /// Stores `src` at `at`; false (nothing written) past the end of the mapping. The caller
    /// has given the range disk blocks (a store into a hole of a full disk is a SIGBUS).
    pub fn write(&self, at: usize, src: &[u8]) -> bool {
        if at.checked_add(src.len()).is_none_or(|end| end > self.raw.len()) {
            return false;
        }
        // SAFETY: inside the mapping (checked above); the owning index writes only under its
        // `&mut self`, so no slice from `bytes` overlaps this store.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.raw.as_mut_ptr().add(at), src.len()) };
        true
    }

    pub fn flush(&self) -> io::Result<()> {
        self.raw.flush()
    }
}

pub struct IndexMapCache {
    lru: BoundedLru<Arc<IndexMap>>,
}

impl IndexMapCache {
    pub fn new(capacity: usize) -> Self {
        IndexMapCache { lru: BoundedLru::new(capacity) }
    }

    /// Sets the bound (at start, from the config), unmapping what no longer fits.
    pub fn set_capacity(&self, capacity: usize) {
        self.lru.set_capacity(capacity);
    }

    /// Index `id`'s file at `path` mapped over `len` bytes, mapped now if the cache does not
    /// hold it. A mapping of another length (left from before a resize the owner failed to
    /// report) is replaced, never served.
    pub fn get(&self, id: u64, path: &Path, len: usize) -> io::Result<Arc<IndexMap>> {
        if let Some(m) = self.lru.lock().touch(id).filter(|m| m.len() == len) {
            self.lru.hit();
            return Ok(m);
        }
        self.lru.miss();
        if len == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "an empty index file has nothing to map"));
        }
        let file = OpenOptions::new().read(true).write(true).open(path)?;
        if file.metadata()?.len() < len as u64 {
            // A store or load past the end of the file would be a SIGBUS, not an error.
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("index {} is shorter than expected", path.display()),
            ));
        }
        let raw = memmap2::MmapOptions::new().len(len).map_raw(&file)?;
        // Lookups touch a few scattered pages and appends one page at a time: without this,
        // the first store into a preallocated (sparse) index reads ahead a large range of it
        // into the page cache, only for the trim at the next roll or close to drop it again.
        if let Err(e) = raw.advise(memmap2::Advice::Random) {
            tracing::debug!(index = %path.display(), error = %e, "madvise(MADV_RANDOM) failed");
        }
        let map = Arc::new(IndexMap { raw });
        let capacity = self.lru.capacity();
        let shed = self.lru.lock().insert(id, map.clone(), capacity);
        self.lru.evicted(shed.len());
        drop(shed);
        Ok(map)
    }

    /// Index `id`'s mapping if the cache holds one, without mapping it or counting a use.
    pub fn peek(&self, id: u64) -> Option<Arc<IndexMap>> {
        self.lru.lock().peek(id)
    }

    /// Forgets index `id` (resized, deleted or dropped): unmapped once no reader holds it.
    pub fn remove(&self, id: u64) {
        let gone = self.lru.lock().remove(id);
        drop(gone);
    }

    /// Whether index `id` is mapped in the cache.
    pub fn holds(&self, id: u64) -> bool {
        self.lru.lock().contains(id)
    }

    pub fn stats(&self) -> SegmentFileStats {
        self.lru.stats()
    }
}

/// Until `configure` runs (tests, tools): room for any test's indexes, far below the limit.
const DEFAULT_CAPACITY: usize = 4096;

/// The process's cache.
pub fn index_maps() -> &'static IndexMapCache {
    static CACHE: OnceLock<IndexMapCache> = OnceLock::new();
    CACHE.get_or_init(|| IndexMapCache::new(DEFAULT_CAPACITY))
}

/// Maps kept for everything else in the process: each thread's stack and guard (the I/O pool
/// can grow to hundreds of threads), the allocator's arenas, libraries, the embedded store.
/// Measured use outside the indexes is a few hundred; this leaves ample room.
pub const RESERVED_MAPS: u64 = 8192;

/// Below this a broker remaps its busiest indexes over and over.
const AUTO_MIN: usize = 64;

/// Kafka's kernel default for vm.max_map_count, for when /proc cannot tell.
const DEFAULT_MAX_MAP_COUNT: u64 = 65_530;

/// The cache's size for `gregor.log.index.mmap.cache.size` (None: from the limit) under a
/// `vm.max_map_count` of `max_maps`. A configured size the kernel cannot hold alongside the
/// reserve is an error naming the key: the broker would otherwise fail mmaps (and thread
/// starts) once busy, long after it started.
pub fn size_for(configured: Option<usize>, max_maps: u64) -> Result<usize, String> {
    let room = max_maps.saturating_sub(RESERVED_MAPS);
    match configured {
        Some(n) if n as u64 > room => Err(format!(
            "gregor.log.index.mmap.cache.size ({n}) does not fit under vm.max_map_count ({max_maps}) less \
             {RESERVED_MAPS} maps kept for threads and the allocator; lower it to at most {room} or raise \
             vm.max_map_count"
        )),
        Some(n) => Ok(n),
        None => Ok((room.min(usize::MAX as u64) as usize).max(AUTO_MIN)),
    }
}

/// The kernel's per-process map limit.
pub fn max_map_count() -> u64 {
    std::fs::read_to_string("/proc/sys/vm/max_map_count")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(DEFAULT_MAX_MAP_COUNT)
}

/// Sizes the process's cache at start from the config and vm.max_map_count.
pub fn configure(configured: Option<usize>) -> Result<usize, String> {
    let max_maps = max_map_count();
    let size = size_for(configured, max_maps)?;
    index_maps().set_capacity(size);
    tracing::info!(size, max_map_count = max_maps, "index map cache sized (gregor.log.index.mmap.cache.size)");
    Ok(size)
}

/// A fresh index id, never reused.
pub fn next_index_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(n: usize) -> (tempfile::TempDir, Vec<std::path::PathBuf>) {
        let d = tempfile::tempdir().unwrap();
        let paths = (0..n)
            .map(|i| {
                let p = d.path().join(format!("{i}.index"));
                std::fs::write(&p, [i as u8; 8]).unwrap();
                p
            })
            .collect();
        (d, paths)
    }

    #[test]
    fn least_recently_used_is_unmapped_and_a_holder_keeps_reading() {
        let (_d, p) = files(3);
        let c = IndexMapCache::new(2);
        let first = c.get(1, &p[0], 8).unwrap();
        c.get(2, &p[1], 8).unwrap();
        c.get(1, &p[0], 8).unwrap(); // 2 is now the oldest
        c.get(3, &p[2], 8).unwrap();
        let s = c.stats();
        assert_eq!((s.hits, s.misses, s.evictions, s.open, s.capacity), (1, 3, 1, 2, 2));
        assert!(c.holds(1) && !c.holds(2) && c.holds(3));
        c.set_capacity(1);
        assert!(!c.holds(1), "shrinking unmaps the least recently used");
        assert_eq!(first.bytes(0, 8), Some(&[0u8; 8][..]), "a holder reads through an eviction");
        assert_eq!(first.bytes(4, 8), None);
        assert!(!first.write(4, &[1; 8]));
        assert_eq!(c.get(2, &p[1], 8).unwrap().bytes(0, 1), Some(&[1u8][..]));
    }

    #[test]
    fn a_mapping_of_another_length_is_never_served() {
        let (_d, p) = files(1);
        let c = IndexMapCache::new(4);
        c.get(1, &p[0], 8).unwrap();
        std::fs::write(&p[0], [7u8; 16]).unwrap();
        let m = c.get(1, &p[0], 16).unwrap();
        assert_eq!((m.len(), c.stats().misses), (16, 2));
        assert!(c.get(1, &p[0], 32).is_err(), "longer than the file");
        assert!(c.get(1, &p[0], 0).is_err());
    }

    #[test]
    fn size_from_the_config_and_the_map_limit() {
        assert_eq!(size_for(None, 65_530), Ok(65_530 - RESERVED_MAPS as usize));
        assert_eq!(size_for(None, 1000), Ok(AUTO_MIN));
        assert_eq!(size_for(Some(64), 65_530), Ok(64));
        let e = size_for(Some(60_000), 65_530).unwrap_err();
        assert!(e.contains("gregor.log.index.mmap.cache.size") && e.contains("vm.max_map_count"), "{e}");
    }
}
