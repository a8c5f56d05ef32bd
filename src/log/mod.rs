//! On-disk segment store, laid out exactly like Kafka's: one directory per
//! partition (`<topic>-<partition>`), segments named by their 20-digit base
//! offset (`.log` data, `.index` offset index, `.timeindex` time index), and
//! Kafka's text checkpoint files in each log dir.
//!
//! Invariants kept across the module:
//! * a `.log` file only ever holds whole, CRC-valid v2 batches up to the
//!   segment's in-memory size; anything after that (torn writes) is cut on
//!   recovery before any reader can see it;
//! * indexes are hints: every lookup is followed by a header-only forward
//!   scan, so a lost index entry costs time, never correctness;
//! * nothing here spawns threads; the broker drives flush/retention/checkpoint.

pub mod batch;
pub mod checkpoint;
pub mod cleaner;
pub mod compression;
pub mod dir_failure;
pub mod fd_cache;
pub mod index;
pub mod index_cache;
pub mod legacy;
mod lru;
pub mod manager;
pub mod partition_log;
pub mod producer_snapshot;
pub mod producer_state;
pub mod segment;
pub mod zero_copy;

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::protocol::{ApiError, ErrorCode};

pub use batch::{validate_batches, BatchHeader};
pub use checkpoint::{read_partition_metadata, write_partition_metadata};
pub use index::{OffsetIndex, TimeIndex};
pub use manager::LogManager;
pub use partition_log::{Log, LogStats};
pub use segment::LogSegment;

#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
    #[error("corrupt message: {0}")]
    CorruptMessage(String),
    #[error("invalid record: {0}")]
    InvalidRecord(String),
    #[error("unsupported version: {0}")]
    UnsupportedVersion(String),
    #[error("unsupported compression: {0}")]
    UnsupportedCompression(String),
    #[error("message larger than max.message.bytes")]
    MessageTooLarge,
    #[error("record set larger than segment.bytes")]
    RecordListTooLarge,
    #[error("offset {offset} out of range [{log_start_offset}, {log_end_offset}]")]
    OffsetOutOfRange { offset: i64, log_start_offset: i64, log_end_offset: i64 },
    #[error("invalid topic: {0}")]
    InvalidTopic(String),
    /// The log dir holding this partition failed or the log was deleted.
    #[error("log storage unavailable: {0}")]
    StorageUnavailable(String),
}

impl LogError {
    /// Kafka error code to put in a response.
    pub fn kafka_code(&self) -> i16 {
        match self {
            LogError::Io(_) | LogError::StorageUnavailable(_) => ErrorCode::KafkaStorageError.code(),
            LogError::CorruptMessage(_) => ErrorCode::CorruptMessage.code(),
            LogError::InvalidRecord(_) => ErrorCode::InvalidRecord.code(),
            LogError::UnsupportedVersion(_) => ErrorCode::UnsupportedVersion.code(),
            LogError::UnsupportedCompression(_) => ErrorCode::UnsupportedCompressionType.code(),
            LogError::MessageTooLarge => ErrorCode::MessageTooLarge.code(),
            LogError::RecordListTooLarge => ErrorCode::RecordListTooLarge.code(),
            LogError::OffsetOutOfRange { .. } => ErrorCode::OffsetOutOfRange.code(),
            LogError::InvalidTopic(_) => ErrorCode::InvalidTopicException.code(),
        }
    }
}

impl From<LogError> for ApiError {
    fn from(e: LogError) -> ApiError {
        ApiError { code: e.kafka_code(), message: e.to_string() }
    }
}

const DAY_MS: i64 = 24 * 60 * 60 * 1000;

/// Per-topic effective config (Kafka property names in comments).
#[derive(Clone, Debug, PartialEq)]
pub struct LogConfig {
    /// segment.bytes / log.segment.bytes
    pub segment_bytes: u64,
    /// segment.ms / log.roll.ms | log.roll.hours
    pub segment_ms: i64,
    /// index.interval.bytes
    pub index_interval_bytes: u32,
    /// segment.index.bytes / log.index.size.max.bytes
    pub max_index_size: u32,
    /// retention.ms (-1 = forever)
    pub retention_ms: i64,
    /// retention.bytes (-1 = unlimited)
    pub retention_bytes: i64,
    /// max.message.bytes / message.max.bytes
    pub max_message_bytes: u32,
    /// flush.messages
    pub flush_interval_messages: u64,
    /// flush.ms
    pub flush_interval_ms: u64,
    /// file.delete.delay.ms (accepted but files are removed at once, see
    /// `partition_log`)
    pub file_delete_delay_ms: u64,
    /// message.downconversion.enable / log.message.downconversion.enable: whether Fetch
    /// v0-v3 consumers get the log down-converted or UNSUPPORTED_VERSION.
    pub message_downconversion_enable: bool,
    /// cleanup.policy contains `compact`: the log cleaner keeps the last record per key.
    pub compact: bool,
    /// cleanup.policy contains `delete`: retention.ms / retention.bytes delete old segments.
    pub delete: bool,
    /// delete.retention.ms / log.cleaner.delete.retention.ms: how long a tombstone outlives
    /// the cleaning pass that first saw it.
    pub delete_retention_ms: i64,
    /// min.compaction.lag.ms: records younger than this are never compacted.
    pub min_compaction_lag_ms: i64,
    /// max.compaction.lag.ms: dirty records older than this make the log cleanable whatever
    /// its dirty ratio (and bound segment.ms on compacted topics).
    pub max_compaction_lag_ms: i64,
    /// min.cleanable.dirty.ratio / log.cleaner.min.cleanable.ratio
    pub min_cleanable_dirty_ratio: f64,
    /// message.timestamp.type / log.message.timestamp.type is LogAppendTime: the leader stamps
    /// each batch with its own clock (attribute bit 3, maxTimestamp), as Kafka does.
    pub log_append_time: bool,
}

impl LogConfig {
    /// Kafka's maxSegmentMs: a compacted log also rolls by max.compaction.lag.ms, since the
    /// cleaner never touches the active segment.
    pub fn max_segment_ms(&self) -> i64 {
        if self.compact {
            self.segment_ms.min(self.max_compaction_lag_ms)
        } else {
            self.segment_ms
        }
    }
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            segment_bytes: 1 << 30,
            segment_ms: 7 * DAY_MS,
            index_interval_bytes: 4096,
            max_index_size: 10 * 1024 * 1024,
            retention_ms: 7 * DAY_MS,
            retention_bytes: -1,
            max_message_bytes: 1_048_588,
            flush_interval_messages: u64::MAX,
            flush_interval_ms: u64::MAX,
            file_delete_delay_ms: 60_000,
            message_downconversion_enable: true,
            compact: false,
            delete: true,
            delete_retention_ms: DAY_MS,
            min_compaction_lag_ms: 0,
            max_compaction_lag_ms: i64::MAX,
            min_cleanable_dirty_ratio: 0.5,
            log_append_time: false,
        }
    }
}

/// Result of one append.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AppendInfo {
    pub first_offset: i64,
    pub last_offset: i64,
    /// Largest batch maxTimestamp in the append (-1 if none).
    pub max_timestamp: i64,
    /// Last offset of the batch holding `max_timestamp` (batch granularity).
    pub offset_of_max_timestamp: i64,
    pub record_count: u64,
    /// The broker time stamped on the batches (LogAppendTime topics), else -1: the Produce
    /// response's log_append_time_ms.
    pub log_append_time: i64,
}

/// A byte range of a segment file that Fetch sends as-is. It holds the file
/// open, so it stays readable even if retention deletes the segment; a
/// concurrent `truncate_to` may shorten it, in which case `read_into` fails
/// with `UnexpectedEof`.
#[derive(Clone, Debug)]
pub struct FileRange {
    pub file: Arc<File>,
    pub position: u64,
    pub len: usize,
    /// The offset after the range's last batch.
    pub end_offset: i64,
}

impl FileRange {
    /// Appends the range's bytes to `out` with positional reads.
    pub fn read_into(&self, out: &mut Vec<u8>) -> std::io::Result<()> {
        let start = out.len();
        out.resize(start + self.len, 0);
        let r = self.file.read_exact_at(&mut out[start..], self.position);
        if r.is_err() {
            out.truncate(start);
        }
        r
    }

    /// Appends the range's bytes to `out`, read straight into its spare capacity: a fetch
    /// hands these bytes on as they are, so they are neither zeroed first nor copied after.
    pub fn read_into_buf(&self, out: &mut bytes::BytesMut) -> std::io::Result<()> {
        use std::os::fd::AsRawFd;
        let start = out.len();
        out.reserve(self.len);
        let mut done = 0;
        while done < self.len {
            let spare = out.spare_capacity_mut();
            let want = (self.len - done).min(spare.len());
            let at = (self.position + done as u64) as libc::off_t;
            // SAFETY: pread writes at most `want` bytes, which the spare capacity holds (it
            // was reserved above), and only the bytes it reports written are then counted
            // as initialised.
            let n = unsafe { libc::pread(self.file.as_raw_fd(), spare.as_mut_ptr().cast(), want, at) };
            let failed = match n {
                n if n > 0 => {
                    // SAFETY: the `n` bytes after the current length were written just now.
                    unsafe { out.set_len(out.len() + n as usize) };
                    done += n as usize;
                    continue;
                }
                0 => std::io::Error::from(std::io::ErrorKind::UnexpectedEof),
                _ => std::io::Error::last_os_error(),
            };
            if failed.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            out.truncate(start);
            return Err(failed);
        }
        Ok(())
    }
}

/// `00000000000000000042` - Kafka's 20-digit zero-padded base offset.
pub fn file_prefix(base_offset: i64) -> String {
    format!("{base_offset:020}")
}

pub fn log_file_path(dir: &Path, base_offset: i64) -> PathBuf {
    dir.join(format!("{}.log", file_prefix(base_offset)))
}

pub fn index_file_path(dir: &Path, base_offset: i64) -> PathBuf {
    dir.join(format!("{}.index", file_prefix(base_offset)))
}

pub fn time_index_file_path(dir: &Path, base_offset: i64) -> PathBuf {
    dir.join(format!("{}.timeindex", file_prefix(base_offset)))
}

pub fn txn_index_file_path(dir: &Path, base_offset: i64) -> PathBuf {
    dir.join(format!("{}.txnindex", file_prefix(base_offset)))
}

/// Partition directory name: `<topic>-<partition>`.
pub fn partition_dir_name(topic: &str, partition: i32) -> String {
    format!("{topic}-{partition}")
}

/// Splits a partition directory name at the LAST '-' (topics may contain
/// '-' and '.'). Rejects Kafka's `-delete`/`-future` dirs and anything whose
/// suffix is not a non-negative integer.
pub fn parse_partition_dir_name(name: &str) -> Option<(String, i32)> {
    let (topic, part) = name.rsplit_once('-')?;
    if topic.is_empty() || part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let p: i32 = part.parse().ok()?;
    Some((topic.to_string(), p))
}

/// Kafka's legal topic characters; also keeps names safe as path components.
pub fn validate_topic_name(topic: &str) -> Result<(), LogError> {
    let ok = !topic.is_empty()
        && topic.len() <= 249
        && topic != "."
        && topic != ".."
        && topic.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(LogError::InvalidTopic(topic.to_string()))
    }
}

/// Wall clock in ms since the epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(file_prefix(0), "00000000000000000000");
        assert_eq!(file_prefix(368769), "00000000000000368769");
        assert_eq!(log_file_path(Path::new("/d"), 5), PathBuf::from("/d/00000000000000000005.log"));
        assert_eq!(parse_partition_dir_name("orders-0"), Some(("orders".into(), 0)));
        assert_eq!(parse_partition_dir_name("my-top.ic-12"), Some(("my-top.ic".into(), 12)));
        assert_eq!(parse_partition_dir_name("orders-0.abc-delete"), None);
        assert_eq!(parse_partition_dir_name("orders"), None);
        assert_eq!(parse_partition_dir_name("-3"), None);
        assert_eq!(parse_partition_dir_name("t--3"), Some(("t-".into(), 3)));
        assert!(validate_topic_name("a.b-c_d").is_ok());
        assert!(validate_topic_name("../x").is_err());
        assert!(validate_topic_name("..").is_err());
        assert!(validate_topic_name("").is_err());
    }

    #[test]
    fn error_codes() {
        assert_eq!(LogError::Io(std::io::Error::other("x")).kafka_code(), ErrorCode::KafkaStorageError.code());
        assert_eq!(
            LogError::OffsetOutOfRange { offset: 1, log_start_offset: 0, log_end_offset: 0 }.kafka_code(),
            ErrorCode::OffsetOutOfRange.code()
        );
    }
}
