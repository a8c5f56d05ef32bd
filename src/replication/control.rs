//! What a broker does with the controller's requests (Kafka's `ReplicaManager`
//! `becomeLeaderOrFollower` and `stopReplicas`, and `MetadataCache.updateMetadata`). The
//! fencing of stale controllers and broker epochs happens before these are called; here each
//! partition is checked against its own leader epoch.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use uuid::Uuid;

use crate::broker::Broker;
use crate::controller::messages::{
    LeaderAndIsrPartitionError, LeaderAndIsrRequest, LeaderAndIsrResponse, StopReplicaPartitionError,
    StopReplicaRequest, StopReplicaResponse, UpdateMetadataRequest, UpdateMetadataResponse,
};
use crate::metadata::{zk_data, BrokerInfo, PartitionInfo, TopicInfo};
use crate::protocol::ErrorCode;
use crate::sync::MutexExt;

/// The leader of a partition whose topic is being deleted, in UpdateMetadata (Kafka's
/// `LeaderAndIsr.LeaderDuringDelete`).
pub const LEADER_DURING_DELETE: i32 = -2;
/// LeaderAndIsr `type` (Kafka's `AbstractControlRequest.Type`): an increment, or every
/// partition the broker replicates.
pub const INCREMENTAL_STATE: i8 = 1;
pub const FULL_STATE: i8 = 2;

impl Broker {
    /// Makes this broker leader or follower of each partition in the request, points the
    /// follower fetchers at the leaders, and, for a full-state request, deletes hosted
    /// replicas the controller no longer assigns here.
    pub fn become_leader_or_follower(self: &Arc<Self>, req: &LeaderAndIsrRequest) -> LeaderAndIsrResponse {
        // One controller request at a time (Kafka's replica state change lock): two at once
        // would open or delete the same partition's files together. Client requests never
        // take this lock.
        let _serial = self.replica_state_lock.lock_unpoisoned();
        let me = self.config.broker_id;
        let snapshot = self.cache.snapshot();
        let mut errors = Vec::new();
        let mut listed: HashSet<(&str, i32)> = HashSet::new();
        for topic in &req.topics {
            let configs = match snapshot.topics.get(&topic.topic_name) {
                Some(t) => t.configs.clone(),
                None => self.read_topic_config(&topic.topic_name),
            };
            let effective = self.effective_config();
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
                if let Some(local) = self.replicas.hosted(&topic.topic_name, p.partition_index) {
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
                let part = match self.replicas.open_replica(
                    &topic.topic_name,
                    p.partition_index,
                    &id,
                    log_config.clone(),
                ) {
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
                    let offsets = topic.topic_name == crate::group::OFFSETS_TOPIC;
                    // Until its groups are loaded, a new coordinator answers
                    // COORDINATOR_LOAD_IN_PROGRESS rather than "no offsets".
                    let txn_state = topic.topic_name == crate::controller::auto_create::TRANSACTION_STATE_TOPIC;
                    if offsets {
                        self.set_loading_offsets(p.partition_index, true);
                    }
                    if txn_state {
                        self.txns.set_loading(p.partition_index, true);
                    }
                    if part.become_leader(p.leader_epoch, &p.replicas, &p.isr) {
                        tracing::info!(topic = %topic.topic_name, partition = p.partition_index, epoch = p.leader_epoch, "became leader");
                        self.txns.forget_partition(&(topic.topic_name.to_string(), p.partition_index));
                        if offsets {
                            self.load_groups(Some(p.partition_index));
                        }
                        if txn_state {
                            self.load_txns(Some(p.partition_index));
                        }
                    }
                    if txn_state {
                        self.txns.set_loading(p.partition_index, false);
                    }
                    if offsets {
                        self.set_loading_offsets(p.partition_index, false);
                    }
                } else {
                    let was_leader = part.is_leader();
                    // Verified transactional writes matter only to a leader; a later term
                    // here verifies again.
                    self.txns.forget_partition(&(topic.topic_name.to_string(), p.partition_index));
                    if part.become_follower(p.leader, p.leader_epoch, &p.replicas, &p.isr) {
                        tracing::info!(topic = %topic.topic_name, partition = p.partition_index, leader = p.leader, epoch = p.leader_epoch, "following");
                    }
                    if was_leader && topic.topic_name == crate::group::OFFSETS_TOPIC {
                        self.unload_groups(p.partition_index);
                    }
                    if was_leader && topic.topic_name == crate::controller::auto_create::TRANSACTION_STATE_TOPIC {
                        self.unload_txns(p.partition_index);
                    }
                    if p.leader >= 0 && !self.shutting_down.load(std::sync::atomic::Ordering::Acquire) {
                        self.fetchers.follow(self, p.leader, tp);
                    } else {
                        self.fetchers.unfollow(&tp);
                    }
                }
                errors.push(partition_error(&topic.topic_name, topic.topic_id, p.partition_index, 0));
            }
        }
        if req.request_type == FULL_STATE {
            for part in self.replicas.all_partitions() {
                if listed.contains(&(part.topic.as_str(), part.index)) {
                    continue;
                }
                tracing::info!(topic = %part.topic, partition = part.index, "not assigned here by the controller; deleting local log");
                self.fetchers.unfollow(&(part.topic.clone(), part.index));
                if let Err(e) = self.replicas.remove_partition(&part.topic, part.index) {
                    tracing::warn!(topic = %part.topic, partition = part.index, error = %e, "cannot delete partition log");
                }
            }
        }
        self.fetchers.start_added();
        self.replicas.notify_changed();
        LeaderAndIsrResponse { error_code: 0, partition_errors: errors }
    }

    /// Stops following the listed partitions, deleting their logs where asked.
    pub fn stop_replicas(&self, req: &StopReplicaRequest) -> StopReplicaResponse {
        let _serial = self.replica_state_lock.lock_unpoisoned();
        let mut errors = Vec::new();
        for topic in &req.topics {
            for p in &topic.partitions {
                let tp = (topic.topic_name.clone(), p.partition_index);
                let local = self.replicas.hosted(&topic.topic_name, p.partition_index);
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
                self.txns.forget_partition(&(topic.topic_name.to_string(), p.partition_index));
                let mut error_code = 0;
                if p.delete_partition {
                    tracing::info!(topic = %topic.topic_name, partition = p.partition_index, "StopReplica: deleting local log");
                    if let Err(e) = self.replicas.remove_partition(&topic.topic_name, p.partition_index) {
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
        self.replicas.notify_changed();
        StopReplicaResponse { error_code: 0, partition_errors: errors }
    }

    /// Brings this broker's metadata image up to date with the controller's: the live
    /// brokers, and the partitions the request names (a deleted topic's with leader -2).
    /// Topic configs are read once, when a topic first appears here.
    pub fn update_metadata(&self, req: &UpdateMetadataRequest) -> UpdateMetadataResponse {
        let listener = self.config.inter_broker_listener.clone();
        let brokers: Vec<BrokerInfo> = req
            .live_brokers
            .iter()
            .filter_map(|b| {
                let endpoints: Vec<crate::config::Endpoint> = b
                    .endpoints
                    .iter()
                    .filter_map(|e| {
                        let protocol = match e.security_protocol {
                            1 => "SSL",
                            2 => "SASL_PLAINTEXT",
                            3 => "SASL_SSL",
                            _ => "PLAINTEXT",
                        };
                        Some(crate::config::Endpoint::of_broker(
                            e.listener.clone(),
                            e.host.clone(),
                            u16::try_from(e.port).ok()?,
                            protocol,
                        ))
                    })
                    .collect();
                let ep = endpoints.iter().find(|e| e.listener_name == listener).or(endpoints.first())?.clone();
                Some(BrokerInfo { id: b.id, host: ep.host, port: ep.port, rack: b.rack.clone(), epoch: -1, endpoints })
            })
            .collect();
        let snapshot = self.cache.snapshot();
        let new_topics: Vec<String> = req
            .topics
            .iter()
            .filter(|t| !snapshot.topics.contains_key(&t.topic_name))
            .filter(|t| t.partitions.iter().any(|p| p.leader != LEADER_DURING_DELETE))
            .map(|t| t.topic_name.clone())
            .collect();
        let configs = self.read_topic_configs(&new_topics);
        self.cache.update(|c| {
            c.brokers = brokers;
            c.controller_id = req.controller_id;
            for t in &req.topics {
                let mut info = match c.topics.get(&t.topic_name) {
                    Some(old) => (**old).clone(),
                    None => TopicInfo {
                        name: t.topic_name.clone(),
                        id: t.topic_id,
                        partitions: Vec::new(),
                        configs: configs.get(&t.topic_name).cloned().unwrap_or_default(),
                    },
                };
                if t.topic_id != Uuid::nil() {
                    info.id = t.topic_id;
                }
                let mut deleted = false;
                for p in &t.partitions {
                    if p.leader == LEADER_DURING_DELETE {
                        deleted = true;
                        continue;
                    }
                    let next = PartitionInfo {
                        index: p.partition_index,
                        leader: p.leader,
                        leader_epoch: p.leader_epoch,
                        replicas: p.replicas.clone(),
                        isr: p.isr.clone(),
                        partition_epoch: p.zk_version,
                        adding_replicas: Vec::new(),
                        removing_replicas: Vec::new(),
                        offline_replicas: p.offline_replicas.clone(),
                    };
                    match info.partitions.binary_search_by_key(&p.partition_index, |x| x.index) {
                        Ok(i) => {
                            let old = &info.partitions[i];
                            // A reordered older state never replaces a newer one.
                            if (old.leader_epoch, old.partition_epoch) <= (next.leader_epoch, next.partition_epoch) {
                                info.partitions[i] = next;
                            }
                        }
                        Err(i) => info.partitions.insert(i, next),
                    }
                }
                if deleted {
                    c.topics.remove(&t.topic_name);
                } else {
                    c.topics.insert(t.topic_name.clone(), Arc::new(info));
                }
            }
        });
        // DeleteTopics answers once the topic is gone from this image.
        self.replicas.notify_metadata_changed();
        // As Kafka's KafkaApis does with the partitions UpdateMetadata shows deleted.
        let deleted: Vec<(String, i32)> = req
            .topics
            .iter()
            .flat_map(|t| {
                t.partitions
                    .iter()
                    .filter(|p| p.leader == LEADER_DURING_DELETE)
                    .map(|p| (t.topic_name.clone(), p.partition_index))
            })
            .collect();
        self.on_partitions_deleted(&deleted);
        UpdateMetadataResponse { error_code: 0 }
    }

    fn read_topic_config(&self, name: &str) -> BTreeMap<String, String> {
        self.read_topic_configs(&[name.to_string()]).remove(name).unwrap_or_default()
    }

    /// `/config/topics/<t>` of each topic, in one pipelined read.
    pub fn read_topic_configs(&self, names: &[String]) -> BTreeMap<String, BTreeMap<String, String>> {
        self.try_read_topic_configs(names).unwrap_or_else(|e| {
            tracing::warn!(error = %e, "cannot read topic configs; using broker defaults until they change");
            BTreeMap::new()
        })
    }

    /// The overrides in `/config/topics/<name>` of each topic (empty where none is set).
    pub fn try_read_topic_configs(
        &self,
        names: &[String],
    ) -> Result<BTreeMap<String, BTreeMap<String, String>>, crate::metadata::store::StoreError> {
        if names.is_empty() {
            return Ok(BTreeMap::new());
        }
        let paths: Vec<String> = names.iter().map(|n| zk_data::topic_config_path(n)).collect();
        let found = self.store.get_many_versioned(&paths)?;
        Ok(names
            .iter()
            .zip(found)
            .map(|(n, d)| (n.clone(), d.map(|(d, _)| zk_data::parse_topic_config(&d)).unwrap_or_default()))
            .collect())
    }
}

fn partition_error(topic: &str, id: Uuid, partition: i32, error_code: i16) -> LeaderAndIsrPartitionError {
    LeaderAndIsrPartitionError { topic_name: topic.to_string(), topic_id: id, partition_index: partition, error_code }
}
