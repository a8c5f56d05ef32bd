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

use super::leader_epoch::LeaderEpochCache;
use crate::log::producer_snapshot as snapshot;
use crate::log::producer_state::{ProducerStateManager, SequenceCheck};
use crate::log::{zero_copy, AppendInfo, BatchHeader, FileRange, Log, LogConfig, LogError, LogStats};
use crate::metrics::{IsrMetrics, TopicMetrics};
use crate::protocol::ErrorCode;
use crate::sync::MutexExt;

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
    sessions: Mutex<Vec<Weak<super::fetch_session::Changes>>>,
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
        self.wake_high_watermark_waiters();
    }

    /// Wakes the requests a move of the high watermark can answer: all but followers' fetches.
    fn wake_high_watermark_waiters(&self) {
        notify_all(&self.waiters);
        let sessions = lock(&self.sessions);
        for s in sessions.iter().filter_map(Weak::upgrade) {
            s.mark(&self.topic, self.index);
        }
    }

    /// Marks this partition in `changes` at each of its changes until the session is gone.
    pub fn watch_changes(&self, changes: &Arc<super::fetch_session::Changes>) {
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

    pub fn latest_epoch(&self) -> i32 {
        lock(&self.epochs).latest_epoch().unwrap_or(-1)
    }

    /// Takes leadership at `epoch`. Returns false if this broker already led at that epoch
    /// (then only the replica set and ISR are refreshed).
    pub fn become_leader(&self, epoch: i32, replicas: &[i32], isr: &[i32]) -> bool {
        // Held across the role change: a follower append in progress finishes first, and one
        // that starts later sees the new role (lock order: producers, log, state).
        let producers = lock(&self.producers);
        let leo = self.log_end_offset();
        let mut s = lock(&self.state);
        s.replicas = replicas.to_vec();
        if s.role == Role::Leader && s.leader_epoch == epoch {
            // The replica set may change within an epoch (a reassignment step whose epoch
            // bump was lost in a race): replicas that joined must be able to join the ISR.
            let now = Instant::now();
            s.followers.retain(|r, _| replicas.contains(r));
            for &r in replicas.iter().filter(|&&r| r != self.broker_id) {
                s.followers.entry(r).or_insert(FollowerProgress {
                    log_end_offset: -1,
                    last_caught_up: now,
                    leader_end_at_last_fetch: -1,
                });
            }
            let change = apply_isr(&mut s, isr.to_vec());
            drop(s);
            drop(producers);
            self.report_isr_change(change);
            self.maybe_advance_high_watermark();
            self.wake();
            return false;
        }
        s.isr = isr.to_vec();
        s.role = Role::Leader;
        s.leader_epoch = epoch;
        s.epoch_start_offset = leo;
        drop(s);
        // The producer state is the one kept while following (or leading): every batch this
        // log holds went through it, and truncations rebuilt it. Rebuilt here from the newest
        // snapshot, it would know only each producer's batches since the last roll, and a
        // retry of an earlier one of its last five (after a failover, the usual retry) would be
        // refused as out of order instead of answered with its offsets.
        self.publish_unstable(&producers);
        drop(producers);
        let mut s = lock(&self.state);
        let now = Instant::now();
        s.followers = replicas
            .iter()
            .filter(|&&r| r != self.broker_id)
            .map(|&r| (r, FollowerProgress { log_end_offset: -1, last_caught_up: now, leader_end_at_last_fetch: -1 }))
            .collect();
        drop(s);
        lock(&self.epochs).assign(epoch, leo);
        self.maybe_advance_high_watermark();
        self.wake();
        true
    }

    /// Follows `leader` at `epoch`. Returns true if the leader or epoch changed.
    pub fn become_follower(&self, leader: i32, epoch: i32, replicas: &[i32], isr: &[i32]) -> bool {
        let mut s = lock(&self.state);
        s.replicas = replicas.to_vec();
        s.isr = isr.to_vec();
        let changed = s.role != (Role::Follower { leader }) || s.leader_epoch != epoch;
        s.role = Role::Follower { leader };
        s.leader_epoch = epoch;
        s.followers.clear();
        drop(s);
        // A produce waiting for this broker's high watermark as leader must learn it is not.
        self.wake();
        changed
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
        // A log busy with another write (perhaps a roll's fsync) is not waited for here: the
        // append goes to the pool and waits there.
        let log = match self.log.try_lock() {
            Ok(log) => log,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return true,
        };
        log.append_may_block(records.len(), count.max(1), crate::log::now_ms())
    }

    /// Appends a producer's batches as leader.
    pub fn append(&self, records: Bytes, max_message_bytes: u32) -> ProduceResult {
        self.append_verified(records, max_message_bytes, None)
    }

    /// [`Self::txn_markers_of`] for a producer, read before its transactional write was
    /// verified (KIP-890): the write is refused if a marker for it was written since, unless
    /// its transaction here is still open. Otherwise a zombie's write verified just before
    /// the marker that ends its transaction could land behind that marker, opening a
    /// transaction no coordinator will ever end.
    pub fn txn_markers_of(&self, producer_id: i64) -> u64 {
        lock(&self.producers).markers_of(producer_id)
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

    /// Publishes the first offset of the oldest open transaction (the caller holds the
    /// producers lock, so publications happen in the order the state changed).
    fn publish_unstable(&self, producers: &ProducerStateManager) {
        self.first_unstable.store(producers.first_unstable_offset().unwrap_or(i64::MAX), Ordering::Release);
    }

    /// Kafka's last stable offset: below it every transaction has ended.
    pub fn last_stable_offset(&self) -> i64 {
        self.high_watermark().min(self.first_unstable.load(Ordering::Acquire))
    }

    /// Whether `producer_id` has a transaction open on this partition.
    pub fn in_transaction(&self, producer_id: i64) -> bool {
        lock(&self.producers).in_transaction(producer_id)
    }

    /// WriteTxnMarkers on the leader: appends a COMMIT or ABORT marker for the producer's
    /// transaction here, which ends it (and records an abort in the `.txnindex`). Returns the
    /// error code and, when written, the marker's offset.
    pub fn write_marker(&self, producer_id: i64, epoch: i16, commit: bool, coordinator_epoch: i32) -> (i16, i64) {
        let mut producers = lock(&self.producers);
        if producers.epoch_of(producer_id).is_some_and(|known| epoch < known) {
            return (ErrorCode::InvalidProducerEpoch.code(), -1);
        }
        let now = crate::log::now_ms();
        let mut buf = crate::log::batch::encode_control_batch(producer_id, epoch, commit, coordinator_epoch, now);
        let headers = match crate::log::validate_batches(&buf, u32::MAX) {
            Ok(h) => h,
            Err(e) => return (e.kafka_code(), -1),
        };
        let mut log = self.lock_log();
        let (role, leader_epoch) = self.role();
        if role != Role::Leader {
            return (ErrorCode::NotLeaderOrFollower.code(), -1);
        }
        let info = match log.append_validated_batches(&mut buf, headers, leader_epoch) {
            Ok(info) => info,
            Err(e) => {
                tracing::warn!(topic = %self.topic, partition = self.index, error = %e, "marker append failed");
                return (e.kafka_code(), -1);
            }
        };
        let snap = snapshot_at_roll(&mut log, &producers, info.first_offset);
        let marker = crate::log::batch::EndTxnMarker { commit, coordinator_epoch };
        let aborted =
            producers.complete_transaction(producer_id, epoch, info.first_offset, marker, now, self.high_watermark());
        if let Some(a) = aborted {
            if let Err(e) = log.append_aborted_txn(&a) {
                // The marker is in the log: a restart that rescans it finds the abort again.
                tracing::warn!(topic = %self.topic, partition = self.index, error = %e, "cannot write .txnindex");
            }
        }
        self.publish_unstable(&producers);
        drop(log);
        self.write_snapshot(snap);
        drop(producers);
        self.advance_high_watermark();
        // Followers wait for the log end, read_committed consumers for the stable offset: both
        // may have moved even when the high watermark has not.
        self.wake();
        (0, info.first_offset)
    }

    /// Writes a producer-state snapshot taken at a roll. The producers lock is still held, so
    /// a truncation cannot run between taking it and writing it.
    fn write_snapshot(&self, snap: Option<(PathBuf, i64, Vec<u8>)>) {
        if let Some((dir, offset, bytes)) = snap {
            if let Err(e) = snapshot::write(&dir, offset, &bytes) {
                // Only a slower restart is lost: it rescans from an older snapshot.
                tracing::warn!(topic = %self.topic, partition = self.index, offset, error = %e, "cannot write producer snapshot");
            }
        }
    }

    /// At clean shutdown: a snapshot at the log end, so the next start rescans nothing.
    pub fn snapshot_producer_state(&self) {
        let producers = lock(&self.producers);
        let log = self.lock_log();
        if log.is_deleted() {
            return;
        }
        let (dir, end, empty) =
            (log.dir().to_path_buf(), log.log_end_offset(), log.log_end_offset() <= log.log_start_offset());
        drop(log);
        // An empty log has nothing to rescan; one at this offset describes the same log
        // prefix, so the same state (a truncation below it deleted it). A broker with many
        // idle partitions writes nothing for them.
        if empty || snapshot::snapshot_path(&dir, end).exists() {
            return;
        }
        self.write_snapshot(Some((dir, end, snapshot::encode(&producers.snapshot_entries()))));
    }

    /// The idempotent producers this replica has state for (DescribeProducers).
    pub fn active_producers(&self) -> Vec<crate::log::producer_state::ActiveProducer> {
        lock(&self.producers).active()
    }

    /// Appends batches fetched from `leader`, keeping their offsets and epochs. Nothing is
    /// appended once this replica no longer follows `leader`: an answer that waited in a socket
    /// (a paused process) must not land in the log of a replica that has since become leader.
    pub fn append_as_follower(&self, leader: i32, records: &[u8], leader_high_watermark: i64) -> Result<(), LogError> {
        // become_leader takes `producers` before it changes the role, so the role cannot
        // change between this check and the append.
        let mut producers = lock(&self.producers);
        let mut log = self.lock_log();
        if self.role().0 != (Role::Follower { leader }) {
            tracing::debug!(topic = %self.topic, partition = self.index, leader, "dropped a fetch answer: no longer following that leader");
            return Ok(());
        }
        let mut snap = None;
        if !records.is_empty() {
            let info = log.append_as_follower(records)?;
            snap = snapshot_at_roll(&mut log, &producers, info.first_offset);
        }
        let leo = log.log_end_offset();
        drop(log);
        self.write_snapshot(snap);
        self.metrics.record_follower_append(records.len() as u64);
        let mut epochs = lock(&self.epochs);
        let mut rest = records;
        let mut aborted = Vec::new();
        while let Some(h) = BatchHeader::parse(rest) {
            epochs.assign(h.partition_leader_epoch, h.base_offset);
            if h.producer_id >= 0 && h.is_control() {
                // A follower keeps the producer state a leader would, so that it can answer
                // DescribeProducers and take over as leader.
                if let Some(marker) = crate::log::batch::end_txn_marker(rest) {
                    let hw = self.high_watermark();
                    aborted.extend(producers.complete_transaction(
                        h.producer_id,
                        h.producer_epoch,
                        h.base_offset,
                        marker,
                        h.max_timestamp,
                        hw,
                    ));
                }
            } else if h.producer_id >= 0 && h.is_transactional() {
                producers.observe_transactional(h.producer_id, h.base_offset);
            }
            if h.producer_id >= 0 && h.base_sequence >= 0 {
                let last_seq = h.base_sequence.wrapping_add(h.last_offset_delta) & i32::MAX;
                producers.record(
                    h.producer_id,
                    h.producer_epoch,
                    h.base_sequence,
                    last_seq,
                    h.base_offset,
                    h.max_timestamp,
                );
            }
            let size = h.total_size().min(rest.len());
            rest = &rest[size..];
        }
        drop(epochs);
        self.publish_unstable(&producers);
        if !aborted.is_empty() {
            let mut log = self.lock_log();
            for a in &aborted {
                if let Err(e) = log.append_aborted_txn(a) {
                    tracing::warn!(topic = %self.topic, partition = self.index, error = %e, "cannot write .txnindex");
                }
            }
        }
        drop(producers);
        // A follower's high watermark is the leader's, as far as its own log reaches.
        let hw = leader_high_watermark.min(leo).max(0);
        self.high_watermark.fetch_max(hw, Ordering::AcqRel);
        // Consumers reading from this follower (KIP-392).
        self.wake();
        Ok(())
    }

    /// Truncates a follower's log after divergence (and its epoch cache with it).
    pub fn truncate_to(&self, offset: i64) -> Result<(), LogError> {
        let mut producers = lock(&self.producers);
        let mut log = self.lock_log();
        log.truncate_to(offset)?;
        let leo = log.log_end_offset();
        drop(log);
        // (the rebuild drops the snapshots above the new end)
        // Batches cut from the log must be forgotten too, or a producer's retry of one of
        // them would be answered as a duplicate that is no longer stored.
        *producers = rebuild_producer_state(&self.log);
        self.publish_unstable(&producers);
        drop(producers);
        lock(&self.epochs).truncate_from_end(leo);
        self.high_watermark.fetch_min(leo, Ordering::AcqRel);
        Ok(())
    }

    /// Restarts an empty log at the leader's log start (the follower fell behind retention).
    pub fn reset_to(&self, offset: i64) -> Result<(), LogError> {
        let mut producers = lock(&self.producers);
        let mut log = self.lock_log();
        log.truncate_fully_and_start_at(offset)?;
        snapshot::delete_above(log.dir(), i64::MIN);
        drop(log);
        *producers = ProducerStateManager::default();
        self.publish_unstable(&producers);
        drop(producers);
        lock(&self.epochs).truncate_from_end(0);
        self.high_watermark.store(offset, Ordering::Release);
        Ok(())
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

    /// A consumer's fetch: leader only, up to the high watermark (read_committed: up to the
    /// last stable offset, with the aborted transactions in what is returned).
    pub fn read(&self, offset: i64, max_bytes: usize, current_leader_epoch: i32, committed: bool) -> FetchResult {
        if !self.is_leader() {
            return FetchResult::error(ErrorCode::NotLeaderOrFollower.code());
        }
        if let Err(code) = self.check_epoch(current_leader_epoch) {
            return FetchResult::error(code);
        }
        self.read_isolated(offset, max_bytes, committed)
    }

    fn read_isolated(&self, offset: i64, max_bytes: usize, committed: bool) -> FetchResult {
        if !committed {
            return self.read_up_to(offset, max_bytes, self.high_watermark());
        }
        let lso = self.last_stable_offset();
        let (mut r, end) = self.read_ranges_up_to(offset, max_bytes, lso);
        r.last_stable_offset = lso;
        if r.error_code == 0 {
            // The records returned end at the last batch's end; aborts that begin before
            // that and end at or after the fetch offset are the consumer's to skip.
            let upper = end.unwrap_or(offset);
            let aborted =
                if upper > offset { lock(&self.producers).aborted_between(offset, upper) } else { Vec::new() };
            r.aborted = Some(aborted);
        }
        r
    }

    /// A consumer's fetch from a follower (Fetch v11+, KIP-392): up to this replica's high
    /// watermark, with the leader epoch the client knows checked as a leader checks it.
    pub fn read_as_follower(
        &self,
        offset: i64,
        max_bytes: usize,
        current_leader_epoch: i32,
        committed: bool,
    ) -> FetchResult {
        if !matches!(self.role().0, Role::Follower { .. }) {
            return FetchResult::error(ErrorCode::NotLeaderOrFollower.code());
        }
        if let Err(code) = self.check_epoch(current_leader_epoch) {
            return FetchResult::error(code);
        }
        self.read_isolated(offset, max_bytes, committed)
    }

    /// A leader's followers in the ISR that hold `offset`, with their log end offsets: where a
    /// consumer may read it.
    pub fn in_sync_followers_at(&self, offset: i64) -> Vec<(i32, i64)> {
        let s = lock(&self.state);
        if s.role != Role::Leader {
            return Vec::new();
        }
        s.isr
            .iter()
            .filter(|r| **r != self.broker_id)
            .filter_map(|r| s.followers.get(r).filter(|f| f.log_end_offset >= offset).map(|f| (*r, f.log_end_offset)))
            .collect()
    }

    /// Everything in the log, committed or not (the group coordinator replays its partition
    /// on taking it over, as Kafka does).
    pub fn read_to_log_end(&self, offset: i64, max_bytes: usize) -> FetchResult {
        self.read_up_to(offset, max_bytes, i64::MAX)
    }

    fn read_up_to(&self, offset: i64, max_bytes: usize, limit: i64) -> FetchResult {
        self.read_ranges_up_to(offset, max_bytes, limit).0
    }

    /// Also the offset after the last batch returned. Large record sets become placeholders
    /// for their file ranges when a Fetch collects them for sendfile ([`zero_copy`]).
    fn read_ranges_up_to(&self, offset: i64, max_bytes: usize, limit: i64) -> (FetchResult, Option<i64>) {
        let hw = self.high_watermark();
        let (ranges, start) = {
            let log = self.lock_log();
            let start = log.log_start_offset();
            match log.read(offset, max_bytes, Some(limit)) {
                Ok(r) => (r, start),
                Err(e) => {
                    let r = FetchResult {
                        error_code: e.kafka_code(),
                        high_watermark: hw,
                        log_start_offset: start,
                        records: Bytes::new(),
                        diverging: None,
                        last_stable_offset: hw,
                        aborted: None,
                    };
                    return (r, None);
                }
            }
        };
        let end = ranges.last().map(|r| r.end_offset);
        let records = match zero_copy::defer(&ranges) {
            Some(placeholder) => placeholder,
            None => {
                let mut out = bytes::BytesMut::with_capacity(ranges.iter().map(|r| r.len).sum());
                for r in &ranges {
                    if let Err(e) = FileRange::read_into_buf(r, &mut out) {
                        tracing::warn!(topic = %self.topic, partition = self.index, error = %e, "read failed");
                        return (FetchResult::error(ErrorCode::KafkaStorageError.code()), None);
                    }
                }
                out.freeze()
            }
        };
        let r = FetchResult {
            error_code: 0,
            high_watermark: hw,
            log_start_offset: start,
            records,
            diverging: None,
            last_stable_offset: hw.min(self.first_unstable.load(Ordering::Acquire)),
            aborted: None,
        };
        (r, end)
    }

    /// A follower's fetch: records up to the log end, and the follower's progress, which
    /// moves the high watermark and may bring it back into the ISR. Returns the result, the
    /// new ISR if it should grow (for the caller to record in ZooKeeper), and whether the high
    /// watermark moved (waiting acks=all writes and consumers must then be woken).
    pub fn follower_fetch(
        &self,
        replica: i32,
        fetch_offset: i64,
        last_fetched_epoch: i32,
        current_leader_epoch: i32,
        max_bytes: usize,
    ) -> (FetchResult, Option<Vec<i32>>, bool) {
        if !self.is_leader() {
            return (FetchResult::error(ErrorCode::NotLeaderOrFollower.code()), None, false);
        }
        if let Err(code) = self.check_epoch(current_leader_epoch) {
            return (FetchResult::error(code), None, false);
        }
        let leo = self.log_end_offset();
        if last_fetched_epoch >= 0 {
            let (epoch, end) = self.end_offset_for_epoch(last_fetched_epoch);
            if epoch != last_fetched_epoch || end < fetch_offset {
                let r = FetchResult {
                    error_code: 0,
                    high_watermark: self.high_watermark(),
                    log_start_offset: self.log_start_offset(),
                    records: Bytes::new(),
                    diverging: Some((epoch, end)),
                    last_stable_offset: -1,
                    aborted: None,
                };
                return (r, None, false);
            }
        }
        let mut expand = None;
        {
            let now = Instant::now();
            let mut s = lock(&self.state);
            let hw = self.high_watermark();
            let epoch_start = s.epoch_start_offset;
            let in_isr = s.isr.contains(&replica);
            if let Some(f) = s.followers.get_mut(&replica) {
                if fetch_offset >= leo || fetch_offset >= f.leader_end_at_last_fetch && f.leader_end_at_last_fetch >= 0
                {
                    f.last_caught_up = now;
                }
                f.log_end_offset = fetch_offset;
                f.leader_end_at_last_fetch = leo;
                if !in_isr && fetch_offset >= hw && fetch_offset >= epoch_start {
                    let mut isr = s.isr.clone();
                    isr.push(replica);
                    expand = Some(isr);
                }
            }
        }
        let moved = self.maybe_advance_high_watermark();
        (self.read_up_to(fetch_offset, max_bytes, i64::MAX), expand, moved)
    }

    /// Followers in the ISR that have not caught up within `lag`; the new ISR without them.
    pub fn isr_to_shrink(&self, lag: Duration) -> Option<Vec<i32>> {
        let leo = self.log_end_offset();
        let s = lock(&self.state);
        if s.role != Role::Leader {
            return None;
        }
        let now = Instant::now();
        let lagging: Vec<i32> = s
            .isr
            .iter()
            .copied()
            .filter(|r| *r != self.broker_id)
            .filter(|r| {
                s.followers.get(r).is_some_and(|f| f.log_end_offset < leo && now.duration_since(f.last_caught_up) > lag)
            })
            .collect();
        if lagging.is_empty() {
            return None;
        }
        Some(s.isr.iter().copied().filter(|r| !lagging.contains(r)).collect())
    }

    /// Applies an ISR change that is now recorded in ZooKeeper.
    pub fn set_isr(&self, isr: Vec<i32>) {
        let change = apply_isr(&mut lock(&self.state), isr);
        self.report_isr_change(change);
        self.maybe_advance_high_watermark();
    }

    /// Logs and counts a leader's ISR change, outside the state lock (a log line is I/O).
    fn report_isr_change(&self, change: Option<(Vec<i32>, Vec<i32>)>) {
        let Some((from, to)) = change else { return };
        let (topic, partition) = (&self.topic, self.index);
        if to.len() < from.len() {
            tracing::info!(%topic, partition, ?from, ?to, "ISR shrunk");
            self.isr_metrics.record_shrink();
        } else if to.len() > from.len() {
            tracing::info!(%topic, partition, ?from, ?to, "ISR expanded");
            self.isr_metrics.record_expand();
        }
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

    /// ListOffsets v0 (Kafka's `legacyFetchOffsetsBefore`): up to `max` offsets, newest first,
    /// among the segments' first offsets (each dated by its file's mtime) and, when the active
    /// segment holds data, the log end (dated now). -1 (latest) starts from the newest, -2
    /// (earliest) takes the first only, a time takes the newest dated at or before it. A
    /// consumer never sees past the high watermark: offsets above it give way to it.
    pub fn legacy_offsets_before(&self, timestamp: i64, max: i32, from_consumer: bool) -> Vec<i64> {
        let mut dated: Vec<(i64, i64)> = {
            let log = self.lock_log();
            let start = log.log_start_offset();
            let mut v: Vec<(i64, i64)> =
                log.segments().map(|s| (s.base_offset().max(start), s.last_modified_ms())).collect();
            if log.segments().last().is_some_and(|s| s.size() > 0) {
                v.push((log.log_end_offset(), crate::log::now_ms()));
            }
            v
        };
        let newest = match timestamp {
            -1 => dated.len().checked_sub(1),
            -2 => (!dated.is_empty()).then_some(0),
            ts => dated.iter().rposition(|&(_, t)| t <= ts),
        };
        let Some(newest) = newest else { return Vec::new() };
        dated.truncate(newest + 1);
        let mut offsets: Vec<i64> = dated.iter().rev().take(max.max(0) as usize).map(|&(o, _)| o).collect();
        offsets.sort_unstable_by(|a, b| b.cmp(a));
        if from_consumer {
            let hw = self.high_watermark();
            if offsets.iter().any(|&o| o > hw) {
                offsets.retain(|&o| o <= hw);
                offsets.insert(0, hw);
            }
        }
        offsets
    }

    /// ListOffsets MAX_TIMESTAMP (KIP-734): the first record carrying the largest timestamp.
    pub fn offset_of_max_timestamp(&self) -> Result<Option<(i64, i64)>, LogError> {
        let max = self.lock_log().segments().map(|s| s.max_timestamp()).max();
        match max {
            Some(ts) if ts >= 0 => self.offset_for_timestamp(ts),
            _ => Ok(None),
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
            Some(p) => super::leader_epoch::sync_checkpoint(&p),
            None => Ok(()),
        }
    }
}

/// The one place a leader's ISR changes within its epoch; returns (from, to) if it did. The
/// controller's answer to AlterPartition and its LeaderAndIsr carrying the same ISR race each
/// other: whichever comes first is the change, reported once, and the other finds nothing to do.
fn apply_isr(s: &mut ReplicaState, isr: Vec<i32>) -> Option<(Vec<i32>, Vec<i32>)> {
    if s.isr == isr {
        return None;
    }
    let from = std::mem::replace(&mut s.isr, isr);
    (s.role == Role::Leader).then(|| (from, s.isr.clone()))
}

/// The snapshot to write when the append that just ended started a new segment at
/// `first_offset`: the producer state, not yet updated with that append, is then exactly the
/// state of the offsets below it.
fn snapshot_at_roll(
    log: &mut Log,
    producers: &ProducerStateManager,
    first_offset: i64,
) -> Option<(PathBuf, i64, Vec<u8>)> {
    let at = log.take_rolled_at()?;
    (at == first_offset).then(|| (log.dir().to_path_buf(), at, snapshot::encode(&producers.snapshot_entries())))
}

/// Producer state as of the log end: the newest usable snapshot, then the batches above it
/// (the whole log when there is none), so that a producer retrying across a restart is still
/// recognised and a transaction opened long ago still holds back the stable offset. Also
/// brings the `.txnindex` files of the rescanned range in line with the log, and restarts the
/// rescan below a damaged one so that it can be rebuilt.
fn rebuild_producer_state(log: &Mutex<Log>) -> ProducerStateManager {
    let mut guard = log.lock_unpoisoned();
    let dir = guard.dir().to_path_buf();
    let leo = guard.log_end_offset();
    // Snapshots above the log end describe records a recovery cut or a truncation removed.
    snapshot::delete_above(&dir, leo);
    let limit = guard.first_damaged_txn_index().map_or(leo, |d| d.min(leo));
    let (mut state, from) = match snapshot::load_newest(&dir, limit) {
        Some((offset, entries)) => (ProducerStateManager::from_snapshot(&entries), offset),
        // No usable snapshot (a log written before snapshots existed, or all damaged): the
        // newest two segments, as Kafka rebuilds then, rather than a whole log that may be
        // terabytes; below a damaged `.txnindex` so it is rebuilt. The snapshot written after
        // this rescan makes the next start cheap.
        None => {
            let bases = guard.segment_base_offsets();
            let recent = bases.len().checked_sub(2).and_then(|i| bases.get(i)).copied().unwrap_or(i64::MIN);
            (ProducerStateManager::default(), recent.min(limit).max(guard.log_start_offset()))
        }
    };
    let mut found = Vec::new();
    match guard.producer_batches_from(from) {
        Ok(batches) => {
            for (h, marker) in batches {
                if h.is_control() {
                    if let Some(marker) = marker {
                        found.extend(state.complete_transaction(
                            h.producer_id,
                            h.producer_epoch,
                            h.base_offset,
                            marker,
                            h.max_timestamp,
                            h.base_offset,
                        ));
                    }
                    continue;
                }
                if h.base_sequence >= 0 {
                    let last_seq = h.base_sequence.wrapping_add(h.last_offset_delta) & i32::MAX;
                    state.record(
                        h.producer_id,
                        h.producer_epoch,
                        h.base_sequence,
                        last_seq,
                        h.base_offset,
                        h.max_timestamp,
                    );
                }
                if h.is_transactional() {
                    state.observe_transactional(h.producer_id, h.base_offset);
                }
            }
            if let Err(e) = guard.sync_aborted_txns(from, &found) {
                tracing::warn!(dir = %dir.display(), error = %e, "cannot rebuild the aborted-transaction index");
            }
            // Older aborts are known from the segments' .txnindex files.
            state.restore_aborted(guard.aborted_txns_before(from));
            if from < leo {
                // The next rebuild (a leadership change, a restart) starts from here.
                if let Err(e) = snapshot::write(&dir, leo, &snapshot::encode(&state.snapshot_entries())) {
                    tracing::warn!(dir = %dir.display(), error = %e, "cannot write producer snapshot");
                }
            }
        }
        Err(e) => tracing::warn!(dir = %dir.display(), error = %e, "cannot rebuild producer state"),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::batch::simple_batch;

    /// A partition of broker 1 over a fresh log in `dir`.
    fn partition(dir: &std::path::Path) -> Partition {
        let config = LogConfig { segment_bytes: 1 << 20, max_index_size: 4096, ..LogConfig::default() };
        let log = Log::open(dir.join("t-0"), config, 0, 0, true).unwrap();
        Partition::open("t", 0, 1, Arc::new(Mutex::new(log)), None, TopicMetrics::detached(), IsrMetrics::detached())
    }

    fn append(p: &Partition, records: usize) -> ProduceResult {
        let r = p.append(Bytes::from(simple_batch(records, 10, 1)), 1 << 20);
        assert_eq!(r.error_code, 0);
        r
    }

    #[test]
    fn markers_end_transactions_and_bound_the_stable_offset() {
        use crate::log::batch::{encode_batch, BatchOptions, SimpleRecord, TRANSACTIONAL_BIT};
        let dir = tempfile::tempdir().unwrap();
        let p = partition(dir.path());
        p.become_leader(0, &[1], &[1]);
        let opts = BatchOptions {
            attributes: TRANSACTIONAL_BIT,
            producer_id: 7,
            producer_epoch: 0,
            base_sequence: 0,
            ..BatchOptions::default()
        };
        let recs: Vec<SimpleRecord<'_>> =
            (0..3).map(|_| SimpleRecord { timestamp: 1, key: None, value: Some(b"x"), headers: vec![] }).collect();
        assert_eq!(p.append(Bytes::from(encode_batch(&opts, &recs)), 1 << 20).error_code, 0);
        append(&p, 2);
        assert_eq!(p.high_watermark(), 5);
        assert_eq!(p.last_stable_offset(), 0, "the open transaction holds the LSO at its first offset");
        let r = p.read(0, 1 << 20, -1, true);
        assert!(r.records.is_empty());
        assert_eq!(r.last_stable_offset, 0);
        assert!(!p.read(0, 1 << 20, -1, false).records.is_empty());
        // A client may not write markers.
        let marker = crate::log::batch::encode_control_batch(7, 0, true, 0, 1);
        assert_eq!(p.append(Bytes::from(marker), 1 << 20).error_code, ErrorCode::InvalidRecord.code());
        assert_eq!(p.write_marker(7, 0, false, 3), (0, 5));
        assert_eq!(p.high_watermark(), 6);
        assert_eq!(p.last_stable_offset(), 6);
        let r = p.read(0, 1 << 20, -1, true);
        assert_eq!(r.aborted, Some(vec![(7, 0)]));
        assert!(p.read(6, 1 << 20, -1, true).aborted.unwrap_or_default().is_empty());
        // The producer's older epoch is fenced by a newer marker.
        assert_eq!(p.write_marker(7, 1, false, 3).0, 0);
        assert_eq!(p.write_marker(7, 0, true, 3).0, ErrorCode::InvalidProducerEpoch.code());
        drop(p);
        // The records are stamped 1 ms after the epoch and the marker now: segment.ms rolled
        // the log at the marker, and the entry is in the index of the segment holding it.
        let txnindex = std::fs::read(dir.path().join("t-0/00000000000000000005.txnindex")).unwrap();
        assert_eq!(txnindex.len(), 34, "one aborted transaction, one Kafka .txnindex entry");
        assert_eq!(&txnindex[2..10], &7i64.to_be_bytes());
        // Reopened, the partition knows the abort again.
        let p = partition(dir.path());
        p.become_leader(1, &[1], &[1]);
        assert_eq!(p.last_stable_offset(), p.high_watermark());
        assert_eq!(p.read(0, 1 << 20, -1, true).aborted, Some(vec![(7, 0)]));
    }

    /// A partition over `dir/t-0` with small segments, opened as after a crash (or cleanly).
    fn small_segment_partition(dir: &std::path::Path, clean: bool) -> Partition {
        let config = LogConfig { segment_bytes: 1024, max_index_size: 4096, ..LogConfig::default() };
        let log = Log::open(dir.join("t-0"), config, 0, 0, clean).unwrap();
        let p = Partition::open(
            "t",
            0,
            1,
            Arc::new(Mutex::new(log)),
            None,
            TopicMetrics::detached(),
            IsrMetrics::detached(),
        );
        p.become_leader(0, &[1], &[1]);
        p
    }

    /// Records stamped now, so that segment.ms does not roll the log at the next marker.
    fn txn_batch(producer_id: i64, seq: i32, n: usize) -> Bytes {
        txn_batch_at(producer_id, seq, n, crate::log::now_ms())
    }

    fn txn_batch_at(producer_id: i64, seq: i32, n: usize, timestamp: i64) -> Bytes {
        use crate::log::batch::{encode_batch, BatchOptions, SimpleRecord, TRANSACTIONAL_BIT};
        let opts = BatchOptions {
            attributes: TRANSACTIONAL_BIT,
            producer_id,
            producer_epoch: 0,
            base_sequence: seq,
            ..BatchOptions::default()
        };
        let recs: Vec<SimpleRecord<'_>> =
            (0..n).map(|_| SimpleRecord { timestamp, key: None, value: Some(b"t"), headers: vec![] }).collect();
        Bytes::from(encode_batch(&opts, &recs))
    }

    #[test]
    fn a_write_verified_before_its_transactions_marker_is_refused_after_it() {
        let dir = tempfile::tempdir().unwrap();
        let p = small_segment_partition(dir.path(), true);
        // First transaction: verified, written, then ended by its marker.
        let before = p.txn_markers_of(9);
        assert_eq!(p.append_verified(txn_batch(9, 0, 2), 1 << 20, Some(before)).error_code, 0);
        assert_eq!(p.write_marker(9, 0, true, 1).0, 0);
        // A late write of that transaction, verified before the marker: refused, so it cannot
        // open a transaction behind the marker that nothing would end.
        let r = p.append_verified(txn_batch(9, 2, 1), 1 << 20, Some(before));
        assert_eq!(r.error_code, ErrorCode::InvalidTxnState.code());
        assert_eq!(p.last_stable_offset(), p.high_watermark());
        // The next transaction, verified after the marker, is written; so is its second
        // write, even after another producer's marker.
        let now = p.txn_markers_of(9);
        assert_eq!(p.append_verified(txn_batch(9, 2, 1), 1 << 20, Some(now)).error_code, 0);
        assert_eq!(p.write_marker(4, 0, false, 1).0, 0);
        assert_eq!(p.append_verified(txn_batch(9, 3, 1), 1 << 20, Some(now)).error_code, 0);
        assert!(p.last_stable_offset() < p.high_watermark(), "its transaction is open");
    }

    fn snapshots(dir: &std::path::Path) -> Vec<i64> {
        snapshot::list(&dir.join("t-0")).into_iter().map(|(o, _)| o).collect()
    }

    #[test]
    fn a_transaction_opened_segments_ago_survives_a_crash() {
        let dir = tempfile::tempdir().unwrap();
        let p = small_segment_partition(dir.path(), true);
        assert_eq!(p.append(txn_batch(7, 0, 3), 1 << 20).error_code, 0);
        while p.lock_log().segment_count() < 6 {
            append(&p, 5);
        }
        let (hw, taken) = (p.high_watermark(), snapshots(dir.path()));
        assert_eq!(p.last_stable_offset(), 0);
        assert_eq!(taken.len(), snapshot::SNAPSHOTS_KEPT, "a snapshot per roll, the newest few kept: {taken:?}");
        assert!(taken.iter().all(|&o| o > 3 && p.lock_log().segment_base_offsets().contains(&o)));
        drop(p);
        // No clean shutdown: the newest snapshot plus the active segment tell of the transaction.
        let p = small_segment_partition(dir.path(), false);
        assert_eq!(p.high_watermark(), hw);
        assert_eq!(p.last_stable_offset(), 0, "the open transaction still holds back the stable offset");
        assert!(p.read(0, 1 << 20, -1, true).records.is_empty());
        // Its sequence continues where it was: the snapshot kept the producer's last batch.
        assert_eq!(p.append(txn_batch(7, 3, 1), 1 << 20).error_code, 0);
        let (code, marker) = p.write_marker(7, 0, false, 0);
        assert_eq!(code, 0);
        assert_eq!(p.last_stable_offset(), marker + 1);
        assert_eq!(p.read(0, 1 << 20, -1, true).aborted, Some(vec![(7, 0)]));
    }

    #[test]
    fn a_snapshot_is_what_a_restart_reads_and_a_bad_one_is_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let p = small_segment_partition(dir.path(), true);
        for _ in 0..4 {
            append(&p, 5);
        }
        let leo = p.log_end_offset();
        drop(p);
        let logdir = dir.path().join("t-0");
        // A snapshot the log itself does not back: producer 99 with a transaction open at 2.
        // Trusting it shows the restart read it rather than rescanning the log.
        let entry = snapshot::SnapshotEntry {
            producer_id: 99,
            epoch: 0,
            last_sequence: 0,
            last_offset: 2,
            offset_delta: 0,
            timestamp: 1,
            coordinator_epoch: -1,
            current_txn_first_offset: 2,
        };
        snapshot::write(&logdir, leo, &snapshot::encode(&[entry])).unwrap();
        // One from beyond the log end (a crash lost what it described) is deleted unread.
        snapshot::write(&logdir, leo + 100, &snapshot::encode(&[])).unwrap();
        let p = small_segment_partition(dir.path(), false);
        assert_eq!(p.last_stable_offset(), 2);
        assert_eq!(snapshots(dir.path()), vec![leo]);
        drop(p);
        // Torn: ignored with a warning, deleted, and the log rescanned (which knows no
        // transaction).
        let path = snapshot::snapshot_path(&logdir, leo);
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() - 3]).unwrap();
        let p = small_segment_partition(dir.path(), false);
        assert_eq!(p.last_stable_offset(), p.high_watermark());
        assert_eq!(p.high_watermark(), leo);
        // The rescan left a snapshot at the end for the next rebuild.
        assert_eq!(snapshots(dir.path()), vec![leo]);
        assert!(snapshot::decode(&std::fs::read(&path).unwrap()).unwrap().is_empty());
    }

    #[test]
    fn a_shutdown_snapshot_is_kafkas_format_byte_for_byte() {
        let dir = tempfile::tempdir().unwrap();
        let p = partition(dir.path());
        p.become_leader(0, &[1], &[1]);
        append(&p, 2);
        assert_eq!(p.append(txn_batch_at(7, 0, 3, 1), 1 << 20).error_code, 0);
        p.snapshot_producer_state();
        let b = std::fs::read(dir.path().join("t-0/00000000000000000005.snapshot")).unwrap();
        let i16_at = |o: usize| i16::from_be_bytes(b[o..o + 2].try_into().unwrap());
        let i32_at = |o: usize| i32::from_be_bytes(b[o..o + 4].try_into().unwrap());
        let i64_at = |o: usize| i64::from_be_bytes(b[o..o + 8].try_into().unwrap());
        assert_eq!(i16_at(0), 1, "version");
        assert_eq!(u32::from_be_bytes(b[2..6].try_into().unwrap()), crc32c::crc32c(&b[6..]), "CRC32C of the rest");
        assert_eq!(i32_at(6), 1, "one producer entry");
        assert_eq!(b.len(), 10 + 46);
        assert_eq!(i64_at(10), 7, "producer id");
        assert_eq!(i16_at(18), 0, "epoch");
        assert_eq!(i32_at(20), 2, "last sequence");
        assert_eq!(i64_at(24), 4, "last offset");
        assert_eq!(i32_at(32), 2, "offset delta");
        assert_eq!(i64_at(36), 1, "timestamp");
        assert_eq!(i32_at(44), -1, "coordinator epoch");
        assert_eq!(i64_at(48), 2, "first offset of the open transaction");
    }

    #[test]
    fn truncation_drops_aborts_and_snapshots_above_the_new_end() {
        let dir = tempfile::tempdir().unwrap();
        let p = partition(dir.path());
        p.become_leader(0, &[1], &[1]);
        assert_eq!(p.append(txn_batch(7, 0, 3), 1 << 20).error_code, 0);
        assert_eq!(p.write_marker(7, 0, false, 0), (0, 3));
        assert_eq!(p.append(txn_batch(8, 0, 2), 1 << 20).error_code, 0);
        assert_eq!(p.write_marker(8, 0, true, 0), (0, 6));
        p.snapshot_producer_state();
        let txnindex = dir.path().join("t-0/00000000000000000000.txnindex");
        assert_eq!(std::fs::read(&txnindex).unwrap().len(), 34);
        assert_eq!(snapshots(dir.path()), vec![7]);
        p.become_follower(2, 1, &[1, 2], &[1, 2]);
        // The commit marker goes: producer 8's transaction is open again.
        p.truncate_to(6).unwrap();
        assert_eq!(snapshots(dir.path()), vec![6], "the one above the new end went; a rebuilt one is at it");
        assert_eq!(std::fs::read(&txnindex).unwrap().len(), 34, "the abort below the new end stays");
        assert_eq!(p.last_stable_offset(), 4);
        // The abort marker goes too: both transactions are open, nothing is aborted.
        p.truncate_to(3).unwrap();
        assert!(!txnindex.exists(), "the abort above the new end left the index");
        assert_eq!(p.last_stable_offset(), 0);
        p.become_leader(3, &[1], &[1]);
        assert_eq!(p.read(0, 1 << 20, -1, false).aborted, None);
        assert_eq!(p.write_marker(7, 0, true, 0), (0, 3));
        assert_eq!(p.read(0, 1 << 20, -1, true).aborted, Some(vec![]));
    }

    #[test]
    fn a_missing_or_torn_txnindex_is_rebuilt_from_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let p = small_segment_partition(dir.path(), true);
        assert_eq!(p.append(txn_batch(7, 0, 3), 1 << 20).error_code, 0);
        assert_eq!(p.write_marker(7, 0, false, 0), (0, 3));
        while p.lock_log().segment_count() < 4 {
            let now = crate::log::now_ms();
            assert_eq!(p.append(Bytes::from(simple_batch(5, 10, now)), 1 << 20).error_code, 0);
        }
        drop(p);
        let txnindex = dir.path().join("t-0/00000000000000000000.txnindex");
        let original = std::fs::read(&txnindex).unwrap();
        assert_eq!(original.len(), 34);
        // Torn (a crash while appending an entry): rebuilt from the log, below every snapshot.
        std::fs::write(&txnindex, &original[..20]).unwrap();
        let p = small_segment_partition(dir.path(), false);
        let rebuilt = std::fs::read(&txnindex).unwrap();
        assert_eq!(rebuilt[..26], original[..26], "version, producer id, first and last offset");
        assert_eq!(p.read(0, 1 << 20, -1, true).aborted, Some(vec![(7, 0)]));
        drop(p);
        // An entry whose marker is not in its segment: damage, rebuilt the same way.
        let mut alien = original.clone();
        alien[18..26].copy_from_slice(&1_000_000i64.to_be_bytes());
        std::fs::write(&txnindex, &alien).unwrap();
        let p = small_segment_partition(dir.path(), false);
        assert_eq!(std::fs::read(&txnindex).unwrap()[..26], original[..26]);
        // Missing where the restart rescans (the active segment, above the newest snapshot,
        // where a crash can lose an entry written after its marker): rebuilt too.
        assert_eq!(p.append(txn_batch(8, 0, 1), 1 << 20).error_code, 0);
        let (_, marker) = p.write_marker(8, 0, false, 0);
        let active = p.lock_log().segment_base_offsets().last().copied().unwrap();
        let newest = dir.path().join(format!("t-0/{}.txnindex", crate::log::file_prefix(active)));
        let written = std::fs::read(&newest).unwrap();
        drop(p);
        std::fs::remove_file(&newest).unwrap();
        let p = small_segment_partition(dir.path(), false);
        assert_eq!(std::fs::read(&newest).unwrap()[..26], written[..26]);
        assert_eq!(p.read(0, 1 << 20, -1, true).aborted, Some(vec![(7, 0), (8, marker - 1)]));
    }

    #[test]
    fn a_leaders_isr_changes_are_counted_once_and_appends_by_records() {
        let dir = tempfile::tempdir().unwrap();
        let m = crate::metrics::BrokerMetrics::new().unwrap();
        let config = LogConfig { segment_bytes: 1 << 20, max_index_size: 4096, ..LogConfig::default() };
        let log = Log::open(dir.path().join("t-0"), config, 0, 0, true).unwrap();
        let p = Partition::open("t", 0, 1, Arc::new(Mutex::new(log)), None, m.topics.topic("t"), m.isr.clone());
        p.become_leader(0, &[1, 2, 3], &[1, 2, 3]);
        assert_eq!(m.isr.counts(), (0, 0), "a new leader's ISR is not a change");
        p.set_isr(vec![1, 2]);
        // The controller's LeaderAndIsr carrying the ISR just applied changes nothing.
        p.become_leader(0, &[1, 2, 3], &[1, 2]);
        assert_eq!(m.isr.counts(), (1, 0));
        // Here LeaderAndIsr came first and the AlterPartition answer second.
        p.become_leader(0, &[1, 2, 3], &[1, 2, 3]);
        p.set_isr(vec![1, 2, 3]);
        assert_eq!(m.isr.counts(), (1, 1));
        // A follower's ISR, or a new epoch's, is not this broker's change.
        p.become_follower(2, 1, &[1, 2, 3], &[2, 3]);
        p.set_isr(vec![2]);
        p.become_leader(2, &[1, 2, 3], &[1]);
        assert_eq!(m.isr.counts(), (1, 1));

        let batch = simple_batch(5, 10, 1);
        let bytes = batch.len();
        assert_eq!(p.append(Bytes::from(batch), 1 << 20).error_code, 0);
        let text = m.render(&Default::default());
        assert!(text.contains("kafka_server_brokertopicmetrics_messagesin_total{topic=\"t\"} 5\n"), "{text}");
        assert!(text.contains(&format!("kafka_server_brokertopicmetrics_bytesin_total{{topic=\"t\"}} {bytes}\n")));
        assert_eq!(p.log_stats().size_bytes(), bytes as u64);
    }

    /// Whether `waiter` holds a wake-up: a permit makes `notified()` ready at its first poll.
    fn woken(waiter: &Notify) -> bool {
        let n = waiter.notified();
        tokio::pin!(n);
        n.enable()
    }

    #[test]
    fn an_append_wakes_the_waiters_of_its_partition_only() {
        let (d1, d2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (a, b) = (partition(d1.path()), partition(d2.path()));
        a.become_leader(0, &[1], &[1]);
        b.become_leader(0, &[1], &[1]);
        let (on_a, on_b) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
        a.watch(&on_a);
        b.watch(&on_b);
        // Listed once however often it registers (a fetch re-registers after each wake-up).
        b.watch(&on_b);
        append(&a, 2);
        assert!(woken(&on_a), "an append wakes its own partition's waiter");
        assert!(!woken(&on_b), "and no other partition's");
        // One-shot: a second append needs a second registration.
        append(&a, 1);
        assert!(!woken(&on_a));
        append(&b, 1);
        assert!(woken(&on_b));
        assert!(!woken(&on_b), "registered twice, woken once");

        // acks=all: a follower's fetch that moves the high watermark wakes the producer.
        let d3 = tempfile::tempdir().unwrap();
        let c = partition(d3.path());
        c.become_leader(0, &[1, 2], &[1, 2]);
        append(&c, 3);
        let producer = Arc::new(Notify::new());
        c.watch(&producer);
        c.follower_fetch(2, 0, -1, 0, 1 << 20);
        assert!(!woken(&producer), "the follower has nothing yet: the high watermark stays");
        c.follower_fetch(2, 3, -1, 0, 1 << 20);
        assert!(woken(&producer));
        // A waiter that went away leaves nothing behind to wake.
        c.watch(&Arc::new(Notify::new()));
        c.become_follower(2, 1, &[1, 2], &[1, 2]);
    }

    #[test]
    fn a_followers_fetch_is_woken_by_records_and_role_changes_not_by_the_high_watermark() {
        let d = tempfile::tempdir().unwrap();
        let p = partition(d.path());
        p.become_leader(0, &[1, 2, 3], &[1, 2, 3]);
        append(&p, 3);
        let (follower, producer) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
        p.watch_log_end(&follower);
        p.watch(&producer);
        // Follower 2 caught up; follower 3 too: the high watermark moves to 3.
        p.follower_fetch(2, 3, -1, 0, 1 << 20);
        p.follower_fetch(3, 3, -1, 0, 1 << 20);
        assert_eq!(p.high_watermark(), 3);
        assert!(woken(&producer), "acks=all waits for the high watermark");
        assert!(!woken(&follower), "a follower parked at the log end has nothing new to read");
        append(&p, 1);
        assert!(woken(&follower), "records past the log end answer it");
        p.watch_log_end(&follower);
        p.become_follower(2, 1, &[1, 2, 3], &[1, 2, 3]);
        assert!(woken(&follower), "so does the end of this broker's leadership");
    }

    #[test]
    fn high_watermark_is_the_smallest_isr_end_and_never_moves_back() {
        let dir = tempfile::tempdir().unwrap();
        let p = partition(dir.path());
        p.become_leader(3, &[1, 2, 3], &[1, 2, 3]);
        append(&p, 5);
        // No follower has fetched: nothing is committed.
        assert!(!p.maybe_advance_high_watermark());
        assert_eq!(p.high_watermark(), 0);
        p.follower_fetch(2, 5, 3, 3, 1 << 20);
        assert_eq!(p.high_watermark(), 0, "follower 3 has not fetched yet");
        let (_, _, moved) = p.follower_fetch(3, 4, 3, 3, 1 << 20);
        assert!(moved);
        assert_eq!(p.high_watermark(), 4);
        // A follower reporting less (it truncated) does not pull the high watermark back.
        p.follower_fetch(3, 2, 3, 3, 1 << 20);
        assert_eq!(p.high_watermark(), 4);
        // Dropping the slow follower from the ISR lets the rest commit.
        p.set_isr(vec![1, 2]);
        assert_eq!(p.high_watermark(), 5);
    }

    #[test]
    fn a_follower_rejoins_the_isr_only_when_caught_up_to_the_high_watermark() {
        let dir = tempfile::tempdir().unwrap();
        let p = partition(dir.path());
        p.become_leader(0, &[1, 2, 3], &[1, 2]);
        append(&p, 10);
        p.follower_fetch(2, 10, 0, 0, 1 << 20);
        assert_eq!(p.high_watermark(), 10);
        let (_, expand, _) = p.follower_fetch(3, 6, 0, 0, 1 << 20);
        assert_eq!(expand, None, "below the high watermark");
        let (_, expand, _) = p.follower_fetch(3, 10, 0, 0, 1 << 20);
        assert_eq!(expand, Some(vec![1, 2, 3]));
        // An ISR member is never proposed again.
        p.set_isr(vec![1, 2, 3]);
        let (_, expand, _) = p.follower_fetch(3, 10, 0, 0, 1 << 20);
        assert_eq!(expand, None);
    }

    #[test]
    fn lagging_followers_are_proposed_for_removal() {
        let dir = tempfile::tempdir().unwrap();
        let p = partition(dir.path());
        p.become_leader(0, &[1, 2, 3], &[1, 2, 3]);
        p.follower_fetch(2, 0, -1, 0, 1 << 20);
        p.follower_fetch(3, 0, -1, 0, 1 << 20);
        append(&p, 4);
        // Both were caught up a moment ago: within a generous lag nobody is dropped.
        assert_eq!(p.isr_to_shrink(Duration::from_secs(60)), None);
        p.follower_fetch(2, 4, 0, 0, 1 << 20);
        // With no lag allowed, the one still behind the log end goes, the caught-up one stays.
        assert_eq!(p.isr_to_shrink(Duration::ZERO), Some(vec![1, 2]));
        // A follower never shrinks anything.
        p.become_follower(2, 1, &[1, 2, 3], &[2, 3]);
        assert_eq!(p.isr_to_shrink(Duration::ZERO), None);
    }

    #[test]
    fn follower_fetches_are_fenced_and_told_where_logs_diverge() {
        let dir = tempfile::tempdir().unwrap();
        let p = partition(dir.path());
        p.become_leader(2, &[1, 2], &[1, 2]);
        append(&p, 3);
        let (r, _, _) = p.follower_fetch(2, 0, -1, 1, 1 << 20);
        assert_eq!(r.error_code, ErrorCode::FencedLeaderEpoch.code());
        let (r, _, _) = p.follower_fetch(2, 0, -1, 5, 1 << 20);
        assert_eq!(r.error_code, ErrorCode::UnknownLeaderEpoch.code());
        // The follower led at epoch 1 (before any epoch this leader knows) and wrote 7
        // records: it must cut back to where epoch 2 begins here.
        let (r, _, _) = p.follower_fetch(2, 7, 1, 2, 1 << 20);
        assert_eq!((r.error_code, r.diverging), (0, Some((1, 0))));
        // Same epoch, but further than this leader's log goes in it.
        let (r, _, _) = p.follower_fetch(2, 9, 2, 2, 1 << 20);
        assert_eq!(r.diverging, Some((2, 3)));
        // In agreement: records, no divergence.
        let (r, _, _) = p.follower_fetch(2, 0, -1, 2, 1 << 20);
        assert_eq!(r.diverging, None);
        assert!(!r.records.is_empty());
        // Not the leader any more: the follower must look elsewhere.
        p.become_follower(2, 3, &[1, 2], &[1, 2]);
        let (r, _, _) = p.follower_fetch(2, 0, -1, 3, 1 << 20);
        assert_eq!(r.error_code, ErrorCode::NotLeaderOrFollower.code());
    }
}
