//! The replica manager: the partitions this broker hosts, and the rules for appending to and
//! reading from them. Standalone, this broker leads every partition and the high watermark is
//! the log end offset; replication (followers, ISR) builds on this type.
//!
//! Locking: a partition's producer state lock is taken before its log lock, and neither is held
//! across an await. Readers copy file ranges out after releasing the log lock.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};

use bytes::Bytes;
use tokio::sync::Notify;

use crate::log::{AppendInfo, FileRange, Log, LogConfig, LogError, LogManager};
use crate::txn::{ProducerStateManager, SequenceCheck};

pub type TopicPartition = (String, i32);

pub struct Partition {
    pub topic: String,
    pub index: i32,
    log: Arc<Mutex<Log>>,
    producers: Mutex<ProducerStateManager>,
}

/// What Produce answers for one partition.
#[derive(Debug, Clone, Copy)]
pub struct ProduceResult {
    pub error_code: i16,
    pub base_offset: i64,
    pub log_start_offset: i64,
}

/// What Fetch answers for one partition: the stored batches as they are on disk.
pub struct FetchResult {
    pub error_code: i16,
    pub high_watermark: i64,
    pub log_start_offset: i64,
    pub records: Bytes,
}

impl Partition {
    fn lock_log(&self) -> std::sync::MutexGuard<'_, Log> {
        // The log's own operations restore consistency on error before returning, so a panic
        // elsewhere while the guard was held leaves nothing half-written.
        self.log.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn log_end_offset(&self) -> i64 {
        self.lock_log().log_end_offset()
    }

    pub fn log_start_offset(&self) -> i64 {
        self.lock_log().log_start_offset()
    }

    /// Standalone there are no followers, so everything appended is committed.
    pub fn high_watermark(&self) -> i64 {
        self.log_end_offset()
    }

    pub fn append(&self, records: Bytes, leader_epoch: i32, max_message_bytes: u32) -> ProduceResult {
        let fail = |code: i16| ProduceResult { error_code: code, base_offset: -1, log_start_offset: -1 };
        let headers = match crate::log::validate_batches(&records, max_message_bytes) {
            Ok(h) => h,
            Err(e) => {
                tracing::info!(topic = %self.topic, partition = self.index, error = %e, "rejected produce");
                return fail(e.kafka_code());
            }
        };
        let mut producers = self.producers.lock().unwrap_or_else(|p| p.into_inner());
        for h in headers.iter().filter(|h| h.producer_id >= 0 && h.base_sequence >= 0) {
            let last_seq = h.base_sequence.wrapping_add(h.last_offset_delta) & i32::MAX;
            match producers.check(h.producer_id, h.producer_epoch, h.base_sequence, last_seq) {
                SequenceCheck::Append => {}
                SequenceCheck::Duplicate { first_offset } if headers.len() == 1 => {
                    return ProduceResult {
                        error_code: 0,
                        base_offset: first_offset,
                        log_start_offset: self.log_start_offset(),
                    };
                }
                SequenceCheck::Duplicate { .. } => return fail(46),
                SequenceCheck::Reject(code) => return fail(code),
            }
        }
        let mut buf = records.to_vec();
        let mut log = self.lock_log();
        let info: AppendInfo = match log.append(&mut buf, leader_epoch) {
            Ok(info) => info,
            Err(e) => {
                tracing::warn!(topic = %self.topic, partition = self.index, error = %e, "append failed");
                return fail(e.kafka_code());
            }
        };
        let mut offset = info.first_offset;
        for h in &headers {
            if h.producer_id >= 0 && h.base_sequence >= 0 {
                let last_seq = h.base_sequence.wrapping_add(h.last_offset_delta) & i32::MAX;
                producers.record(h.producer_id, h.producer_epoch, h.base_sequence, last_seq, offset);
            }
            offset += h.last_offset_delta as i64 + 1;
        }
        if let Err(e) = log.maybe_flush(crate::log::now_ms()) {
            tracing::warn!(topic = %self.topic, partition = self.index, error = %e, "flush failed");
        }
        let log_start_offset = log.log_start_offset();
        drop(log);
        drop(producers);
        ProduceResult { error_code: 0, base_offset: info.first_offset, log_start_offset }
    }

    pub fn read(&self, offset: i64, max_bytes: usize) -> FetchResult {
        let (ranges, hw, start) = {
            let log = self.lock_log();
            let hw = log.log_end_offset();
            let start = log.log_start_offset();
            match log.read(offset, max_bytes, Some(hw)) {
                Ok(r) => (r, hw, start),
                Err(e) => {
                    return FetchResult {
                        error_code: e.kafka_code(),
                        high_watermark: hw,
                        log_start_offset: start,
                        records: Bytes::new(),
                    }
                }
            }
        };
        let mut out = Vec::with_capacity(ranges.iter().map(|r| r.len).sum());
        for r in &ranges {
            if let Err(e) = FileRange::read_into(r, &mut out) {
                tracing::warn!(topic = %self.topic, partition = self.index, error = %e, "read failed");
                return FetchResult {
                    error_code: 56,
                    high_watermark: hw,
                    log_start_offset: start,
                    records: Bytes::new(),
                };
            }
        }
        FetchResult { error_code: 0, high_watermark: hw, log_start_offset: start, records: Bytes::from(out) }
    }

    /// ListOffsets by time: the first record whose timestamp is >= `ts`, and its timestamp.
    /// The log finds the batch; for an uncompressed batch the records' own timestamps give the
    /// exact record, as Kafka answers. A compressed batch answers with its first offset.
    pub fn offset_for_timestamp(&self, ts: i64) -> Result<Option<(i64, i64)>, LogError> {
        let (found, range) = {
            let log = self.lock_log();
            let Some(found) = log.offset_for_timestamp(ts)? else { return Ok(None) };
            let range = log.read(found.0, 1, None)?.into_iter().next();
            (found, range)
        };
        let Some(range) = range else { return Ok(Some(found)) };
        let mut batch = Vec::with_capacity(range.len);
        range.read_into(&mut batch)?;
        Ok(Some(first_record_at_or_after(&batch, ts, found.0).unwrap_or(found)))
    }

    pub fn delete_records_before(&self, offset: i64) -> Result<i64, LogError> {
        self.lock_log().delete_records_before(offset)
    }

    /// Applies flush.messages / flush.ms; errors are logged, the data stays in the page cache.
    pub fn maybe_flush(&self) {
        if let Err(e) = self.lock_log().maybe_flush(crate::log::now_ms()) {
            tracing::warn!(topic = %self.topic, partition = self.index, error = %e, "flush failed");
        }
    }

    pub fn set_config(&self, config: LogConfig) {
        self.lock_log().set_config(config);
    }
}

/// How many of the newest segments are re-read for producer state when a partition opens.
const PRODUCER_STATE_SEGMENTS: usize = 2;

/// Producer sequence state from the batches at the end of the log, so that a producer retrying
/// across a broker restart is still recognised and not written twice.
fn rebuild_producer_state(log: &Mutex<Log>) -> ProducerStateManager {
    let mut state = ProducerStateManager::default();
    let guard = log.lock().unwrap_or_else(|p| p.into_inner());
    match guard.recent_producer_batches(PRODUCER_STATE_SEGMENTS) {
        Ok(headers) => {
            for h in headers {
                let last_seq = h.base_sequence.wrapping_add(h.last_offset_delta) & i32::MAX;
                state.record(h.producer_id, h.producer_epoch, h.base_sequence, last_seq, h.base_offset);
            }
        }
        Err(e) => tracing::warn!(dir = %guard.dir().display(), error = %e, "cannot rebuild producer state"),
    }
    state
}

/// Walks the records of an uncompressed batch for the first with timestamp >= `ts` at an
/// offset >= `min_offset`. None if the batch is compressed or malformed.
fn first_record_at_or_after(batch: &[u8], ts: i64, min_offset: i64) -> Option<(i64, i64)> {
    use crate::log::batch::{read_varint, read_varlong};
    let h = crate::log::BatchHeader::parse(batch)?;
    if h.compression() != 0 || batch.len() < h.total_size() {
        return None;
    }
    let mut rest = &batch[crate::log::batch::HEADER_SIZE..h.total_size()];
    for _ in 0..h.records_count {
        let (len, n) = read_varint(rest)?;
        let record = rest.get(n..n + usize::try_from(len).ok()?)?;
        rest = &rest[n + len as usize..];
        let body = record.get(1..)?; // attributes
        let (ts_delta, n) = read_varlong(body)?;
        let (offset_delta, _) = read_varint(body.get(n..)?)?;
        let (offset, timestamp) = (h.base_offset + offset_delta as i64, h.base_timestamp + ts_delta);
        if timestamp >= ts && offset >= min_offset {
            return Some((offset, timestamp));
        }
    }
    None
}

pub struct ReplicaManager {
    pub broker_id: i32,
    logs: LogManager,
    partitions: RwLock<HashMap<TopicPartition, Arc<Partition>>>,
    /// Woken on every append so long-polling fetches re-check without polling.
    data_arrived: Notify,
}

impl ReplicaManager {
    pub fn new(broker_id: i32, logs: LogManager) -> ReplicaManager {
        ReplicaManager { broker_id, logs, partitions: RwLock::new(HashMap::new()), data_arrived: Notify::new() }
    }

    pub fn logs(&self) -> &LogManager {
        &self.logs
    }

    pub fn partition(&self, topic: &str, index: i32) -> Option<Arc<Partition>> {
        self.partitions.read().unwrap_or_else(|p| p.into_inner()).get(&(topic.to_string(), index)).cloned()
    }

    /// Opens (creating if needed) the log of a partition this broker hosts.
    pub fn make_leader(
        &self,
        topic: &str,
        index: i32,
        topic_id: &str,
        config: LogConfig,
    ) -> Result<Arc<Partition>, LogError> {
        if let Some(p) = self.partition(topic, index) {
            return Ok(p);
        }
        let log = self.logs.get_or_create(topic, index, config)?;
        {
            let guard = log.lock().unwrap_or_else(|p| p.into_inner());
            let dir: PathBuf = guard.dir().to_path_buf();
            drop(guard);
            if !matches!(crate::log::read_partition_metadata(&dir), Ok(Some(_))) {
                crate::log::write_partition_metadata(&dir, topic_id)?;
            }
        }
        let producers = rebuild_producer_state(&log);
        let p = Arc::new(Partition { topic: topic.to_string(), index, log, producers: Mutex::new(producers) });
        self.partitions.write().unwrap_or_else(|p| p.into_inner()).insert((topic.to_string(), index), p.clone());
        Ok(p)
    }

    /// Stops leading a partition but keeps its log (leadership moved elsewhere). Returns
    /// whether it was being served.
    pub fn stop_serving(&self, topic: &str, index: i32) -> bool {
        self.partitions.write().unwrap_or_else(|p| p.into_inner()).remove(&(topic.to_string(), index)).is_some()
    }

    pub fn remove_partition(&self, topic: &str, index: i32) -> Result<(), LogError> {
        self.partitions.write().unwrap_or_else(|p| p.into_inner()).remove(&(topic.to_string(), index));
        self.logs.delete_log(topic, index)
    }

    pub fn notify_appended(&self) {
        self.data_arrived.notify_waiters();
    }

    /// A future that completes at the next append. Create it *before* checking for data, so an
    /// append between the check and the wait is not missed.
    pub fn appended(&self) -> tokio::sync::futures::Notified<'_> {
        self.data_arrived.notified()
    }

    pub fn all_partitions(&self) -> Vec<Arc<Partition>> {
        self.partitions.read().unwrap_or_else(|p| p.into_inner()).values().cloned().collect()
    }
}
