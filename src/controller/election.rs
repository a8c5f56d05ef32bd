//! The controller's duties in ZooKeeper mode (Kafka's `KafkaController` event handlers, run
//! as one idempotent pass over the tree after any change): give new partitions their first
//! leader, move leadership off brokers that left, drop dead replicas from the ISR, and carry
//! out topic deletions requested under `/admin/delete_topics`.

use std::collections::BTreeSet;

use crate::broker::Broker;
use crate::metadata::store::StoreError;
use crate::metadata::zk_data::{self, PartitionState};

pub const ADMIN_DELETE_TOPICS: &str = "/admin/delete_topics";

/// Kafka's leader election for one partition: the first replica in assignment order that is
/// alive and in the ISR; with unclean election allowed, any live replica; otherwise none.
pub fn elect_leader(replicas: &[i32], isr: &[i32], live: &BTreeSet<i32>, unclean: bool) -> Option<i32> {
    replicas.iter().copied().find(|r| live.contains(r) && isr.contains(r)).or_else(|| {
        if unclean {
            replicas.iter().copied().find(|r| live.contains(r))
        } else {
            None
        }
    })
}

/// What the controller writes for a partition given its current state, or None if nothing
/// needs to change.
pub fn next_state(
    replicas: &[i32],
    current: Option<&PartitionState>,
    live: &BTreeSet<i32>,
    unclean: bool,
    controller_epoch: i32,
) -> Option<PartitionState> {
    let Some(state) = current else {
        let isr: Vec<i32> = replicas.iter().copied().filter(|r| live.contains(r)).collect();
        let leader = isr.first().copied().unwrap_or(-1);
        return Some(PartitionState { leader, leader_epoch: 0, isr, controller_epoch });
    };
    let leader_alive = state.leader >= 0 && live.contains(&state.leader);
    let live_isr: Vec<i32> = state.isr.iter().copied().filter(|r| live.contains(r)).collect();
    if leader_alive {
        if live_isr.len() == state.isr.len() {
            return None;
        }
        return Some(PartitionState {
            leader: state.leader,
            leader_epoch: state.leader_epoch + 1,
            isr: live_isr,
            controller_epoch,
        });
    }
    match elect_leader(replicas, &live_isr, live, unclean) {
        Some(leader) => {
            let isr = if live_isr.contains(&leader) { live_isr } else { vec![leader] };
            Some(PartitionState { leader, leader_epoch: state.leader_epoch + 1, isr, controller_epoch })
        }
        // No eligible replica: leaderless, keeping the last ISR so that the replica that has
        // every committed record is the one that may lead again (as Kafka keeps it).
        None if state.leader != -1 => Some(PartitionState {
            leader: -1,
            leader_epoch: state.leader_epoch + 1,
            isr: if live_isr.is_empty() { vec![state.leader] } else { live_isr },
            controller_epoch,
        }),
        None => None,
    }
}

impl Broker {
    /// One pass of controller duties; only the controller calls it.
    pub fn controller_pass(&self, live: &BTreeSet<i32>) -> Result<(), StoreError> {
        let epoch = self.controller_epoch();
        for topic in self.store.try_children(ADMIN_DELETE_TOPICS)? {
            if self.config.delete_topic_enable {
                self.store.delete_recursive(&zk_data::topic_path(&topic))?;
                self.store.delete_recursive(&zk_data::topic_config_path(&topic))?;
                tracing::info!(%topic, "deleted topic");
            }
            self.store.delete_recursive(&format!("{ADMIN_DELETE_TOPICS}/{topic}"))?;
        }
        let unclean_default = self.config.values.get("unclean.leader.election.enable").is_some_and(|v| v == "true");
        for topic in self.store.try_children(zk_data::BROKER_TOPICS)? {
            let Some(data) = self.store.try_get(&zk_data::topic_path(&topic))? else { continue };
            let Some((assignment, _)) = zk_data::parse_topic_json(&data) else {
                tracing::warn!(%topic, "topic znode with JSON gregor does not understand; skipped");
                continue;
            };
            let unclean = self
                .store
                .get(&zk_data::topic_config_path(&topic))
                .map(|d| zk_data::parse_topic_config(&d))
                .and_then(|c| c.get("unclean.leader.election.enable").map(|v| v == "true"))
                .unwrap_or(unclean_default);
            for (&p, replicas) in &assignment {
                let path = zk_data::partition_state_path(&topic, p);
                let current = self.store.try_get(&path)?.and_then(|d| zk_data::parse_partition_state(&d));
                if let Some(next) = next_state(replicas, current.as_ref(), live, unclean, epoch) {
                    if current.as_ref().is_some_and(|c| c.controller_epoch > epoch) {
                        // A newer controller has written here: we are stale and must not act.
                        tracing::warn!(%topic, partition = p, "partition state from a newer controller epoch; stepping back");
                        return Ok(());
                    }
                    tracing::info!(%topic, partition = p, leader = next.leader, isr = ?next.isr, epoch = next.leader_epoch, "partition state change");
                    self.store.set(&path, &zk_data::partition_state_json(&next))?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn live(ids: &[i32]) -> BTreeSet<i32> {
        ids.iter().copied().collect()
    }

    #[test]
    fn new_partition_gets_first_live_replica() {
        let s = next_state(&[2, 0, 1], None, &live(&[0, 1]), false, 3).unwrap();
        assert_eq!((s.leader, s.isr, s.leader_epoch, s.controller_epoch), (0, vec![0, 1], 0, 3));
    }

    #[test]
    fn dead_leader_moves_to_next_in_isr_and_bumps_epoch() {
        let cur = PartitionState { leader: 0, leader_epoch: 4, isr: vec![0, 1, 2], controller_epoch: 1 };
        let s = next_state(&[0, 1, 2], Some(&cur), &live(&[1, 2]), false, 2).unwrap();
        assert_eq!((s.leader, s.isr, s.leader_epoch), (1, vec![1, 2], 5));
        // Nothing to do when everything is alive.
        assert!(next_state(&[0, 1, 2], Some(&cur), &live(&[0, 1, 2]), false, 2).is_none());
    }

    #[test]
    fn dead_follower_leaves_isr() {
        let cur = PartitionState { leader: 0, leader_epoch: 4, isr: vec![0, 1, 2], controller_epoch: 1 };
        let s = next_state(&[0, 1, 2], Some(&cur), &live(&[0, 1]), false, 2).unwrap();
        assert_eq!((s.leader, s.isr), (0, vec![0, 1]));
    }

    #[test]
    fn out_of_sync_replica_leads_only_when_unclean() {
        let cur = PartitionState { leader: 0, leader_epoch: 1, isr: vec![0], controller_epoch: 1 };
        let clean = next_state(&[0, 1], Some(&cur), &live(&[1]), false, 1).unwrap();
        assert_eq!((clean.leader, clean.isr.clone()), (-1, vec![0]));
        let unclean = next_state(&[0, 1], Some(&cur), &live(&[1]), true, 1).unwrap();
        assert_eq!((unclean.leader, unclean.isr), (1, vec![1]));
        // Once leaderless, nothing changes until an ISR member returns.
        assert!(next_state(&[0, 1], Some(&clean), &live(&[1]), false, 1).is_none());
        let back = next_state(&[0, 1], Some(&clean), &live(&[0, 1]), false, 1).unwrap();
        assert_eq!(back.leader, 0);
    }
}
