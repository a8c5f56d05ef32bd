//! The controller's duties in ZooKeeper mode (Kafka's `KafkaController` event handlers, run
//! for the znodes each batch of watch events names): give new partitions their first leader,
//! move leadership off brokers that left, drop dead replicas from the ISR, and carry out topic
//! deletions requested under `/admin/delete_topics`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use super::Controller;
use crate::metadata::store::StoreError;
use crate::metadata::zk_data::{self, PartitionState};
use crate::metadata::zk_sync::Changes;
use crate::metadata::{PartitionInfo, TopicInfo};
use crate::protocol::{ApiError, ErrorCode};
use crate::sync::MutexExt;

pub const ADMIN_DELETE_TOPICS: &str = "/admin/delete_topics";
pub const ADMIN_REASSIGN_PARTITIONS: &str = "/admin/reassign_partitions";

/// Parses Kafka's `/admin/reassign_partitions` JSON: (topic, partition, replicas).
pub fn parse_reassignment(data: &str) -> Vec<(String, i32, Vec<i32>)> {
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

/// How the controller decides one partition's next state from its current one.
#[derive(Clone, Copy)]
enum Decision {
    /// Leader and ISR for the brokers now alive (`next_state`).
    Membership { unclean: bool },
    /// Leadership back to the preferred replica.
    Preferred,
}

/// A partition the controller's image says must change, to be decided again from ZooKeeper.
struct Candidate<'a> {
    topic: &'a str,
    partition: i32,
    replicas: &'a [i32],
    decision: Decision,
    /// Its leader is gone: it is unavailable until this change is written.
    leaderless: bool,
    /// The brokers that may lead it or stay in its ISR, when some of its replicas are in
    /// offline log dirs (None: every live broker).
    live: Option<BTreeSet<i32>>,
}

/// Partition-state changes in flight at once. ZooKeeper commits a pipeline of writes in a few
/// fsyncs, where one write after another costs an fsync each (10,000 of them after a broker
/// of a large cluster dies).
const STATE_CHANGE_BATCH: usize = 1000;

impl Controller {
    /// The controller's share of a pass, decided from its image of the cluster (the metadata
    /// cache, just brought up to date): topic deletions and reassignments, first leaders for
    /// new partitions, and, when brokers came or went, new leaders and ISRs for the
    /// partitions that named them. Only partitions whose state must change are read again
    /// from ZooKeeper and written (compare-and-set on the znode version), so a pass costs the
    /// partitions it changes plus an in-memory scan.
    pub fn controller_duties(&self, live: &BTreeSet<i32>, scope: Option<&Changes>) -> Result<(), StoreError> {
        if scope.is_none_or(|c| c.admin) {
            for topic in self.store.try_children(ADMIN_DELETE_TOPICS)? {
                if self.config.delete_topic_enable {
                    self.store.delete_recursive(&zk_data::topic_path(&topic))?;
                    self.store.delete_recursive(&zk_data::topic_config_path(&topic))?;
                    tracing::info!(%topic, "deleted topic");
                }
                self.store.delete_recursive(&format!("{ADMIN_DELETE_TOPICS}/{topic}"))?;
            }
        }
        // A reassignment advances when its new replicas join the ISR: the ISR change names the
        // partition, so only the partitions in this pass are looked at.
        self.reassignment_duties(live, scope)?;
        let snapshot = self.cache.snapshot();
        let unclean_default =
            self.effective_config().values.get("unclean.leader.election.enable").is_some_and(|v| v == "true");
        let everything = scope.is_none_or(|c| c.brokers);
        let topics: Vec<&Arc<TopicInfo>> = match scope {
            Some(c) if !everything => {
                c.topics.iter().chain(c.partitions.keys()).filter_map(|t| snapshot.topics.get(t)).collect()
            }
            _ => snapshot.topics.values().collect(),
        };
        let epoch = self.controller_epoch();
        // A replica in an offline log dir counts as a dead broker for its partition only.
        let offline = self.offline_replicas_by_partition();
        let creating = self.creating.lock_unpoisoned().clone();
        let mut candidates = Vec::new();
        for topic in topics.into_iter().filter(|t| !creating.contains(&t.name)) {
            let unclean =
                topic.configs.get("unclean.leader.election.enable").map(|v| v == "true").unwrap_or(unclean_default);
            for p in &topic.partitions {
                let here: Option<BTreeSet<i32>> = match offline.is_empty() {
                    true => None,
                    false => offline
                        .get(&(topic.name.clone(), p.index))
                        .map(|gone| live.iter().copied().filter(|b| !gone.contains(b)).collect()),
                };
                let live_here = here.as_ref().unwrap_or(live);
                let current = cached_state(p);
                if next_state(&p.replicas, current.as_ref(), live_here, unclean, epoch).is_some() {
                    candidates.push(Candidate {
                        topic: &topic.name,
                        partition: p.index,
                        replicas: &p.replicas,
                        decision: Decision::Membership { unclean },
                        leaderless: !live_here.contains(&p.leader),
                        live: here,
                    });
                }
            }
        }
        self.change_partition_states(candidates, live)
    }

    /// Preferred leader election over every partition (auto.leader.rebalance.enable's timer).
    pub fn preferred_elections(&self) -> Result<(), StoreError> {
        let snapshot = self.cache.snapshot();
        let live: BTreeSet<i32> = snapshot.brokers.iter().map(|b| b.id).collect();
        let epoch = self.controller_epoch();
        let mut candidates = Vec::new();
        for topic in snapshot.topics.values() {
            for p in &topic.partitions {
                let Some(current) = cached_state(p) else { continue };
                if preferred_leader_state(&p.replicas, &current, &live, epoch).is_some() {
                    candidates.push(Candidate {
                        topic: &topic.name,
                        partition: p.index,
                        replicas: &p.replicas,
                        decision: Decision::Preferred,
                        leaderless: false,
                        live: None,
                    });
                }
            }
        }
        self.change_partition_states(candidates, &live)
    }

    /// Reads the candidates' states with their versions, decides again from what ZooKeeper
    /// holds (the image may be a moment behind), and writes each result if its znode did not
    /// change meanwhile; leaderless partitions first. A write that lost a race is decided
    /// again when its watch event arrives. Stops early if a newer controller has written:
    /// this one is stale and must not act. What was written goes into the image and out to
    /// the brokers in the same pass (one LeaderAndIsr and one UpdateMetadata per broker), as
    /// Kafka's controller updates its context: waiting for the watch events of thousands of
    /// writes to come back would add a second pass to every failover.
    fn change_partition_states(
        &self,
        mut candidates: Vec<Candidate<'_>>,
        live: &BTreeSet<i32>,
    ) -> Result<(), StoreError> {
        if candidates.is_empty() {
            return Ok(());
        }
        let started = std::time::Instant::now();
        let considered = candidates.len();
        candidates.sort_by_key(|c| !c.leaderless);
        let epoch = self.controller_epoch();
        let mut applied: Applied = BTreeMap::new();
        let mut stale = false;
        for chunk in candidates.chunks(STATE_CHANGE_BATCH) {
            let paths: Vec<String> =
                chunk.iter().map(|c| zk_data::partition_state_path(c.topic, c.partition)).collect();
            let current = self.store.get_many_versioned(&paths)?;
            let mut writes = Vec::new();
            let mut decided = Vec::new();
            for ((cand, path), cur) in chunk.iter().zip(paths).zip(current) {
                let parsed = cur.as_ref().and_then(|(d, v)| zk_data::parse_partition_state(d).map(|s| (s, *v)));
                if cur.is_some() && parsed.is_none() {
                    tracing::warn!(%path, "partition state gregor does not understand; skipped");
                    continue;
                }
                if parsed.as_ref().is_some_and(|(s, _)| s.controller_epoch > epoch) {
                    tracing::warn!(
                        topic = cand.topic,
                        partition = cand.partition,
                        "partition state from a newer controller epoch; stepping back"
                    );
                    stale = true;
                    break;
                }
                let state = parsed.as_ref().map(|(s, _)| s);
                let live = cand.live.as_ref().unwrap_or(live);
                let next = match cand.decision {
                    Decision::Membership { unclean } => next_state(cand.replicas, state, live, unclean, epoch),
                    Decision::Preferred => state.and_then(|s| preferred_leader_state(cand.replicas, s, live, epoch)),
                };
                let Some(next) = next else { continue };
                tracing::debug!(topic = cand.topic, partition = cand.partition, leader = next.leader, isr = ?next.isr, epoch = next.leader_epoch, "partition state change");
                let version = parsed.map(|(_, v)| v);
                writes.push((path, zk_data::partition_state_json(&next), version));
                decided.push((cand.topic, cand.partition, next, version.map_or(0, |v| v + 1)));
            }
            if stale {
                return Ok(());
            }
            let written = match self.store.write_many_guarded(&writes, self.epoch_guard()) {
                Ok(w) => w,
                Err(StoreError::Fenced(_)) => {
                    tracing::warn!("a newer controller was elected; this one's partition state writes were refused");
                    return Ok(());
                }
                Err(e) => return Err(e),
            };
            for ((result, (path, _, _)), (topic, partition, state, version)) in
                written.into_iter().zip(&writes).zip(decided)
            {
                match result {
                    Ok(()) => applied.entry(topic.to_string()).or_default().push((partition, state, version)),
                    Err(StoreError::BadVersion(_)) | Err(StoreError::NodeExists(_)) => {
                        tracing::info!(%path, "partition state changed meanwhile; deciding again at the next event")
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        let written: usize = applied.values().map(Vec::len).sum();
        let wrote = started.elapsed();
        let topics = self.apply_written_states(&applied);
        self.propagate(Some(&topics));
        tracing::info!(
            considered,
            written,
            topics = topics.len(),
            write_ms = wrote.as_millis() as u64,
            total_ms = started.elapsed().as_millis() as u64,
            "partition state changes written and sent"
        );
        Ok(())
    }

    /// Puts states this controller wrote into the image, unless the image already holds a
    /// later one (an AlterPartition that won the race after this pass read the znodes).
    fn apply_written_states(&self, applied: &Applied) -> BTreeSet<String> {
        let mut topics = BTreeSet::new();
        self.cache.update(|c| {
            for (name, changes) in applied {
                let Some(t) = c.topics.get(name) else { continue };
                let mut next = (**t).clone();
                for (partition, state, version) in changes {
                    let Some(p) = next.partitions.iter_mut().find(|p| p.index == *partition) else { continue };
                    if (p.leader_epoch, p.partition_epoch) > (state.leader_epoch, *version) {
                        continue;
                    }
                    p.leader = state.leader;
                    p.leader_epoch = state.leader_epoch;
                    p.isr = state.isr.clone();
                    p.partition_epoch = *version;
                }
                c.topics.insert(name.clone(), Arc::new(next));
                topics.insert(name.clone());
            }
        });
        topics
    }
}

/// States written by one pass, by topic: (partition, state, its znode version now).
type Applied = BTreeMap<String, Vec<(i32, PartitionState, i32)>>;

/// An ElectLeaders request's kind (Kafka's `ElectionType`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum ElectionType {
    Preferred,
    Unclean,
}

/// What an admin-requested election decides for one partition from its state: the state to
/// write, or the error Kafka answers (ELECTION_NOT_NEEDED when the preferred replica already
/// leads, or, unclean, when the leader is alive).
pub fn admin_election(
    kind: ElectionType,
    replicas: &[i32],
    state: &PartitionState,
    live: &BTreeSet<i32>,
    controller_epoch: i32,
) -> Result<PartitionState, ErrorCode> {
    match kind {
        ElectionType::Preferred => {
            if replicas.first() == Some(&state.leader) {
                return Err(ErrorCode::ElectionNotNeeded);
            }
            preferred_leader_state(replicas, state, live, controller_epoch)
                .ok_or(ErrorCode::PreferredLeaderNotAvailable)
        }
        ElectionType::Unclean => {
            if state.leader >= 0 && live.contains(&state.leader) {
                return Err(ErrorCode::ElectionNotNeeded);
            }
            next_state(replicas, Some(state), live, true, controller_epoch)
                .filter(|s| s.leader >= 0)
                .ok_or(ErrorCode::EligibleLeadersNotAvailable)
        }
    }
}

/// Writes to a partition's state before an admin election gives up on compare-and-set races
/// with the controller's own passes.
const ADMIN_ELECTION_ATTEMPTS: usize = 3;

impl Controller {
    /// ElectLeaders on the controller: decides each partition from its state in ZooKeeper and
    /// writes the new state (compare-and-set); the controller's next pass, woken by the watch on
    /// that znode, tells the brokers. Returns the new (leader, leader epoch) per partition.
    pub fn elect_leaders(&self, kind: ElectionType, partitions: &[(String, i32)]) -> Vec<Result<(i32, i32), ApiError>> {
        let snapshot = self.cache.snapshot();
        let live = self.eligible_brokers(&snapshot);
        let epoch = self.controller_epoch();
        partitions
            .iter()
            .map(|(topic, partition)| {
                let Some(p) = snapshot.topics.get(topic).and_then(|t| t.partitions.iter().find(|p| p.index == *partition))
                else {
                    return Err(ApiError::new(
                        ErrorCode::UnknownTopicOrPartition,
                        format!("The partition {topic}-{partition} does not exist."),
                    ));
                };
                let fail = |code: ErrorCode| {
                    let why = match code {
                        ErrorCode::ElectionNotNeeded => "Leader election not needed for topic partition.".to_string(),
                        _ => format!("Failed to elect leader for partition {topic}-{partition} under strategy {kind:?}"),
                    };
                    ApiError::new(code, why)
                };
                if !self.store.is_zookeeper() {
                    // Standalone, the one broker leads every partition it has.
                    let state = cached_state(p).ok_or_else(|| fail(ErrorCode::EligibleLeadersNotAvailable))?;
                    return admin_election(kind, &p.replicas, &state, &live, epoch)
                        .map(|s| (s.leader, s.leader_epoch))
                        .map_err(fail);
                }
                let path = zk_data::partition_state_path(topic, *partition);
                for _ in 0..ADMIN_ELECTION_ATTEMPTS {
                    let Some((data, version)) = self.store.get_versioned(&path)? else {
                        return Err(fail(ErrorCode::EligibleLeadersNotAvailable));
                    };
                    let state = zk_data::parse_partition_state(&data)
                        .ok_or_else(|| ApiError::new(ErrorCode::UnknownServerError, format!("unreadable {path}")))?;
                    let next = admin_election(kind, &p.replicas, &state, &live, epoch).map_err(fail)?;
                    match self.store.set_if_version(&path, &zk_data::partition_state_json(&next), version) {
                        Ok(()) => {
                            tracing::info!(%topic, partition, leader = next.leader, epoch = next.leader_epoch, ?kind, "leader elected by request");
                            return Ok((next.leader, next.leader_epoch));
                        }
                        Err(StoreError::BadVersion(_)) => continue,
                        Err(e) => return Err(e.into()),
                    }
                }
                Err(ApiError::new(ErrorCode::UnknownServerError, format!("{path} kept changing; try again")))
            })
            .collect()
    }
}

/// The partition state a cached partition was read from; None if it had none.
fn cached_state(p: &PartitionInfo) -> Option<PartitionState> {
    (p.leader_epoch >= 0).then(|| PartitionState {
        leader: p.leader,
        leader_epoch: p.leader_epoch,
        isr: p.isr.clone(),
        controller_epoch: -1,
    })
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

    #[test]
    fn admin_elections_follow_kafkas_rules() {
        let st =
            |leader, isr: &[i32]| PartitionState { leader, leader_epoch: 4, isr: isr.to_vec(), controller_epoch: 1 };
        let all = live(&[1, 2, 3]);
        // preferred: already leading, back to the preferred one, preferred out of the ISR
        assert_eq!(
            admin_election(ElectionType::Preferred, &[1, 2], &st(1, &[1, 2]), &all, 2),
            Err(ErrorCode::ElectionNotNeeded)
        );
        let s = admin_election(ElectionType::Preferred, &[1, 2], &st(2, &[2, 1]), &all, 2).unwrap();
        assert_eq!((s.leader, s.leader_epoch, s.controller_epoch), (1, 5, 2));
        assert_eq!(
            admin_election(ElectionType::Preferred, &[1, 2], &st(2, &[2]), &all, 2),
            Err(ErrorCode::PreferredLeaderNotAvailable)
        );
        // unclean: a live leader needs none; a dead one is replaced by any live replica
        assert_eq!(
            admin_election(ElectionType::Unclean, &[1, 2], &st(1, &[1]), &all, 2),
            Err(ErrorCode::ElectionNotNeeded)
        );
        let s = admin_election(ElectionType::Unclean, &[1, 2], &st(-1, &[1]), &live(&[2, 3]), 2).unwrap();
        assert_eq!((s.leader, s.isr.clone(), s.leader_epoch), (2, vec![2], 5));
        assert_eq!(
            admin_election(ElectionType::Unclean, &[1, 2], &st(-1, &[1]), &live(&[3]), 2),
            Err(ErrorCode::EligibleLeadersNotAvailable)
        );
    }
}
