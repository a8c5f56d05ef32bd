//! What the controller answers to brokers: ControlledShutdown (move every leadership away from
//! a departing broker before it stops) and AlterPartition (a leader's ISR change, which only
//! the controller writes to ZooKeeper).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use uuid::Uuid;

use super::Controller;
use crate::metadata::cache::ClusterSnapshot;
use crate::metadata::zk_data::{self, PartitionState};
use crate::metadata::StoreError;
use crate::protocol::inter_broker::{
    AlterPartitionPartitionResult, AlterPartitionRequest, AlterPartitionResponse, AlterPartitionTopicResult,
    ControlledShutdownResponse, RemainingPartition,
};
use crate::protocol::ErrorCode;
use crate::sync::MutexExt;

/// How long a ControlledShutdown waits for the moved leaderships to be read back before it
/// answers with what remains (the broker then asks again). Kafka has no key for it: its
/// controller answers as soon as its own context holds the moves, which ours holds only once
/// the watch events are read back. It stays well under `request.timeout.ms`, which the
/// stopping broker gives the request, and equal to the default of
/// `controlled.shutdown.retry.backoff.ms`, its pause before asking again.
const SHUTDOWN_SETTLE: Duration = Duration::from_secs(5);

/// An accepted ISR change: (its slot in the response, topic, partition, new state, the
/// version it replaces).
type IsrWrite = ((usize, usize), String, i32, PartitionState, i32);

impl Controller {
    /// The brokers that may lead or join an ISR: registered and not shutting down.
    pub fn eligible_brokers(&self, snapshot: &ClusterSnapshot) -> BTreeSet<i32> {
        let leaving = self.leaving_brokers(snapshot);
        snapshot.brokers.iter().map(|b| b.id).filter(|b| !leaving.contains(b)).collect()
    }

    /// Checks a request's broker epoch against the image; answers the epoch the broker is
    /// registered with.
    fn check_broker_epoch(&self, snapshot: &ClusterSnapshot, broker: i32, epoch: i64) -> Result<i64, ErrorCode> {
        if !self.is_controller() {
            return Err(ErrorCode::NotController);
        }
        match snapshot.brokers.iter().find(|b| b.id == broker) {
            None => Err(ErrorCode::BrokerNotAvailable),
            Some(b) if epoch != -1 && epoch != b.epoch => {
                if epoch > b.epoch {
                    // The broker registered again (a new session) and this controller has not
                    // read it yet: a lost or late watch event would otherwise leave the broker
                    // refused until something else changes under /brokers/ids. It retries;
                    // by then the pass has read its registration.
                    tracing::info!(broker, epoch, known = b.epoch, "newer broker epoch in a request; re-reading it");
                    self.store.mark_dirty(&crate::metadata::zk_data::broker_path(broker));
                }
                Err(ErrorCode::StaleBrokerEpoch)
            }
            Some(b) => Ok(b.epoch),
        }
    }

    /// Marks `broker` as shutting down, moves leadership of its partitions to other ISR
    /// members and takes it out of every ISR, and answers with the partitions it still leads
    /// (those with no other replica to take over).
    pub fn handle_controlled_shutdown(self: &Arc<Self>, broker: i32, epoch: i64) -> ControlledShutdownResponse {
        let refuse =
            |code: ErrorCode| ControlledShutdownResponse { error_code: code.code(), remaining_partitions: vec![] };
        let snapshot = self.cache.snapshot();
        let registered = match self.check_broker_epoch(&snapshot, broker, epoch) {
            Ok(registered) => registered,
            Err(code) => return refuse(code),
        };
        tracing::info!(broker, "controlled shutdown requested");
        self.shutting_down_brokers.lock_unpoisoned().insert(broker, registered);
        let eligible = self.eligible_brokers(&snapshot);
        if let Err(e) = self.controller_duties(&eligible, None) {
            tracing::warn!(broker, error = %e, "controlled shutdown: cannot move leadership");
            return refuse(ErrorCode::UnknownServerError);
        }
        let remaining = |s: &ClusterSnapshot| -> Vec<RemainingPartition> {
            s.topics
                .values()
                .flat_map(|t| {
                    t.partitions
                        .iter()
                        .filter(|p| p.leader == broker && p.isr.iter().any(|r| *r != broker && eligible.contains(r)))
                        .map(|p| RemainingPartition { topic_name: t.name.clone(), partition_index: p.index })
                })
                .collect()
        };
        // The moves are written; they are in the image once their watch events are read.
        let deadline = Instant::now() + SHUTDOWN_SETTLE;
        let mut left = remaining(&self.cache.snapshot());
        while !left.is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
            left = remaining(&self.cache.snapshot());
        }
        ControlledShutdownResponse { error_code: 0, remaining_partitions: left }
    }

    /// A leader's proposed ISRs: each checked against the image (leader, leader epoch,
    /// partition epoch, eligible new members) and written with a compare-and-set on the
    /// state znode's version, then told to every broker.
    pub fn handle_alter_partition(&self, req: &AlterPartitionRequest) -> AlterPartitionResponse {
        let snapshot = self.cache.snapshot();
        if let Err(code) = self.check_broker_epoch(&snapshot, req.broker_id, req.broker_epoch) {
            return AlterPartitionResponse { error_code: code.code(), ..Default::default() };
        }
        let eligible = self.eligible_brokers(&snapshot);
        let epoch = self.controller_epoch();
        let mut results: Vec<AlterPartitionTopicResult> = Vec::new();
        let mut writes: Vec<IsrWrite> = Vec::new();
        for t in &req.topics {
            let topic = if t.topic_id != Uuid::nil() {
                snapshot.topic_by_id(t.topic_id)
            } else {
                snapshot.topics.get(&t.topic_name)
            };
            let mut out = AlterPartitionTopicResult {
                topic_name: t.topic_name.clone(),
                topic_id: t.topic_id,
                partitions: Vec::new(),
            };
            for p in &t.partitions {
                let mut r = AlterPartitionPartitionResult { partition_index: p.partition_index, ..Default::default() };
                let unknown = if t.topic_id != Uuid::nil() {
                    ErrorCode::UnknownTopicId
                } else {
                    ErrorCode::UnknownTopicOrPartition
                };
                let Some(cur) = topic.and_then(|t| t.partitions.iter().find(|x| x.index == p.partition_index)) else {
                    r.error_code = unknown.code();
                    out.partitions.push(r);
                    continue;
                };
                let new_isr: Vec<i32> = p.new_isr_with_epochs.iter().map(|b| b.broker_id).collect();
                let code = if cur.leader != req.broker_id {
                    ErrorCode::NotLeaderOrFollower
                } else if p.leader_epoch != cur.leader_epoch {
                    ErrorCode::FencedLeaderEpoch
                } else if p.partition_epoch != cur.partition_epoch {
                    // Either side may be behind: the image is re-read from the znode, and the
                    // leader adopts the state this answer carries.
                    if let Some(topic) = topic {
                        self.store.mark_dirty(&zk_data::partition_state_path(&topic.name, p.partition_index));
                    }
                    ErrorCode::InvalidUpdateVersion
                } else if new_isr.iter().any(|b| !cur.isr.contains(b) && !eligible.contains(b))
                    || !new_isr.contains(&cur.leader)
                {
                    // A broker shutting down or gone may not join (KIP-841); the leader stays.
                    ErrorCode::IneligibleReplica
                } else {
                    ErrorCode::None
                };
                r.error_code = code.code();
                r.leader_id = cur.leader;
                r.leader_epoch = cur.leader_epoch;
                r.isr = cur.isr.clone();
                r.partition_epoch = cur.partition_epoch;
                if code == ErrorCode::None && new_isr != cur.isr {
                    let state = PartitionState {
                        leader: cur.leader,
                        leader_epoch: cur.leader_epoch,
                        isr: new_isr,
                        controller_epoch: epoch,
                    };
                    if let Some(topic) = topic {
                        writes.push((
                            (results.len(), out.partitions.len()),
                            topic.name.clone(),
                            p.partition_index,
                            state,
                            cur.partition_epoch,
                        ));
                    }
                }
                out.partitions.push(r);
            }
            results.push(out);
        }
        if !writes.is_empty() {
            let ops: Vec<(String, String, Option<i32>)> = writes
                .iter()
                .map(|(_, t, p, s, v)| {
                    (zk_data::partition_state_path(t, *p), zk_data::partition_state_json(s), Some(*v))
                })
                .collect();
            let written = match self.store.write_many(&ops) {
                Ok(w) => w,
                Err(e) => {
                    tracing::warn!(error = %e, "AlterPartition: cannot write ISR changes");
                    return AlterPartitionResponse {
                        error_code: ErrorCode::UnknownServerError.code(),
                        ..Default::default()
                    };
                }
            };
            let mut applied: BTreeMap<String, Vec<(i32, Vec<i32>, i32)>> = BTreeMap::new();
            for (((slot, topic, partition, state, version), _), result) in writes.into_iter().zip(ops).zip(written) {
                let r = &mut results[slot.0].partitions[slot.1];
                match result {
                    Ok(()) => {
                        tracing::info!(%topic, partition, from = ?r.isr, to = ?state.isr, "ISR change");
                        r.isr = state.isr.clone();
                        r.partition_epoch = version + 1;
                        applied.entry(topic).or_default().push((partition, state.isr, version + 1));
                    }
                    Err(StoreError::BadVersion(_)) => {
                        // The image is behind the znode (a write whose watch event has not been
                        // handled yet): until the next pass re-reads it, every proposal would
                        // be refused, and an ISR that cannot shrink holds acks=all produce.
                        self.store.mark_dirty(&zk_data::partition_state_path(&topic, partition));
                        r.error_code = ErrorCode::InvalidUpdateVersion.code()
                    }
                    Err(e) => {
                        tracing::warn!(%topic, partition, error = %e, "AlterPartition: write failed");
                        r.error_code = ErrorCode::UnknownServerError.code()
                    }
                }
            }
            // Into the image at once, so the next proposal is checked against it, and out to
            // the brokers; the watch events of these writes then find nothing new.
            self.cache.update(|c| {
                for (name, changes) in &applied {
                    let Some(t) = c.topics.get(name) else { continue };
                    let mut next = (**t).clone();
                    for (partition, isr, version) in changes {
                        if let Some(p) = next.partitions.iter_mut().find(|p| p.index == *partition) {
                            p.isr = isr.clone();
                            p.partition_epoch = *version;
                        }
                    }
                    c.topics.insert(name.clone(), Arc::new(next));
                }
            });
            self.propagate(Some(&applied.keys().cloned().collect()));
        }
        AlterPartitionResponse { throttle_time_ms: 0, error_code: 0, topics: results }
    }
}
