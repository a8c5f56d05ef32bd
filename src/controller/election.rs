//! The controller's duties in ZooKeeper mode (Kafka's `KafkaController` event handlers, run
//! as one idempotent pass over the tree after any change): give new partitions their first
//! leader, move leadership off brokers that left, drop dead replicas from the ISR, and carry
//! out topic deletions requested under `/admin/delete_topics`.

use std::collections::BTreeSet;

use crate::broker::Broker;
use crate::metadata::store::StoreError;
use crate::metadata::zk_data::{self, PartitionState};

pub const ADMIN_DELETE_TOPICS: &str = "/admin/delete_topics";
pub const ADMIN_REASSIGN_PARTITIONS: &str = "/admin/reassign_partitions";

/// One step of moving a partition to `target` replicas, as Kafka's controller does it: first
/// add the new replicas (the assignment is the union, so they start following), and once all
/// of them are in the ISR, drop the old ones. Returns the assignment to write, or None when
/// the move is complete.
pub fn reassignment_step(current: &[i32], target: &[i32], isr: &[i32]) -> Option<Vec<i32>> {
    if current == target {
        return None;
    }
    let mut union: Vec<i32> = target.to_vec();
    union.extend(current.iter().filter(|r| !target.contains(r)));
    if current != union.as_slice() {
        return Some(union);
    }
    if target.iter().all(|r| isr.contains(r)) {
        return Some(target.to_vec());
    }
    Some(union)
}

/// Parses Kafka's `/admin/reassign_partitions` JSON: (topic, partition, replicas).
fn parse_reassignment(data: &str) -> Vec<(String, i32, Vec<i32>)> {
    let Ok(v) = serde_json::from_str::<serde_json::Value>(data) else { return vec![] };
    let Some(list) = v.get("partitions").and_then(|p| p.as_array()) else { return vec![] };
    list.iter()
        .filter_map(|e| {
            let topic = e.get("topic")?.as_str()?.to_string();
            let partition = e.get("partition")?.as_i64()? as i32;
            let replicas = e.get("replicas")?.as_array()?.iter().filter_map(|r| r.as_i64()).map(|r| r as i32).collect();
            Some((topic, partition, replicas))
        })
        .collect()
}

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

/// Preferred leader election: the first replica of the assignment takes leadership back when
/// it is alive and in the ISR.
pub fn preferred_leader_state(
    replicas: &[i32],
    current: &PartitionState,
    live: &BTreeSet<i32>,
    controller_epoch: i32,
) -> Option<PartitionState> {
    let preferred = *replicas.first()?;
    if current.leader == preferred || !live.contains(&preferred) || !current.isr.contains(&preferred) {
        return None;
    }
    Some(PartitionState {
        leader: preferred,
        leader_epoch: current.leader_epoch + 1,
        isr: current.isr.clone(),
        controller_epoch,
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
        self.reassign_partitions(live)?;
        let preferred = self.take_preferred_election();
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
                let mut next = next_state(replicas, current.as_ref(), live, unclean, epoch);
                if next.is_none() && preferred {
                    next = current.as_ref().and_then(|c| preferred_leader_state(replicas, c, live, epoch));
                }
                if let Some(next) = next {
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

impl Broker {
    /// Advances the reassignments requested in `/admin/reassign_partitions` by one step each
    /// and removes the request once every partition has its target replicas.
    fn reassign_partitions(&self, live: &BTreeSet<i32>) -> Result<(), StoreError> {
        let Some(data) = self.store.try_get(ADMIN_REASSIGN_PARTITIONS)? else { return Ok(()) };
        let mut done = true;
        for (topic, partition, target) in parse_reassignment(&data) {
            let Some(topic_data) = self.store.try_get(&zk_data::topic_path(&topic))? else { continue };
            let Some((mut assignment, id)) = zk_data::parse_topic_json(&topic_data) else { continue };
            let Some(current) = assignment.get(&partition).cloned() else { continue };
            if target.is_empty() || target.iter().any(|r| !live.contains(r)) {
                tracing::warn!(%topic, partition, ?target, "reassignment names a broker that is not alive; waiting");
                done = false;
                continue;
            }
            let state_path = zk_data::partition_state_path(&topic, partition);
            let state = self.store.try_get(&state_path)?.and_then(|d| zk_data::parse_partition_state(&d));
            let isr = state.as_ref().map(|s| s.isr.clone()).unwrap_or_default();
            let Some(next) = reassignment_step(&current, &target, &isr) else { continue };
            if next == current {
                done = false; // new replicas still catching up
                continue;
            }
            tracing::info!(%topic, partition, from = ?current, to = ?next, "reassignment step");
            if next == target {
                if let Some(mut s) = state {
                    s.isr.retain(|r| target.contains(r));
                    if !target.contains(&s.leader) {
                        s.leader = elect_leader(&target, &s.isr, live, false).unwrap_or(-1);
                    }
                    s.leader_epoch += 1;
                    s.controller_epoch = self.controller_epoch();
                    self.store.set(&state_path, &zk_data::partition_state_json(&s))?;
                }
            } else {
                done = false;
            }
            assignment.insert(partition, next);
            self.store.set(
                &zk_data::topic_path(&topic),
                &zk_data::topic_json(&assignment, id.unwrap_or_else(zk_data::new_kafka_uuid)),
            )?;
        }
        if done {
            self.store.delete_recursive(ADMIN_REASSIGN_PARTITIONS)?;
            tracing::info!("partition reassignment complete");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reassignment_adds_then_removes() {
        // [1,2] -> [2,3]: first the union, then (once 3 is in the ISR) the target.
        assert_eq!(reassignment_step(&[1, 2], &[2, 3], &[1, 2]), Some(vec![2, 3, 1]));
        assert_eq!(reassignment_step(&[2, 3, 1], &[2, 3], &[1, 2]), Some(vec![2, 3, 1]));
        assert_eq!(reassignment_step(&[2, 3, 1], &[2, 3], &[1, 2, 3]), Some(vec![2, 3]));
        assert_eq!(reassignment_step(&[2, 3], &[2, 3], &[2, 3]), None);
    }

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
