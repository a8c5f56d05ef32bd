//! One partition replica on this broker (Kafka's `Partition`): its log, producer state,
//! leader epoch cache, high watermark, and, when this broker leads it, what each follower has
//! fetched, from which the high watermark and the ISR follow.
//!
//! Lock order: producers, then log, then state, then epochs. None is held across an await.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicI32, AtomicI64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::Notify;

use crate::log::producer_snapshot as snapshot;
use crate::log::producer_state::{ProducerStateManager, SequenceCheck};
use crate::log::{zero_copy, AppendInfo, BatchHeader, FileRange, Log, LogConfig, LogError, LogStats};
use crate::metrics::{IsrMetrics, TopicMetrics};
use crate::protocol::ErrorCode;
use crate::replication::fetch_session::Changes;
use crate::replication::leader_epoch::LeaderEpochCache;
use crate::sync::MutexExt;

mod isr;
pub use isr::FollowerPosition;
mod read;
mod transactions;

use transactions::{rebuild_producer_state, snapshot_at_roll};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Leader,
    Follower { leader: i32 },
}

#[derive(Debug, Clone)]
struct FollowerProgress {
    log_end_offset: i64,
    /// The last time this follower had everything the leader had (Kafka's lastCaughtUpTime).
    last_caught_up: Instant,
    /// Leader LEO when this follower's previous fetch arrived.
    leader_end_at_last_fetch: i64,
    /// The fetch session that last read this partition for the follower: while it lives and
    /// holds the partition, each of its fetches that leaves the partition unread is one at
    /// which the follower still had what it had at that read.
    session: Option<Weak<Changes>>,
}

impl FollowerProgress {
    fn new(now: Instant) -> FollowerProgress {
        FollowerProgress { log_end_offset: -1, last_caught_up: now, leader_end_at_last_fetch: -1, session: None }
    }

    /// Kafka's lastCaughtUpTime, with the session's fetches that skipped this partition
    /// counted: they only skip it while neither the follower's position nor the leader's end
    /// moved, so a follower caught up at its last read was caught up at each of them.
    fn caught_up_at(&self) -> Instant {
        let vouched = (self.log_end_offset >= self.leader_end_at_last_fetch && self.leader_end_at_last_fetch >= 0)
            .then(|| self.session.as_ref().and_then(Weak::upgrade))
            .flatten()
            .and_then(|c| c.last_fetch());
        vouched.map_or(self.last_caught_up, |t| t.max(self.last_caught_up))
    }
}

#[derive(Debug)]
struct ReplicaState {
    role: Role,
    leader_epoch: i32,
    replicas: Vec<i32>,
    isr: Vec<i32>,
    followers: HashMap<i32, FollowerProgress>,
    /// First offset of the current leader epoch (the ISR expansion rule needs it).
    epoch_start_offset: i64,
}

/// What Produce answers for one partition.
#[derive(Debug, Clone, Copy)]
pub struct ProduceResult {
    pub error_code: i16,
    pub base_offset: i64,
    /// Last offset written (base_offset - 1 when nothing was written).
    pub last_offset: i64,
    pub log_start_offset: i64,
    /// The broker time stamped on the batches of a LogAppendTime topic, else -1.
    pub log_append_time: i64,
}

/// What Fetch answers for one partition: the stored batches as they are on disk.
pub struct FetchResult {
    pub error_code: i16,
    pub high_watermark: i64,
    pub log_start_offset: i64,
    pub records: Bytes,
    /// For a follower whose log diverged: (epoch, end offset) to truncate to.
    pub diverging: Option<(i32, i64)>,
    /// The last stable offset (the high watermark unless a transaction is open).
    pub last_stable_offset: i64,
    /// For a read_committed fetch: (producer id, first offset) of the aborted transactions
    /// overlapping the records returned.
    pub aborted: Option<Vec<(i64, i64)>>,
}

impl FetchResult {
    fn error(code: i16) -> FetchResult {
        FetchResult {
            error_code: code,
            high_watermark: -1,
            log_start_offset: -1,
            records: Bytes::new(),
            diverging: None,
            last_stable_offset: -1,
            aborted: None,
        }
    }
}

pub struct Partition {
    pub topic: String,
    pub index: i32,
    broker_id: i32,
    log: Arc<Mutex<Log>>,
    producers: Mutex<ProducerStateManager>,
    epochs: Mutex<LeaderEpochCache>,
    /// Shared with the log, whose cleaner must not pass it.
    high_watermark: Arc<AtomicI64>,
    /// The first offset of the oldest open transaction (i64::MAX: none), published under the
    /// producers lock whenever transactions open or end, read without it.
    first_unstable: Arc<AtomicI64>,
    /// The version of the partition's state znode the controller last told this broker
    /// (Kafka's partition epoch): AlterPartition is a compare-and-set against it.
    partition_epoch: AtomicI32,
    state: Mutex<ReplicaState>,
    /// The topic's traffic counters, resolved once so that appends and reads count without a
    /// lookup.
    metrics: TopicMetrics,
    isr_metrics: IsrMetrics,
    log_stats: Arc<LogStats>,
    /// Requests parked until this partition changes (fetches short of min.bytes, acks=all
    /// produces short of the high watermark). Woken and dropped at the next append,
    /// high-watermark move or role change, so an append wakes only those waiting on this
    /// partition. Weak: a request that finished without a change leaves only a dead entry,
    /// pruned at the next registration.
    waiters: Mutex<Vec<Weak<Notify>>>,
    /// Followers' fetches parked at the log end: as `waiters`, but not woken when only the
    /// high watermark moves, which answers nothing a follower waits for (Kafka's DelayedFetch
    /// for a follower counts bytes past its fetch offset). Each follower's fetch moves the
    /// high watermark, so otherwise every one would wake the other followers' fetches to
    /// read nothing and park again.
    end_waiters: Mutex<Vec<Weak<Notify>>>,
    /// Consumer fetch sessions holding this partition, told of every change for as long as
    /// they live (unlike waiters, which are told once).
    sessions: Mutex<Vec<Weak<Changes>>>,
}

/// What a metrics scrape reads of a partition's replica state.
#[derive(Debug, Clone, Copy)]
pub struct ReplicaCounts {
    pub leader: bool,
    pub replicas: usize,
    pub isr: usize,
}

/// Adds `waiter` to `list` once. A request re-registers after each wake-up of another
/// partition it waits on; requests gone without a wake-up leave no growing list.
fn register(list: &Mutex<Vec<Weak<Notify>>>, waiter: &Arc<Notify>) {
    let mut w = lock(list);
    w.retain(|x| x.strong_count() > 0);
    if !w.iter().any(|x| std::ptr::eq(x.as_ptr(), Arc::as_ptr(waiter))) {
        w.push(Arc::downgrade(waiter));
    }
}

/// Wakes and forgets every waiter in `list` (each registers again if it still waits).
fn notify_all(list: &Mutex<Vec<Weak<Notify>>>) {
    let waiters = std::mem::take(&mut *lock(list));
    for w in waiters {
        if let Some(n) = w.upgrade() {
            n.notify_one();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every operation below restores its invariants before it can fail, so a guard poisoned
    // by a panic elsewhere still protects consistent data.
    m.lock_unpoisoned()
}

impl Partition {
    pub fn open(
        topic: &str,
        index: i32,
        broker_id: i32,
        log: Arc<Mutex<Log>>,
        checkpointed_hw: Option<i64>,
        metrics: TopicMetrics,
        isr_metrics: IsrMetrics,
    ) -> Partition {
        let producers = rebuild_producer_state(&log);
        let (epochs, leo, log_stats, high_watermark, first_unstable) = {
            let guard = lock(&log);
            (
                LeaderEpochCache::load(guard.dir()),
                guard.log_end_offset(),
                guard.stats(),
                guard.high_watermark_cell(),
                guard.first_unstable_offset_cell(),
            )
        };
        first_unstable.store(producers.first_unstable_offset().unwrap_or(i64::MAX), Ordering::Release);
        high_watermark.store(checkpointed_hw.unwrap_or(0).clamp(0, leo), Ordering::Release);
        Partition {
            topic: topic.to_string(),
            index,
            broker_id,
            log,
            producers: Mutex::new(producers),
            epochs: Mutex::new(epochs),
            high_watermark,
            first_unstable,
            partition_epoch: AtomicI32::new(-1),
            state: Mutex::new(ReplicaState {
                role: Role::Follower { leader: -1 },
                leader_epoch: -1,
                replicas: vec![],
                isr: vec![],
                followers: HashMap::new(),
                epoch_start_offset: 0,
            }),
            metrics,
            isr_metrics,
            log_stats,
            waiters: Mutex::new(Vec::new()),
            end_waiters: Mutex::new(Vec::new()),
            sessions: Mutex::new(Vec::new()),
        }
    }

    /// Has `waiter` notified at this partition's next change. One-shot: a waiter that wants
    /// the change after that registers again. Register before checking the condition waited
    /// for: a change in between leaves a permit in `waiter`, so its next wait returns at once.
    pub fn watch(&self, waiter: &Arc<Notify>) {
        register(&self.waiters, waiter);
    }

    /// [`Partition::watch`] for a follower's fetch, which waits for records past the log end
    /// and so is not woken by a move of the high watermark alone.
    pub fn watch_log_end(&self, waiter: &Arc<Notify>) {
        register(&self.end_waiters, waiter);
    }

    /// Wakes every request waiting on this partition, and marks it changed in the fetch
    /// sessions that hold it.
    pub fn wake(&self) {
        notify_all(&self.end_waiters);
        notify_all(&self.waiters);
        self.mark_sessions(true);
    }

    /// Wakes the requests a move of the high watermark can answer: all but followers' fetches.
    fn wake_high_watermark_waiters(&self) {
        notify_all(&self.waiters);
        self.mark_sessions(false);
    }

    /// Marks this partition changed in the fetch sessions that hold it, so that their next
    /// fetch reads it. Unless `wake_followers`, a follower's fetch parked at the log end is
    /// left to its timeout: it waits for records, which this change does not bring.
    fn mark_sessions(&self, wake_followers: bool) {
        let sessions = lock(&self.sessions);
        for s in sessions.iter().filter_map(Weak::upgrade) {
            if wake_followers || !s.follower() {
                s.mark(&self.topic, self.index);
            } else {
                s.keep(&self.topic, self.index);
            }
        }
    }

    /// Marks this partition in `changes` at each of its changes until the session is gone.
    pub fn watch_changes(&self, changes: &Arc<Changes>) {
        let mut s = lock(&self.sessions);
        s.retain(|x| x.strong_count() > 0);
        if !s.iter().any(|x| std::ptr::eq(x.as_ptr(), Arc::as_ptr(changes))) {
            s.push(Arc::downgrade(changes));
        }
    }

    pub fn metrics(&self) -> &TopicMetrics {
        &self.metrics
    }

    pub fn log_stats(&self) -> &LogStats {
        &self.log_stats
    }

    pub fn replica_counts(&self) -> ReplicaCounts {
        let s = lock(&self.state);
        ReplicaCounts { leader: s.role == Role::Leader, replicas: s.replicas.len(), isr: s.isr.len() }
    }

    fn lock_log(&self) -> MutexGuard<'_, Log> {
        lock(&self.log)
    }

    pub fn partition_epoch(&self) -> i32 {
        self.partition_epoch.load(Ordering::Acquire)
    }

    pub fn set_partition_epoch(&self, epoch: i32) {
        self.partition_epoch.store(epoch, Ordering::Release);
    }

    pub fn log_end_offset(&self) -> i64 {
        self.lock_log().log_end_offset()
    }

    pub fn log_start_offset(&self) -> i64 {
        self.lock_log().log_start_offset()
    }

    pub fn high_watermark(&self) -> i64 {
        self.high_watermark.load(Ordering::Acquire)
    }

    pub fn is_leader(&self) -> bool {
        lock(&self.state).role == Role::Leader
    }

    pub fn role(&self) -> (Role, i32) {
        let s = lock(&self.state);
        (s.role, s.leader_epoch)
    }

    pub fn isr(&self) -> Vec<i32> {
        lock(&self.state).isr.clone()
    }

    pub fn in_isr(&self, replica: i32) -> bool {
        lock(&self.state).isr.contains(&replica)
    }

    pub fn latest_epoch(&self) -> i32 {
        lock(&self.epochs).latest_epoch().unwrap_or(-1)
    }

    /// Moves the high watermark to the smallest log end offset in the ISR (never backwards),
    /// waking this partition's waiters if it moved. Returns true if it moved.
    pub fn maybe_advance_high_watermark(&self) -> bool {
        let moved = self.advance_high_watermark();
        if moved {
            self.wake_high_watermark_waiters();
        }
        moved
    }

    fn advance_high_watermark(&self) -> bool {
        let leo = self.log_end_offset();
        let s = lock(&self.state);
        if s.role != Role::Leader {
            return false;
        }
        let mut candidate = leo;
        for r in s.isr.iter().filter(|&&r| r != self.broker_id) {
            match s.followers.get(r) {
                Some(f) => candidate = candidate.min(f.log_end_offset.max(0)),
                None => candidate = candidate.min(0),
            }
        }
        drop(s);
        let old = self.high_watermark.fetch_max(candidate, Ordering::AcqRel);
        candidate > old
    }

    /// Whether appending `records` could block on the disk beyond a page-cache write (a
    /// segment roll or an fsync due, or the log busy with another write): such appends are
    /// run off the network workers.
    pub fn append_may_block(&self, records: &[u8]) -> bool {
        let mut count = 0u64;
        let mut rest = records;
        while let Some(h) = BatchHeader::parse(rest) {
            count = count.saturating_add(h.records_count.max(0) as u64);
            let size = h.total_size().clamp(1, rest.len());
            rest = &rest[size..];
        }
        self.write_may_block(records.len(), count.max(1))
    }

    /// [`Partition::append_may_block`] for a write of `len` bytes holding `records` records.
    pub fn write_may_block(&self, len: usize, records: u64) -> bool {
        // A log busy with another write (perhaps a roll's fsync) is not waited for here: the
        // append goes to the pool and waits there.
        let log = match self.log.try_lock() {
            Ok(log) => log,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return true,
        };
        log.append_may_block(len, records, crate::log::now_ms())
    }

    /// Appends a producer's batches as leader.
    pub fn append(&self, records: Bytes, max_message_bytes: u32) -> ProduceResult {
        self.append_verified(records, max_message_bytes, None)
    }

    /// [`Self::append`] of a transactional write verified when the producer's marker count
    /// here was `markers_at_verification` (None: nothing to hold it to).
    pub fn append_verified(
        &self,
        records: Bytes,
        max_message_bytes: u32,
        markers_at_verification: Option<u64>,
    ) -> ProduceResult {
        let fail = |code: i16| ProduceResult {
            error_code: code,
            base_offset: -1,
            last_offset: -1,
            log_start_offset: -1,
            log_append_time: -1,
        };
        let headers = match crate::log::validate_batches(&records, max_message_bytes) {
            Ok(h) => h,
            Err(e) => {
                tracing::info!(topic = %self.topic, partition = self.index, error = %e, "rejected produce");
                return fail(e.kafka_code());
            }
        };
        // Markers come from transaction coordinators only (WriteTxnMarkers), never in a Produce.
        if headers.iter().any(|h| h.is_control()) {
            return fail(ErrorCode::InvalidRecord.code());
        }
        let mut producers = lock(&self.producers);
        for h in headers.iter().filter(|h| h.producer_id >= 0 && h.base_sequence >= 0) {
            let last_seq = h.base_sequence.wrapping_add(h.last_offset_delta) & i32::MAX;
            match producers.check(h.producer_id, h.producer_epoch, h.base_sequence, last_seq) {
                SequenceCheck::Append => {}
                SequenceCheck::Duplicate { first_offset } if headers.len() == 1 => {
                    return ProduceResult {
                        error_code: 0,
                        base_offset: first_offset,
                        last_offset: first_offset + h.last_offset_delta as i64,
                        log_start_offset: self.log_start_offset(),
                        log_append_time: -1,
                    };
                }
                SequenceCheck::Duplicate { .. } => return fail(ErrorCode::DuplicateSequenceNumber.code()),
                SequenceCheck::Reject(code) => return fail(code),
            }
        }
        if let Some(markers) = markers_at_verification {
            // Under the producers lock, which a marker write takes too: the marker is either
            // counted here or written after this append (and then ends it).
            let ended_since = headers.iter().any(|h| {
                h.is_transactional()
                    && !producers.in_transaction(h.producer_id)
                    && producers.markers_of(h.producer_id) != markers
            });
            if ended_since {
                return fail(ErrorCode::InvalidTxnState.code());
            }
        }
        let mut log = self.lock_log();
        // Checked under the log lock so that a leadership change cannot slip in between.
        let (role, epoch) = self.role();
        if role != Role::Leader {
            return fail(ErrorCode::NotLeaderOrFollower.code());
        }
        let info: AppendInfo = match log.append_validated_shared(&records, headers.clone(), epoch) {
            Ok(info) => info,
            Err(e) => {
                tracing::warn!(topic = %self.topic, partition = self.index, error = %e, "append failed");
                return fail(e.kafka_code());
            }
        };
        let snap = snapshot_at_roll(&mut log, &producers, info.first_offset);
        let mut offset = info.first_offset;
        let mut transactional = false;
        for h in &headers {
            if h.producer_id >= 0 && h.base_sequence >= 0 {
                let last_seq = h.base_sequence.wrapping_add(h.last_offset_delta) & i32::MAX;
                producers.record(h.producer_id, h.producer_epoch, h.base_sequence, last_seq, offset, h.max_timestamp);
            }
            if h.producer_id >= 0 && h.is_transactional() {
                producers.observe_transactional(h.producer_id, offset);
                transactional = true;
            }
            offset += h.last_offset_delta as i64 + 1;
        }
        if transactional {
            self.publish_unstable(&producers);
        }
        if let Err(e) = log.maybe_flush(crate::log::now_ms()) {
            tracing::warn!(topic = %self.topic, partition = self.index, error = %e, "flush failed");
        }
        let log_start_offset = log.log_start_offset();
        drop(log);
        self.write_snapshot(snap);
        drop(producers);
        self.metrics.record_leader_append(info.record_count, records.len() as u64);
        self.advance_high_watermark();
        // Followers' fetches wait for the log end, consumers' for the high watermark.
        self.wake();
        ProduceResult {
            error_code: 0,
            base_offset: info.first_offset,
            last_offset: info.last_offset,
            log_start_offset,
            log_append_time: info.log_append_time,
        }
    }

    /// The end of `epoch` in this log, as OffsetForLeaderEpoch answers.
    pub fn end_offset_for_epoch(&self, epoch: i32) -> (i32, i64) {
        let leo = self.log_end_offset();
        lock(&self.epochs).end_offset_for(epoch, leo)
    }

    pub fn epoch_for_offset(&self, offset: i64) -> i32 {
        lock(&self.epochs).epoch_for_offset(offset)
    }

    /// The clients' leader-epoch fencing (KIP-320): an older epoch than ours is
    /// FENCED_LEADER_EPOCH, a newer one UNKNOWN_LEADER_EPOCH (our metadata is behind).
    pub fn check_epoch(&self, current_leader_epoch: i32) -> Result<(), i16> {
        let s = lock(&self.state);
        if current_leader_epoch < 0 || current_leader_epoch == s.leader_epoch {
            Ok(())
        } else if current_leader_epoch < s.leader_epoch {
            Err(ErrorCode::FencedLeaderEpoch.code())
        } else {
            Err(ErrorCode::UnknownLeaderEpoch.code())
        }
    }

    pub fn delete_records_before(&self, offset: i64) -> Result<i64, LogError> {
        let start = self.lock_log().delete_records_before(offset)?;
        // Fetch sessions report a new log start offset in their next incremental answer.
        self.wake();
        Ok(start)
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

    /// After a log dir move swapped this partition's log for its copy in `dir`.
    pub fn relocate_epoch_checkpoint(&self, dir: &std::path::Path) {
        lock(&self.epochs).relocate(dir);
    }

    /// Makes the leader-epoch checkpoint durable if it changed since the last call; the
    /// fsync runs without the cache's lock, which follower fetches take.
    pub fn sync_epoch_checkpoint(&self) -> std::io::Result<()> {
        let path = lock(&self.epochs).take_unsynced();
        match path {
            Some(p) => crate::replication::leader_epoch::sync_checkpoint(&p),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests;
