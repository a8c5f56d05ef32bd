//! How a broker converges on the cluster state kept in ZooKeeper: after any change under the
//! watched paths it re-reads live brokers, the controller, topics, partition states and topic
//! configs, publishes them to the metadata cache, and opens or stops serving the partitions it
//! leads. Because every pass reads the whole truth, a missed notification or a restart costs
//! nothing: the next pass converges.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use super::cache::{BrokerInfo, PartitionInfo, TopicInfo};
use super::store::StoreError;
use super::zk_data;
use crate::broker::Broker;

/// Reads `/brokers/ids/<id>`: the endpoint for `listener` if the broker has one, else its
/// first endpoint.
fn parse_broker(id: i32, data: &str, listener: &str) -> Option<BrokerInfo> {
    let v: Value = serde_json::from_str(data).ok()?;
    let endpoints = v.get("endpoints").and_then(Value::as_array).cloned().unwrap_or_default();
    let parsed: Vec<crate::config::Endpoint> = endpoints
        .iter()
        .filter_map(Value::as_str)
        .filter_map(|e| crate::config::parse_endpoints("endpoints", e).ok())
        .flatten()
        .collect();
    let ep = parsed.iter().find(|e| e.listener_name == listener).or(parsed.first())?;
    Some(BrokerInfo {
        id,
        host: ep.host.clone(),
        port: ep.port,
        rack: v.get("rack").and_then(Value::as_str).map(str::to_string),
    })
}

impl Broker {
    /// One full pass; see the module docs.
    pub fn reconcile(self: &Arc<Self>) -> Result<(), StoreError> {
        let store = &self.store;
        let listener = self.config.listeners.first().map(|l| l.listener_name.clone()).unwrap_or_default();
        let mut brokers = Vec::new();
        for child in store.try_children(zk_data::BROKER_IDS)? {
            let Ok(id) = child.parse::<i32>() else { continue };
            let Some(data) = store.try_get(&zk_data::broker_path(id))? else { continue };
            match parse_broker(id, &data, &listener) {
                Some(b) => brokers.push(b),
                None => tracing::warn!(broker = id, "broker registration gregor does not understand; skipped"),
            }
        }
        let live: BTreeSet<i32> = brokers.iter().map(|b| b.id).collect();

        let controller_of =
            |d: &str| serde_json::from_str::<Value>(d).ok().and_then(|v| v.get("brokerid")?.as_i64()).map(|i| i as i32);
        let mut controller = store.try_get(zk_data::CONTROLLER)?.as_deref().and_then(controller_of);
        if controller.is_none() && self.try_become_controller()? {
            controller = Some(self.config.broker_id);
        }
        if controller != Some(self.config.broker_id) && self.is_controller() {
            tracing::warn!("no longer the controller");
            self.resign_controller();
        }
        if self.is_controller() {
            self.controller_pass(&live)?;
        }

        let previous = self.cache.snapshot();
        let mut topics = BTreeMap::new();
        for name in store.try_children(zk_data::BROKER_TOPICS)? {
            let Some(data) = store.try_get(&zk_data::topic_path(&name))? else { continue };
            let Some((assignment, id)) = zk_data::parse_topic_json(&data) else {
                tracing::warn!(topic = %name, "topic znode gregor does not understand; skipped");
                continue;
            };
            let id = match id {
                Some(id) => id,
                // A topic written by hand (as old tools did) gets its id from the controller.
                None if self.is_controller() => {
                    let id = zk_data::new_kafka_uuid();
                    store.set(&zk_data::topic_path(&name), &zk_data::topic_json(&assignment, id))?;
                    id
                }
                None => continue,
            };
            let configs = store
                .try_get(&zk_data::topic_config_path(&name))?
                .map(|d| zk_data::parse_topic_config(&d))
                .unwrap_or_default();
            let mut partitions = Vec::with_capacity(assignment.len());
            for (&p, replicas) in &assignment {
                let state = store
                    .try_get(&zk_data::partition_state_path(&name, p))?
                    .and_then(|d| zk_data::parse_partition_state(&d));
                let (leader, leader_epoch, isr) = match state {
                    Some(s) => (s.leader, s.leader_epoch, s.isr),
                    None => (-1, -1, vec![]),
                };
                partitions.push(PartitionInfo { index: p, leader, leader_epoch, replicas: replicas.clone(), isr });
            }
            topics.insert(name.clone(), Arc::new(TopicInfo { name, id, partitions, configs }));
        }
        self.cache.update(|c| {
            c.brokers = brokers;
            c.controller_id = controller.unwrap_or(-1);
            c.topics = topics.clone();
        });
        self.apply_leadership(&previous.topics, &topics);
        Ok(())
    }

    /// Makes this broker leader or follower of each partition it hosts as the states say,
    /// points the follower fetchers at the right leaders, deletes the logs of deleted topics,
    /// and applies changed topic configs.
    fn apply_leadership(
        self: &Arc<Self>,
        before: &BTreeMap<String, Arc<TopicInfo>>,
        now: &BTreeMap<String, Arc<TopicInfo>>,
    ) {
        let me = self.config.broker_id;
        for topic in now.values() {
            let config_changed = before.get(&topic.name).is_some_and(|b| b.configs != topic.configs);
            let log_config = match self.config.log_config_for(&topic.configs) {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(topic = %topic.name, error = %e, "invalid topic config; using broker defaults");
                    self.config.log.clone()
                }
            };
            let id = zk_data::uuid_to_kafka(topic.id);
            for p in &topic.partitions {
                let tp = (topic.name.clone(), p.index);
                if !p.replicas.contains(&me) {
                    self.fetchers.unfollow(&tp);
                    // Reassigned away from this broker: its copy is no longer needed
                    // (Kafka's StopReplica with delete).
                    if self.replicas.hosted(&topic.name, p.index).is_some() {
                        tracing::info!(topic = %topic.name, partition = p.index, "no longer a replica; deleting local log");
                        if let Err(e) = self.replicas.remove_partition(&topic.name, p.index) {
                            tracing::warn!(topic = %topic.name, partition = p.index, error = %e, "cannot delete partition log");
                        }
                    }
                    continue;
                }
                let part = match self.replicas.open_replica(&topic.name, p.index, &id, log_config.clone()) {
                    Ok(part) => part,
                    Err(e) => {
                        tracing::error!(topic = %topic.name, partition = p.index, error = %e, "cannot open partition");
                        continue;
                    }
                };
                if config_changed {
                    part.set_config(log_config.clone());
                }
                if p.leader == me {
                    self.fetchers.unfollow(&tp);
                    let offsets = topic.name == crate::group::OFFSETS_TOPIC;
                    // Until its groups are loaded, a new coordinator answers
                    // COORDINATOR_LOAD_IN_PROGRESS rather than "no offsets".
                    if offsets {
                        self.set_loading_offsets(p.index, true);
                    }
                    if part.become_leader(p.leader_epoch, &p.replicas, &p.isr) {
                        tracing::info!(topic = %topic.name, partition = p.index, epoch = p.leader_epoch, "became leader");
                        if offsets {
                            self.load_groups(Some(p.index));
                        }
                    }
                    if offsets {
                        self.set_loading_offsets(p.index, false);
                    }
                } else {
                    if part.become_follower(p.leader, p.leader_epoch, &p.replicas, &p.isr) {
                        tracing::info!(topic = %topic.name, partition = p.index, leader = p.leader, epoch = p.leader_epoch, "following");
                    }
                    if p.leader >= 0 && !self.shutting_down.load(std::sync::atomic::Ordering::Acquire) {
                        self.fetchers.follow(self, p.leader, tp);
                    } else {
                        self.fetchers.unfollow(&tp);
                    }
                }
            }
        }
        for part in self.replicas.all_partitions() {
            if !now.contains_key(&part.topic) {
                self.fetchers.unfollow(&(part.topic.clone(), part.index));
                if let Err(e) = self.replicas.remove_partition(&part.topic, part.index) {
                    tracing::warn!(topic = %part.topic, partition = part.index, error = %e, "cannot delete partition log");
                }
            }
        }
        self.replicas.notify_changed();
    }

    /// Re-runs [`Broker::reconcile`] whenever ZooKeeper reports a change (ZooKeeper mode only).
    pub fn spawn_reconciler(self: &Arc<Self>) {
        let super::store::ZnodeStore::ZooKeeper(zk) = &*self.store else { return };
        let mut changes = zk.changes();
        let mut sessions = zk.sessions();
        let b = self.clone();
        // A controller whose session ended must stop acting at once: another broker may be
        // elected before this one hears anything more from ZooKeeper.
        tokio::spawn(async move {
            while sessions.changed().await.is_ok() {
                let event = *sessions.borrow_and_update();
                if !event.live && b.is_controller() {
                    tracing::warn!("ZooKeeper session lost: resigning as controller");
                    b.resign_controller();
                    b.cache.update(|c| c.controller_id = -1);
                }
            }
        });
        let broker = self.clone();
        let check_every = self
            .config
            .values
            .get("leader.imbalance.check.interval.seconds")
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(300)
            .max(1);
        tokio::spawn(async move {
            let mut imbalance_check = tokio::time::interval(Duration::from_secs(check_every));
            imbalance_check.tick().await;
            loop {
                tokio::select! {
                    changed = changes.changed() => if changed.is_err() { return },
                    _ = imbalance_check.tick() => broker.request_preferred_election(),
                }
                loop {
                    let b = broker.clone();
                    let result = tokio::task::spawn_blocking(move || b.reconcile()).await;
                    match result {
                        Ok(Ok(())) => break,
                        Ok(Err(e)) => tracing::warn!(error = %e, "cannot read cluster state; retrying"),
                        Err(e) => tracing::error!(error = %e, "reconcile task failed; retrying"),
                    }
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        });
    }
}
