//! What a broker does with the controller's requests (Kafka's `ReplicaManager`
//! `becomeLeaderOrFollower` and `stopReplicas`). The fencing of stale controllers and broker epochs happens before these are called; here each
//! partition is checked against its own leader epoch.

use std::collections::HashSet;
use std::sync::Arc;

use uuid::Uuid;

use super::ReplicaManager;
use crate::api::error::ErrorCode;
use crate::controller::messages::{
    LeaderAndIsrPartitionError, LeaderAndIsrRequest, LeaderAndIsrResponse, StopReplicaPartitionError,
    StopReplicaRequest, StopReplicaResponse,
};
use crate::metadata::zk_data;

/// The leader of a partition whose topic is being deleted, in UpdateMetadata (Kafka's
/// `LeaderAndIsr.LeaderDuringDelete`).
pub const LEADER_DURING_DELETE: i32 = -2;
/// LeaderAndIsr `type` (Kafka's `AbstractControlRequest.Type`): an increment, or every
/// partition the broker replicates.
pub const INCREMENTAL_STATE: i8 = 1;
pub const FULL_STATE: i8 = 2;

impl ReplicaManager {
    /// Makes this broker leader or follower of each partition in the request, points the
    /// follower fetchers at the leaders, and, for a full-state request, deletes hosted
    /// replicas the controller no longer assigns here.
    pub fn become_leader_or_follower(self: &Arc<Self>, req: &LeaderAndIsrRequest) -> LeaderAndIsrResponse {
        // One controller request at a time (Kafka's replica state change lock): two at once
        // would open or delete the same partition's files together. Client requests never
        // take this lock.
        let _serial = self.state_lock.lock().unwrap_or_else(|p| p.into_inner());
        let me = self.broker_id;
        let snapshot = self.handles.cache.snapshot();
        let mut errors = Vec::new();
        let mut listed: HashSet<(&str, i32)> = HashSet::new();
        for topic in &req.topics {
            let configs = match snapshot.topics.get(&topic.topic_name) {
                Some(t) => t.configs.clone(),
                None => self.read_topic_config(&topic.topic_name),
            };
            let effective = self.handles.dynamic.effective();
            let log_config = match effective.log_config_for(&configs) {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(topic = %topic.topic_name, error = %e, "invalid topic config; using broker defaults");
                    effective.log.clone()
                }
            };
            let id = zk_data::uuid_to_kafka(topic.topic_id);
            for p in &topic.partitions {
                listed.insert((topic.topic_name.as_str(), p.partition_index));
                let tp = (topic.topic_name.clone(), p.partition_index);
                if let Some(local) = self.hosted(&topic.topic_name, p.partition_index) {
                    let epoch = local.role().1;
                    if epoch > p.leader_epoch {
                        // Kafka answers an older leader epoch as a stale controller.
                        errors.push(partition_error(
                            &topic.topic_name,
                            topic.topic_id,
                            p.partition_index,
                            ErrorCode::StaleControllerEpoch.code(),
                        ));
                        continue;
                    }
                    if epoch == p.leader_epoch && local.partition_epoch() > p.partition_epoch {
                        // An ISR this broker already replaced: nothing to do.
                        errors.push(partition_error(&topic.topic_name, topic.topic_id, p.partition_index, 0));
                        continue;
                    }
                }
                if !p.replicas.contains(&me) {
                    errors.push(partition_error(&topic.topic_name, topic.topic_id, p.partition_index, 0));
                    continue;
                }
                let part = match self.open_replica(&topic.topic_name, p.partition_index, &id, log_config.clone()) {
                    Ok(part) => part,
                    Err(e) => {
                        tracing::error!(topic = %topic.topic_name, partition = p.partition_index, error = %e, "cannot open partition");
                        errors.push(partition_error(
                            &topic.topic_name,
                            topic.topic_id,
                            p.partition_index,
                            ErrorCode::KafkaStorageError.code(),
                        ));
                        continue;
                    }
                };
                part.set_partition_epoch(p.partition_epoch);
                if p.leader == me {
                    self.fetchers.unfollow(&tp);
                    // Until its state is loaded, a new coordinator answers
                    // COORDINATOR_LOAD_IN_PROGRESS rather than "no offsets".
                    if let Some(l) = self.listener() {
                        l.before_become_leader(&tp);
                    }
                    let new_term = part.become_leader(p.leader_epoch, &p.replicas, &p.isr);
                    if new_term {
                        tracing::info!(topic = %topic.topic_name, partition = p.partition_index, epoch = p.leader_epoch, "became leader");
                    }
                    if let Some(l) = self.listener() {
                        if new_term {
                            l.forget_partition(&tp);
                        }
                        l.on_become_leader(&tp, new_term);
                    }
                } else {
                    let was_leader = part.is_leader();
                    // Verified transactional writes matter only to a leader; a later term
                    // here verifies again.
                    if let Some(l) = self.listener() {
                        l.forget_partition(&tp);
                    }
                    if part.become_follower(p.leader, p.leader_epoch, &p.replicas, &p.isr) {
                        tracing::info!(topic = %topic.topic_name, partition = p.partition_index, leader = p.leader, epoch = p.leader_epoch, "following");
                    }
                    if was_leader {
                        if let Some(l) = self.listener() {
                            l.on_resign(&tp);
                        }
                    }
                    if p.leader >= 0 && !self.is_shutting_down() {
                        self.fetchers.follow(self, p.leader, tp);
                    } else {
                        self.fetchers.unfollow(&tp);
                    }
                }
                errors.push(partition_error(&topic.topic_name, topic.topic_id, p.partition_index, 0));
            }
        }
        if req.request_type == FULL_STATE {
            for part in self.all_partitions() {
                if listed.contains(&(part.topic.as_str(), part.index)) {
                    continue;
                }
                tracing::info!(topic = %part.topic, partition = part.index, "not assigned here by the controller; deleting local log");
                self.fetchers.unfollow(&(part.topic.clone(), part.index));
                if let Err(e) = self.remove_partition(&part.topic, part.index) {
                    tracing::warn!(topic = %part.topic, partition = part.index, error = %e, "cannot delete partition log");
                }
            }
        }
        self.fetchers.start_added();
        self.notify_changed();
        LeaderAndIsrResponse { error_code: 0, partition_errors: errors }
    }

    /// Stops following the listed partitions, deleting their logs where asked.
    pub fn stop_replicas(&self, req: &StopReplicaRequest) -> StopReplicaResponse {
        let _serial = self.state_lock.lock().unwrap_or_else(|p| p.into_inner());
        let mut errors = Vec::new();
        for topic in &req.topics {
            for p in &topic.partitions {
                let tp = (topic.topic_name.clone(), p.partition_index);
                let local = self.hosted(&topic.topic_name, p.partition_index);
                // -2 marks a deletion, -1 a request without an epoch: both apply.
                if p.leader_epoch >= 0 && local.as_ref().is_some_and(|l| l.role().1 > p.leader_epoch) {
                    errors.push(StopReplicaPartitionError {
                        topic_name: topic.topic_name.clone(),
                        partition_index: p.partition_index,
                        error_code: ErrorCode::FencedLeaderEpoch.code(),
                    });
                    continue;
                }
                self.fetchers.unfollow(&tp);
                if let Some(l) = self.listener() {
                    l.forget_partition(&tp);
                }
                let mut error_code = 0;
                if p.delete_partition {
                    tracing::info!(topic = %topic.topic_name, partition = p.partition_index, "StopReplica: deleting local log");
                    if let Err(e) = self.remove_partition(&topic.topic_name, p.partition_index) {
                        tracing::warn!(topic = %topic.topic_name, partition = p.partition_index, error = %e, "cannot delete partition log");
                        error_code = ErrorCode::KafkaStorageError.code();
                    }
                }
                errors.push(StopReplicaPartitionError {
                    topic_name: topic.topic_name.clone(),
                    partition_index: p.partition_index,
                    error_code,
                });
            }
        }
        self.notify_changed();
        StopReplicaResponse { error_code: 0, partition_errors: errors }
    }
}

impl ReplicaManager {
    fn read_topic_config(&self, name: &str) -> std::collections::BTreeMap<String, String> {
        let names = [name.to_string()];
        crate::metadata::update_metadata::read_topic_configs(&self.handles.store, &names)
            .remove(name)
            .unwrap_or_default()
    }
}

fn partition_error(topic: &str, id: Uuid, partition: i32, error_code: i16) -> LeaderAndIsrPartitionError {
    LeaderAndIsrPartitionError { topic_name: topic.to_string(), topic_id: id, partition_index: partition, error_code }
}
