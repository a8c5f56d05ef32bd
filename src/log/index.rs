//! Kafka's sparse, memory-mapped segment indexes.
//!
//! `.index`: 8-byte entries `relative offset (u32 BE) | position in .log (u32 BE)`.
//! `.timeindex`: 12-byte entries `timestamp (i64 BE) | relative offset (u32 BE)`.
//!
//! Invariants: entries are strictly increasing (offset index) or
//! non-decreasing (time index); bytes past the last entry are zero, so the
//! real entry count of a preallocated file left by a crash is "up to the
//! last non-zero entry". The active segment's files are preallocated to
//! `max_index_size` (rounded down to a whole entry); inactive ones are
//! trimmed to their used size. Indexes are only hints: a bad one is rebuilt
//! from the log by the segment.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::index_cache::{index_maps, next_index_id, IndexMap};

pub const OFFSET_ENTRY_SIZE: usize = 8;
pub const TIME_ENTRY_SIZE: usize = 12;

/// The file + entry bookkeeping behind both index kinds. The file is mapped only while an
/// operation reads or writes entries, through the process's [`index_maps`] cache; the entry
/// count, the last entry and the file's length are kept here so appends' checks, a reload and
/// a flush of an idle index need no mapping.
#[derive(Debug)]
struct MmapIndex {
    path: PathBuf,
    /// This index's key in [`index_maps`].
    id: u64,
    /// The file's length changed since the last flush (a trim or preallocation), so a flush
    /// must also sync the file, not only the mapped bytes.
    len_dirty: AtomicBool,
    /// Entries were written or zeroed since the last flush.
    dirty: AtomicBool,
    entry_size: usize,
    entries: usize,
    /// Entries the file can hold (its length over the entry size): what a mapping covers.
    capacity: usize,
    /// The bytes of the last entry (meaningful while `entries > 0`).
    last: [u8; TIME_ENTRY_SIZE],
    /// File length was not a whole number of entries when opened.
    misaligned: bool,
    /// The file did not exist: any data in the log is unindexed.
    created: bool,
    /// Bytes from the file's start known to have disk blocks. A preallocated index is sparse,
    /// and a store through the mapping into a hole on a full file system is a SIGBUS, not an
    /// error: each page is allocated before its first entry goes in, and an entry that gets no
    /// space is left out (the index is sparse anyway; lookups scan from an earlier entry).
    allocated: usize,
}

/// The unit [`MmapIndex::push`] allocates in.
const ALLOC_UNIT: usize = 4096;

/// Entries before the first all-zero slot of a preallocated index: slots 1.. are non-zero up
/// to the end of the entries and zero after, so a binary search finds it in a few reads.
fn count_used_entries(file: &File, entry_size: usize, slots: usize) -> io::Result<usize> {
    let mut buf = vec![0u8; entry_size];
    let mut zero = |i: usize| -> io::Result<bool> {
        file.read_exact_at(&mut buf, (i * entry_size) as u64)?;
        Ok(buf.iter().all(|&b| b == 0))
    };
    if slots == 0 {
        return Ok(0);
    }
    let (mut lo, mut hi) = (1usize, slots);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if zero(mid)? {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    if lo == 1 && zero(0)? {
        return Ok(0);
    }
    Ok(lo)
}

fn preallocated_len(max_index_size: u32, entry_size: usize) -> u64 {
    let n = (max_index_size as usize / entry_size).max(2);
    (n * entry_size) as u64
}

impl MmapIndex {
    fn open(path: &Path, entry_size: usize, max_index_size: u32, preallocate: bool) -> io::Result<Self> {
        let created = !path.exists();
        // Closed again before returning: an index holds no descriptor, and maps only on use.
        let file = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path)?;
        let len = file.metadata()?.len();
        let misaligned = len % entry_size as u64 != 0;
        let whole = len - len % entry_size as u64;
        // Only a preallocated file (the active segment's, left by a crash) has zeros behind its
        // entries; a new one has none and a trimmed one is all entries. The search reads the
        // file rather than a mapping, so opening many partitions maps nothing and leaves no
        // pages resident.
        let entries = if created {
            0
        } else if whole == preallocated_len(max_index_size, entry_size) {
            count_used_entries(&file, entry_size, (whole / entry_size as u64) as usize)?
        } else {
            (whole / entry_size as u64) as usize
        };
        let mut idx = MmapIndex {
            path: path.to_path_buf(),
            id: next_index_id(),
            len_dirty: AtomicBool::new(false),
            dirty: AtomicBool::new(false),
            entry_size,
            entries,
            capacity: (whole / entry_size as u64) as usize,
            last: [0; TIME_ENTRY_SIZE],
            misaligned,
            created,
            allocated: 0,
        };
        idx.read_last(&file)?;
        // The page holding the last entry has blocks; the ones after it may not.
        idx.allocated = (idx.entries * entry_size).div_ceil(ALLOC_UNIT) * ALLOC_UNIT;
        let target = if preallocate {
            preallocated_len(max_index_size, entry_size).max((idx.entries * entry_size) as u64)
        } else {
            (idx.entries * entry_size) as u64
        };
        if target != len {
            idx.resize_file(&file, target)?;
        }
        Ok(idx)
    }

    /// Reloads the cached last entry from the file.
    fn read_last(&mut self, file: &File) -> io::Result<()> {
        if self.entries > 0 {
            let at = ((self.entries - 1) * self.entry_size) as u64;
            file.read_exact_at(&mut self.last[..self.entry_size], at)?;
        }
        Ok(())
    }

    /// The whole file mapped, for one operation: drop it when the operation ends.
    fn map(&self) -> io::Result<Arc<IndexMap>> {
        index_maps().get(self.id, &self.path, self.capacity * self.entry_size)
    }

    fn resize(&mut self, len: u64) -> io::Result<()> {
        let file = OpenOptions::new().read(true).write(true).open(&self.path)?;
        self.resize_file(&file, len)
    }

    fn resize_file(&mut self, file: &File, len: u64) -> io::Result<()> {
        let len = len - len % self.entry_size as u64;
        // No mapping may outlive a shrink (a load past the end is a SIGBUS), and a grown file
        // needs a longer one: the next use maps afresh. `&mut self` means no operation of
        // this index holds one now.
        index_maps().remove(self.id);
        file.set_len(len)?;
        self.len_dirty.store(true, Ordering::Relaxed);
        // Growing adds a hole; shrinking frees the blocks past the end.
        self.allocated = self.allocated.min(len as usize);
        self.capacity = len as usize / self.entry_size;
        if self.entries > self.capacity {
            self.entries = self.capacity;
            self.read_last(file)?;
        }
        Ok(())
    }

    /// Gives `[allocated, end)` (rounded up to whole pages, within the file) disk blocks.
    fn allocate_to(&mut self, end: usize) -> bool {
        let mapped = self.capacity * self.entry_size;
        let to = end.div_ceil(ALLOC_UNIT).saturating_mul(ALLOC_UNIT).min(mapped);
        if to <= self.allocated {
            return true;
        }
        let file = match OpenOptions::new().write(true).open(&self.path) {
            Ok(f) => f,
            Err(_) => return false,
        };
        use std::os::fd::AsRawFd;
        let (from, len) = (self.allocated as libc::off_t, (to - self.allocated) as libc::off_t);
        // SAFETY: fallocate(2) on a file descriptor we own, for a range inside the file; mode 0
        // only allocates, it never changes the file's length or contents.
        let rc = unsafe { libc::fallocate(file.as_raw_fd(), 0, from, len) };
        if rc == 0 {
            self.allocated = to;
            return true;
        }
        match io::Error::last_os_error().raw_os_error() {
            // A file system without fallocate: nothing better to do than the plain store.
            Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS) => {
                self.allocated = usize::MAX;
                true
            }
            _ => false,
        }
    }

    /// Renames the file; a mapping stays valid (it refers to the inode, not the name).
    fn rename(&mut self, to: &Path) -> io::Result<()> {
        std::fs::rename(&self.path, to)?;
        self.path = to.to_path_buf();
        Ok(())
    }

    /// The file now lives at `to` because its directory was renamed (a log dir move).
    fn moved_to(&mut self, to: &Path) {
        self.path = to.to_path_buf();
    }

    fn last(&self) -> Option<&[u8]> {
        (self.entries > 0).then(|| &self.last[..self.entry_size])
    }

    /// Entry `i` of `map` (an empty slice past the mapping, which `entries` never reaches).
    fn entry<'m>(&self, map: &'m IndexMap, i: usize) -> &'m [u8] {
        map.bytes(i * self.entry_size, self.entry_size).unwrap_or(&[])
    }

    /// Adds an entry; false when it was left out (the index full, no disk blocks for it, or
    /// no mapping to be had: the index is sparse anyway, lookups scan from an earlier entry).
    fn push(&mut self, bytes: &[u8]) -> bool {
        if self.entries >= self.capacity || bytes.len() != self.entry_size {
            return false;
        }
        let at = self.entries * self.entry_size;
        if at + self.entry_size > self.allocated && !self.allocate_to(at + self.entry_size) {
            return false;
        }
        let map = match self.map() {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(index = %self.path.display(), error = %e, "index entry left out: cannot map the index");
                return false;
            }
        };
        if !map.write(at, bytes) {
            return false;
        }
        self.entries += 1;
        self.last[..self.entry_size].copy_from_slice(bytes);
        self.dirty.store(true, Ordering::Relaxed);
        true
    }

    /// Keeps the first `n` entries, zeroing the rest so a later crash-open does not resurrect
    /// them. Through the file, not a mapping (the page cache is the same): recovery and
    /// truncation of many indexes map nothing.
    fn truncate_entries(&mut self, n: usize) -> io::Result<()> {
        if n >= self.entries {
            return Ok(());
        }
        let file = OpenOptions::new().read(true).write(true).open(&self.path)?;
        let (from, to) = (n * self.entry_size, self.entries * self.entry_size);
        file.write_all_at(&vec![0u8; to - from], from as u64)?;
        self.entries = n;
        self.read_last(&file)?;
        self.dirty.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// Makes written entries and length changes durable; an index untouched since its last
    /// flush costs nothing.
    fn flush(&self) -> io::Result<()> {
        let dirty = self.dirty.swap(false, Ordering::Relaxed);
        let len_dirty = self.len_dirty.swap(false, Ordering::Relaxed);
        if !dirty && !len_dirty {
            return Ok(());
        }
        let synced = match index_maps().peek(self.id) {
            // msync writes back the range's dirty pages, whichever mapping dirtied them.
            Some(m) if !len_dirty => m.flush(),
            // The mapping was dropped since the stores (they sit in the page cache) or the
            // length changed: sync the file itself.
            _ => File::open(&self.path).and_then(|f| f.sync_data()),
        };
        if synced.is_err() {
            self.dirty.fetch_or(dirty, Ordering::Relaxed);
            self.len_dirty.fetch_or(len_dirty, Ordering::Relaxed);
        }
        synced
    }

    /// The used entries' bytes, read from the file: a check at load maps nothing.
    fn read_entries(&self) -> io::Result<Vec<u8>> {
        let mut buf = vec![0u8; self.entries * self.entry_size];
        if !buf.is_empty() {
            File::open(&self.path)?.read_exact_at(&mut buf, 0)?;
        }
        Ok(buf)
    }

    /// Greatest slot whose key is <= `target` (keys non-decreasing), by
    /// binary search over the used entries.
    fn largest_lower_bound(&self, target: i64, key: impl Fn(&[u8]) -> i64) -> io::Result<Option<usize>> {
        if self.entries == 0 {
            return Ok(None);
        }
        let map = self.map()?;
        let entry = |i| key(self.entry(&map, i));
        if entry(0) > target {
            return Ok(None);
        }
        let (mut lo, mut hi) = (0usize, self.entries - 1);
        while lo < hi {
            let mid = lo + (hi - lo).div_ceil(2);
            if entry(mid) <= target {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        Ok(Some(lo))
    }
}

impl Drop for MmapIndex {
    /// An index that goes (deleted, replaced, closed) takes its mapping with it.
    fn drop(&mut self) {
        index_maps().remove(self.id);
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    b.get(at..at + 4).and_then(|s| s.try_into().ok()).map(u32::from_be_bytes).unwrap_or(0)
}
fn i64_at(b: &[u8], at: usize) -> i64 {
    b.get(at..at + 8).and_then(|s| s.try_into().ok()).map(i64::from_be_bytes).unwrap_or(0)
}

/// Offset -> file position index of one segment.
#[derive(Debug)]
pub struct OffsetIndex {
    inner: MmapIndex,
    base_offset: i64,
}

impl OffsetIndex {
    /// Opens or creates the file. `preallocate` is true for the active
    /// segment; otherwise the file is trimmed to its used entries.
    pub fn open(path: &Path, base_offset: i64, max_index_size: u32, preallocate: bool) -> io::Result<Self> {
        Ok(OffsetIndex { inner: MmapIndex::open(path, OFFSET_ENTRY_SIZE, max_index_size, preallocate)?, base_offset })
    }
    pub fn path(&self) -> &Path {
        &self.inner.path
    }
    pub fn rename(&mut self, to: &Path) -> io::Result<()> {
        self.inner.rename(to)
    }
    pub fn moved_to(&mut self, to: &Path) {
        self.inner.moved_to(to)
    }
    pub fn base_offset(&self) -> i64 {
        self.base_offset
    }
    pub fn entries(&self) -> usize {
        self.inner.entries
    }
    pub fn is_full(&self) -> bool {
        self.inner.entries >= self.inner.capacity
    }
    /// Whether the index's file is mapped in the process's cache now.
    pub fn is_mapped(&self) -> bool {
        index_maps().holds(self.inner.id)
    }
    /// Drops the cache's mapping, as an eviction does.
    #[cfg(test)]
    pub fn unmap(&self) {
        index_maps().remove(self.inner.id)
    }
    fn decode(&self, e: &[u8]) -> (i64, u32) {
        (self.base_offset + i64::from(u32_at(e, 0)), u32_at(e, 4))
    }
    /// (absolute offset, position) of entry `i` (maps the index).
    pub fn entry(&self, i: usize) -> io::Result<(i64, u32)> {
        let map = self.inner.map()?;
        Ok(self.decode(self.inner.entry(&map, i)))
    }
    pub fn last_entry(&self) -> Option<(i64, u32)> {
        self.inner.last().map(|e| self.decode(e))
    }
    /// Adds an entry; ignored (returns false) unless offset and position
    /// both grow and the offset fits in 32 bits relative to the base.
    pub fn append(&mut self, offset: i64, position: u32) -> bool {
        let rel = offset - self.base_offset;
        if !(0..=i64::from(i32::MAX)).contains(&rel) {
            return false;
        }
        if let Some((lo, lp)) = self.last_entry() {
            if offset <= lo || position <= lp {
                return false;
            }
        }
        let mut e = [0u8; OFFSET_ENTRY_SIZE];
        e[..4].copy_from_slice(&(rel as u32).to_be_bytes());
        e[4..].copy_from_slice(&position.to_be_bytes());
        self.inner.push(&e)
    }
    /// Greatest entry with offset <= target, or (base_offset, 0). An error only when the
    /// index cannot be mapped.
    pub fn lookup(&self, target: i64) -> io::Result<(i64, u32)> {
        let rel = target - self.base_offset;
        match self.inner.largest_lower_bound(rel, |e| i64::from(u32_at(e, 0)))? {
            Some(i) => self.entry(i),
            None => Ok((self.base_offset, 0)),
        }
    }
    /// Drops entries with offset >= `offset`.
    pub fn truncate_to(&mut self, offset: i64) -> io::Result<()> {
        let keep = match self.inner.largest_lower_bound(offset - self.base_offset, |e| i64::from(u32_at(e, 0)))? {
            None => 0,
            Some(i) if self.entry(i)?.0 == offset => i,
            Some(i) => i + 1,
        };
        self.inner.truncate_entries(keep)
    }
    pub fn reset(&mut self) -> io::Result<()> {
        self.inner.truncate_entries(0)?;
        self.inner.misaligned = false;
        self.inner.created = false;
        Ok(())
    }
    /// True if the file was missing when opened (and not rebuilt since).
    pub fn was_created(&self) -> bool {
        self.inner.created
    }
    /// Entries strictly increasing, offsets inside [base, next_offset),
    /// positions inside the log.
    pub fn sanity_check(&self, next_offset: i64, log_size: u64) -> io::Result<bool> {
        if self.inner.misaligned {
            return Ok(false);
        }
        let bytes = self.inner.read_entries()?;
        let mut prev: Option<(i64, u32)> = None;
        for e in bytes.chunks_exact(OFFSET_ENTRY_SIZE) {
            let (o, p) = self.decode(e);
            if o >= next_offset || u64::from(p) >= log_size {
                return Ok(false);
            }
            if let Some((po, pp)) = prev {
                if o <= po || p <= pp {
                    return Ok(false);
                }
            }
            prev = Some((o, p));
        }
        Ok(true)
    }
    pub fn trim(&mut self) -> io::Result<()> {
        let len = (self.inner.entries * OFFSET_ENTRY_SIZE) as u64;
        self.inner.resize(len)
    }
    /// Re-grows a trimmed index so the segment can take appends again.
    pub fn preallocate(&mut self, max_index_size: u32) -> io::Result<()> {
        let len =
            preallocated_len(max_index_size, OFFSET_ENTRY_SIZE).max((self.inner.entries * OFFSET_ENTRY_SIZE) as u64);
        if len as usize != self.inner.capacity * OFFSET_ENTRY_SIZE {
            self.inner.resize(len)?;
        }
        Ok(())
    }
    pub fn flush(&self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Timestamp -> offset index of one segment.
#[derive(Debug)]
pub struct TimeIndex {
    inner: MmapIndex,
    base_offset: i64,
}

impl TimeIndex {
    pub fn open(path: &Path, base_offset: i64, max_index_size: u32, preallocate: bool) -> io::Result<Self> {
        Ok(TimeIndex { inner: MmapIndex::open(path, TIME_ENTRY_SIZE, max_index_size, preallocate)?, base_offset })
    }
    pub fn path(&self) -> &Path {
        &self.inner.path
    }
    pub fn rename(&mut self, to: &Path) -> io::Result<()> {
        self.inner.rename(to)
    }
    pub fn moved_to(&mut self, to: &Path) {
        self.inner.moved_to(to)
    }
    pub fn entries(&self) -> usize {
        self.inner.entries
    }
    /// Like Kafka, one slot stays free for the entry written when the
    /// segment becomes inactive.
    pub fn is_full(&self) -> bool {
        self.inner.entries + 1 >= self.inner.capacity
    }
    /// Whether the index's file is mapped in the process's cache now.
    pub fn is_mapped(&self) -> bool {
        index_maps().holds(self.inner.id)
    }
    /// Drops the cache's mapping, as an eviction does.
    #[cfg(test)]
    pub fn unmap(&self) {
        index_maps().remove(self.inner.id)
    }
    fn decode(&self, e: &[u8]) -> (i64, i64) {
        (i64_at(e, 0), self.base_offset + i64::from(u32_at(e, 8)))
    }
    /// (timestamp, absolute offset) of entry `i` (maps the index).
    pub fn entry(&self, i: usize) -> io::Result<(i64, i64)> {
        let map = self.inner.map()?;
        Ok(self.decode(self.inner.entry(&map, i)))
    }
    pub fn last_entry(&self) -> Option<(i64, i64)> {
        self.inner.last().map(|e| self.decode(e))
    }
    /// Appends when `timestamp` exceeds the last entry's timestamp. Returns
    /// whether an entry was written.
    pub fn maybe_append(&mut self, timestamp: i64, offset: i64) -> bool {
        let rel = offset - self.base_offset;
        if !(0..=i64::from(i32::MAX)).contains(&rel) {
            return false;
        }
        // An empty index behaves as if its last entry were (NO_TIMESTAMP, base).
        let (lt, lo) = self.last_entry().unwrap_or((-1, self.base_offset));
        if timestamp <= lt || offset < lo {
            return false;
        }
        if self.inner.entries >= self.inner.capacity {
            // Only the on-roll entry can get here; grow by one entry.
            let len = ((self.inner.entries + 1) * TIME_ENTRY_SIZE) as u64;
            if self.inner.resize(len).is_err() {
                return false;
            }
        }
        let mut e = [0u8; TIME_ENTRY_SIZE];
        e[..8].copy_from_slice(&timestamp.to_be_bytes());
        e[8..].copy_from_slice(&(rel as u32).to_be_bytes());
        self.inner.push(&e)
    }
    /// Offset to start scanning from for the first batch with a timestamp
    /// at or above `target`: the offset of the greatest entry whose
    /// timestamp is strictly below the target (every record before it is
    /// older), else the segment base. An error only when the index cannot be mapped.
    pub fn lookup(&self, target: i64) -> io::Result<i64> {
        match self.inner.largest_lower_bound(target.saturating_sub(1), |e| i64_at(e, 0))? {
            Some(i) => Ok(self.entry(i)?.1),
            None => Ok(self.base_offset),
        }
    }
    /// Drops entries pointing at offsets >= `offset`.
    pub fn truncate_to(&mut self, offset: i64) -> io::Result<()> {
        let mut keep = self.inner.entries;
        if self.last_entry().is_some_and(|(_, o)| o >= offset) {
            let map = self.inner.map()?;
            while keep > 0 && self.decode(self.inner.entry(&map, keep - 1)).1 >= offset {
                keep -= 1;
            }
        }
        self.inner.truncate_entries(keep)
    }
    pub fn reset(&mut self) -> io::Result<()> {
        self.inner.truncate_entries(0)?;
        self.inner.misaligned = false;
        self.inner.created = false;
        Ok(())
    }
    /// True if the file was missing when opened (and not rebuilt since).
    pub fn was_created(&self) -> bool {
        self.inner.created
    }
    /// Timestamps and offsets non-decreasing, offsets inside the segment.
    pub fn sanity_check(&self, next_offset: i64) -> io::Result<bool> {
        if self.inner.misaligned {
            return Ok(false);
        }
        let bytes = self.inner.read_entries()?;
        let mut prev: Option<(i64, i64)> = None;
        for e in bytes.chunks_exact(TIME_ENTRY_SIZE) {
            let (t, o) = self.decode(e);
            if o >= next_offset {
                return Ok(false);
            }
            if let Some((pt, po)) = prev {
                if t < pt || o < po {
                    return Ok(false);
                }
            }
            prev = Some((t, o));
        }
        Ok(true)
    }
    pub fn trim(&mut self) -> io::Result<()> {
        let len = (self.inner.entries * TIME_ENTRY_SIZE) as u64;
        self.inner.resize(len)
    }
    pub fn preallocate(&mut self, max_index_size: u32) -> io::Result<()> {
        let len = preallocated_len(max_index_size, TIME_ENTRY_SIZE).max((self.inner.entries * TIME_ENTRY_SIZE) as u64);
        if len as usize != self.inner.capacity * TIME_ENTRY_SIZE {
            self.inner.resize(len)?;
        }
        Ok(())
    }
    pub fn flush(&self) -> io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests;
