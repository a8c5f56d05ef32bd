//! Replication throttles (Kafka's `ReplicationQuotaManager`, KIP-73): while a reassignment
//! copies a partition, `leader.replication.throttled.rate` bounds the bytes a leader sends to
//! followers of the partitions its topic lists in `leader.replication.throttled.replicas`,
//! and `follower.replication.throttled.rate` the bytes a follower fetches for those listed in
//! `follower.replication.throttled.replicas`. Replicas in the ISR are never throttled: only
//! catching up is slowed, never keeping up.
//!
//! One token bucket per direction and broker, holding at most a second of the rate: a fetch
//! may take what is left and go below zero (a batch is never split), after which throttled
//! partitions get no data until the bucket has refilled.

use std::sync::Mutex;
use std::time::Instant;

use crate::sync::MutexExt;

/// Kafka's default for both rates (Long.MaxValue): no throttle.
pub const UNLIMITED: u64 = i64::MAX as u64;

pub struct ReplicationQuota {
    bucket: Mutex<Option<(f64, Instant)>>,
}

impl Default for ReplicationQuota {
    fn default() -> Self {
        ReplicationQuota { bucket: Mutex::new(None) }
    }
}

impl ReplicationQuota {
    fn refill(slot: &mut Option<(f64, Instant)>, rate: u64, now: Instant) -> f64 {
        let cap = rate as f64;
        let (tokens, at) = slot.get_or_insert((cap, now));
        let elapsed = now.saturating_duration_since(*at).as_secs_f64();
        *tokens = (*tokens + elapsed * cap).min(cap);
        *at = now;
        *tokens
    }

    /// True while the bytes recorded at `rate` bytes/s are over the bound.
    pub fn exceeded(&self, rate: u64) -> bool {
        if rate >= UNLIMITED {
            return false;
        }
        let mut slot = self.bucket.lock_unpoisoned();
        Self::refill(&mut slot, rate, Instant::now()) <= 0.0
    }

    pub fn record(&self, rate: u64, bytes: usize) {
        if rate >= UNLIMITED || bytes == 0 {
            return;
        }
        let mut slot = self.bucket.lock_unpoisoned();
        Self::refill(&mut slot, rate, Instant::now());
        if let Some((tokens, _)) = slot.as_mut() {
            *tokens -= bytes as f64;
        }
    }
}

/// Whether a `*.replication.throttled.replicas` value throttles `partition` on `broker`: `*`,
/// or a `partition:broker` pair naming both (the value is validated when it is set).
pub fn is_throttled(list: Option<&String>, partition: i32, broker: i32) -> bool {
    let Some(list) = list.map(|l| l.trim()) else { return false };
    if list == "*" {
        return true;
    }
    list.split(',')
        .filter_map(|item| item.split_once(':'))
        .any(|(p, b)| p.trim().parse::<i32>().ok() == Some(partition) && b.trim().parse::<i32>().ok() == Some(broker))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn throttled_replicas_name_partition_and_broker() {
        let list = "0:1, 0:2,3:4".to_string();
        assert!(is_throttled(Some(&list), 0, 2));
        assert!(is_throttled(Some(&list), 3, 4));
        assert!(!is_throttled(Some(&list), 3, 1));
        assert!(is_throttled(Some(&"*".to_string()), 7, 9));
        assert!(!is_throttled(Some(&String::new()), 0, 1));
        assert!(!is_throttled(None, 0, 1));
    }

    #[test]
    fn the_bucket_holds_a_second_and_goes_below_zero() {
        let q = ReplicationQuota::default();
        assert!(!q.exceeded(1000));
        q.record(1000, 1500);
        assert!(q.exceeded(1000));
        assert!(!q.exceeded(UNLIMITED));
        std::thread::sleep(std::time::Duration::from_millis(700));
        assert!(!q.exceeded(1000), "refilled after half a second and more");
    }
}
