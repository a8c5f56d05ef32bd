//! Per-partition producer state for idempotent produce: for each producer id, its epoch and the
//! last few batches it wrote (Kafka keeps five, matching the clients' in-flight limit), so a
//! retried batch is recognised and answered with its original offset instead of being
//! written again, and a gap in sequence numbers is refused.

use std::collections::{HashMap, VecDeque};

use super::producer_snapshot::SnapshotEntry;
use crate::log::batch::EndTxnMarker;
use crate::protocol::ErrorCode;

/// How many recent batches per producer are remembered for duplicate detection.
const CACHED_BATCHES: usize = 5;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct BatchRecord {
    first_seq: i32,
    last_seq: i32,
    first_offset: i64,
    /// Last offset minus first offset (a snapshot stores the batch by its last offset).
    offset_delta: i32,
}

#[derive(Debug)]
struct ProducerEntry {
    epoch: i16,
    batches: VecDeque<BatchRecord>,
    /// The max timestamp of its last batch or marker (DescribeProducers' `last_timestamp`).
    last_timestamp: i64,
    /// The epoch of the coordinator that wrote its last marker here, -1 before any (kept in
    /// snapshots, reported by DescribeProducers).
    coordinator_epoch: i32,
    /// Markers written for it here since this broker loaded the partition (memory only: the
    /// windows it guards are those of requests in flight).
    markers: u64,
}

impl Default for ProducerEntry {
    fn default() -> ProducerEntry {
        ProducerEntry { epoch: 0, batches: VecDeque::new(), last_timestamp: -1, coordinator_epoch: -1, markers: 0 }
    }
}

/// One producer with state here, as DescribeProducers reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActiveProducer {
    pub producer_id: i64,
    pub epoch: i16,
    pub last_sequence: i32,
    pub last_timestamp: i64,
    /// The epoch of the coordinator that wrote its last marker here, -1 if none.
    pub coordinator_epoch: i32,
    /// The first offset of its open transaction here, -1 if none.
    pub txn_start_offset: i64,
}

#[derive(Debug, PartialEq, Eq)]
pub enum SequenceCheck {
    /// Write it.
    Append,
    /// Already written at this offset; answer success without writing.
    Duplicate { first_offset: i64 },
    /// Kafka error code to return (OUT_OF_ORDER_SEQUENCE_NUMBER, INVALID_PRODUCER_EPOCH).
    Reject(i16),
}

/// A transaction that ended in an ABORT marker: read_committed consumers are told to drop the
/// producer's batches from `first_offset` up to the marker (Kafka's `AbortedTxn`, one
/// `.txnindex` entry).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AbortedTxn {
    pub producer_id: i64,
    pub first_offset: i64,
    /// The offset of the ABORT marker.
    pub last_offset: i64,
    pub last_stable_offset: i64,
}

#[derive(Debug, Default)]
pub struct ProducerStateManager {
    producers: HashMap<i64, ProducerEntry>,
    /// Open transactions on this partition: producer id to the offset of its first batch in
    /// the transaction. The smallest of those bounds the last stable offset.
    ongoing: HashMap<i64, i64>,
    /// The same, by first offset, so the smallest is found without a scan.
    ongoing_by_offset: std::collections::BTreeSet<(i64, i64)>,
    /// Aborted transactions, in marker order (so by `last_offset`).
    aborted: Vec<AbortedTxn>,
}

fn next_seq(seq: i32) -> i32 {
    // Sequences wrap from i32::MAX to 0, as the clients number them.
    if seq == i32::MAX {
        0
    } else {
        seq + 1
    }
}

impl ProducerStateManager {
    pub fn check(&self, producer_id: i64, epoch: i16, first_seq: i32, last_seq: i32) -> SequenceCheck {
        let Some(entry) = self.producers.get(&producer_id) else {
            // Unknown producer: either new, or its state was not kept across a restart. Kafka
            // accepts the batch in both cases rather than fail a healthy producer.
            return SequenceCheck::Append;
        };
        if epoch < entry.epoch {
            return SequenceCheck::Reject(ErrorCode::InvalidProducerEpoch.code());
        }
        if epoch > entry.epoch {
            return if first_seq == 0 {
                SequenceCheck::Append
            } else {
                SequenceCheck::Reject(ErrorCode::OutOfOrderSequenceNumber.code())
            };
        }
        if let Some(b) = entry.batches.iter().find(|b| b.first_seq == first_seq && b.last_seq == last_seq) {
            return SequenceCheck::Duplicate { first_offset: b.first_offset };
        }
        match entry.batches.back() {
            Some(last) if first_seq == next_seq(last.last_seq) => SequenceCheck::Append,
            None => SequenceCheck::Append,
            Some(_) => SequenceCheck::Reject(ErrorCode::OutOfOrderSequenceNumber.code()),
        }
    }

    /// A batch of a transaction was written at `offset`: the first one opens the transaction
    /// on this partition.
    pub fn observe_transactional(&mut self, producer_id: i64, offset: i64) {
        if let std::collections::hash_map::Entry::Vacant(e) = self.ongoing.entry(producer_id) {
            e.insert(offset);
            self.ongoing_by_offset.insert((offset, producer_id));
        }
    }

    /// Whether `producer_id` has a transaction open here.
    pub fn in_transaction(&self, producer_id: i64) -> bool {
        self.ongoing.contains_key(&producer_id)
    }

    /// How many markers this partition has taken for `producer_id`: a transactional append
    /// verified before a marker that is not yet written must not land after it.
    pub fn markers_of(&self, producer_id: i64) -> u64 {
        self.producers.get(&producer_id).map_or(0, |e| e.markers)
    }

    /// The epoch this partition knows for `producer_id` (a marker older than it is refused).
    pub fn epoch_of(&self, producer_id: i64) -> Option<i16> {
        self.producers.get(&producer_id).map(|e| e.epoch)
    }

    /// A COMMIT or ABORT marker stamped `timestamp` was written at `marker_offset`: the
    /// producer's transaction here ends, and from `epoch` on its older epochs are fenced (the
    /// coordinator bumps the epoch when it aborts a transaction that timed out). Returns the
    /// aborted-transaction entry an ABORT makes (None for a COMMIT, or when no transaction was
    /// open).
    pub fn complete_transaction(
        &mut self,
        producer_id: i64,
        epoch: i16,
        marker_offset: i64,
        marker: EndTxnMarker,
        timestamp: i64,
        high_watermark: i64,
    ) -> Option<AbortedTxn> {
        let commit = marker.commit;
        let entry = self.producers.entry(producer_id).or_default();
        entry.markers = entry.markers.wrapping_add(1);
        entry.coordinator_epoch = marker.coordinator_epoch;
        entry.last_timestamp = timestamp;
        if epoch > entry.epoch {
            entry.epoch = epoch;
            entry.batches.clear();
        }
        let first = self.ongoing.remove(&producer_id)?;
        self.ongoing_by_offset.remove(&(first, producer_id));
        if commit {
            return None;
        }
        let lso = self.first_unstable_offset().unwrap_or(i64::MAX).min(high_watermark.max(first));
        let aborted =
            AbortedTxn { producer_id, first_offset: first, last_offset: marker_offset, last_stable_offset: lso };
        self.aborted.push(aborted);
        Some(aborted)
    }

    /// The first offset of the oldest transaction still open here.
    pub fn first_unstable_offset(&self) -> Option<i64> {
        self.ongoing_by_offset.iter().next().map(|(o, _)| *o)
    }

    /// The aborted transactions a read_committed fetch of `[start, upper)` must be told of:
    /// those that end at or after `start` and begin before `upper`.
    pub fn aborted_between(&self, start: i64, upper: i64) -> Vec<(i64, i64)> {
        let from = self.aborted.partition_point(|a| a.last_offset < start);
        self.aborted[from..]
            .iter()
            .filter(|a| a.first_offset < upper)
            .map(|a| (a.producer_id, a.first_offset))
            .collect()
    }

    /// Aborted-transaction entries restored from `.txnindex` files, oldest first.
    pub fn restore_aborted(&mut self, entries: Vec<AbortedTxn>) {
        let newest_known = self.aborted.first().map(|a| a.last_offset).unwrap_or(i64::MAX);
        let mut older: Vec<AbortedTxn> = entries.into_iter().filter(|a| a.last_offset < newest_known).collect();
        older.append(&mut self.aborted);
        self.aborted = older;
    }

    /// The producers with state here, by id; one known only from a marker has no last
    /// sequence (-1), as Kafka lists it.
    pub fn active(&self) -> Vec<ActiveProducer> {
        let mut out: Vec<ActiveProducer> = self
            .producers
            .iter()
            .map(|(&producer_id, e)| ActiveProducer {
                producer_id,
                epoch: e.epoch,
                last_sequence: e.batches.back().map_or(-1, |b| b.last_seq),
                last_timestamp: e.last_timestamp,
                coordinator_epoch: e.coordinator_epoch,
                txn_start_offset: self.ongoing.get(&producer_id).copied().unwrap_or(-1),
            })
            .collect();
        out.sort_by_key(|p| p.producer_id);
        out
    }

    /// The state as a snapshot's entries (Kafka keeps one batch per producer in a snapshot,
    /// so after a restart only a retry of the last batch is recognised as a duplicate).
    pub fn snapshot_entries(&self) -> Vec<SnapshotEntry> {
        let mut out: Vec<SnapshotEntry> = self
            .producers
            .iter()
            .map(|(&producer_id, e)| {
                let last = e.batches.back();
                let last_offset = last.map_or(-1, |b| b.first_offset + b.offset_delta as i64);
                SnapshotEntry {
                    producer_id,
                    epoch: e.epoch,
                    last_sequence: last.map_or(-1, |b| b.last_seq),
                    last_offset,
                    offset_delta: last.map_or(0, |b| b.offset_delta),
                    timestamp: e.last_timestamp,
                    coordinator_epoch: e.coordinator_epoch,
                    current_txn_first_offset: self.ongoing.get(&producer_id).copied().unwrap_or(-1),
                }
            })
            .collect();
        // A transaction seen without sequence numbers still holds back the stable offset.
        for (&producer_id, &first) in self.ongoing.iter().filter(|(p, _)| !self.producers.contains_key(p)) {
            out.push(SnapshotEntry {
                producer_id,
                epoch: -1,
                last_sequence: -1,
                last_offset: -1,
                offset_delta: 0,
                timestamp: -1,
                coordinator_epoch: -1,
                current_txn_first_offset: first,
            });
        }
        out.sort_by_key(|e| e.producer_id);
        out
    }

    /// State restored from a snapshot's entries.
    pub fn from_snapshot(entries: &[SnapshotEntry]) -> ProducerStateManager {
        let mut s = ProducerStateManager::default();
        for e in entries {
            if e.epoch >= 0 || e.last_offset >= 0 {
                let entry = s.producers.entry(e.producer_id).or_default();
                entry.epoch = e.epoch.max(0);
                entry.last_timestamp = e.timestamp;
                entry.coordinator_epoch = e.coordinator_epoch;
                if e.last_offset >= 0 && e.last_sequence >= 0 {
                    let first_seq = e.last_sequence.wrapping_sub(e.offset_delta) & i32::MAX;
                    entry.batches.push_back(BatchRecord {
                        first_seq,
                        last_seq: e.last_sequence,
                        first_offset: e.last_offset - e.offset_delta as i64,
                        offset_delta: e.offset_delta,
                    });
                }
            }
            if e.current_txn_first_offset >= 0 {
                s.observe_transactional(e.producer_id, e.current_txn_first_offset);
            }
        }
        s
    }

    pub fn record(
        &mut self,
        producer_id: i64,
        epoch: i16,
        first_seq: i32,
        last_seq: i32,
        first_offset: i64,
        timestamp: i64,
    ) {
        let entry = self.producers.entry(producer_id).or_default();
        entry.last_timestamp = timestamp;
        if epoch != entry.epoch {
            entry.batches.clear();
            entry.epoch = epoch;
        }
        // A batch's records are numbered consecutively, so its sequences span its offsets.
        let offset_delta = last_seq.wrapping_sub(first_seq) & i32::MAX;
        entry.batches.push_back(BatchRecord { first_seq, last_seq, first_offset, offset_delta });
        while entry.batches.len() > CACHED_BATCHES {
            entry.batches.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn marker(commit: bool, coordinator_epoch: i32) -> EndTxnMarker {
        EndTxnMarker { commit, coordinator_epoch }
    }

    #[test]
    fn sequence_rules() {
        let mut s = ProducerStateManager::default();
        assert_eq!(s.check(7, 0, 0, 9), SequenceCheck::Append);
        s.record(7, 0, 0, 9, 100, 0);
        assert_eq!(s.check(7, 0, 0, 9), SequenceCheck::Duplicate { first_offset: 100 });
        assert_eq!(s.check(7, 0, 20, 29), SequenceCheck::Reject(45));
        assert_eq!(s.check(7, 0, 10, 19), SequenceCheck::Append);
        s.record(7, 0, 10, 19, 110, 0);
        assert_eq!(s.check(7, 1, 0, 0), SequenceCheck::Append);
        assert_eq!(s.check(7, 1, 5, 6), SequenceCheck::Reject(45));
        s.record(7, 1, 0, 0, 120, 0);
        assert_eq!(s.check(7, 0, 20, 20), SequenceCheck::Reject(47));
        // Only the last five batches are remembered.
        for i in 1..=6 {
            s.record(7, 1, i, i, 120 + i as i64, 0);
        }
        assert_eq!(s.check(7, 1, 1, 1), SequenceCheck::Reject(45));
        assert_eq!(s.check(7, 1, 6, 6), SequenceCheck::Duplicate { first_offset: 126 });
    }

    #[test]
    fn transactions_bound_the_stable_offset_and_aborts_are_listed() {
        let mut s = ProducerStateManager::default();
        assert_eq!(s.first_unstable_offset(), None);
        s.observe_transactional(1, 10);
        s.observe_transactional(1, 12);
        s.observe_transactional(2, 11);
        assert_eq!(s.first_unstable_offset(), Some(10));
        assert!(s.in_transaction(1));
        assert_eq!(s.complete_transaction(1, 0, 13, marker(true, 0), 0, 13), None);
        assert_eq!(s.first_unstable_offset(), Some(11));
        let a = s.complete_transaction(2, 0, 14, marker(false, 0), 0, 14).unwrap();
        assert_eq!((a.first_offset, a.last_offset), (11, 14));
        assert_eq!(s.first_unstable_offset(), None);
        assert_eq!(s.aborted_between(0, 100), vec![(2, 11)]);
        assert_eq!(s.aborted_between(15, 100), vec![]);
        assert_eq!(s.aborted_between(0, 11), vec![]);
        // A marker with a bumped epoch fences the producer's older epoch.
        s.complete_transaction(3, 4, 20, marker(false, 0), 0, 20);
        assert_eq!(s.check(3, 3, 0, 0), SequenceCheck::Reject(47));
        assert_eq!(s.check(3, 4, 0, 0), SequenceCheck::Append);
    }

    #[test]
    fn wraps_at_i32_max() {
        let mut s = ProducerStateManager::default();
        s.record(1, 0, i32::MAX - 1, i32::MAX, 0, 0);
        assert_eq!(s.check(1, 0, 0, 3), SequenceCheck::Append);
    }

    #[test]
    fn active_producers_report_their_last_batch() {
        let mut s = ProducerStateManager::default();
        s.record(9, 2, 0, 4, 10, 1_000);
        s.record(9, 2, 5, 7, 15, 2_000);
        s.record(3, 0, 0, 0, 20, 500);
        let a = s.active();
        assert_eq!(
            a.iter().map(|p| (p.producer_id, p.epoch, p.last_sequence, p.last_timestamp)).collect::<Vec<_>>(),
            vec![(3, 0, 0, 500), (9, 2, 7, 2_000)]
        );
    }

    #[test]
    fn a_marker_records_its_coordinator_epoch_and_snapshots_keep_it() {
        let mut s = ProducerStateManager::default();
        s.record(5, 0, 0, 2, 0, 1_000);
        s.observe_transactional(5, 0);
        assert_eq!(s.active()[0].coordinator_epoch, -1, "no marker yet");
        assert_eq!(s.complete_transaction(5, 0, 3, marker(true, 7), 2_000, 3), None);
        // A producer known only from a marker is listed too, without a last sequence.
        s.complete_transaction(6, 1, 4, marker(false, 2), 2_500, 4);
        let a = s.active();
        assert_eq!(
            a.iter()
                .map(|p| (p.producer_id, p.last_sequence, p.last_timestamp, p.coordinator_epoch, p.txn_start_offset))
                .collect::<Vec<_>>(),
            vec![(5, 2, 2_000, 7, -1), (6, -1, 2_500, 2, -1)]
        );
        let restored = ProducerStateManager::from_snapshot(&s.snapshot_entries());
        assert_eq!(restored.active(), a);
        // A new epoch of the producer keeps the coordinator epoch until its next marker.
        s.record(5, 1, 0, 0, 5, 3_000);
        assert_eq!(s.active()[0].coordinator_epoch, 7);
    }
}
