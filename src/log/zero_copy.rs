//! Record sets that stay in their segment file until the socket takes them (sendfile).
//!
//! The protocol crate encodes a Fetch response from `Bytes`, so a record set that is to go
//! from file to socket without passing through memory is represented, while the response is
//! built and encoded, by a placeholder: a `Bytes` of the right length over a read-only region
//! of zero pages that is never backed by memory, paired with the file ranges it stands for.
//! The response writer recognises a placeholder by its address and sends the ranges in its
//! place.
//!
//! Placeholders are only handed out inside [`collect`], which the Fetch handler wraps around
//! its synchronous read of the partitions of one response, on a connection whose bytes go to
//! the socket as they are (plaintext). Everything else reads records as bytes, as before: a
//! placeholder read as bytes would be zeros, so none may escape to a caller that reads it.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::OnceLock;

use bytes::Bytes;

use super::FileRange;

/// Smaller record sets are read into the response: below this, one pread plus a share of a
/// writev cost less than a sendfile call of their own.
pub const SENDFILE_MIN_BYTES: usize = 16 * 1024;

/// Address space reserved for placeholders (never touched, so never memory). One response's
/// placeholders do not overlap, so their sum is bounded by this; a larger one is read instead.
const REGION_BYTES: usize = 1 << 34;

struct Region {
    base: usize,
    len: usize,
}

fn region() -> Option<&'static Region> {
    static REGION: OnceLock<Option<Region>> = OnceLock::new();
    REGION
        .get_or_init(|| {
            // SAFETY: a fresh private anonymous mapping; nothing else refers to its addresses.
            // It is never unmapped, so slices of it live for the rest of the process.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    REGION_BYTES,
                    libc::PROT_READ,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                    -1,
                    0,
                )
            };
            if p == libc::MAP_FAILED {
                tracing::warn!(error = %std::io::Error::last_os_error(), "no address space for sendfile; fetches copy");
                return None;
            }
            Some(Region { base: p as usize, len: REGION_BYTES })
        })
        .as_ref()
}

/// The file ranges each placeholder of one response stands for, by placeholder address.
#[derive(Default)]
pub struct FileRanges {
    by_address: HashMap<usize, (usize, Vec<FileRange>)>,
}

impl FileRanges {
    pub fn is_empty(&self) -> bool {
        self.by_address.is_empty()
    }

    /// Whether `b` is one of this response's placeholders.
    pub fn holds(&self, b: &[u8]) -> bool {
        self.by_address.get(&(b.as_ptr() as usize)).is_some_and(|(len, _)| *len == b.len())
    }

    /// The ranges `b` stands for, if it is a placeholder (each is given out once).
    pub fn take(&mut self, b: &[u8]) -> Option<Vec<FileRange>> {
        if !self.holds(b) {
            return None;
        }
        self.by_address.remove(&(b.as_ptr() as usize)).map(|(_, ranges)| ranges)
    }
}

struct Collector {
    /// Next free byte of the region.
    cursor: usize,
    ranges: FileRanges,
}

thread_local! {
    static COLLECTING: RefCell<Option<Collector>> = const { RefCell::new(None) };
}

/// Runs `read` (synchronous: it never yields, so the thread-local stays this request's), with
/// record sets of [`SENDFILE_MIN_BYTES`] or more returned as placeholders when `enabled`.
pub fn collect<T>(enabled: bool, read: impl FnOnce() -> T) -> (T, FileRanges) {
    if !enabled || region().is_none() {
        return (read(), FileRanges::default());
    }
    COLLECTING.with(|c| *c.borrow_mut() = Some(Collector { cursor: 0, ranges: FileRanges::default() }));
    // Taken back even if `read` unwinds, so no later request on this thread gets placeholders.
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            COLLECTING.with(|c| c.borrow_mut().take());
        }
    }
    let reset = Reset;
    let out = read();
    let ranges = COLLECTING.with(|c| c.borrow_mut().take()).map(|c| c.ranges).unwrap_or_default();
    drop(reset);
    (out, ranges)
}

/// A placeholder for `ranges` if a [`collect`] is running and they are worth sending from the
/// file; None: read them.
pub fn defer(ranges: &[FileRange]) -> Option<Bytes> {
    let len: usize = ranges.iter().map(|r| r.len).sum();
    if len < SENDFILE_MIN_BYTES {
        return None;
    }
    let region = region()?;
    COLLECTING.with(|c| {
        let mut c = c.borrow_mut();
        let c = c.as_mut()?;
        let end = c.cursor.checked_add(len).filter(|e| *e <= region.len)?;
        let address = region.base + c.cursor;
        c.cursor = end;
        // SAFETY: [address, address + len) lies in the region, which is mapped readable for
        // the life of the process and never written.
        let placeholder: &'static [u8] = unsafe { std::slice::from_raw_parts(address as *const u8, len) };
        c.ranges.by_address.insert(address, (len, ranges.to_vec()));
        Some(Bytes::from_static(placeholder))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::sync::Arc;

    fn range(len: usize) -> FileRange {
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&vec![7u8; len]).unwrap();
        FileRange { file: Arc::new(f), position: 0, len, end_offset: 1 }
    }

    #[test]
    fn placeholders_only_inside_a_collection_and_only_for_large_sets() {
        assert!(defer(&[range(SENDFILE_MIN_BYTES)]).is_none());
        let ((a, b, small), mut files) = collect(true, || {
            (defer(&[range(SENDFILE_MIN_BYTES)]), defer(&[range(SENDFILE_MIN_BYTES), range(5)]), defer(&[range(10)]))
        });
        let (a, b) = (a.unwrap(), b.unwrap());
        assert!(small.is_none());
        assert_eq!((a.len(), b.len()), (SENDFILE_MIN_BYTES, SENDFILE_MIN_BYTES + 5));
        assert_ne!(a.as_ptr(), b.as_ptr());
        assert!(!files.holds(&a[..10]));
        assert_eq!(files.take(&b).unwrap().len(), 2);
        assert!(files.take(&b).is_none());
        assert_eq!(files.take(&a).unwrap()[0].len, SENDFILE_MIN_BYTES);
        assert!(defer(&[range(SENDFILE_MIN_BYTES)]).is_none(), "nothing after the collection");
        let (none, files) = collect(false, || defer(&[range(SENDFILE_MIN_BYTES)]));
        assert!(none.is_none() && files.is_empty());
    }
}
