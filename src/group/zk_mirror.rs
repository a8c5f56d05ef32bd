//! Committed offsets copied into ZooKeeper's old offsets tree,
//! `/consumers/<group>/offsets/<topic>/<partition>` (one decimal znode per partition), where the
//! tools of ZooKeeper-era clusters read them: Burrow's `kafka_zk` module, CMAK, old offset
//! checkers. `__consumer_offsets` stays the source of truth; the copy may lag by an interval.
//!
//! A commit only marks its partitions in a map (latest offset wins, no I/O); a background pass
//! writes what is marked once per interval, at most `max_writes` znodes per pass, so ZooKeeper's
//! load is bounded by the configuration, never by how often groups commit.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::broker::Broker;

/// Where an old consumer (and Kafka 3.9's OffsetCommit v0) keeps a partition's offset.
pub fn offset_path(group: &str, topic: &str, partition: i32) -> String {
    format!("/consumers/{group}/offsets/{topic}/{partition}")
}

/// A name that is one znode: anything else would write elsewhere in the tree.
pub fn is_znode_name(s: &str) -> bool {
    !s.is_empty() && s != "." && s != ".." && !s.contains('/') && !s.contains('\0')
}

type Key = (String, String, i32);

/// What is waiting to be copied: the latest committed offset per (group, topic, partition),
/// None for an offset that was deleted.
#[derive(Default)]
pub struct OffsetMirror {
    enabled: bool,
    pending: Mutex<HashMap<Key, Option<i64>>>,
}

impl OffsetMirror {
    pub fn new(enabled: bool) -> OffsetMirror {
        OffsetMirror { enabled, pending: Mutex::default() }
    }

    pub fn record(&self, group: &str, topic: &str, partition: i32, offset: Option<i64>) {
        if !self.enabled || !is_znode_name(group) || !is_znode_name(topic) {
            return;
        }
        self.lock().insert((group.to_string(), topic.to_string(), partition), offset);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Option<i64>>> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn take(&self, max: usize) -> Vec<(Key, Option<i64>)> {
        let mut pending = self.lock();
        if pending.len() <= max {
            return pending.drain().collect();
        }
        let keys: Vec<Key> = pending.keys().take(max).cloned().collect();
        keys.into_iter().filter_map(|k| pending.remove_entry(&k)).collect()
    }

    /// Puts back what a failed pass took, unless a newer commit was marked meanwhile.
    fn requeue(&self, entries: Vec<(Key, Option<i64>)>) {
        let mut pending = self.lock();
        for (k, v) in entries {
            pending.entry(k).or_insert(v);
        }
    }

    pub fn pending(&self) -> usize {
        self.lock().len()
    }
}

impl Broker {
    /// Copies marked offsets into ZooKeeper every `interval` (ZooKeeper mode only).
    pub fn spawn_offsets_zk_mirror(self: &Arc<Self>) {
        let Some(interval) = self.config.offsets_zk_mirror_interval else { return };
        if !self.store.is_zookeeper() {
            return;
        }
        let max = self.config.offsets_zk_mirror_max_writes;
        let b = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let batch = b.offsets_zk_mirror.take(max);
                if batch.is_empty() {
                    continue;
                }
                // ZooKeeper calls block their thread.
                let b2 = b.clone();
                let _ = tokio::task::spawn_blocking(move || b2.write_offsets_to_zk(batch)).await;
            }
        });
    }

    fn write_offsets_to_zk(&self, batch: Vec<(Key, Option<i64>)>) {
        let writes: Vec<(String, String)> =
            batch.iter().filter_map(|((g, t, p), o)| o.map(|o| (offset_path(g, t, *p), o.to_string()))).collect();
        let mut result = self.store.upsert_many(&writes);
        for ((g, t, p), _) in batch.iter().filter(|(_, o)| o.is_none()) {
            if result.is_err() {
                break;
            }
            result = self.store.delete_recursive(&offset_path(g, t, *p));
        }
        if let Err(e) = result {
            tracing::warn!(error = %e, znodes = batch.len(), "could not copy committed offsets to ZooKeeper; retrying");
            self.offsets_zk_mirror.requeue(batch);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latest_commit_wins_and_takes_are_bounded() {
        let m = OffsetMirror::new(true);
        for o in 0..10 {
            m.record("g", "t", 0, Some(o));
        }
        m.record("g", "t", 1, Some(3));
        m.record("a/b", "t", 0, Some(1));
        assert_eq!(m.pending(), 2);
        let first = m.take(1);
        assert_eq!(first.len(), 1);
        let rest = m.take(10);
        let mut all: Vec<_> = first.into_iter().chain(rest).collect();
        all.sort();
        assert_eq!(all, vec![(("g".into(), "t".into(), 0), Some(9)), (("g".into(), "t".into(), 1), Some(3))]);
    }

    #[test]
    fn requeue_never_overwrites_a_newer_commit() {
        let m = OffsetMirror::new(true);
        m.record("g", "t", 0, Some(1));
        let taken = m.take(10);
        m.record("g", "t", 0, Some(2));
        m.requeue(taken);
        assert_eq!(m.take(10), vec![(("g".into(), "t".into(), 0), Some(2))]);
    }

    #[test]
    fn disabled_records_nothing() {
        let m = OffsetMirror::new(false);
        m.record("g", "t", 0, Some(1));
        assert_eq!(m.pending(), 0);
    }
}
