//! Per-partition producer state for idempotent produce: for each producer id, its epoch and the
//! last few batches it wrote (Kafka keeps five, matching the clients' in-flight limit), so a
//! retried batch is recognised and answered with its original offset instead of being
//! written again, and a gap in sequence numbers is refused.

use std::collections::{HashMap, VecDeque};

/// How many recent batches per producer are remembered for duplicate detection.
const CACHED_BATCHES: usize = 5;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct BatchRecord {
    first_seq: i32,
    last_seq: i32,
    first_offset: i64,
}

#[derive(Debug, Default)]
struct ProducerEntry {
    epoch: i16,
    batches: VecDeque<BatchRecord>,
    /// The max timestamp of its last batch (DescribeProducers' `last_timestamp`).
    last_timestamp: i64,
}

/// One producer with state here, as DescribeProducers reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActiveProducer {
    pub producer_id: i64,
    pub epoch: i16,
    pub last_sequence: i32,
    pub last_timestamp: i64,
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

const OUT_OF_ORDER_SEQUENCE_NUMBER: i16 = 45;
const INVALID_PRODUCER_EPOCH: i16 = 47;

#[derive(Debug, Default)]
pub struct ProducerStateManager {
    producers: HashMap<i64, ProducerEntry>,
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
            return SequenceCheck::Reject(INVALID_PRODUCER_EPOCH);
        }
        if epoch > entry.epoch {
            return if first_seq == 0 {
                SequenceCheck::Append
            } else {
                SequenceCheck::Reject(OUT_OF_ORDER_SEQUENCE_NUMBER)
            };
        }
        if let Some(b) = entry.batches.iter().find(|b| b.first_seq == first_seq && b.last_seq == last_seq) {
            return SequenceCheck::Duplicate { first_offset: b.first_offset };
        }
        match entry.batches.back() {
            Some(last) if first_seq == next_seq(last.last_seq) => SequenceCheck::Append,
            None => SequenceCheck::Append,
            Some(_) => SequenceCheck::Reject(OUT_OF_ORDER_SEQUENCE_NUMBER),
        }
    }

    /// The producers with batches remembered, by id.
    pub fn active(&self) -> Vec<ActiveProducer> {
        let mut out: Vec<ActiveProducer> = self
            .producers
            .iter()
            .filter_map(|(&producer_id, e)| {
                Some(ActiveProducer {
                    producer_id,
                    epoch: e.epoch,
                    last_sequence: e.batches.back()?.last_seq,
                    last_timestamp: e.last_timestamp,
                })
            })
            .collect();
        out.sort_by_key(|p| p.producer_id);
        out
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
        entry.batches.push_back(BatchRecord { first_seq, last_seq, first_offset });
        while entry.batches.len() > CACHED_BATCHES {
            entry.batches.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
