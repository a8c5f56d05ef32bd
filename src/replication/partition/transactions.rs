//! A partition's producer state: transaction markers, the last stable offset, and the
//! producer snapshots written at rolls and shutdown and read back at open.

use super::*;

/// The snapshot to write when the append that just ended started a new segment at
/// `first_offset`: the producer state, not yet updated with that append, is then exactly the
/// state of the offsets below it.
pub(super) fn snapshot_at_roll(
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
pub(super) fn rebuild_producer_state(log: &Mutex<Log>) -> ProducerStateManager {
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

impl Partition {
    /// [`Self::txn_markers_of`] for a producer, read before its transactional write was
    /// verified (KIP-890): the write is refused if a marker for it was written since, unless
    /// its transaction here is still open. Otherwise a zombie's write verified just before
    /// the marker that ends its transaction could land behind that marker, opening a
    /// transaction no coordinator will ever end.
    pub fn txn_markers_of(&self, producer_id: i64) -> u64 {
        lock(&self.producers).markers_of(producer_id)
    }

    /// Publishes the first offset of the oldest open transaction (the caller holds the
    /// producers lock, so publications happen in the order the state changed).
    pub(super) fn publish_unstable(&self, producers: &ProducerStateManager) {
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
    pub(super) fn write_snapshot(&self, snap: Option<(PathBuf, i64, Vec<u8>)>) {
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
}
