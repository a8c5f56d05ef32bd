//! Partition reassignment as a Kafka 2.4+ controller does it in ZooKeeper mode
//! (`KafkaController.onPartitionReassignment`). The reassignment in flight lives in the topic
//! znode: the replica list is the target followed by the old replicas that are leaving
//! (RS = TRS ∪ ORS), with `adding_replicas` and `removing_replicas` saying which is which.
//!
//! 1. Start: write RS, AR = TRS − ORS, RR = ORS − TRS, bump the leader epoch; the new
//!    replicas are told by LeaderAndIsr and start fetching.
//! 2. When the ISR holds every target replica: the replica list becomes TRS, a leader outside
//!    it (or dead) is replaced by the first live target replica in the ISR, the leaving
//!    replicas leave the ISR and are sent StopReplica with deletion.
//!
//! Requests come from AlterPartitionReassignments (a null target cancels: back to the old
//! replicas) and from the legacy `/admin/reassign_partitions` znode, whose entries are started
//! the same way and dropped from it as they complete.

use std::collections::{BTreeMap, BTreeSet};

use super::Controller;
use crate::metadata::store::StoreError;
use crate::metadata::zk_data::{self, Moving, PartitionState};
use crate::metadata::zk_sync::Changes;
use crate::metadata::PartitionInfo;
use crate::protocol::{ApiError, ErrorCode};

use super::election::{elect_leader, parse_reassignment, ADMIN_REASSIGN_PARTITIONS};

/// The replica set a partition moves to: the full list while in flight and who joins and
/// leaves (Kafka's `ReplicaAssignment.reassignTo`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub replicas: Vec<i32>,
    pub moving: Moving,
    pub target: Vec<i32>,
}

/// The replicas a partition had before its reassignment in flight (all of them if none).
pub fn origin_replicas(p: &PartitionInfo) -> Vec<i32> {
    p.replicas.iter().copied().filter(|r| !p.adding_replicas.contains(r)).collect()
}

/// Target first, then the old replicas that leave.
pub fn reassign_to(origin: &[i32], target: &[i32]) -> Plan {
    let mut replicas = target.to_vec();
    replicas.extend(origin.iter().copied().filter(|r| !target.contains(r)));
    let adding = replicas.iter().copied().filter(|r| !origin.contains(r)).collect();
    let removing = replicas.iter().copied().filter(|r| !target.contains(r)).collect();
    Plan { replicas, moving: Moving { adding, removing }, target: target.to_vec() }
}

/// Checks one requested move as Kafka's controller does and plans it. `None` cancels the
/// reassignment in flight.
pub fn plan_reassignment(p: &PartitionInfo, target: Option<&[i32]>, live: &BTreeSet<i32>) -> Result<Plan, ApiError> {
    let bad = |m: String| Err(ApiError::new(ErrorCode::InvalidReplicaAssignment, m));
    let origin = origin_replicas(p);
    let target: Vec<i32> = match target {
        Some(t) => t.to_vec(),
        None if p.is_being_reassigned() => origin.clone(),
        None => {
            return Err(ApiError::new(
                ErrorCode::NoReassignmentInProgress,
                "No reassignment is in progress for this partition.",
            ))
        }
    };
    if target.is_empty() {
        return bad("Empty replica list specified in partition reassignment.".into());
    }
    if target.iter().collect::<BTreeSet<_>>().len() != target.len() {
        return bad(format!("Duplicate replica ids in partition reassignment replica list: {target:?}"));
    }
    if target.iter().any(|r| *r < 0) {
        return bad(format!("Invalid broker id in replica list: {target:?}"));
    }
    let plan = reassign_to(&origin, &target);
    if !plan.moving.adding.iter().all(|r| live.contains(r)) {
        return bad(format!(
            "Replica assignment has brokers that are not alive. Replica list: {:?}, live broker list: {:?}",
            plan.moving.adding, live
        ));
    }
    Ok(plan)
}

/// The state a partition takes with `replicas`: the ISR keeps only replicas of the new set, a
/// leader outside it (or dead) gives way to the first live target replica in the ISR, and the
/// leader epoch goes up so every replica hears of the new set.
pub fn state_for(
    current: &PartitionState,
    replicas: &[i32],
    target: &[i32],
    live: &BTreeSet<i32>,
    controller_epoch: i32,
) -> PartitionState {
    let isr: Vec<i32> = current.isr.iter().copied().filter(|r| replicas.contains(r)).collect();
    let leader = if replicas.contains(&current.leader) && live.contains(&current.leader) {
        current.leader
    } else {
        elect_leader(target, &isr, live, false).unwrap_or(-1)
    };
    let isr = if isr.is_empty() && leader >= 0 { vec![leader] } else { isr };
    PartitionState { leader, leader_epoch: current.leader_epoch + 1, isr, controller_epoch }
}

/// Each requested (topic, partition, target or None to cancel).
pub type ReassignmentRequest = (String, i32, Option<Vec<i32>>);

/// A reassignment in flight: (topic, partition, replicas, adding, removing).
pub type Ongoing = (String, i32, Vec<i32>, Vec<i32>, Vec<i32>);

impl Controller {
    /// AlterPartitionReassignments on the controller: each move checked, started (or, when its
    /// target is already in the ISR, such as a cancellation or a shrink, finished at once) and
    /// told to the brokers before the answer.
    pub fn alter_reassignments(&self, wanted: &[ReassignmentRequest]) -> Vec<Result<(), ApiError>> {
        let owned = wanted.to_vec();
        self.as_event("alter reassignments", move |c| c.alter_reassignments_step(&owned))
            .unwrap_or_else(|e| vec![Err(e); wanted.len()])
    }

    fn alter_reassignments_step(&self, wanted: &[ReassignmentRequest]) -> Vec<Result<(), ApiError>> {
        let live = self.eligible_ids();
        let mut touched = BTreeSet::new();
        let results = wanted
            .iter()
            .map(|(topic, partition, target)| {
                let Some(p) = self.cached_partition(topic, *partition) else {
                    return Err(ApiError::new(
                        ErrorCode::UnknownTopicOrPartition,
                        format!("Unable to find partition {topic}-{partition}."),
                    ));
                };
                let plan = plan_reassignment(&p, target.as_deref(), &live)?;
                if !p.is_being_reassigned() && plan.replicas == p.replicas {
                    // Already there: nothing to copy, and no epoch to bump.
                    return Ok(());
                }
                tracing::info!(%topic, partition, from = ?p.replicas, to = ?plan.target, "reassignment requested");
                self.advance(topic, &p, plan, &live)?;
                touched.insert(topic.clone());
                Ok(())
            })
            .collect();
        self.propagate(Some(&touched));
        results
    }

    /// The reassignments in flight (all, or those of `only`), from the controller's image:
    /// (topic, partition, replicas, adding, removing).
    pub fn list_reassignments(&self, only: Option<&BTreeMap<String, BTreeSet<i32>>>) -> Vec<Ongoing> {
        let snapshot = self.cache.snapshot();
        let mut out = Vec::new();
        for (name, t) in &snapshot.topics {
            let wanted = match only {
                Some(o) => match o.get(name) {
                    Some(parts) => Some(parts),
                    None => continue,
                },
                None => None,
            };
            for p in t.partitions.iter().filter(|p| p.is_being_reassigned()) {
                if wanted.is_some_and(|w| !w.contains(&p.index)) {
                    continue;
                }
                out.push((
                    name.clone(),
                    p.index,
                    p.replicas.clone(),
                    p.adding_replicas.clone(),
                    p.removing_replicas.clone(),
                ));
            }
        }
        out
    }

    /// The controller's share of a pass: requests in the legacy znode are started, and the
    /// partitions of this pass whose target replicas are all in the ISR are finished.
    pub fn reassignment_duties(&self, live: &BTreeSet<i32>, scope: Option<&Changes>) -> Result<(), StoreError> {
        if scope.is_none_or(|c| c.admin) {
            self.legacy_reassignments(live)?;
        }
        let snapshot = self.cache.snapshot();
        let names: Vec<&String> = match scope {
            Some(c) if !c.brokers => c.topics.iter().chain(c.partitions.keys()).collect(),
            _ => snapshot.topics.keys().collect(),
        };
        let mut finished = Vec::new();
        for name in names {
            let Some(t) = snapshot.topics.get(name) else { continue };
            for p in t.partitions.iter().filter(|p| p.is_being_reassigned()) {
                let target = p.target_replicas();
                if !target.iter().all(|r| p.isr.contains(r)) {
                    continue;
                }
                let plan = Plan { replicas: target.clone(), moving: Moving::default(), target };
                match self.advance(name, p, plan, live) {
                    Ok(()) => finished.push((name.clone(), p.index)),
                    Err(e) => {
                        tracing::info!(topic = %name, partition = p.index, error = %e.message, "reassignment not finished yet")
                    }
                }
            }
        }
        if !finished.is_empty() {
            self.drop_from_legacy(&finished)?;
            let topics = finished.iter().map(|(t, _)| t.clone()).collect();
            self.propagate(Some(&topics));
        }
        Ok(())
    }

    /// Starts the moves `/admin/reassign_partitions` asks for that are not under way, and
    /// drops from it those that are done or cannot be done (as Kafka does).
    fn legacy_reassignments(&self, live: &BTreeSet<i32>) -> Result<(), StoreError> {
        let Some(data) = self.store.try_get(ADMIN_REASSIGN_PARTITIONS)? else { return Ok(()) };
        let entries = parse_reassignment(&data);
        let mut keep = Vec::new();
        let mut started = BTreeSet::new();
        for (topic, partition, target) in &entries {
            let Some(p) = self.cached_partition(topic, *partition) else {
                tracing::warn!(%topic, partition, "reassignment of a partition that does not exist; dropped");
                continue;
            };
            if p.is_being_reassigned() && p.target_replicas() == *target {
                keep.push((topic.clone(), *partition, target.clone()));
                continue;
            }
            if !p.is_being_reassigned() && p.replicas == *target {
                continue;
            }
            match plan_reassignment(&p, Some(target), live) {
                Ok(plan) => match self.advance(topic, &p, plan, live) {
                    Ok(()) => {
                        started.insert(topic.clone());
                        keep.push((topic.clone(), *partition, target.clone()));
                    }
                    Err(e) => {
                        tracing::info!(%topic, partition, error = %e.message, "reassignment not started yet");
                        keep.push((topic.clone(), *partition, target.clone()));
                    }
                },
                Err(e) => tracing::warn!(%topic, partition, error = %e.message, "reassignment refused; dropped"),
            }
        }
        if keep.len() != entries.len() {
            self.write_legacy(&keep)?;
        }
        if !started.is_empty() {
            self.propagate(Some(&started));
        }
        Ok(())
    }

    fn drop_from_legacy(&self, done: &[(String, i32)]) -> Result<(), StoreError> {
        let Some(data) = self.store.try_get(ADMIN_REASSIGN_PARTITIONS)? else { return Ok(()) };
        let entries = parse_reassignment(&data);
        let keep: Vec<(String, i32, Vec<i32>)> =
            entries.iter().filter(|(t, p, _)| !done.iter().any(|(dt, dp)| dt == t && dp == p)).cloned().collect();
        if keep.len() != entries.len() {
            self.write_legacy(&keep)?;
        }
        Ok(())
    }

    fn write_legacy(&self, keep: &[(String, i32, Vec<i32>)]) -> Result<(), StoreError> {
        if keep.is_empty() {
            tracing::info!("partition reassignments of {ADMIN_REASSIGN_PARTITIONS} complete");
            return self.store.delete_recursive(ADMIN_REASSIGN_PARTITIONS);
        }
        let partitions: Vec<serde_json::Value> =
            keep.iter().map(|(t, p, r)| serde_json::json!({"topic": t, "partition": p, "replicas": r})).collect();
        self.store
            .set(ADMIN_REASSIGN_PARTITIONS, &serde_json::json!({"version": 1, "partitions": partitions}).to_string())
    }

    /// Writes one step of a move: the partition state first (its ISR never names a replica
    /// the new set lacks, whichever write lands), then the topic znode, both compare-and-set;
    /// then the image. The caller tells the brokers.
    fn advance(&self, topic: &str, p: &PartitionInfo, plan: Plan, live: &BTreeSet<i32>) -> Result<(), ApiError> {
        let topic_path = zk_data::topic_path(topic);
        let state_path = zk_data::partition_state_path(topic, p.index);
        let (Some((topic_data, topic_version)), Some((state_data, state_version))) =
            (self.store.get_versioned(&topic_path)?, self.store.get_versioned(&state_path)?)
        else {
            return Err(ApiError::new(ErrorCode::UnknownTopicOrPartition, format!("{topic}-{} is gone", p.index)));
        };
        let unreadable = || ApiError::new(ErrorCode::UnknownServerError, format!("unreadable znodes of {topic}"));
        let (mut assignment, id, mut moving) = zk_data::parse_topic_json_moving(&topic_data).ok_or_else(unreadable)?;
        let current = zk_data::parse_partition_state(&state_data).ok_or_else(unreadable)?;
        let conflict = || {
            ApiError::new(
                ErrorCode::ReassignmentInProgress,
                format!("{topic}-{} changed meanwhile; try again", p.index),
            )
        };
        // The plan was made from the image; the versions below only guard the read-to-write
        // gap. A step planned from an older image (a controller pass finishing a move that an
        // AlterPartitionReassignments has just cancelled) must not be written over the newer one.
        let in_flight = Moving { adding: p.adding_replicas.clone(), removing: p.removing_replicas.clone() };
        if assignment.get(&p.index) != Some(&p.replicas)
            || moving.get(&p.index).cloned().unwrap_or_default() != in_flight
        {
            return Err(conflict());
        }
        let next = state_for(&current, &plan.replicas, &plan.target, live, self.controller_epoch());
        assignment.insert(p.index, plan.replicas.clone());
        if plan.moving == Moving::default() {
            moving.remove(&p.index);
        } else {
            moving.insert(p.index, plan.moving.clone());
        }
        let id = id.unwrap_or_else(zk_data::new_kafka_uuid);
        let writes = vec![
            (state_path.clone(), zk_data::partition_state_json(&next), Some(state_version)),
            (topic_path.clone(), zk_data::topic_json_moving(&assignment, id, &moving), Some(topic_version)),
        ];
        let written = self.store.write_many(&writes)?;
        if written.len() != writes.len() {
            return Err(conflict());
        }
        for result in written {
            match result {
                Ok(()) => {}
                Err(StoreError::BadVersion(_)) => return Err(conflict()),
                Err(e) => return Err(e.into()),
            }
        }
        tracing::info!(topic, partition = p.index, replicas = ?plan.replicas, adding = ?plan.moving.adding, removing = ?plan.moving.removing, leader = next.leader, epoch = next.leader_epoch, "reassignment step written");
        self.cache.update(|c| {
            let Some(t) = c.topics.get(topic) else { return };
            let mut t = (**t).clone();
            if let Some(x) = t.partitions.iter_mut().find(|x| x.index == p.index) {
                x.replicas = plan.replicas.clone();
                x.adding_replicas = plan.moving.adding.clone();
                x.removing_replicas = plan.moving.removing.clone();
                x.leader = next.leader;
                x.leader_epoch = next.leader_epoch;
                x.isr = next.isr.clone();
                x.partition_epoch = state_version + 1;
            }
            c.topics.insert(topic.to_string(), std::sync::Arc::new(t));
        });
        Ok(())
    }

    fn cached_partition(&self, topic: &str, partition: i32) -> Option<PartitionInfo> {
        self.cache.topic(topic)?.partitions.iter().find(|p| p.index == partition).cloned()
    }

    /// Live brokers not in controlled shutdown.
    fn eligible_ids(&self) -> BTreeSet<i32> {
        self.eligible_brokers(&self.cache.snapshot())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn live(ids: &[i32]) -> BTreeSet<i32> {
        ids.iter().copied().collect()
    }

    fn part(replicas: &[i32], adding: &[i32], removing: &[i32]) -> PartitionInfo {
        PartitionInfo {
            index: 0,
            leader: replicas[0],
            leader_epoch: 3,
            replicas: replicas.to_vec(),
            isr: replicas.to_vec(),
            partition_epoch: 1,
            adding_replicas: adding.to_vec(),
            removing_replicas: removing.to_vec(),
            offline_replicas: Vec::new(),
        }
    }

    #[test]
    fn a_move_adds_before_it_removes() {
        let plan = reassign_to(&[1, 2, 3], &[2, 3, 4]);
        assert_eq!(plan.replicas, vec![2, 3, 4, 1]);
        assert_eq!(plan.moving, Moving { adding: vec![4], removing: vec![1] });
        // Nothing moves: no replica joins or leaves.
        assert_eq!(reassign_to(&[1, 2], &[1, 2]).moving, Moving::default());
    }

    #[test]
    fn a_cancellation_returns_to_the_old_replicas_and_needs_one_in_flight() {
        let moving = part(&[2, 3, 4, 1], &[4], &[1]);
        // As Kafka's `originReplicas`: the in-flight list without the joining replicas, in its
        // order (the target came first, so the old order is not restored).
        let plan = plan_reassignment(&moving, None, &live(&[1, 2, 3, 4])).unwrap();
        assert_eq!((plan.replicas, plan.moving), (vec![2, 3, 1], Moving::default()));
        let idle = part(&[1, 2, 3], &[], &[]);
        assert_eq!(
            plan_reassignment(&idle, None, &live(&[1, 2, 3])).unwrap_err().code,
            ErrorCode::NoReassignmentInProgress.code()
        );
        // A new target while one is in flight starts from the old replicas, not the union.
        let plan = plan_reassignment(&moving, Some(&[3, 4, 5]), &live(&[1, 2, 3, 4, 5])).unwrap();
        assert_eq!(plan.replicas, vec![3, 4, 5, 2, 1]);
        assert_eq!(plan.moving, Moving { adding: vec![4, 5], removing: vec![2, 1] });
    }

    #[test]
    fn bad_targets_are_refused_as_kafka_refuses_them() {
        let p = part(&[1, 2], &[], &[]);
        let code = |t: &[i32]| plan_reassignment(&p, Some(t), &live(&[1, 2, 3])).unwrap_err().code;
        let bad = ErrorCode::InvalidReplicaAssignment.code();
        assert_eq!(code(&[]), bad);
        assert_eq!(code(&[1, 1]), bad);
        assert_eq!(code(&[-1, 2]), bad);
        assert_eq!(code(&[1, 9]), bad);
    }

    #[test]
    fn finishing_moves_the_leader_into_the_target_and_shrinks_the_isr() {
        let cur = PartitionState { leader: 1, leader_epoch: 5, isr: vec![1, 2, 3, 4], controller_epoch: 1 };
        let s = state_for(&cur, &[2, 3, 4], &[2, 3, 4], &live(&[1, 2, 3, 4]), 2);
        assert_eq!((s.leader, s.isr, s.leader_epoch, s.controller_epoch), (2, vec![2, 3, 4], 6, 2));
        // Starting keeps leader and ISR, and bumps the epoch.
        let s = state_for(&cur, &[2, 3, 4, 1], &[2, 3, 4], &live(&[1, 2, 3, 4]), 2);
        assert_eq!((s.leader, s.isr, s.leader_epoch), (1, vec![1, 2, 3, 4], 6));
    }
}
