//! One log segment: a `.log` file of whole v2 batches plus its `.index` and
//! `.timeindex`.
//!
//! Invariants: bytes `[0, size)` of the `.log` file are a sequence of
//! complete batches with strictly increasing offsets, all `>= base_offset`
//! and within `i32::MAX` of it; `next_offset` is one past the last batch's
//! last offset (or `base_offset` when empty). Writes go to `size` with
//! positional I/O so readers holding the file can pread concurrently. The
//! segment is trusted only after `load_trusted` or `recover` succeeded.

use std::fs::{File, OpenOptions};
use std::io::{self, BufReader, Read};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::batch::{self, BatchHeader, HEADER_SIZE};
use super::fd_cache::{self, segment_files};
use super::index::{OffsetIndex, TimeIndex};
use super::{index_file_path, log_file_path, time_index_file_path, LogConfig, LogError};

/// Reads batch headers one after another without touching records. It
/// fetches `cap` bytes at a time so that runs of small batches cost one
/// pread, and jumps over large batches with a fresh pread.
pub struct HeaderScanner {
    file: Arc<File>,
    pos: u64,
    end: u64,
    buf: Vec<u8>,
    buf_start: u64,
    buf_len: usize,
}

impl HeaderScanner {
    pub fn new(file: Arc<File>, from: u64, end: u64, cap: usize) -> Self {
        HeaderScanner { file, pos: from, end, buf: vec![0; cap.max(HEADER_SIZE)], buf_start: 0, buf_len: 0 }
    }

    pub fn position(&self) -> u64 {
        self.pos
    }

    /// Next `(position, header)`; `Ok(None)` exactly at `end`. A header that
    /// is torn, not magic 2, or claims more bytes than remain is an error.
    pub fn next_header(&mut self) -> Result<Option<(u64, BatchHeader)>, LogError> {
        if self.pos >= self.end {
            return Ok(None);
        }
        let avail = self.end - self.pos;
        if avail < HEADER_SIZE as u64 {
            return Err(LogError::CorruptMessage(format!("torn batch header at position {}", self.pos)));
        }
        let in_buf =
            self.pos >= self.buf_start && self.pos + HEADER_SIZE as u64 <= self.buf_start + self.buf_len as u64;
        if !in_buf {
            let n = (self.buf.len() as u64).min(avail) as usize;
            self.file.read_exact_at(&mut self.buf[..n], self.pos)?;
            self.buf_start = self.pos;
            self.buf_len = n;
        }
        let at = (self.pos - self.buf_start) as usize;
        let h = BatchHeader::parse(&self.buf[at..at + HEADER_SIZE])
            .ok_or_else(|| LogError::CorruptMessage("short header".into()))?;
        h.check_framing(avail.min(usize::MAX as u64) as usize)?;
        let here = self.pos;
        self.pos += h.total_size() as u64;
        Ok(Some((here, h)))
    }
}

#[derive(Debug)]
pub struct LogSegment {
    base_offset: i64,
    log_path: PathBuf,
    /// This segment's key in the process's [`fd_cache`]: the `.log` file is opened on
    /// demand through it, never held here.
    id: u64,
    size: u64,
    offset_index: OffsetIndex,
    time_index: TimeIndex,
    next_offset: i64,
    max_timestamp: i64,
    offset_of_max_timestamp: i64,
    /// maxTimestamp of the first batch: segment.ms counts from it (Kafka's
    /// rollingBasedTimestamp); `None` falls back to `created_ms`.
    rolling_base_timestamp: Option<i64>,
    created_ms: i64,
    bytes_since_last_index_entry: u64,
    index_interval_bytes: u32,
    max_index_size: u32,
    /// Indexes preallocated for appends (false once trimmed).
    active: bool,
}

/// Kafka's suffix for a segment the cleaner is still writing.
pub const CLEANED_SUFFIX: &str = ".cleaned";
/// Kafka's suffix for a cleaned segment that replaces the segments it overlaps.
pub const SWAP_SUFFIX: &str = ".swap";

fn open_log_file(path: &Path, create: bool) -> io::Result<File> {
    OpenOptions::new().read(true).write(true).create(create).truncate(false).open(path)
}

impl LogSegment {
    /// New empty active segment. Refuses to clobber a non-empty `.log`.
    pub fn create(dir: &Path, base_offset: i64, config: &LogConfig, now_ms: i64) -> Result<Self, LogError> {
        let log_path = log_file_path(dir, base_offset);
        let file = open_log_file(&log_path, true)?;
        if file.metadata()?.len() != 0 {
            return Err(LogError::Io(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("segment {} already exists", log_path.display()),
            )));
        }
        let mut seg = Self::assemble(dir, base_offset, file, config, now_ms, true)?;
        // Stale index files with this name (e.g. left by a truncation) must go.
        seg.offset_index.reset()?;
        seg.time_index.reset()?;
        Ok(seg)
    }

    /// A segment the log cleaner fills: its files carry Kafka's `.cleaned` suffix until
    /// [`LogSegment::rename_suffix`] swaps it in, so a crash leaves nothing a restart would
    /// take for a live segment. Any leftover of an earlier attempt is replaced.
    pub fn create_cleaned(dir: &Path, base_offset: i64, config: &LogConfig, now_ms: i64) -> Result<Self, LogError> {
        let paths = Self::paths(dir, base_offset, CLEANED_SUFFIX);
        for p in &paths {
            match std::fs::remove_file(p) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e.into()),
            }
        }
        let file = open_log_file(&paths[0], true)?;
        let mut seg = Self::assemble_at(&paths, base_offset, file, config, now_ms, true)?;
        seg.offset_index.reset()?;
        seg.time_index.reset()?;
        Ok(seg)
    }

    /// The `.log`, `.index` and `.timeindex` paths with `suffix` appended ("" for the live names).
    pub fn paths(dir: &Path, base_offset: i64, suffix: &str) -> [PathBuf; 3] {
        let with = |p: PathBuf| {
            let mut s = p.into_os_string();
            s.push(suffix);
            PathBuf::from(s)
        };
        [
            with(log_file_path(dir, base_offset)),
            with(index_file_path(dir, base_offset)),
            with(time_index_file_path(dir, base_offset)),
        ]
    }

    /// Renames the three files to their live names plus `suffix` (the cleaner's
    /// `.cleaned` -> `.swap` -> "" steps). Open handles and mappings stay valid.
    pub fn rename_suffix(&mut self, dir: &Path, suffix: &str) -> Result<(), LogError> {
        let [log, index, time] = Self::paths(dir, self.base_offset, suffix);
        std::fs::rename(&self.log_path, &log)?;
        self.log_path = log;
        self.offset_index.rename(&index)?;
        self.time_index.rename(&time)?;
        Ok(())
    }

    /// Points the segment at `dir` after its directory was renamed there as a whole (a log
    /// dir move): no file is touched, open handles and mappings stay valid.
    pub fn moved_to(&mut self, dir: &Path) {
        let [log, index, time] = Self::paths(dir, self.base_offset, "");
        self.log_path = log;
        self.offset_index.moved_to(&index);
        self.time_index.moved_to(&time);
    }

    /// maxTimestamp of the segment's first batch, if it has one.
    pub fn first_batch_timestamp(&self) -> Option<i64> {
        self.rolling_base_timestamp
    }

    /// Opens an existing segment's files. Contents are not trusted yet: call
    /// `load_trusted` or `recover` next.
    pub fn open(dir: &Path, base_offset: i64, config: &LogConfig, active: bool, now_ms: i64) -> Result<Self, LogError> {
        let file = open_log_file(&log_file_path(dir, base_offset), false)?;
        Self::assemble(dir, base_offset, file, config, now_ms, active)
    }

    fn assemble(
        dir: &Path,
        base_offset: i64,
        file: File,
        config: &LogConfig,
        now_ms: i64,
        active: bool,
    ) -> Result<Self, LogError> {
        Self::assemble_at(&Self::paths(dir, base_offset, ""), base_offset, file, config, now_ms, active)
    }

    fn assemble_at(
        paths: &[PathBuf; 3],
        base_offset: i64,
        file: File,
        config: &LogConfig,
        now_ms: i64,
        active: bool,
    ) -> Result<Self, LogError> {
        let size = file.metadata()?.len();
        let offset_index = OffsetIndex::open(&paths[1], base_offset, config.max_index_size, active)?;
        let time_index = TimeIndex::open(&paths[2], base_offset, config.max_index_size, active)?;
        let id = fd_cache::next_segment_id();
        // Loading reads the file next: hand it to the cache rather than open it twice.
        segment_files().insert(id, file);
        Ok(LogSegment {
            base_offset,
            log_path: paths[0].clone(),
            id,
            size,
            offset_index,
            time_index,
            next_offset: base_offset,
            max_timestamp: -1,
            offset_of_max_timestamp: -1,
            rolling_base_timestamp: None,
            created_ms: now_ms,
            bytes_since_last_index_entry: 0,
            index_interval_bytes: config.index_interval_bytes,
            max_index_size: config.max_index_size,
            active,
        })
    }

    pub fn base_offset(&self) -> i64 {
        self.base_offset
    }
    pub fn size(&self) -> u64 {
        self.size
    }
    pub fn next_offset(&self) -> i64 {
        self.next_offset
    }
    pub fn is_empty(&self) -> bool {
        self.size == 0
    }
    pub fn max_timestamp(&self) -> i64 {
        self.max_timestamp
    }
    /// The `.log` file, opened again if the cache closed it. Hold it only as long as a read
    /// or a response needs it: each holder keeps a descriptor open.
    pub fn log_file(&self) -> Result<Arc<File>, LogError> {
        Ok(segment_files().get(self.id, &self.log_path)?)
    }
    /// Identifies this segment for its life (a cleaner pass checks it is swapping out the
    /// segments it read).
    pub fn id(&self) -> u64 {
        self.id
    }
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }
    pub fn offset_index(&self) -> &OffsetIndex {
        &self.offset_index
    }
    pub fn time_index(&self) -> &TimeIndex {
        &self.time_index
    }

    /// Timestamp retention compares against: the largest batch timestamp,
    /// or the file's mtime when no batch carried one (Kafka does the same).
    pub fn largest_timestamp(&self) -> i64 {
        if self.max_timestamp >= 0 {
            return self.max_timestamp;
        }
        self.last_modified_ms()
    }

    /// The log file's mtime in ms (0 if unreadable): what ListOffsets v0 calls a segment's time.
    pub fn last_modified_ms(&self) -> i64 {
        // By path: a stat needs no descriptor (and the file's name is its own while it lives).
        std::fs::metadata(&self.log_path)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0)
    }

    pub fn set_config(&mut self, config: &LogConfig) {
        self.index_interval_bytes = config.index_interval_bytes;
        self.max_index_size = config.max_index_size;
    }

    pub fn scanner(&self, from: u64, cap: usize) -> Result<HeaderScanner, LogError> {
        Ok(HeaderScanner::new(self.log_file()?, from, self.size, cap))
    }

    /// Trusts the segment after cheap checks: both indexes pass their sanity
    /// check against `upper_bound` (next segment's base, or `i64::MAX`) and
    /// the batches after the last offset-index entry have sane headers.
    /// `Ok(false)` means the caller must `recover` it.
    pub fn load_trusted(&mut self, upper_bound: i64) -> Result<bool, LogError> {
        if !self.offset_index.sanity_check(upper_bound, self.size)? || !self.time_index.sanity_check(upper_bound)? {
            return Ok(false);
        }
        if self.size > 0 && (self.offset_index.was_created() || self.time_index.was_created()) {
            return Ok(false);
        }
        if !self.reload_tail(true)? {
            return Ok(false);
        }
        Ok(self.next_offset <= upper_bound)
    }

    /// Recomputes next offset, max timestamp and index bookkeeping from the
    /// indexes plus a header scan after the last offset-index entry. With
    /// `strict`, a tail where the append rule would have written an offset
    /// entry means entries were lost (or index.interval.bytes changed) and
    /// the index is reported bad so it gets rebuilt.
    fn reload_tail(&mut self, strict: bool) -> Result<bool, LogError> {
        let (entry_offset, entry_pos) = match self.offset_index.last_entry() {
            Some((o, p)) => (Some(o), u64::from(p)),
            None => (None, 0),
        };
        match self.time_index.last_entry() {
            Some((t, o)) => {
                self.max_timestamp = t;
                self.offset_of_max_timestamp = o;
            }
            None => {
                self.max_timestamp = -1;
                self.offset_of_max_timestamp = -1;
            }
        }
        self.next_offset = self.base_offset;
        self.rolling_base_timestamp = None;
        let mut expected = self.base_offset;
        let mut first = true;
        let mut since_entry = 0u64;
        // Judge fullness against the configured size: an inactive index is
        // trimmed to exactly its entries and so always looks full.
        let check_missing = strict && self.offset_index.entries() + 1 < self.max_index_size as usize / 8;
        let log = self.log_file()?;
        let mut sc = HeaderScanner::new(log.clone(), entry_pos, self.size, 64 * 1024);
        loop {
            let (_, h) = match sc.next_header() {
                Ok(Some(x)) => x,
                Ok(None) => break,
                Err(LogError::Io(e)) => return Err(LogError::Io(e)),
                Err(_) => return Ok(false),
            };
            if first {
                if let Some(o) = entry_offset {
                    if h.last_offset() != o {
                        return Ok(false);
                    }
                }
                first = false;
            }
            if h.base_offset < expected
                || h.last_offset_delta < 0
                || h.last_offset() - self.base_offset > i64::from(i32::MAX)
            {
                return Ok(false);
            }
            if check_missing && since_entry > u64::from(self.index_interval_bytes) {
                return Ok(false);
            }
            since_entry += h.total_size() as u64;
            expected = h.next_offset();
            if h.max_timestamp > self.max_timestamp {
                self.max_timestamp = h.max_timestamp;
                self.offset_of_max_timestamp = h.last_offset();
            }
            self.next_offset = h.next_offset();
        }
        self.bytes_since_last_index_entry = self.size.saturating_sub(entry_pos);
        if self.size > 0 {
            let mut hb = [0u8; HEADER_SIZE];
            log.read_exact_at(&mut hb, 0)?;
            if let Some(h) = BatchHeader::parse(&hb) {
                if h.max_timestamp >= 0 {
                    self.rolling_base_timestamp = Some(h.max_timestamp);
                }
            }
        }
        Ok(true)
    }

    /// Full validation of every batch (framing, CRC, offsets), rebuilding
    /// both indexes. Cuts the file at the first invalid byte and returns how
    /// many bytes were cut.
    pub fn recover(&mut self) -> Result<u64, LogError> {
        self.offset_index.reset()?;
        self.time_index.reset()?;
        self.next_offset = self.base_offset;
        self.max_timestamp = -1;
        self.offset_of_max_timestamp = -1;
        self.rolling_base_timestamp = None;
        self.bytes_since_last_index_entry = 0;
        let log = self.log_file()?;
        let file_len = log.metadata()?.len();
        let mut reader = BufReader::with_capacity(1 << 20, File::open(&self.log_path)?);
        let mut pos = 0u64;
        let mut buf = Vec::new();
        let mut hdr = [0u8; HEADER_SIZE];
        while file_len - pos >= HEADER_SIZE as u64 {
            if reader.read_exact(&mut hdr).is_err() {
                break;
            }
            let h = match BatchHeader::parse(&hdr) {
                Some(h) => h,
                None => break,
            };
            if h.check_framing((file_len - pos).min(usize::MAX as u64) as usize).is_err() {
                break;
            }
            buf.clear();
            buf.extend_from_slice(&hdr);
            buf.resize(h.total_size(), 0);
            if reader.read_exact(&mut buf[HEADER_SIZE..]).is_err() {
                break;
            }
            let h = match batch::check_stored_batch(&buf) {
                Ok(h) => h,
                Err(_) => break,
            };
            if h.base_offset < self.next_offset || h.last_offset() - self.base_offset > i64::from(i32::MAX) {
                break;
            }
            self.index_batch(pos, &h);
            pos += h.total_size() as u64;
        }
        self.size = pos;
        let cut = file_len - pos;
        if cut > 0 {
            log.set_len(pos)?;
        }
        Ok(cut)
    }

    /// Index bookkeeping for one batch written at `pos` (Kafka's rule: an
    /// entry when more than index.interval.bytes were appended since the
    /// last one, so the first batch never gets one).
    fn index_batch(&mut self, pos: u64, h: &BatchHeader) {
        if h.max_timestamp > self.max_timestamp {
            self.max_timestamp = h.max_timestamp;
            self.offset_of_max_timestamp = h.last_offset();
        }
        if self.bytes_since_last_index_entry > u64::from(self.index_interval_bytes) {
            self.offset_index.append(h.last_offset(), pos as u32);
            self.time_index.maybe_append(self.max_timestamp, self.offset_of_max_timestamp);
            self.bytes_since_last_index_entry = 0;
        }
        self.bytes_since_last_index_entry += h.total_size() as u64;
        if self.rolling_base_timestamp.is_none() && h.max_timestamp >= 0 && pos == 0 {
            self.rolling_base_timestamp = Some(h.max_timestamp);
        }
        self.next_offset = h.next_offset();
    }

    /// Writes already-validated batches (offsets assigned) at the end. On a
    /// write error the file is cut back so the segment stays consistent.
    pub fn append(&mut self, records: &[u8], headers: &[BatchHeader]) -> Result<(), LogError> {
        self.append_patched(records, headers, &[])
    }

    /// [`LogSegment::append`], with `heads[i]` written in place of the first bytes of batch
    /// `i` (its base offset and leader epoch, assigned here): a leader appends a producer's
    /// batches from the request buffer, which is shared and so is not patched in memory.
    /// Without `heads`, `records` is written as it is.
    pub fn append_patched(
        &mut self,
        records: &[u8],
        headers: &[BatchHeader],
        heads: &[[u8; PATCHED_HEAD]],
    ) -> Result<(), LogError> {
        self.ensure_active()?;
        let log = self.log_file()?;
        let start = self.size;
        let written = if heads.is_empty() {
            log.write_all_at(records, start)
        } else {
            write_patched_at(&log, records, headers, heads, start)
        };
        if let Err(e) = written {
            if let Err(e2) = log.set_len(start) {
                tracing::error!(segment = %self.log_path.display(), error = %e2, "could not cut back a failed append");
            }
            return Err(LogError::Io(e));
        }
        let mut pos = start;
        for h in headers {
            self.index_batch(pos, h);
            pos += h.total_size() as u64;
        }
        self.size = pos;
        Ok(())
    }

    /// Kafka's roll conditions, checked before writing `len` bytes holding
    /// offsets `[first_offset, last_offset]` with max timestamp `max_ts`.
    pub fn should_roll(
        &self,
        config: &LogConfig,
        len: usize,
        first_offset: i64,
        last_offset: i64,
        max_ts: i64,
        now_ms: i64,
    ) -> bool {
        let limit = config.segment_bytes.min(i32::MAX as u64);
        let non_empty = self.size > 0;
        let full = non_empty && self.size + len as u64 > limit;
        let waited = match self.rolling_base_timestamp {
            Some(t) => max_ts.saturating_sub(t),
            None => now_ms.saturating_sub(self.created_ms),
        };
        let aged = non_empty && waited > config.max_segment_ms();
        let index_full = self.offset_index.is_full() || self.time_index.is_full();
        let overflow = first_offset < self.base_offset || last_offset - self.base_offset > i64::from(i32::MAX);
        full || aged || index_full || overflow
    }

    /// Whether an append of `len` bytes at about `now_ms` could roll this segment: a look that
    /// needs no batch header, erring towards yes (a producer's timestamps near now, no offset
    /// overflow, as [`Self::should_roll`] decides them).
    pub fn may_roll(&self, config: &LogConfig, len: usize, now_ms: i64) -> bool {
        let non_empty = self.size > 0;
        let full = non_empty && self.size + len as u64 > config.segment_bytes.min(i32::MAX as u64);
        let since = self.rolling_base_timestamp.unwrap_or(self.created_ms);
        let aged = non_empty && now_ms.saturating_sub(since) > config.max_segment_ms();
        full || aged || self.offset_index.is_full() || self.time_index.is_full()
    }

    /// First batch whose last offset is >= `offset`, as (position, header).
    pub fn find_batch(&self, offset: i64) -> Result<Option<(u64, BatchHeader)>, LogError> {
        let (_, pos) = self.offset_index.lookup(offset)?;
        let mut sc = self.scanner(u64::from(pos), 16 * 1024)?;
        while let Some((p, h)) = sc.next_header()? {
            if h.last_offset() >= offset {
                return Ok(Some((p, h)));
            }
        }
        Ok(None)
    }

    /// First batch with maxTimestamp >= `ts` holding an offset >=
    /// `min_offset` (batch granularity).
    pub fn find_by_timestamp(&self, ts: i64, min_offset: i64) -> Result<Option<BatchHeader>, LogError> {
        if self.max_timestamp < ts {
            return Ok(None);
        }
        let start_offset = self.time_index.lookup(ts)?.max(min_offset);
        let (_, pos) = self.offset_index.lookup(start_offset)?;
        let mut sc = self.scanner(u64::from(pos), 16 * 1024)?;
        while let Some((_, h)) = sc.next_header()? {
            if h.max_timestamp >= ts && h.last_offset() >= min_offset {
                return Ok(Some(h));
            }
        }
        Ok(None)
    }

    /// Removes every batch whose last offset is >= `offset` (whole batches).
    /// Returns the bytes removed.
    pub fn truncate_to(&mut self, offset: i64) -> Result<u64, LogError> {
        let cut = match self.find_batch(offset)? {
            None => return Ok(0),
            Some((pos, _)) => pos,
        };
        // Indexes first: one that failed to shrink would point past the cut log, while one
        // shrunk ahead of a failed cut only lacks entries (they are hints).
        self.offset_index.truncate_to(offset)?;
        self.time_index.truncate_to(offset)?;
        self.log_file()?.set_len(cut)?;
        let removed = self.size - cut;
        self.size = cut;
        if !self.reload_tail(false)? {
            self.recover()?;
        }
        if self.size == 0 {
            self.created_ms = super::now_ms();
        }
        Ok(removed)
    }

    /// Re-grows trimmed indexes so the segment can take appends.
    pub fn ensure_active(&mut self) -> Result<(), LogError> {
        if !self.active {
            self.offset_index.preallocate(self.max_index_size)?;
            self.time_index.preallocate(self.max_index_size)?;
            self.active = true;
        }
        Ok(())
    }

    /// Called at roll and close: record the segment's max timestamp in the
    /// time index (so a reopen finds it without a scan) and trim both
    /// indexes to their used size.
    pub fn make_inactive(&mut self) -> Result<(), LogError> {
        if self.max_timestamp >= 0 {
            self.time_index.maybe_append(self.max_timestamp, self.offset_of_max_timestamp);
        }
        self.offset_index.trim()?;
        self.time_index.trim()?;
        self.active = false;
        Ok(())
    }

    pub fn flush(&self) -> Result<(), LogError> {
        self.log_file()?.sync_data()?;
        self.offset_index.flush()?;
        self.time_index.flush()?;
        Ok(())
    }

    /// Renames the files to `*.deleted` and removes them. Readers holding a
    /// `FileRange` keep their open file; the cache's is closed first.
    pub fn delete_files(self) -> Result<(), LogError> {
        // The aborted-transaction index goes with its segment (it only exists for segments
        // where a transaction was aborted).
        let txn_index = self.log_path.parent().map(|d| super::txn_index_file_path(d, self.base_offset));
        let paths =
            [self.log_path.clone(), self.offset_index.path().to_path_buf(), self.time_index.path().to_path_buf()];
        drop(self);
        if let Some(t) = txn_index {
            match std::fs::remove_file(&t) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e.into()),
            }
        }
        for p in paths {
            let mut deleted = p.clone().into_os_string();
            deleted.push(".deleted");
            match std::fs::rename(&p, &deleted) {
                Ok(()) => std::fs::remove_file(&deleted)?,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }
}

impl Drop for LogSegment {
    /// A segment that goes (deleted, replaced, its log closed) takes its cache entry with it.
    fn drop(&mut self) {
        segment_files().remove(self.id);
    }
}

/// The bytes of a batch that a leader's append assigns: base offset, length (unchanged) and
/// partition leader epoch, all outside the CRC.
pub const PATCHED_HEAD: usize = 16;

/// Writes `records` at `at` with each batch's first [`PATCHED_HEAD`] bytes taken from `heads`,
/// in as few `pwritev` calls as the kernel allows.
fn write_patched_at(
    file: &File,
    records: &[u8],
    headers: &[BatchHeader],
    heads: &[[u8; PATCHED_HEAD]],
    at: u64,
) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let invalid = || io::Error::new(io::ErrorKind::InvalidInput, "batch headers do not match the records");
    if heads.len() != headers.len() {
        return Err(invalid());
    }
    let mut slices = Vec::with_capacity(headers.len() * 2 + 1);
    let mut pos = 0usize;
    for (h, head) in headers.iter().zip(heads) {
        let end = pos + h.total_size();
        slices.push(io::IoSlice::new(head));
        slices.push(io::IoSlice::new(records.get(pos + PATCHED_HEAD..end).ok_or_else(invalid)?));
        pos = end;
    }
    if let Some(rest) = records.get(pos..).filter(|r| !r.is_empty()) {
        slices.push(io::IoSlice::new(rest));
    }
    let mut left = &mut slices[..];
    let mut offset = at;
    while !left.is_empty() {
        // IOV_MAX on Linux.
        let count = left.len().min(1024) as libc::c_int;
        // SAFETY: IoSlice is ABI-compatible with iovec on Unix, and each one points into
        // `heads` or `records`, both borrowed for the whole call.
        let n = unsafe { libc::pwritev(file.as_raw_fd(), left.as_ptr().cast(), count, offset as libc::off_t) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        offset += n as u64;
        io::IoSlice::advance_slices(&mut left, n as usize);
    }
    Ok(())
}
