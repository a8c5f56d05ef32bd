//! The controller: decides replica assignment and partition leadership and records both in the
//! znode tree in Kafka's layout. Standalone, this broker is the only one and so the controller;
//! every change is written to the store first (the durable truth), then to the metadata cache,
//! then applied to the local replicas.

pub mod auto_create;
pub mod channel;
pub mod election;
pub mod events;
pub mod features;
pub mod log_dir_events;
mod metadata_listener;
pub mod propagate;
pub mod reassign;
pub mod requests;
pub mod state;
#[cfg(test)]
mod unit_tests;

pub use state::{Controller, LocalBroker};

use std::collections::BTreeMap;
use std::sync::Arc;

use uuid::Uuid;

use crate::metadata::zk_data::{self, PartitionState};
use crate::metadata::{PartitionInfo, TopicInfo};
use crate::protocol::{ApiError, ErrorCode};
use crate::sync::MutexExt;

/// Kafka's limit: 249, so that `<topic>-<partition>` plus a deletion suffix fits in 255 bytes.
const MAX_TOPIC_NAME_LEN: usize = 249;

/// Kafka's topic name rules (`Topic.validate`).
pub fn validate_topic_name(name: &str) -> Result<(), ApiError> {
    let bad = |why: String| Err(ApiError::new(ErrorCode::InvalidTopicException, why));
    if name.is_empty() {
        return bad("Topic name is illegal, it can't be empty".into());
    }
    if name == "." || name == ".." {
        return bad("Topic name cannot be \".\" or \"..\"".into());
    }
    if name.len() > MAX_TOPIC_NAME_LEN {
        return bad(format!("Topic name is illegal, it can't be longer than {MAX_TOPIC_NAME_LEN} characters"));
    }
    if !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-') {
        return bad(format!(
            "Topic name \"{name}\" is illegal, it contains a character other than ASCII alphanumerics, '.', '_' and '-'"
        ));
    }
    Ok(())
}

/// The seed document's assignment: partition i on broker (i mod n), its replica j on broker
/// ((i + j) mod n), over the sorted live brokers.
pub fn assign_replicas(brokers: &[i32], first_partition: i32, count: i32, rf: i16) -> BTreeMap<i32, Vec<i32>> {
    let mut sorted = brokers.to_vec();
    sorted.sort_unstable();
    let n = sorted.len();
    (first_partition..first_partition + count)
        .map(|i| {
            let replicas = (0..rf as usize).map(|j| sorted[(i as usize + j) % n]).collect();
            (i, replicas)
        })
        .collect()
}

/// One partition's manual replica list, as Kafka's `AdminZkClient.validateReplicaAssignment`
/// checks it: no empty list, no broker twice, only registered brokers.
fn check_replicas(partition: i32, replicas: &[i32], live: &[i32]) -> Result<(), ApiError> {
    let bad = |m: String| Err(ApiError::new(ErrorCode::InvalidReplicaAssignment, m));
    if replicas.is_empty() {
        return bad(format!("Cannot have replication factor of 0 for partition id {partition}."));
    }
    let distinct: std::collections::BTreeSet<i32> = replicas.iter().copied().collect();
    if distinct.len() != replicas.len() {
        return bad(format!(
            "Duplicate brokers not allowed in replica assignment: {replicas:?} for partition id {partition}."
        ));
    }
    let unknown: Vec<i32> = distinct.iter().copied().filter(|r| !live.contains(r)).collect();
    if !unknown.is_empty() {
        return bad(format!("Unknown broker(s) in replica assignment: {unknown:?}."));
    }
    Ok(())
}

/// The manual assignment of the partitions CreatePartitions adds: one list per new
/// partition, each of the topic's replication factor.
fn check_added_partitions(added: &BTreeMap<i32, Vec<i32>>, adding: i32, rf: i16, live: &[i32]) -> Result<(), ApiError> {
    if added.len() as i64 != i64::from(adding) {
        return Err(ApiError::new(
            ErrorCode::InvalidReplicaAssignment,
            format!("Increasing the number of partitions by {adding} but {} assignments provided.", added.len()),
        ));
    }
    for (p, replicas) in added {
        check_replicas(*p, replicas, live)?;
    }
    let bad: Vec<(i32, usize)> =
        added.iter().filter(|(_, r)| r.len() != rf as usize).map(|(p, r)| (*p, r.len())).collect();
    if !bad.is_empty() {
        return Err(ApiError::new(
            ErrorCode::InvalidReplicaAssignment,
            format!(
                "Inconsistent replication factor between partitions, partition 0 has {rf} while partitions {:?} have replication factors {:?}, respectively.",
                bad.iter().map(|b| b.0).collect::<Vec<_>>(),
                bad.iter().map(|b| b.1).collect::<Vec<_>>()
            ),
        ));
    }
    Ok(())
}

/// Empties the controller's set of topics being created when a creation step ends, however
/// it ends.
struct Creating<'a>(&'a std::sync::Mutex<std::collections::BTreeSet<String>>);

impl Drop for Creating<'_> {
    fn drop(&mut self) {
        self.0.lock_unpoisoned().clear();
    }
}

pub struct TopicRequest {
    pub name: String,
    pub num_partitions: i32,
    pub replication_factor: i16,
    pub assignment: BTreeMap<i32, Vec<i32>>,
    pub configs: BTreeMap<String, String>,
}

impl Controller {
    /// Refuses a topic of more partitions than `gregor.max.partitions.per.topic`, before
    /// anything is allocated for them.
    pub(crate) fn check_partition_bound(&self, partitions: i32) -> Result<(), ApiError> {
        let max = self.config.max_partitions_per_topic;
        if partitions > max {
            return Err(ApiError::new(
                ErrorCode::InvalidPartitions,
                format!("{partitions} partitions exceed gregor.max.partitions.per.topic ({max})."),
            ));
        }
        Ok(())
    }

    fn live_broker_ids(&self) -> Vec<i32> {
        self.cache.snapshot().brokers.iter().map(|b| b.id).collect()
    }

    /// Checks a CreateTopics entry and fills in defaults; writes nothing.
    pub fn plan_topic(&self, req: TopicRequest) -> Result<TopicRequest, ApiError> {
        self.plan_topics(vec![req]).pop().unwrap_or_else(|| Err(ApiError::new(ErrorCode::UnknownServerError, "")))
    }

    /// [`Controller::plan_topic`] for many entries, one answer each in order. Their znodes
    /// are looked up together (pipelined), not two round trips to ZooKeeper per topic.
    pub fn plan_topics(&self, reqs: Vec<TopicRequest>) -> Vec<Result<TopicRequest, ApiError>> {
        // Only valid names make valid paths: one that is not would fail the whole lookup.
        let valid: Vec<&str> =
            reqs.iter().map(|r| r.name.as_str()).filter(|n| validate_topic_name(n).is_ok()).collect();
        let mut found = std::collections::HashMap::new();
        if self.store.is_zookeeper() && !valid.is_empty() {
            let mut paths: Vec<String> = valid.iter().map(|n| zk_data::topic_path(n)).collect();
            paths.extend(valid.iter().map(|n| format!("{}/{}", election::ADMIN_DELETE_TOPICS, n)));
            match self.store.get_many_versioned(&paths) {
                Ok(f) => {
                    for (i, name) in valid.iter().enumerate() {
                        found.insert(name.to_string(), (f[i].is_some(), f[valid.len() + i].is_some()));
                    }
                }
                Err(e) => {
                    let e = ApiError::from(e);
                    return reqs.iter().map(|_| Err(e.clone())).collect();
                }
            }
        }
        reqs.into_iter()
            .map(|req| {
                let (in_store, deleting) = found.get(&req.name).copied().unwrap_or_default();
                self.plan_one(req, in_store, deleting)
            })
            .collect()
    }

    fn plan_one(&self, mut req: TopicRequest, in_store: bool, deleting: bool) -> Result<TopicRequest, ApiError> {
        validate_topic_name(&req.name)?;
        if in_store {
            return Err(ApiError::new(ErrorCode::TopicAlreadyExists, format!("Topic '{}' already exists.", req.name)));
        }
        // As Kafka's AdminZkClient: a name whose deletion is pending is not created again (a
        // client still holding it in its metadata would otherwise bring it straight back).
        if deleting {
            return Err(ApiError::new(
                ErrorCode::TopicAlreadyExists,
                format!("Topic '{}' is marked for deletion.", req.name),
            ));
        }
        if self.cache.topic(&req.name).is_some() {
            return Err(ApiError::new(ErrorCode::TopicAlreadyExists, format!("Topic '{}' already exists.", req.name)));
        }
        for (k, v) in &req.configs {
            self.config
                .validate_topic_config(k, v)
                .map_err(|e| ApiError::new(ErrorCode::InvalidConfig, e.to_string()))?;
        }
        // Keys that must agree with each other (min/max compaction lag).
        self.config.log_config_for(&req.configs).map_err(|e| ApiError::new(ErrorCode::InvalidConfig, e.to_string()))?;
        let live = self.live_broker_ids();
        if req.assignment.is_empty() {
            if req.num_partitions == -1 {
                req.num_partitions = self.config.num_partitions;
            }
            if req.replication_factor == -1 {
                req.replication_factor = self.config.default_replication_factor;
            }
            if req.num_partitions <= 0 {
                return Err(ApiError::new(ErrorCode::InvalidPartitions, "Number of partitions must be larger than 0."));
            }
            if req.replication_factor <= 0 {
                return Err(ApiError::new(
                    ErrorCode::InvalidReplicationFactor,
                    "Replication factor must be larger than 0.",
                ));
            }
            self.check_partition_bound(req.num_partitions)?;
            if req.replication_factor as usize > live.len() {
                return Err(ApiError::new(
                    ErrorCode::InvalidReplicationFactor,
                    format!(
                        "Replication factor: {} larger than available brokers: {}.",
                        req.replication_factor,
                        live.len()
                    ),
                ));
            }
            req.assignment = assign_replicas(&live, 0, req.num_partitions, req.replication_factor);
        } else {
            self.check_partition_bound(i32::try_from(req.assignment.len()).unwrap_or(i32::MAX))?;
            let expected: Vec<i32> = (0..req.assignment.len() as i32).collect();
            if req.assignment.keys().copied().collect::<Vec<_>>() != expected {
                return Err(ApiError::new(ErrorCode::InvalidReplicaAssignment, "Partitions must be numbered 0..n-1."));
            }
            let sizes: std::collections::BTreeSet<usize> = req.assignment.values().map(Vec::len).collect();
            if sizes.len() != 1 {
                return Err(ApiError::new(
                    ErrorCode::InvalidReplicaAssignment,
                    "All partitions should have the same number of replicas",
                ));
            }
            for (p, replicas) in &req.assignment {
                check_replicas(*p, replicas, &live)?;
            }
            req.num_partitions = req.assignment.len() as i32;
            req.replication_factor = req.assignment.values().next().map(|r| r.len() as i16).unwrap_or(0);
        }
        Ok(req)
    }

    /// Creates a planned topic: znodes first, then the cache, then the local logs.
    pub fn create_topic(&self, req: TopicRequest) -> Result<Arc<TopicInfo>, ApiError> {
        self.create_topics(vec![req]).pop().unwrap_or_else(|| Err(ApiError::new(ErrorCode::UnknownServerError, "")))
    }

    /// Creates planned topics together, one result each in order. The znode writes of all of
    /// them are pipelined (config before topic znode for each, as Kafka writes them, so a
    /// broker that sees a topic finds its config; one session's requests apply in order),
    /// then every new partition state at once: a request for 100 topics costs a few round
    /// trips to ZooKeeper, not a few hundred.
    pub fn create_topics(&self, reqs: Vec<TopicRequest>) -> Vec<Result<Arc<TopicInfo>, ApiError>> {
        let n = reqs.len();
        self.as_event("create topics", move |c| c.create_topics_step(reqs)).unwrap_or_else(|e| vec![Err(e); n])
    }

    fn create_topics_step(&self, reqs: Vec<TopicRequest>) -> Vec<Result<Arc<TopicInfo>, ApiError>> {
        let exists =
            |name: &str| ApiError::new(ErrorCode::TopicAlreadyExists, format!("Topic '{name}' already exists."));
        let started = std::time::Instant::now();
        let _creating = Creating(&self.creating);
        let mut results: Vec<Option<Result<Arc<TopicInfo>, ApiError>>> = Vec::with_capacity(reqs.len());
        let mut heads = Vec::new();
        let mut ids = Vec::with_capacity(reqs.len());
        for req in &reqs {
            // Checked again under the lock: two requests may have planned the same topic.
            let id = zk_data::new_kafka_uuid();
            ids.push(id);
            if self.cache.topic(&req.name).is_some() {
                results.push(Some(Err(exists(&req.name))));
                continue;
            }
            results.push(None);
            // The watch pass that reads these znodes back leaves their states to this step.
            self.creating.lock_unpoisoned().insert(req.name.clone());
            heads.push((zk_data::topic_config_path(&req.name), zk_data::topic_config_json(&req.configs), None));
            heads.push((zk_data::topic_path(&req.name), zk_data::topic_json(&req.assignment, id), None));
        }
        let written = match self.store.write_many(&heads) {
            Ok(w) => w,
            Err(e) => {
                let e = ApiError::from(e);
                return results.into_iter().map(|r| r.unwrap_or_else(|| Err(e.clone()))).collect();
            }
        };
        let mut written = written.into_iter();
        let mut states = Vec::new();
        let mut created = Vec::new();
        for (i, req) in reqs.iter().enumerate() {
            if results[i].is_some() {
                continue;
            }
            let (config, topic) = (written.next(), written.next());
            let outcome = match (config, topic) {
                (_, Some(Err(crate::metadata::StoreError::NodeExists(_)))) => Err(exists(&req.name)),
                (_, Some(Err(e))) | (Some(Err(e)), _) if !matches!(e, crate::metadata::StoreError::NodeExists(_)) => {
                    Err(ApiError::from(e))
                }
                (Some(Err(_)), _) => {
                    // A config left by an earlier topic of this name: overwrite it.
                    self.store
                        .set(&zk_data::topic_config_path(&req.name), &zk_data::topic_config_json(&req.configs))
                        .map_err(ApiError::from)
                }
                _ => Ok(()),
            };
            match outcome {
                Ok(()) => {
                    // A new topic: whatever a concurrent pass may have put in the image for
                    // it (read from its half-written znodes) is not a state to keep.
                    let (writes, partitions) = self.initial_states(&req.name, &req.assignment, None);
                    states.extend(writes);
                    created.push((i, partitions));
                }
                Err(e) => results[i] = Some(Err(e)),
            }
        }
        let wrote_heads = started.elapsed();
        let states_written = self.write_new_states(states);
        let wrote_states = started.elapsed();
        for (i, partitions) in created {
            let req = &reqs[i];
            let r = states_written
                .clone()
                .and_then(|()| self.publish_topic(&req.name, ids[i], partitions, req.configs.clone()));
            if r.is_ok() {
                tracing::info!(topic = %req.name, partitions = req.num_partitions, "created topic");
            }
            results[i] = Some(r);
        }
        let created: std::collections::BTreeSet<String> =
            reqs.iter().zip(&results).filter(|(_, r)| matches!(r, Some(Ok(_)))).map(|(q, _)| q.name.clone()).collect();
        // Leaders are told now, not when the watch event for these writes comes back.
        self.propagate(Some(&created));
        tracing::info!(
            topics = created.len(),
            heads_ms = wrote_heads.as_millis() as u64,
            states_ms = (wrote_states - wrote_heads).as_millis() as u64,
            total_ms = started.elapsed().as_millis() as u64,
            "topics created and sent"
        );
        results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(ApiError::new(ErrorCode::UnknownServerError, ""))))
            .collect()
    }

    /// Auto-creation from any broker: the controller creates the topic outright; another
    /// broker writes the topic znodes (as Kafka's AdminZkClient does) and the controller gives
    /// the partitions leaders on its next pass. `None` means "created, not yet led".
    pub fn auto_create_topic(&self, req: TopicRequest) -> Result<Option<Arc<TopicInfo>>, ApiError> {
        if !self.store.is_zookeeper() || self.is_controller() {
            return self.create_topic(req).map(Some);
        }
        self.as_event("auto-create topic", move |c| c.write_new_topic(req))?
    }

    /// A broker that is not the controller writes the topic's znodes; the controller's pass
    /// gives it leaders.
    fn write_new_topic(&self, req: TopicRequest) -> Result<Option<Arc<TopicInfo>>, ApiError> {
        // The config goes first, as Kafka writes it, but never over a topic that exists: the
        // existence check in plan_topic may have raced with another broker's creation, and a
        // blind set would replace that topic's overrides with the broker defaults.
        let config_path = zk_data::topic_config_path(&req.name);
        let config = zk_data::topic_config_json(&req.configs);
        match self.store.create(&config_path, &config, false) {
            Ok(()) => {}
            Err(crate::metadata::StoreError::NodeExists(_)) => {
                if self.store.try_get(&zk_data::topic_path(&req.name))?.is_some() {
                    return Ok(None);
                }
                // A config left by an earlier topic of this name: overwrite it.
                self.store.set(&config_path, &config)?;
            }
            Err(e) => return Err(e.into()),
        }
        match self.store.create(
            &zk_data::topic_path(&req.name),
            &zk_data::topic_json(&req.assignment, zk_data::new_kafka_uuid()),
            false,
        ) {
            Ok(()) | Err(crate::metadata::StoreError::NodeExists(_)) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Steps waiting for the event thread, and steps it ran since start.
    pub fn event_counts(&self) -> (u64, u64) {
        (self.events.len() as u64, self.events.processed().max(0) as u64)
    }

    /// Runs `step` on the controller's event thread, after the changes queued before it.
    fn as_event<R: Send + 'static>(
        &self,
        name: &'static str,
        step: impl FnOnce(&Controller) -> R + Send + 'static,
    ) -> Result<R, ApiError> {
        let Some(me) = self.arc() else {
            return Err(ApiError::new(ErrorCode::NotController, "The controller is shutting down."));
        };
        self.events.run(name, move || step(&me)).map_err(|e| match e {
            events::EventError::Stopped => ApiError::new(ErrorCode::NotController, "The controller is shutting down."),
            events::EventError::Failed => {
                ApiError::new(ErrorCode::UnknownServerError, format!("The controller failed to {name}."))
            }
        })
    }

    /// In ZooKeeper mode only the controller changes topics (clients follow Metadata's
    /// controller id, as with Kafka).
    pub fn check_controller(&self) -> Result<(), ApiError> {
        if self.store.is_zookeeper() && !self.is_controller() {
            return Err(ApiError::new(
                ErrorCode::NotController,
                "This is not the correct controller for this cluster.",
            ));
        }
        Ok(())
    }

    fn write_partition_states(
        &self,
        name: &str,
        id: Uuid,
        assignment: &BTreeMap<i32, Vec<i32>>,
        configs: BTreeMap<String, String>,
    ) -> Result<Arc<TopicInfo>, ApiError> {
        let existing = self.cache.topic(name);
        let (writes, partitions) = self.initial_states(name, assignment, existing.as_deref());
        self.write_new_states(writes)?;
        let info = self.publish_topic(name, id, partitions, configs)?;
        self.propagate(Some(&std::collections::BTreeSet::from([name.to_string()])));
        Ok(info)
    }

    /// Creates the first states of new partitions, in fenced batches (see
    /// [`ZnodeStore::write_many_guarded`]). One already there was written by a pass of this
    /// controller that read the topic back first: its state is as good as this one.
    fn write_new_states(&self, states: Vec<(String, String)>) -> Result<(), ApiError> {
        let writes: Vec<(String, String, Option<i32>)> = states.into_iter().map(|(p, d)| (p, d, None)).collect();
        for r in self.store.write_many_guarded(&writes, self.epoch_guard())? {
            match r {
                Ok(()) | Err(crate::metadata::StoreError::NodeExists(_)) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// First states of the partitions of `assignment` not in `existing` (leader: the first
    /// live replica), as znode creates with their parents, and the topic's partitions.
    fn initial_states(
        &self,
        name: &str,
        assignment: &BTreeMap<i32, Vec<i32>>,
        existing: Option<&TopicInfo>,
    ) -> (Vec<(String, String)>, Vec<PartitionInfo>) {
        let mut partitions: Vec<PartitionInfo> = existing.map(|t| t.partitions.clone()).unwrap_or_default();
        let live = self.live_broker_ids();
        let new_topic = existing.is_none();
        let existing: std::collections::HashSet<i32> = partitions.iter().map(|x| x.index).collect();
        // The parents go first in the same batch: a state create whose parent is missing
        // would fail its whole transaction.
        let partitions_dir = format!("{}/partitions", zk_data::topic_path(name));
        let mut writes = Vec::new();
        if new_topic {
            writes.push((partitions_dir.clone(), String::new()));
        }
        for (&p, replicas) in assignment {
            if existing.contains(&p) {
                continue;
            }
            writes.push((format!("{partitions_dir}/{p}"), String::new()));
            let isr: Vec<i32> = replicas.iter().copied().filter(|r| live.contains(r)).collect();
            let leader = isr.first().copied().unwrap_or(-1);
            let state =
                PartitionState { leader, leader_epoch: 0, isr: isr.clone(), controller_epoch: self.controller_epoch() };
            writes.push((zk_data::partition_state_path(name, p), zk_data::partition_state_json(&state)));
            partitions.push(PartitionInfo {
                index: p,
                leader,
                leader_epoch: 0,
                replicas: replicas.clone(),
                isr,
                partition_epoch: 0,
                adding_replicas: Vec::new(),
                removing_replicas: Vec::new(),
                offline_replicas: Vec::new(),
            });
        }
        partitions.sort_by_key(|p| p.index);
        (writes, partitions)
    }

    /// Puts a topic whose znodes are written into the cache and, standalone, opens its logs.
    fn publish_topic(
        &self,
        name: &str,
        id: Uuid,
        partitions: Vec<PartitionInfo>,
        configs: BTreeMap<String, String>,
    ) -> Result<Arc<TopicInfo>, ApiError> {
        let info = Arc::new(TopicInfo { name: name.to_string(), id, partitions, configs });
        self.cache.update(|c| {
            c.topics.insert(name.to_string(), info.clone());
        });
        self.become_leader_for(&info)?;
        Ok(info)
    }

    /// Standalone: opens the logs of the partitions of `topic` (in ZooKeeper mode every broker
    /// does this for itself when it sees the partition states).
    pub fn become_leader_for(&self, topic: &TopicInfo) -> Result<(), ApiError> {
        if self.store.is_zookeeper() {
            return Ok(());
        }
        let log_config = self
            .effective_config()
            .log_config_for(&topic.configs)
            .map_err(|e| ApiError::new(ErrorCode::InvalidConfig, e.to_string()))?;
        let id = zk_data::uuid_to_kafka(topic.id);
        let Some(local) = self.local() else { return Ok(()) };
        for p in topic.partitions.iter().filter(|p| p.leader == self.config.broker_id) {
            local.make_leader(&topic.name, p.index, &id, log_config.clone())?;
        }
        Ok(())
    }

    pub fn delete_topic(&self, name: &str) -> Result<Uuid, ApiError> {
        let name = name.to_string();
        self.as_event("delete topic", move |c| c.delete_topic_step(&name))?
    }

    fn delete_topic_step(&self, name: &str) -> Result<Uuid, ApiError> {
        if !self.config.delete_topic_enable {
            return Err(ApiError::new(ErrorCode::TopicDeletionDisabled, "Topic deletion is disabled."));
        }
        let Some(topic) = self.cache.topic(name) else {
            return Err(ApiError::new(ErrorCode::UnknownTopicOrPartition, "This server does not host this topic."));
        };
        if self.store.is_zookeeper() {
            // As Kafka does: the request marks the topic, and the controller's own pass deletes
            // it, so deletion never races with that pass re-creating partition states.
            let path = format!("{}/{name}", election::ADMIN_DELETE_TOPICS);
            match self.store.create(&path, "", false) {
                Ok(()) | Err(crate::metadata::StoreError::NodeExists(_)) => return Ok(topic.id),
                Err(e) => return Err(e.into()),
            }
        }
        self.store.delete_recursive(&zk_data::topic_path(name))?;
        self.store.delete_recursive(&zk_data::topic_config_path(name))?;
        self.cache.update(|c| {
            c.topics.remove(name);
        });
        if let Some(local) = self.local() {
            for p in &topic.partitions {
                if let Err(e) = local.remove_partition(name, p.index) {
                    tracing::warn!(topic = %name, partition = p.index, error = %e, "could not delete partition log");
                }
            }
        }
        tracing::info!(topic = %name, "deleted topic");
        // Standalone, no UpdateMetadata will tell the group coordinator.
        let deleted: Vec<(String, i32)> = topic.partitions.iter().map(|p| (name.to_string(), p.index)).collect();
        self.on_partitions_deleted(&deleted);
        Ok(topic.id)
    }

    /// Adds partitions up to `count`, placed by `manual` (one replica list per new partition)
    /// or by the assignment rule.
    pub fn create_partitions(
        &self,
        name: &str,
        count: i32,
        manual: Option<Vec<Vec<i32>>>,
        validate_only: bool,
    ) -> Result<(), ApiError> {
        let name = name.to_string();
        self.as_event("create partitions", move |c| c.create_partitions_step(&name, count, manual, validate_only))?
    }

    fn create_partitions_step(
        &self,
        name: &str,
        count: i32,
        manual: Option<Vec<Vec<i32>>>,
        validate_only: bool,
    ) -> Result<(), ApiError> {
        let Some(topic) = self.cache.topic(name) else {
            return Err(ApiError::new(
                ErrorCode::UnknownTopicOrPartition,
                format!("The topic '{name}' does not exist."),
            ));
        };
        if topic.partitions.iter().any(|p| p.is_being_reassigned()) {
            return Err(ApiError::new(
                ErrorCode::ReassignmentInProgress,
                format!("A partition reassignment is in progress for the topic '{name}'."),
            ));
        }
        let current = topic.partitions.len() as i32;
        if count <= current {
            return Err(ApiError::new(
                ErrorCode::InvalidPartitions,
                format!("Topic currently has {current} partitions, which is higher than the requested {count}."),
            ));
        }
        self.check_partition_bound(count)?;
        let rf = topic.partitions.first().map(|p| p.replicas.len() as i16).unwrap_or(1);
        let live = self.live_broker_ids();
        let added = match manual {
            Some(lists) => {
                let added: BTreeMap<i32, Vec<i32>> = (current..).zip(lists).collect();
                check_added_partitions(&added, count - current, rf, &live)?;
                added
            }
            None => {
                if rf as usize > live.len() {
                    return Err(ApiError::new(ErrorCode::InvalidReplicationFactor, "Not enough live brokers."));
                }
                assign_replicas(&live, current, count - current, rf)
            }
        };
        if validate_only {
            return Ok(());
        }
        let mut assignment: BTreeMap<i32, Vec<i32>> =
            topic.partitions.iter().map(|p| (p.index, p.replicas.clone())).collect();
        assignment.extend(added);
        self.store.set(&zk_data::topic_path(name), &zk_data::topic_json(&assignment, topic.id))?;
        self.write_partition_states(name, topic.id, &assignment, topic.configs.clone())?;
        Ok(())
    }

    /// Replaces a topic's overrides (already validated) and applies them to its open logs.
    pub fn set_topic_configs(&self, name: &str, configs: BTreeMap<String, String>) -> Result<(), ApiError> {
        let Some(topic) = self.cache.topic(name) else {
            return Err(ApiError::new(ErrorCode::UnknownTopicOrPartition, format!("Topic {name} does not exist.")));
        };
        let log_config = self
            .effective_config()
            .log_config_for(&configs)
            .map_err(|e| ApiError::new(ErrorCode::InvalidConfig, e.to_string()))?;
        self.store.set(&zk_data::topic_config_path(name), &zk_data::topic_config_json(&configs))?;
        let mut next = (*topic).clone();
        next.configs = configs;
        let next = Arc::new(next);
        self.cache.update(|c| {
            c.topics.insert(name.to_string(), next.clone());
        });
        if let Some(local) = self.local() {
            for p in &topic.partitions {
                local.set_log_config(name, p.index, log_config.clone());
            }
        }
        Ok(())
    }

    /// Rebuilds the cache from the store at startup, and opens the logs this broker leads.
    pub fn load_topics(&self) -> Result<(), ApiError> {
        for name in self.store.children(zk_data::BROKER_TOPICS) {
            let Some(data) = self.store.get(&zk_data::topic_path(&name)) else { continue };
            let Some((assignment, id)) = zk_data::parse_topic_json(&data) else {
                tracing::warn!(topic = %name, "unreadable topic znode; skipped");
                continue;
            };
            // A topic written by hand without an id (as old tools did) gets one now.
            let id = match id {
                Some(id) => id,
                None => {
                    let id = zk_data::new_kafka_uuid();
                    self.store.set(&zk_data::topic_path(&name), &zk_data::topic_json(&assignment, id))?;
                    id
                }
            };
            let configs = self
                .store
                .get(&zk_data::topic_config_path(&name))
                .map(|d| zk_data::parse_topic_config(&d))
                .unwrap_or_default();
            let mut partitions = Vec::new();
            for (&p, replicas) in &assignment {
                let state = self
                    .store
                    .get(&zk_data::partition_state_path(&name, p))
                    .and_then(|d| zk_data::parse_partition_state(&d));
                let state = match state {
                    Some(s) => s,
                    None => {
                        let s = PartitionState {
                            leader: replicas.first().copied().unwrap_or(-1),
                            leader_epoch: 0,
                            isr: replicas.clone(),
                            controller_epoch: self.controller_epoch(),
                        };
                        self.store.set(&zk_data::partition_state_path(&name, p), &zk_data::partition_state_json(&s))?;
                        s
                    }
                };
                partitions.push(PartitionInfo {
                    index: p,
                    leader: state.leader,
                    leader_epoch: state.leader_epoch,
                    replicas: replicas.clone(),
                    isr: state.isr,
                    partition_epoch: 0,
                    adding_replicas: Vec::new(),
                    removing_replicas: Vec::new(),
                    offline_replicas: Vec::new(),
                });
            }
            let info = Arc::new(TopicInfo { name: name.clone(), id, partitions, configs });
            self.cache.update(|c| {
                c.topics.insert(name.clone(), info.clone());
            });
            self.become_leader_for(&info)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_names_follow_kafka_rules() {
        assert!(validate_topic_name("orders.v1_x-2").is_ok());
        for bad in ["", ".", "..", "a/b", "a b", "ü"] {
            assert!(validate_topic_name(bad).is_err(), "{bad:?}");
        }
        assert!(validate_topic_name(&"a".repeat(249)).is_ok());
        assert!(validate_topic_name(&"a".repeat(250)).is_err());
    }

    #[test]
    fn assignment_follows_the_seed() {
        let a = assign_replicas(&[4, 0, 3, 1, 2], 0, 6, 3);
        assert_eq!(a[&0], vec![0, 1, 2]);
        assert_eq!(a[&3], vec![3, 4, 0]);
        assert_eq!(a[&5], vec![0, 1, 2]);
        let b = assign_replicas(&[0, 1, 2], 3, 2, 2);
        assert_eq!(b.keys().copied().collect::<Vec<_>>(), vec![3, 4]);
        assert_eq!(b[&4], vec![1, 2]);
    }
}
