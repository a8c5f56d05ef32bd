//! Which offsets of what a share-partition read are never handed to a consumer: control
//! batches (transaction markers carry nothing to deliver), and under read_committed the
//! batches of aborted transactions, which Kafka's SharePartition archives as it acquires.

use std::collections::HashSet;

use crate::log::batch::control_marker;
use crate::log::BatchHeader;

/// Inclusive offset ranges to archive instead of acquire, in offset order. `aborted` is what
/// a read_committed read returned: (producer id, first offset) of each aborted transaction
/// that overlaps the records; empty under read_uncommitted.
pub fn unreadable_ranges(records: &[u8], aborted: &[(i64, i64)], committed: bool) -> Vec<(i64, i64)> {
    let mut pending: Vec<(i64, i64)> = if committed { aborted.to_vec() } else { Vec::new() };
    pending.sort_by_key(|&(_, first)| first);
    let mut next_pending = 0;
    let mut aborting: HashSet<i64> = HashSet::new();
    let mut out: Vec<(i64, i64)> = Vec::new();
    let mut rest = records;
    while let Some(h) = BatchHeader::parse(rest) {
        let size = h.total_size();
        if size > rest.len() || size == 0 {
            break;
        }
        let batch = &rest[..size];
        rest = &rest[size..];
        // Transactions that began at or before this batch's end are open for their producers.
        while next_pending < pending.len() && pending[next_pending].1 <= h.last_offset() {
            aborting.insert(pending[next_pending].0);
            next_pending += 1;
        }
        let skip = if h.is_control() {
            if control_marker(batch) == Some(false) {
                aborting.remove(&h.producer_id);
            }
            true
        } else {
            h.is_transactional() && aborting.contains(&h.producer_id)
        };
        if skip {
            match out.last_mut() {
                Some((_, last)) if *last + 1 == h.base_offset => *last = h.last_offset(),
                _ => out.push((h.base_offset, h.last_offset())),
            }
        }
    }
    out
}

/// Whether `offset` lies in one of `ranges` (sorted, disjoint).
pub fn contains(ranges: &[(i64, i64)], offset: i64) -> bool {
    let i = ranges.partition_point(|&(_, last)| last < offset);
    ranges.get(i).is_some_and(|&(first, _)| first <= offset)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::batch::{encode_batch, encode_control_batch, BatchOptions, SimpleRecord, TRANSACTIONAL_BIT};

    fn data(base: i64, n: usize, producer_id: i64, transactional: bool) -> Vec<u8> {
        let opts = BatchOptions {
            attributes: if transactional { TRANSACTIONAL_BIT } else { 0 },
            producer_id,
            ..BatchOptions::default()
        };
        let records: Vec<SimpleRecord> =
            (0..n).map(|_| SimpleRecord { timestamp: 0, key: None, value: Some(b"v"), headers: vec![] }).collect();
        let mut b = encode_batch(&opts, &records);
        b[..8].copy_from_slice(&base.to_be_bytes());
        b
    }

    fn marker(base: i64, producer_id: i64, commit: bool) -> Vec<u8> {
        let mut b = encode_control_batch(producer_id, 0, commit, 0, 0);
        b[..8].copy_from_slice(&base.to_be_bytes());
        b
    }

    #[test]
    fn aborted_batches_and_markers_are_skipped() {
        // Producer 7 aborts [0, 2), commits [3, 5); producer 8 writes plainly in between.
        let log =
            [data(0, 2, 7, true), marker(2, 7, false), data(3, 2, 7, true), data(5, 1, 8, false), marker(6, 7, true)]
                .concat();
        assert_eq!(unreadable_ranges(&log, &[(7, 0)], true), vec![(0, 2), (6, 6)]);
        assert_eq!(unreadable_ranges(&log, &[], false), vec![(2, 2), (6, 6)], "read_uncommitted: markers only");
        assert!(contains(&[(0, 2), (6, 6)], 1) && contains(&[(0, 2), (6, 6)], 6));
        assert!(!contains(&[(0, 2), (6, 6)], 3) && !contains(&[(0, 2), (6, 6)], 7));
    }
}
