//! Leadership, followers and the ISR: role changes, what each follower has fetched, the
//! follower's own appends and truncations, and the ISR changes that follow.

use super::*;

/// The one place a leader's ISR changes within its epoch; returns (from, to) if it did. The
/// controller's answer to AlterPartition and its LeaderAndIsr carrying the same ISR race each
/// other: whichever comes first is the change, reported once, and the other finds nothing to do.
pub(super) fn apply_isr(s: &mut ReplicaState, isr: Vec<i32>) -> Option<(Vec<i32>, Vec<i32>)> {
    if s.isr == isr {
        return None;
    }
    let from = std::mem::replace(&mut s.isr, isr);
    (s.role == Role::Leader).then(|| (from, s.isr.clone()))
}

/// Where a follower's fetch reads from, as its request names it.
#[derive(Debug, Clone, Copy)]
pub struct FollowerPosition {
    pub fetch_offset: i64,
    pub last_fetched_epoch: i32,
    pub current_leader_epoch: i32,
}

impl Partition {
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
                s.followers.entry(r).or_insert(FollowerProgress::new(now));
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
        s.followers =
            replicas.iter().filter(|&&r| r != self.broker_id).map(|&r| (r, FollowerProgress::new(now))).collect();
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
        let position = FollowerPosition { fetch_offset, last_fetched_epoch, current_leader_epoch };
        self.follower_fetch_in_session(replica, position, max_bytes, None)
    }

    /// [`Partition::follower_fetch`] through the follower's fetch session, which from now on
    /// vouches for the follower between reads of this partition (see
    /// [`crate::replication::fetch_session::Changes::touch`]).
    pub fn follower_fetch_in_session(
        &self,
        replica: i32,
        position: FollowerPosition,
        max_bytes: usize,
        session: Option<&Arc<Changes>>,
    ) -> (FetchResult, Option<Vec<i32>>, bool) {
        let FollowerPosition { fetch_offset, last_fetched_epoch, current_leader_epoch } = position;
        if !self.is_leader() {
            return (FetchResult::error(ErrorCode::NotLeaderOrFollower.code()), None, false);
        }
        if let Err(code) = self.check_epoch(current_leader_epoch) {
            // A follower that cannot fetch here is caught up at no fetch of its session.
            self.forget_follower_session(replica);
            return (FetchResult::error(code), None, false);
        }
        let leo = self.log_end_offset();
        if last_fetched_epoch >= 0 {
            let (epoch, end) = self.end_offset_for_epoch(last_fetched_epoch);
            if epoch != last_fetched_epoch || end < fetch_offset {
                self.forget_follower_session(replica);
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
                f.session = session.map(Arc::downgrade);
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

    /// The follower no longer fetches this partition through the session that last read it
    /// (it forgot the partition, or its reads fail): only its own reads count from now on.
    pub fn forget_follower_session(&self, replica: i32) {
        if let Some(f) = lock(&self.state).followers.get_mut(&replica) {
            f.session = None;
        }
    }

    /// Followers in the ISR that have not caught up within `lag`; the new ISR without them.
    /// Called for every partition each tick of the expiry task: reads the published log end,
    /// never the log's lock.
    pub fn isr_to_shrink(&self, lag: Duration) -> Option<Vec<i32>> {
        let leo = self.log_stats.log_end_offset();
        let s = lock(&self.state);
        if s.role != Role::Leader || s.isr.len() < 2 {
            return None;
        }
        let now = Instant::now();
        let lagging: Vec<i32> = s
            .isr
            .iter()
            .copied()
            .filter(|r| *r != self.broker_id)
            .filter(|r| {
                s.followers.get(r).is_some_and(|f| f.log_end_offset < leo && now.duration_since(f.caught_up_at()) > lag)
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
        if change.is_some() {
            // Followers' sessions read it again: one left out must be seen catching up.
            self.mark_sessions(false);
        }
        self.report_isr_change(change);
        self.maybe_advance_high_watermark();
    }

    /// Logs and counts a leader's ISR change, outside the state lock (a log line is I/O).
    pub(super) fn report_isr_change(&self, change: Option<(Vec<i32>, Vec<i32>)>) {
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
}
