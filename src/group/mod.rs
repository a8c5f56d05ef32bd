//! The group coordinator (Kafka's classic protocol): membership, rebalances, committed offsets.
//! `consumer` holds the groups of the new consumer protocol (KIP-848), whose committed offsets
//! are kept with the classic groups' here.
//!
//! Offsets and group metadata are persisted as records in `__consumer_offsets` (see
//! `offsets_log`) and reloaded at startup; membership is mirrored into the znode tree under
//! `/consumers/<group>/ids` and `/consumers/<group>/owners`, as the seed document describes.

pub mod configs;
pub mod consumer;
pub mod coordinator;
pub mod offsets_log;
pub mod service;
pub mod share;
pub mod zk_mirror;

pub use coordinator::{GroupCoordinator, JoinResult, SyncResult};
pub use service::GroupCoordinatorService;

pub use crate::protocol::internal_topics::OFFSETS_TOPIC;

/// Java's `String.hashCode`, which Kafka uses to map a group to its offsets partition.
pub fn java_string_hash(s: &str) -> i32 {
    s.encode_utf16().fold(0i32, |h, c| h.wrapping_mul(31).wrapping_add(c as i32))
}

/// `Utils.abs(groupId.hashCode) % offsets.topic.num.partitions`.
pub fn partition_for(group: &str, partitions: i32) -> i32 {
    let h = java_string_hash(group);
    let abs = if h == i32::MIN { 0 } else { h.abs() };
    abs % partitions.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_partition_matches_java() {
        // Values computed with Java's "...".hashCode().
        assert_eq!(java_string_hash("my-group"), -1_906_497_762);
        assert_eq!(java_string_hash(""), 0);
        assert_eq!(partition_for("my-group", 50), 1_906_497_762 % 50);
        assert_eq!(java_string_hash("console-consumer-12345"), {
            let mut h: i32 = 0;
            for c in "console-consumer-12345".chars() {
                h = h.wrapping_mul(31).wrapping_add(c as i32);
            }
            h
        });
    }
}
