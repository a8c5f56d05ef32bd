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
use std::path::{Path, PathBuf};

use memmap2::MmapMut;

pub const OFFSET_ENTRY_SIZE: usize = 8;
pub const TIME_ENTRY_SIZE: usize = 12;

/// The shared mmap + entry bookkeeping behind both index kinds.
#[derive(Debug)]
struct MmapIndex {
    path: PathBuf,
    /// The file's length changed since the last flush (a trim or preallocation), so a flush
    /// must also sync the file, not only the mapped bytes.
    len_dirty: std::sync::atomic::AtomicBool,
    mmap: Option<MmapMut>,
    entry_size: usize,
    entries: usize,
    /// Entries the current mapping can hold.
    capacity: usize,
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
    use std::os::unix::fs::FileExt;
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
        // The file is closed again once mapped (the mapping keeps the pages): one open file per
        // segment, the log, as Kafka keeps.
        let file = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path)?;
        let len = file.metadata()?.len();
        let misaligned = len % entry_size as u64 != 0;
        let mut idx = MmapIndex {
            path: path.to_path_buf(),
            len_dirty: std::sync::atomic::AtomicBool::new(false),
            mmap: None,
            entry_size,
            entries: 0,
            capacity: 0,
            misaligned,
            created,
            allocated: 0,
        };
        let whole = len - len % entry_size as u64;
        // Only a preallocated file (the active segment's, left by a crash) has zeros behind its
        // entries; a new one has none and a trimmed one is all entries. The search reads the
        // file rather than the mapping, so a broker opening many partitions after a crash
        // does not page in (and keep resident) the regions around each probe.
        let entries = if created {
            0
        } else if whole == preallocated_len(max_index_size, entry_size) {
            count_used_entries(&file, entry_size, (whole / entry_size as u64) as usize)?
        } else {
            (whole / entry_size as u64) as usize
        };
        drop(file);
        idx.map(whole)?;
        idx.entries = entries.min(idx.capacity);
        // The page holding the last entry has blocks; the ones after it may not.
        idx.allocated = (idx.entries * entry_size).div_ceil(ALLOC_UNIT) * ALLOC_UNIT;
        let target = if preallocate {
            preallocated_len(max_index_size, entry_size).max((idx.entries * entry_size) as u64)
        } else {
            (idx.entries * entry_size) as u64
        };
        if target != len {
            idx.resize(target)?;
        }
        Ok(idx)
    }

    fn map(&mut self, len: u64) -> io::Result<()> {
        self.mmap = None;
        self.capacity = 0;
        if len > 0 {
            // SAFETY: the file is private to this index (one owner per
            // segment, opened by us); nobody truncates it while mapped
            // because every resize drops the mapping first.
            let file = OpenOptions::new().read(true).write(true).open(&self.path)?;
            let m = unsafe { memmap2::MmapOptions::new().len(len as usize).map_mut(&file)? };
            self.capacity = len as usize / self.entry_size;
            self.mmap = Some(m);
        }
        Ok(())
    }

    fn resize(&mut self, len: u64) -> io::Result<()> {
        let len = len - len % self.entry_size as u64;
        self.mmap = None;
        OpenOptions::new().write(true).open(&self.path)?.set_len(len)?;
        self.len_dirty.store(true, std::sync::atomic::Ordering::Relaxed);
        // Growing adds a hole; shrinking frees the blocks past the end.
        self.allocated = self.allocated.min(len as usize);
        self.map(len)?;
        self.entries = self.entries.min(self.capacity);
        Ok(())
    }

    /// Gives `[allocated, end)` (rounded up to whole pages, within the mapping) disk blocks.
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

    /// Renames the file; the mapping stays valid (it refers to the inode, not the name).
    fn rename(&mut self, to: &Path) -> io::Result<()> {
        std::fs::rename(&self.path, to)?;
        self.path = to.to_path_buf();
        Ok(())
    }

    /// The file now lives at `to` because its directory was renamed (a log dir move).
    fn moved_to(&mut self, to: &Path) {
        self.path = to.to_path_buf();
    }

    fn entry(&self, i: usize) -> &[u8] {
        match &self.mmap {
            Some(m) => &m[i * self.entry_size..(i + 1) * self.entry_size],
            None => &[],
        }
    }

    fn push(&mut self, bytes: &[u8]) -> bool {
        if self.entries >= self.capacity {
            return false;
        }
        let at = self.entries * self.entry_size;
        if at + self.entry_size > self.allocated && !self.allocate_to(at + self.entry_size) {
            return false;
        }
        match &mut self.mmap {
            Some(m) => {
                m[at..at + self.entry_size].copy_from_slice(bytes);
                self.entries += 1;
                true
            }
            None => false,
        }
    }

    /// Keeps the first `n` entries, zeroing the rest so a later crash-open
    /// does not resurrect them.
    fn truncate_entries(&mut self, n: usize) {
        if n >= self.entries {
            return;
        }
        let (from, to) = (n * self.entry_size, self.entries * self.entry_size);
        if let Some(m) = &mut self.mmap {
            m[from..to].fill(0);
        }
        self.entries = n;
    }

    fn flush(&self) -> io::Result<()> {
        if let Some(m) = &self.mmap {
            m.flush()?;
        }
        // Trims and preallocations change the length: make that durable too.
        if self.len_dirty.swap(false, std::sync::atomic::Ordering::Relaxed) {
            File::open(&self.path)?.sync_data()?;
        }
        Ok(())
    }

    /// Greatest slot whose key is <= `target` (keys non-decreasing), by
    /// binary search over the used entries.
    fn largest_lower_bound(&self, target: i64, key: impl Fn(&[u8]) -> i64) -> Option<usize> {
        if self.entries == 0 || key(self.entry(0)) > target {
            return None;
        }
        let (mut lo, mut hi) = (0usize, self.entries - 1);
        while lo < hi {
            let mid = lo + (hi - lo).div_ceil(2);
            if key(self.entry(mid)) <= target {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        Some(lo)
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}
fn i64_at(b: &[u8], at: usize) -> i64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    i64::from_be_bytes(a)
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
    /// (absolute offset, position) of entry `i`.
    pub fn entry(&self, i: usize) -> (i64, u32) {
        let e = self.inner.entry(i);
        (self.base_offset + i64::from(u32_at(e, 0)), u32_at(e, 4))
    }
    pub fn last_entry(&self) -> Option<(i64, u32)> {
        self.inner.entries.checked_sub(1).map(|i| self.entry(i))
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
    /// Greatest entry with offset <= target, or (base_offset, 0).
    pub fn lookup(&self, target: i64) -> (i64, u32) {
        let rel = target - self.base_offset;
        match self.inner.largest_lower_bound(rel, |e| i64::from(u32_at(e, 0))) {
            Some(i) => self.entry(i),
            None => (self.base_offset, 0),
        }
    }
    /// Drops entries with offset >= `offset`.
    pub fn truncate_to(&mut self, offset: i64) {
        let keep = match self.inner.largest_lower_bound(offset - self.base_offset, |e| i64::from(u32_at(e, 0))) {
            None => 0,
            Some(i) if self.entry(i).0 == offset => i,
            Some(i) => i + 1,
        };
        self.inner.truncate_entries(keep);
    }
    pub fn reset(&mut self) {
        self.inner.truncate_entries(0);
        self.inner.misaligned = false;
        self.inner.created = false;
    }
    /// True if the file was missing when opened (and not rebuilt since).
    pub fn was_created(&self) -> bool {
        self.inner.created
    }
    /// Entries strictly increasing, offsets inside [base, next_offset),
    /// positions inside the log.
    pub fn sanity_check(&self, next_offset: i64, log_size: u64) -> bool {
        if self.inner.misaligned {
            return false;
        }
        let mut prev: Option<(i64, u32)> = None;
        for i in 0..self.entries() {
            let (o, p) = self.entry(i);
            if o >= next_offset || u64::from(p) >= log_size {
                return false;
            }
            if let Some((po, pp)) = prev {
                if o <= po || p <= pp {
                    return false;
                }
            }
            prev = Some((o, p));
        }
        true
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
    /// (timestamp, absolute offset) of entry `i`.
    pub fn entry(&self, i: usize) -> (i64, i64) {
        let e = self.inner.entry(i);
        (i64_at(e, 0), self.base_offset + i64::from(u32_at(e, 8)))
    }
    pub fn last_entry(&self) -> Option<(i64, i64)> {
        self.inner.entries.checked_sub(1).map(|i| self.entry(i))
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
    /// older), else the segment base.
    pub fn lookup(&self, target: i64) -> i64 {
        match self.inner.largest_lower_bound(target.saturating_sub(1), |e| i64_at(e, 0)) {
            Some(i) => self.entry(i).1,
            None => self.base_offset,
        }
    }
    /// Drops entries pointing at offsets >= `offset`.
    pub fn truncate_to(&mut self, offset: i64) {
        let mut keep = self.inner.entries;
        while keep > 0 && self.entry(keep - 1).1 >= offset {
            keep -= 1;
        }
        self.inner.truncate_entries(keep);
    }
    pub fn reset(&mut self) {
        self.inner.truncate_entries(0);
        self.inner.misaligned = false;
        self.inner.created = false;
    }
    /// True if the file was missing when opened (and not rebuilt since).
    pub fn was_created(&self) -> bool {
        self.inner.created
    }
    /// Timestamps and offsets non-decreasing, offsets inside the segment.
    pub fn sanity_check(&self, next_offset: i64) -> bool {
        if self.inner.misaligned {
            return false;
        }
        let mut prev: Option<(i64, i64)> = None;
        for i in 0..self.entries() {
            let (t, o) = self.entry(i);
            if o >= next_offset {
                return false;
            }
            if let Some((pt, po)) = prev {
                if t < pt || o < po {
                    return false;
                }
            }
            prev = Some((t, o));
        }
        true
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
mod tests {
    use super::*;

    #[test]
    fn offset_index_append_lookup() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("00000000000000000100.index");
        let mut idx = OffsetIndex::open(&p, 100, 80, true).unwrap();
        assert_eq!(std::fs::metadata(&p).unwrap().len(), 80);
        assert_eq!(idx.lookup(150), (100, 0));
        assert!(idx.append(110, 4000));
        assert!(idx.append(120, 8000));
        assert!(!idx.append(120, 9000), "non-increasing offset is refused");
        assert!(!idx.append(130, 8000), "non-increasing position is refused");
        assert!(!idx.append(99, 9000), "below base is refused");
        assert!(idx.append(135, 12000));
        assert_eq!(idx.lookup(99), (100, 0));
        assert_eq!(idx.lookup(109), (100, 0));
        assert_eq!(idx.lookup(110), (110, 4000));
        assert_eq!(idx.lookup(119), (110, 4000));
        assert_eq!(idx.lookup(134), (120, 8000));
        assert_eq!(idx.lookup(10_000), (135, 12000));
        assert_eq!(idx.last_entry(), Some((135, 12000)));
        idx.truncate_to(121);
        assert_eq!(idx.entries(), 2);
        idx.truncate_to(120);
        assert_eq!(idx.entries(), 1);
        assert!(idx.sanity_check(111, 4001));
        assert!(!idx.sanity_check(110, 4001));
        assert!(!idx.sanity_check(111, 4000));
        for i in 0..9 {
            idx.append(200 + i, 20000 + i as u32);
        }
        assert!(idx.is_full());
        assert_eq!(idx.entries(), 10);
        assert!(!idx.append(500, 50000));
        idx.trim().unwrap();
        assert_eq!(std::fs::metadata(&p).unwrap().len(), 80);
        idx.truncate_to(205);
        idx.trim().unwrap();
        assert_eq!(std::fs::metadata(&p).unwrap().len(), 6 * 8);
    }

    #[test]
    fn offset_index_bytes_and_reopen() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("x.index");
        {
            let mut idx = OffsetIndex::open(&p, 1000, 4096, true).unwrap();
            idx.append(1003, 0x0102);
            idx.append(1000 + 0x01020304, 0x7fff_fffe);
            idx.flush().unwrap();
            // dropped without trim: crash with preallocated file
        }
        let raw = std::fs::read(&p).unwrap();
        assert_eq!(raw.len(), 4096);
        assert_eq!(&raw[..16], &[0, 0, 0, 3, 0, 0, 1, 2, 1, 2, 3, 4, 0x7f, 0xff, 0xff, 0xfe]);
        assert!(raw[16..].iter().all(|&b| b == 0));
        let mut idx = OffsetIndex::open(&p, 1000, 4096, false).unwrap();
        assert_eq!(idx.entries(), 2);
        assert_eq!(std::fs::metadata(&p).unwrap().len(), 16);
        assert_eq!(idx.entry(1), (1000 + 0x01020304, 0x7fff_fffe));
        idx.preallocate(4096).unwrap();
        assert_eq!(std::fs::metadata(&p).unwrap().len(), 4096);
        assert!(idx.append(1000 + 0x01020305, 0x7fff_ffff));
        assert_eq!(idx.entries(), 3);
    }

    #[test]
    fn misaligned_index_fails_sanity() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("x.index");
        std::fs::write(&p, [0u8, 0, 0, 1, 0, 0, 0, 9, 7]).unwrap();
        let idx = OffsetIndex::open(&p, 0, 4096, false).unwrap();
        assert!(!idx.sanity_check(100, 100));
    }

    #[test]
    fn time_index_append_lookup() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("00000000000000000050.timeindex");
        let mut ti = TimeIndex::open(&p, 50, 60, true).unwrap();
        assert_eq!(std::fs::metadata(&p).unwrap().len(), 60);
        assert_eq!(ti.lookup(5), 50);
        assert!(ti.maybe_append(1000, 55));
        assert!(!ti.maybe_append(1000, 60), "same timestamp is not re-indexed");
        assert!(!ti.maybe_append(900, 60));
        assert!(ti.maybe_append(2000, 60));
        assert!(ti.maybe_append(3000, 70));
        assert_eq!(ti.lookup(999), 50);
        assert_eq!(ti.lookup(1000), 50);
        assert_eq!(ti.lookup(1001), 55);
        assert_eq!(ti.lookup(2500), 60);
        assert_eq!(ti.lookup(i64::MAX), 70);
        assert!(ti.maybe_append(4000, 80));
        assert!(ti.is_full(), "last slot is reserved");
        assert!(ti.maybe_append(5000, 90));
        assert!(ti.maybe_append(6000, 95), "grows for the on-roll entry");
        let raw = std::fs::read(&p).unwrap();
        let mut e0 = 1000i64.to_be_bytes().to_vec();
        e0.extend_from_slice(&5u32.to_be_bytes());
        assert_eq!(&raw[..12], &e0[..]);
        ti.truncate_to(70);
        assert_eq!(ti.last_entry(), Some((2000, 60)));
        assert!(ti.sanity_check(61));
        assert!(!ti.sanity_check(60));
        ti.trim().unwrap();
        assert_eq!(std::fs::metadata(&p).unwrap().len(), 24);
        drop(ti);
        let ti = TimeIndex::open(&p, 50, 60, false).unwrap();
        assert_eq!(ti.entries(), 2);
    }

    /// A preallocated index is sparse: on a full file system a store into one of its holes
    /// through the mapping would kill the process with SIGBUS. Needs a small tmpfs to fill,
    /// so root; without it the test says so and does nothing.
    #[test]
    fn a_full_file_system_leaves_entries_out_instead_of_faulting() {
        let d = tempfile::tempdir().unwrap();
        let mnt = d.path().join("small");
        std::fs::create_dir(&mnt).unwrap();
        let mounted = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=64k", "tmpfs"])
            .arg(&mnt)
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !mounted {
            eprintln!("skipped: cannot mount a tmpfs here (needs root)");
            return;
        }
        struct Unmount(PathBuf);
        impl Drop for Unmount {
            fn drop(&mut self) {
                let _ = std::process::Command::new("umount").arg("-l").arg(&self.0).status();
            }
        }
        let _unmount = Unmount(mnt.clone());
        let mut offsets = OffsetIndex::open(&mnt.join("0.index"), 0, 1 << 20, true).unwrap();
        let mut times = TimeIndex::open(&mnt.join("0.timeindex"), 0, 1 << 20, true).unwrap();
        let filler = mnt.join("filler");
        {
            let mut f = File::create(&filler).unwrap();
            let chunk = [0u8; 4096];
            while std::io::Write::write(&mut f, &chunk).is_ok_and(|n| n > 0) {}
        }
        assert!(!offsets.append(1, 10), "no page to put the entry in");
        assert!(!times.maybe_append(5, 1), "no page to put the entry in");
        assert_eq!((offsets.entries(), times.entries()), (0, 0));
        std::fs::remove_file(&filler).unwrap();
        assert!(offsets.append(1, 10));
        assert!(times.maybe_append(5, 1));
        assert_eq!(offsets.lookup(1), (1, 10));
    }
}
