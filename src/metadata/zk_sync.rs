//! How a broker converges on the cluster state kept in ZooKeeper. Persistent watches name each
//! znode that changed; a pass re-reads just those (a broker list, one topic, one partition
//! state), publishes them to the metadata cache, and opens or stops serving the partitions
//! that changed, so a change costs what it touches, not the size of the cluster. When events
//! may have been missed (start, a new session, a failed pass) the pass reads everything.

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

/// What one batch of watch events touched, by the kind of znode.
#[derive(Debug, Default)]
pub struct Changes {
    pub brokers: bool,
    pub controller: bool,
    /// Topic znodes and topic configs: the whole topic is read again.
    pub topics: BTreeSet<String>,
    /// Partition state znodes of topics not in `topics`.
    pub partitions: BTreeMap<String, BTreeSet<i32>>,
    /// Anything under `/admin` or `/isr_change_notification`: controller work.
    pub admin: bool,
}

impl Changes {
    pub fn from_paths<'a>(paths: impl IntoIterator<Item = &'a String>) -> Changes {
        let mut c = Changes::default();
        for path in paths {
            let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
            match parts.as_slice() {
                ["brokers", "ids", ..] => c.brokers = true,
                ["controller"] => c.controller = true,
                ["brokers", "topics", t] | ["config", "topics", t] => {
                    c.topics.insert(t.to_string());
                }
                ["brokers", "topics", t, "partitions", p, "state"] => {
                    if let Ok(p) = p.parse() {
                        c.partitions.entry(t.to_string()).or_default().insert(p);
                    }
                }
                ["admin", ..] | ["isr_change_notification", ..] => c.admin = true,
                _ => {}
            }
        }
        let topics = &c.topics;
        c.partitions.retain(|t, _| !topics.contains(t));
        c
    }
}

fn partition_info(data: Option<&(String, i32)>, p: i32, replicas: &[i32]) -> PartitionInfo {
    let state = data.and_then(|(d, _)| zk_data::parse_partition_state(d));
    let (leader, leader_epoch, isr) = match state {
        Some(s) => (s.leader, s.leader_epoch, s.isr),
        None => (-1, -1, vec![]),
    };
    PartitionInfo { index: p, leader, leader_epoch, replicas: replicas.to_vec(), isr }
}

/// Reads issued together, so a pass over many znodes costs a few pipelined round trips rather
/// than one per znode (ZooKeeper answers each session's requests in order).
const READ_BATCH: usize = 2000;

fn read_many(store: &super::store::ZnodeStore, paths: &[String]) -> Result<Vec<Option<(String, i32)>>, StoreError> {
    let mut out = Vec::with_capacity(paths.len());
    for chunk in paths.chunks(READ_BATCH) {
        out.extend(store.get_many_versioned(chunk)?);
    }
    Ok(out)
}

impl Broker {
    /// A full pass: reads everything (at start, after a new session, after a failed pass).
    pub fn reconcile(self: &Arc<Self>) -> Result<(), StoreError> {
        self.reconcile_changes(None)
    }

    /// Reads what `changes` names (everything if None), publishes it to the metadata cache,
    /// does the controller's share if this broker is the controller, and applies leadership
    /// to the partitions that changed. Work is proportional to what changed.
    pub fn reconcile_changes(self: &Arc<Self>, changes: Option<&Changes>) -> Result<(), StoreError> {
        let store = &self.store;
        let previous = self.cache.snapshot();
        let brokers = match changes {
            Some(c) if !c.brokers => None,
            _ => Some(self.read_brokers()?),
        };
        let live: BTreeSet<i32> = brokers.as_ref().unwrap_or(&previous.brokers).iter().map(|b| b.id).collect();

        let was_controller = self.is_controller();
        let mut controller = (previous.controller_id >= 0).then_some(previous.controller_id);
        if changes.is_none_or(|c| c.controller || c.brokers) {
            let controller_of = |d: &str| {
                serde_json::from_str::<Value>(d).ok().and_then(|v| v.get("brokerid")?.as_i64()).map(|i| i as i32)
            };
            controller = store.try_get(zk_data::CONTROLLER)?.as_deref().and_then(controller_of);
            if controller.is_none() && self.try_become_controller()? {
                controller = Some(self.config.broker_id);
            }
            if controller != Some(self.config.broker_id) && self.is_controller() {
                tracing::warn!("no longer the controller");
                self.resign_controller();
            }
        }

        let mut topics = previous.topics.clone();
        let scope = match changes {
            None => {
                topics.clear();
                let names = store.try_children(zk_data::BROKER_TOPICS)?;
                for (name, info) in names.iter().zip(self.read_topics(&names)?) {
                    if let Some(info) = info {
                        topics.insert(name.clone(), info);
                    }
                }
                None
            }
            Some(c) => {
                let names: Vec<String> = c.topics.iter().cloned().collect();
                for (name, info) in names.iter().zip(self.read_topics(&names)?) {
                    match info {
                        Some(info) => topics.insert(name.clone(), info),
                        None => topics.remove(name),
                    };
                }
                let wanted: Vec<(&String, i32)> = c
                    .partitions
                    .iter()
                    .filter(|(name, _)| topics.contains_key(*name))
                    .flat_map(|(name, parts)| parts.iter().map(move |&p| (name, p)))
                    .collect();
                let paths: Vec<String> = wanted.iter().map(|(t, p)| zk_data::partition_state_path(t, *p)).collect();
                let mut states: BTreeMap<(&String, i32), Option<(String, i32)>> =
                    wanted.iter().copied().zip(read_many(store, &paths)?).collect();
                for (name, parts) in &c.partitions {
                    let Some(old) = topics.get(name) else { continue };
                    let mut next = (**old).clone();
                    for p in next.partitions.iter_mut().filter(|p| parts.contains(&p.index)) {
                        let data = states.remove(&(name, p.index)).flatten();
                        *p = partition_info(data.as_ref(), p.index, &p.replicas);
                    }
                    topics.insert(name.clone(), Arc::new(next));
                }
                Some(c)
            }
        };
        self.cache.update(|c| {
            if let Some(b) = brokers {
                c.brokers = b;
            }
            c.controller_id = controller.unwrap_or(-1);
            c.topics = topics.clone();
        });
        if self.is_controller() {
            // A new controller starts from the whole image, as Kafka's loads the whole tree.
            self.controller_duties(&live, if was_controller { scope } else { None })?;
        }
        self.apply_leadership(&previous.topics, &topics, scope);
        Ok(())
    }

    fn read_brokers(&self) -> Result<Vec<BrokerInfo>, StoreError> {
        let listener = self.config.listeners.first().map(|l| l.listener_name.clone()).unwrap_or_default();
        let mut brokers = Vec::new();
        for child in self.store.try_children(zk_data::BROKER_IDS)? {
            let Ok(id) = child.parse::<i32>() else { continue };
            let Some(data) = self.store.try_get(&zk_data::broker_path(id))? else { continue };
            match parse_broker(id, &data, &listener) {
                Some(b) => brokers.push(b),
                None => tracing::warn!(broker = id, "broker registration gregor does not understand; skipped"),
            }
        }
        Ok(brokers)
    }

    /// Topics from their znodes (None for one that does not exist or cannot be understood):
    /// topic and config znodes of all of them in one pipeline, then every partition state.
    fn read_topics(&self, names: &[String]) -> Result<Vec<Option<Arc<TopicInfo>>>, StoreError> {
        let store = &self.store;
        let heads: Vec<String> =
            names.iter().flat_map(|n| [zk_data::topic_path(n), zk_data::topic_config_path(n)]).collect();
        let heads = read_many(store, &heads)?;
        let mut parsed = Vec::with_capacity(names.len());
        for (name, pair) in names.iter().zip(heads.chunks(2)) {
            let (topic, config) = (pair.first().cloned().flatten(), pair.get(1).cloned().flatten());
            let Some((data, _)) = topic else {
                parsed.push(None);
                continue;
            };
            let Some((assignment, id)) = zk_data::parse_topic_json(&data) else {
                tracing::warn!(topic = %name, "topic znode gregor does not understand; skipped");
                parsed.push(None);
                continue;
            };
            let id = match id {
                Some(id) => id,
                // A topic written by hand (as old tools did) gets its id from the controller.
                None if self.is_controller() => {
                    let id = zk_data::new_kafka_uuid();
                    store.set(&zk_data::topic_path(name), &zk_data::topic_json(&assignment, id))?;
                    id
                }
                None => {
                    parsed.push(None);
                    continue;
                }
            };
            let configs = config.map(|(d, _)| zk_data::parse_topic_config(&d)).unwrap_or_default();
            parsed.push(Some((name, assignment, id, configs)));
        }
        let state_paths: Vec<String> = parsed
            .iter()
            .flatten()
            .flat_map(|(name, assignment, _, _)| assignment.keys().map(|&p| zk_data::partition_state_path(name, p)))
            .collect();
        let mut states = read_many(store, &state_paths)?.into_iter();
        Ok(parsed
            .into_iter()
            .map(|t| {
                let (name, assignment, id, configs) = t?;
                let partitions = assignment
                    .iter()
                    .map(|(&p, replicas)| partition_info(states.next().flatten().as_ref(), p, replicas))
                    .collect();
                Some(Arc::new(TopicInfo { name: name.clone(), id, partitions, configs }))
            })
            .collect())
    }

    /// Makes this broker leader or follower of each partition it hosts as the states say,
    /// points the follower fetchers at the right leaders, deletes the logs of deleted topics,
    /// and applies changed topic configs.
    fn apply_leadership(
        self: &Arc<Self>,
        before: &BTreeMap<String, Arc<TopicInfo>>,
        now: &BTreeMap<String, Arc<TopicInfo>>,
        scope: Option<&Changes>,
    ) {
        let me = self.config.broker_id;
        let touched: Vec<&Arc<TopicInfo>> = match scope {
            None => now.values().collect(),
            Some(c) => c.topics.iter().chain(c.partitions.keys()).filter_map(|t| now.get(t)).collect(),
        };
        for topic in touched {
            let only = scope.and_then(|c| c.partitions.get(&topic.name));
            let config_changed = before.get(&topic.name).is_some_and(|b| b.configs != topic.configs);
            let log_config = match self.config.log_config_for(&topic.configs) {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(topic = %topic.name, error = %e, "invalid topic config; using broker defaults");
                    self.config.log.clone()
                }
            };
            let id = zk_data::uuid_to_kafka(topic.id);
            for p in topic.partitions.iter().filter(|p| only.is_none_or(|o| o.contains(&p.index))) {
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
        let deleted: Vec<Arc<crate::replication::Partition>> = match scope {
            None => self.replicas.all_partitions().into_iter().filter(|p| !now.contains_key(&p.topic)).collect(),
            Some(c) => c
                .topics
                .iter()
                .filter(|t| !now.contains_key(*t))
                .filter_map(|t| before.get(t))
                .flat_map(|t| t.partitions.iter().filter_map(|p| self.replicas.hosted(&t.name, p.index)))
                .collect(),
        };
        for part in deleted {
            self.fetchers.unfollow(&(part.topic.clone(), part.index));
            if let Err(e) = self.replicas.remove_partition(&part.topic, part.index) {
                tracing::warn!(topic = %part.topic, partition = part.index, error = %e, "cannot delete partition log");
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
                    let result = tokio::task::spawn_blocking(move || {
                        let super::store::ZnodeStore::ZooKeeper(zk) = &*b.store else { return Ok(()) };
                        let dirty = zk.take_dirty();
                        let preferred = b.take_preferred_election();
                        let result = if dirty.full {
                            b.reconcile()
                        } else if dirty.paths.is_empty() {
                            Ok(())
                        } else {
                            b.reconcile_changes(Some(&Changes::from_paths(&dirty.paths)))
                        };
                        let result = result.and_then(|()| match preferred && b.is_controller() {
                            true => b.preferred_elections(),
                            false => Ok(()),
                        });
                        if result.is_err() {
                            // What this pass read is lost with it: start again from the top.
                            zk.mark_all_dirty();
                        }
                        result
                    })
                    .await;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watch_paths_are_sorted_into_what_must_be_read_again() {
        let paths: Vec<String> = [
            "/brokers/ids/2",
            "/brokers/topics/a",
            "/brokers/topics/a/partitions/0/state",
            "/brokers/topics/b/partitions/3/state",
            "/brokers/topics/b/partitions/4/state",
            "/brokers/topics/b/partitions",
            "/config/topics/c",
            "/admin/delete_topics/d",
            "/config/changes/config_change_0000000001",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let c = Changes::from_paths(&paths);
        assert!(c.brokers && c.admin && !c.controller);
        assert_eq!(c.topics.iter().map(String::as_str).collect::<Vec<_>>(), ["a", "c"]);
        // Topic a is read whole, so its partition event adds nothing; b's two states are read.
        assert_eq!(c.partitions.len(), 1);
        assert_eq!(c.partitions["b"].iter().copied().collect::<Vec<_>>(), [3, 4]);
        let only_controller = Changes::from_paths(&["/controller".to_string()]);
        assert!(only_controller.controller && !only_controller.brokers && only_controller.topics.is_empty());
    }
}
