//! How a broker converges on the cluster state kept in ZooKeeper. Persistent watches name each
//! znode that changed; a pass re-reads just those (a broker list, one topic, one partition
//! state), publishes them to the metadata cache, and then tells the components that subscribed
//! ([`MetadataListener`], and the controller as a [`ControllerRole`]), so a change costs what
//! it touches, not the size of the cluster. When events may have been missed (start, a new
//! session, a failed pass) the pass reads everything. Subscribers run after the cache is
//! updated, on the pass's blocking thread, with no lock of the sync held.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, OnceLock, RwLock};
use std::time::Duration;

use serde_json::Value;

use super::cache::{BrokerInfo, ClusterSnapshot, MetadataCache, PartitionInfo, TopicInfo};
use super::listener::{ControllerRole, MetadataListener, Subscribers};
use super::store::{StoreError, ZnodeStore};
use super::update_metadata::try_read_topic_configs;
use super::zk_data;
use crate::config::BrokerConfig;
use crate::protocol::inter_broker::{UpdateMetadataRequest, UpdateMetadataResponse};
use crate::sync::RwLockExt;

/// Reads `/brokers/ids/<id>`: the endpoint for `listener` if the broker has one, else its
/// first endpoint.
pub fn parse_broker(id: i32, data: &str, listener: &str, epoch: i64) -> Option<BrokerInfo> {
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
        epoch,
        endpoints: parsed.clone(),
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
    /// `/config/brokers/*` or a change notification: every broker re-reads its dynamic configs.
    pub broker_configs: bool,
    /// `/config/users`, `/config/clients` or a change notification: client quotas again.
    pub quotas: bool,
    /// `/config/users/<user>`: that user's SCRAM credentials are read again.
    pub users: BTreeSet<String>,
    /// ACL change notifications: the pattern each names is read again.
    pub acl_changes: BTreeSet<String>,
    /// `/config/client-metrics` or a change notification: client-metrics subscriptions again.
    pub client_metrics: bool,
    /// `/config/groups/<group>`: that group's configs are read again.
    pub group_configs: BTreeSet<String>,
    /// A change notification: expired ones are purged.
    pub config_changes: bool,
    /// `/feature`: the finalized features are read again.
    pub feature: bool,
    /// `/log_dir_event_notification/*`: a broker's log dir went offline.
    pub log_dir_events: bool,
}

impl Changes {
    pub fn from_paths<'a>(paths: impl IntoIterator<Item = &'a String>) -> Changes {
        let mut c = Changes::default();
        for path in paths {
            let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
            match parts.as_slice() {
                ["brokers", "ids", ..] => c.brokers = true,
                ["controller"] => c.controller = true,
                ["feature"] => c.feature = true,
                ["brokers", "topics", t] | ["config", "topics", t] => {
                    c.topics.insert(t.to_string());
                }
                ["brokers", "topics", t, "partitions", p, "state"] => {
                    if let Ok(p) = p.parse() {
                        c.partitions.entry(t.to_string()).or_default().insert(p);
                    }
                }
                ["admin", ..] | ["isr_change_notification", ..] => c.admin = true,
                ["log_dir_event_notification", ..] => c.log_dir_events = true,
                ["config", "brokers", ..] => c.broker_configs = true,
                ["config", "changes", ..] => {
                    c.broker_configs = true;
                    c.quotas = true;
                    c.client_metrics = true;
                    c.config_changes = true;
                }
                ["config", "users", u] => {
                    c.users.insert(u.to_string());
                    c.quotas = true;
                }
                ["config", "users" | "clients", ..] => c.quotas = true,
                ["config", "client-metrics", ..] => c.client_metrics = true,
                ["config", "groups", g] => {
                    c.group_configs.insert(g.to_string());
                }
                ["kafka-acl-changes" | "kafka-acl-extended-changes", _] => {
                    c.acl_changes.insert(path.clone());
                }
                _ => {}
            }
        }
        let topics = &c.topics;
        c.partitions.retain(|t, _| !topics.contains(t));
        c
    }
}

fn partition_info(
    data: Option<&(String, i32)>,
    p: i32,
    replicas: &[i32],
    moving: Option<&zk_data::Moving>,
) -> PartitionInfo {
    let state = data.and_then(|(d, v)| zk_data::parse_partition_state(d).map(|s| (s, *v)));
    let (leader, leader_epoch, isr, partition_epoch) = match state {
        Some((s, version)) => (s.leader, s.leader_epoch, s.isr, version),
        None => (-1, -1, vec![], -1),
    };
    PartitionInfo {
        index: p,
        leader,
        leader_epoch,
        replicas: replicas.to_vec(),
        isr,
        partition_epoch,
        adding_replicas: moving.map(|m| m.adding.clone()).unwrap_or_default(),
        removing_replicas: moving.map(|m| m.removing.clone()).unwrap_or_default(),
        offline_replicas: Vec::new(),
    }
}

/// A topic this controller just created is read back from its topic znode, possibly before
/// its partition states are written: the states it published stand until the znodes say
/// otherwise, so the pass does not decide them a second time.
fn keep_published_states(read: Arc<TopicInfo>, published: Option<&Arc<TopicInfo>>) -> Arc<TopicInfo> {
    let Some(published) = published.filter(|p| p.id == read.id) else { return read };
    if read.partitions.iter().all(|p| p.leader_epoch >= 0) {
        return read;
    }
    let mut next = (*read).clone();
    for p in next.partitions.iter_mut().filter(|p| p.leader_epoch < 0) {
        if let Some(old) = published.partitions.iter().find(|o| o.index == p.index && o.leader_epoch >= 0) {
            *p = old.clone();
        }
    }
    Arc::new(next)
}

/// Reads issued together, so a pass over many znodes costs a few pipelined round trips rather
/// than one per znode (ZooKeeper answers each session's requests in order).
const READ_BATCH: usize = 2000;

fn read_many(store: &ZnodeStore, paths: &[String]) -> Result<Vec<Option<(String, i32)>>, StoreError> {
    let mut out = Vec::with_capacity(paths.len());
    for chunk in paths.chunks(READ_BATCH) {
        out.extend(store.get_many_versioned(chunk)?);
    }
    Ok(out)
}

/// The broker's metadata watcher: follows the ZooKeeper tree (who the controller is, topic
/// configs, dynamic configs, quotas, credentials, ACLs, features, and on the controller the
/// whole topic and partition tree), publishes what it reads to the metadata cache, then tells
/// the subscribers. It also applies the controller's UpdateMetadata to the cache, and keeps
/// this broker's epoch (the czxid of its registration).
pub struct ZkSync {
    store: Arc<ZnodeStore>,
    cache: Arc<MetadataCache>,
    broker_id: i32,
    /// Brokers are reached, and so listed, on the inter-broker listener.
    inter_broker_listener: String,
    /// `leader.imbalance.check.interval.seconds`.
    imbalance_check_interval: Duration,
    /// The czxid of this broker's registration, renewed with each ZooKeeper session.
    broker_epoch: AtomicI64,
    controller: OnceLock<Arc<dyn ControllerRole>>,
    subscribers: RwLock<Subscribers>,
}

impl ZkSync {
    pub fn new(config: &BrokerConfig, store: Arc<ZnodeStore>, cache: Arc<MetadataCache>) -> Arc<ZkSync> {
        let check_every = config
            .values
            .get("leader.imbalance.check.interval.seconds")
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(300)
            .max(1);
        Arc::new(ZkSync {
            store,
            cache,
            broker_id: config.broker_id,
            inter_broker_listener: config.inter_broker_listener.clone(),
            imbalance_check_interval: Duration::from_secs(check_every),
            broker_epoch: AtomicI64::new(-1),
            controller: OnceLock::new(),
            subscribers: RwLock::new(Subscribers::default()),
        })
    }

    /// Adds a component told of every change from now on, after those already subscribed.
    pub fn subscribe(&self, listener: Arc<dyn MetadataListener>) {
        self.subscribers.write_unpoisoned().0.push(listener);
    }

    /// Wires the controller in, once, before the first pass.
    pub fn set_controller(&self, controller: Arc<dyn ControllerRole>) {
        let _ = self.controller.set(controller);
    }

    /// A copy, so that no lock is held while the subscribers run.
    fn subscribers(&self) -> Subscribers {
        self.subscribers.read_unpoisoned().clone()
    }

    fn controller(&self) -> Option<&Arc<dyn ControllerRole>> {
        self.controller.get()
    }

    fn is_controller(&self) -> bool {
        self.controller().is_some_and(|c| c.is_active())
    }

    pub fn broker_epoch(&self) -> i64 {
        self.broker_epoch.load(Ordering::Acquire)
    }

    /// Reads this broker's broker epoch (the czxid of its registration) after registering.
    pub fn refresh_broker_epoch(&self) -> Result<(), StoreError> {
        if let Some((_, czxid)) = self.store.get_with_czxid(&zk_data::broker_path(self.broker_id))? {
            self.broker_epoch.store(czxid, Ordering::Release);
        }
        Ok(())
    }

    /// Brings this broker's metadata image up to date with the controller's UpdateMetadata
    /// (see [`super::update_metadata::update_metadata`]), then tells the subscribers.
    pub fn update_metadata(&self, req: &UpdateMetadataRequest) -> UpdateMetadataResponse {
        super::update_metadata::update_metadata(
            &self.cache,
            &self.store,
            &self.inter_broker_listener,
            req,
            &self.subscribers(),
        )
    }

    /// A full pass: reads everything (at start, after a new session, after a failed pass).
    pub fn reconcile(&self) -> Result<(), StoreError> {
        self.reconcile_changes(None)
    }

    /// Reads what `changes` names (everything if None), publishes it to the metadata cache,
    /// tells the subscribers, and, if this broker is the controller, hands it the pass. Work is
    /// proportional to what changed.
    pub fn reconcile_changes(&self, changes: Option<&Changes>) -> Result<(), StoreError> {
        let subscribers = self.subscribers();
        if changes.is_none() {
            // A new session means a new registration, and with it a new broker epoch.
            self.refresh_broker_epoch()?;
        }
        tell_what_changed(&subscribers, changes)?;
        let was_controller = self.is_controller();
        let previous = self.cache.snapshot();
        let mut controller = (previous.controller_id >= 0).then_some(previous.controller_id);
        if changes.is_none_or(|c| c.controller || c.brokers) {
            controller = self.follow_controller()?;
        }
        let role = match self.controller().filter(|c| c.is_active()) {
            Some(role) => role.clone(),
            None => {
                // Everything else a broker knows comes from the controller's requests; of the
                // tree it follows only who the controller is and the topic configs.
                self.cache.update(|c| c.controller_id = controller.unwrap_or(-1));
                match changes {
                    Some(c) => self.reload_topic_configs(&c.topics, &subscribers)?,
                    // Notifications may have been missed (a new session, a failed pass): every
                    // topic's configs are read again, or a change made meanwhile is never seen.
                    None => {
                        let known: BTreeSet<String> = self.cache.snapshot().topics.keys().cloned().collect();
                        self.reload_topic_configs(&known, &subscribers)?;
                    }
                }
                return Ok(());
            }
        };
        // A new controller starts from the whole tree, as Kafka's loads it when elected.
        let changes = if was_controller { changes } else { None };
        let brokers = match changes {
            Some(c) if !c.brokers => None,
            _ => Some(self.read_brokers()?),
        };
        let brokers_read = brokers.is_some();
        let live: BTreeSet<i32> = brokers.as_ref().unwrap_or(&previous.brokers).iter().map(|b| b.id).collect();
        role.on_live_brokers(&live);

        // What this pass read, merged into the image at the end against what the image holds
        // then: topics created and ISRs changed by this controller meanwhile must survive a
        // pass that read the tree a moment before.
        let scope = match changes {
            None => {
                self.publish_tree(brokers, controller, &previous)?;
                None
            }
            Some(changed) => {
                self.publish_changes(changed, brokers, controller)?;
                Some(changed)
            }
        };
        if let Some(c) = scope {
            // Configs changed by others are applied to this broker's own logs here.
            let topics = self.cache.snapshot().topics.clone();
            tell_config_changes(&subscribers, &previous.topics, &topics, &c.topics);
        }
        role.on_metadata_read(&live, brokers_read, scope)
    }

    /// A full pass on the controller: the whole topic tree read, and merged into the cache
    /// with the topics this controller created since `previous` was taken.
    fn publish_tree(
        &self,
        brokers: Option<Vec<BrokerInfo>>,
        controller: Option<i32>,
        previous: &ClusterSnapshot,
    ) -> Result<(), StoreError> {
        let store = &self.store;
        let names = store.try_children(zk_data::BROKER_TOPICS)?;
        let read: BTreeMap<String, Arc<TopicInfo>> =
            names.iter().zip(self.read_topics(&names)?).filter_map(|(n, t)| Some((n.clone(), t?))).collect();
        self.cache.update(|c| {
            if let Some(b) = brokers {
                c.brokers = b;
            }
            c.controller_id = controller.unwrap_or(-1);
            let published: Vec<(String, Arc<TopicInfo>)> = c
                .topics
                .iter()
                .filter(|(n, _)| !previous.topics.contains_key(*n) && !read.contains_key(*n))
                .map(|(n, t)| (n.clone(), t.clone()))
                .collect();
            let mut next = BTreeMap::new();
            for (name, info) in read {
                let info = keep_published_states(info, c.topics.get(&name));
                next.insert(name, info);
            }
            next.extend(published);
            c.topics = next;
        });
        Ok(())
    }

    /// A pass on the controller over what changed: the named topics read whole, the named
    /// partition states read alone.
    fn publish_changes(
        &self,
        changed: &Changes,
        brokers: Option<Vec<BrokerInfo>>,
        controller: Option<i32>,
    ) -> Result<(), StoreError> {
        let store = &self.store;
        let names: Vec<String> = changed.topics.iter().cloned().collect();
        let read = self.read_topics(&names)?;
        let wanted: Vec<(&String, i32)> =
            changed.partitions.iter().flat_map(|(name, parts)| parts.iter().map(move |&p| (name, p))).collect();
        let paths: Vec<String> = wanted.iter().map(|(t, p)| zk_data::partition_state_path(t, *p)).collect();
        let states: BTreeMap<(&String, i32), Option<(String, i32)>> =
            wanted.iter().copied().zip(read_many(store, &paths)?).collect();
        self.cache.update(|c| {
            if let Some(b) = brokers {
                c.brokers = b;
            }
            c.controller_id = controller.unwrap_or(-1);
            for (name, info) in names.iter().zip(read) {
                match info {
                    Some(info) => {
                        let info = keep_published_states(info, c.topics.get(name));
                        c.topics.insert(name.clone(), info);
                    }
                    None => {
                        c.topics.remove(name);
                    }
                }
            }
            for (name, parts) in &changed.partitions {
                let Some(old) = c.topics.get(name) else { continue };
                let mut next = (**old).clone();
                for p in next.partitions.iter_mut().filter(|p| parts.contains(&p.index)) {
                    let Some(data) = states.get(&(name, p.index)) else { continue };
                    let mut fresh = partition_info(data.as_ref(), p.index, &p.replicas, None);
                    fresh.adding_replicas = p.adding_replicas.clone();
                    fresh.removing_replicas = p.removing_replicas.clone();
                    // A state this controller already wrote and applied is not undone
                    // by a read from before it.
                    if (fresh.leader_epoch, fresh.partition_epoch) >= (p.leader_epoch, p.partition_epoch) {
                        *p = fresh;
                    }
                }
                c.topics.insert(name.clone(), Arc::new(next));
            }
        });
        Ok(())
    }

    /// Who holds `/controller` now; if nobody does, this broker tries to be elected. A
    /// controller that finds another elected resigns.
    fn follow_controller(&self) -> Result<Option<i32>, StoreError> {
        let controller_of =
            |d: &str| serde_json::from_str::<Value>(d).ok().and_then(|v| v.get("brokerid")?.as_i64()).map(|i| i as i32);
        let mut controller = self.store.try_get(zk_data::CONTROLLER)?.as_deref().and_then(controller_of);
        if controller.is_none() {
            if let Some(role) = self.controller() {
                if role.try_elect()? {
                    controller = Some(self.broker_id);
                }
            }
        }
        if controller != Some(self.broker_id) && self.is_controller() {
            tracing::warn!("no longer the controller");
            if let Some(role) = self.controller() {
                role.resign();
            }
        }
        Ok(controller)
    }

    /// Non-controller: re-reads the configs of the named topics this broker knows.
    fn reload_topic_configs(&self, names: &BTreeSet<String>, subscribers: &Subscribers) -> Result<(), StoreError> {
        let before = self.cache.snapshot();
        let known: Vec<String> = names.iter().filter(|n| before.topics.contains_key(*n)).cloned().collect();
        if known.is_empty() {
            return Ok(());
        }
        // A failed read fails the pass, which is then retried from the top: the configs in the
        // cache stay as they were rather than fall back to the broker's defaults.
        let configs = try_read_topic_configs(&self.store, &known)?;
        self.cache.update(|c| {
            for (name, conf) in &configs {
                if let Some(t) = c.topics.get(name).filter(|t| t.configs != *conf) {
                    let mut next = (**t).clone();
                    next.configs = conf.clone();
                    c.topics.insert(name.clone(), Arc::new(next));
                }
            }
        });
        let after = self.cache.snapshot();
        tell_config_changes(subscribers, &before.topics, &after.topics, names);
        Ok(())
    }

    fn read_brokers(&self) -> Result<Vec<BrokerInfo>, StoreError> {
        let listener = &self.inter_broker_listener;
        let mut brokers = Vec::new();
        for child in self.store.try_children(zk_data::BROKER_IDS)? {
            let Ok(id) = child.parse::<i32>() else { continue };
            let Some((data, epoch)) = self.store.get_with_czxid(&zk_data::broker_path(id))? else { continue };
            match parse_broker(id, &data, listener, epoch) {
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
            let Some((assignment, id, moving)) = zk_data::parse_topic_json_moving(&data) else {
                tracing::warn!(topic = %name, "topic znode gregor does not understand; skipped");
                parsed.push(None);
                continue;
            };
            let id = match id {
                Some(id) => id,
                // A topic written by hand (as old tools did) gets its id from the controller.
                None if self.is_controller() => {
                    let id = zk_data::new_kafka_uuid();
                    store.set(&zk_data::topic_path(name), &zk_data::topic_json_moving(&assignment, id, &moving))?;
                    id
                }
                None => {
                    parsed.push(None);
                    continue;
                }
            };
            let configs = config.map(|(d, _)| zk_data::parse_topic_config(&d)).unwrap_or_default();
            parsed.push(Some((name, assignment, id, configs, moving)));
        }
        let state_paths: Vec<String> = parsed
            .iter()
            .flatten()
            .flat_map(|(name, assignment, _, _, _)| assignment.keys().map(|&p| zk_data::partition_state_path(name, p)))
            .collect();
        let mut states = read_many(store, &state_paths)?.into_iter();
        Ok(parsed
            .into_iter()
            .map(|t| {
                let (name, assignment, id, configs, moving) = t?;
                let partitions = assignment
                    .iter()
                    .map(|(&p, replicas)| partition_info(states.next().flatten().as_ref(), p, replicas, moving.get(&p)))
                    .collect();
                Some(Arc::new(TopicInfo { name: name.clone(), id, partitions, configs }))
            })
            .collect())
    }

    /// Re-runs [`ZkSync::reconcile_changes`] whenever ZooKeeper reports a change (ZooKeeper
    /// mode only).
    pub fn spawn(self: &Arc<Self>) {
        let ZnodeStore::ZooKeeper(zk) = &*self.store else { return };
        let mut changes = zk.changes();
        let mut sessions = zk.sessions();
        let sync = self.clone();
        // A controller whose session ended must stop acting at once: another broker may be
        // elected before this one hears anything more from ZooKeeper.
        tokio::spawn(async move {
            while sessions.changed().await.is_ok() {
                let event = *sessions.borrow_and_update();
                if !event.live && sync.is_controller() {
                    tracing::warn!("ZooKeeper session lost: resigning as controller");
                    if let Some(role) = sync.controller() {
                        role.resign();
                    }
                    sync.cache.update(|c| c.controller_id = -1);
                }
            }
        });
        let sync = self.clone();
        tokio::spawn(async move {
            let mut imbalance_check = tokio::time::interval(sync.imbalance_check_interval);
            imbalance_check.tick().await;
            loop {
                tokio::select! {
                    changed = changes.changed() => if changed.is_err() { return },
                    _ = imbalance_check.tick() => if let Some(role) = sync.controller() {
                        role.request_preferred_election();
                    },
                }
                loop {
                    let s = sync.clone();
                    let result = tokio::task::spawn_blocking(move || {
                        let ZnodeStore::ZooKeeper(zk) = &*s.store else { return Ok(()) };
                        let dirty = zk.take_dirty();
                        let preferred = s.controller().is_some_and(|c| c.take_preferred_election());
                        let result = if dirty.full {
                            s.reconcile()
                        } else if dirty.paths.is_empty() {
                            Ok(())
                        } else {
                            s.reconcile_changes(Some(&Changes::from_paths(&dirty.paths)))
                        };
                        let result =
                            result.and_then(|()| match s.controller().filter(|c| preferred && c.is_active()) {
                                Some(role) => role.preferred_elections(),
                                None => Ok(()),
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

/// Tells the subscribers what the pass saw change outside the topic tree (everything if
/// `changes` is None), in a fixed order.
fn tell_what_changed(subscribers: &Subscribers, changes: Option<&Changes>) -> Result<(), StoreError> {
    if changes.is_none_or(|c| c.broker_configs) {
        subscribers.on_broker_configs_changed()?;
    }
    if changes.is_none_or(|c| c.quotas) {
        subscribers.on_client_quotas_changed()?;
    }
    if changes.is_none_or(|c| c.client_metrics) {
        subscribers.on_client_metrics_changed()?;
    }
    if changes.is_none_or(|c| c.feature) {
        subscribers.on_features_changed()?;
    }
    match changes {
        None => subscribers.on_group_configs_changed(None)?,
        Some(c) if !c.group_configs.is_empty() => subscribers.on_group_configs_changed(Some(&c.group_configs))?,
        Some(_) => {}
    }
    if changes.is_none_or(|c| c.config_changes) {
        subscribers.on_config_change_notification();
    }
    subscribers.on_credentials_changed(changes.map(|c| &c.users))?;
    subscribers.on_acl_changes(changes.map(|c| &c.acl_changes))
}

/// Tells the subscribers which of `names` have other overrides in `now` than in `before`.
fn tell_config_changes(
    subscribers: &Subscribers,
    before: &BTreeMap<String, Arc<TopicInfo>>,
    now: &BTreeMap<String, Arc<TopicInfo>>,
    names: &BTreeSet<String>,
) {
    let changed: Vec<Arc<TopicInfo>> = names
        .iter()
        .filter_map(|name| match (before.get(name), now.get(name)) {
            (Some(b), Some(t)) if b.configs != t.configs => Some(t.clone()),
            _ => None,
        })
        .collect();
    if !changed.is_empty() {
        subscribers.on_topic_configs_changed(&changed);
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
            "/kafka-acl-changes/acl_changes_0000000003",
            "/kafka-acl-changes",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let c = Changes::from_paths(&paths);
        assert!(c.brokers && c.admin && !c.controller && !c.log_dir_events);
        let dir_event = ["/log_dir_event_notification/log_dir_event_0000000004".to_string()];
        assert!(Changes::from_paths(&dir_event).log_dir_events);
        assert_eq!(
            c.acl_changes.iter().map(String::as_str).collect::<Vec<_>>(),
            ["/kafka-acl-changes/acl_changes_0000000003"]
        );
        assert_eq!(c.topics.iter().map(String::as_str).collect::<Vec<_>>(), ["a", "c"]);
        // Topic a is read whole, so its partition event adds nothing; b's two states are read.
        assert_eq!(c.partitions.len(), 1);
        assert_eq!(c.partitions["b"].iter().copied().collect::<Vec<_>>(), [3, 4]);
        let only_controller = Changes::from_paths(&["/controller".to_string()]);
        assert!(only_controller.controller && !only_controller.brokers && only_controller.topics.is_empty());
        assert!(!c.feature && Changes::from_paths(&["/feature".to_string()]).feature);
        assert!(c.client_metrics, "a change notification may name a client-metrics subscription");
        assert!(Changes::from_paths(&["/config/client-metrics/s".to_string()]).client_metrics);
        let groups = Changes::from_paths(&["/config/groups/g1".to_string()]).group_configs;
        assert_eq!(groups.into_iter().collect::<Vec<_>>(), vec!["g1".to_string()]);
    }
}
