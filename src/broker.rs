//! The broker process: its shared state, startup and clean shutdown (Kafka's `KafkaServer`).
//!
//! Startup order: log dirs (recovery), the znode store, cluster id and broker registration,
//! topics from the store, then the listeners. Shutdown reverses it and ends by writing the
//! clean-shutdown marker so the next start skips recovery.

use std::sync::Arc;
use std::time::Duration;

use crate::config::BrokerConfig;
use crate::controller::Controller;
use crate::group::service::GroupServiceHandles;
use crate::group::{GroupCoordinatorService, OFFSETS_TOPIC};
use crate::log::LogManager;
use crate::metadata::zk_store::ZkStore;
use crate::metadata::{
    zk_data, BrokerInfo, EmbeddedStore, MetadataCache, MetadataListener, StoreError, ZkSync, ZnodeStore,
};
use crate::metrics::BrokerMetrics;
use crate::protocol::internal_topics::TRANSACTION_STATE_TOPIC;
use crate::protocol::ErrorCode;
use crate::replication::alter_partition::ControllerGateway;
use crate::replication::{LeadershipListener, ReplicaHandles, ReplicaManager, TopicPartition};
use crate::txn::{ProducerIdManager, TransactionHandles, TransactionService};

/// Where the embedded store keeps the znode tree, inside the first log dir.
const EMBEDDED_STORE_FILE: &str = "gregor-metadata.json";

mod group_links;
mod txn_links;
pub(crate) use group_links::{OffsetsLink, OffsetsTopicLink, StoreLink, TopicsLink};
use txn_links::{MarkerLink, TopicCreatorLink};

const CONTROLLED_SHUTDOWN_VERSION: i16 = 3;

pub struct Broker {
    /// The static configuration; what is in force is `effective_config()`.
    pub config: BrokerConfig,
    pub dynamic: Arc<crate::dynamic_config::DynamicConfigs>,
    pub cache: Arc<MetadataCache>,
    pub store: Arc<ZnodeStore>,
    /// The replicas hosted here, their fetchers, and the ISR writer.
    pub replicas: Arc<ReplicaManager>,
    /// The group coordinator and what it does on this broker.
    pub groups: Arc<GroupCoordinatorService>,
    /// Producer ids and transactions.
    pub txn: Arc<TransactionService>,
    /// Client quotas from `/config/users` and `/config/clients`, and their byte counts.
    pub quotas: Arc<crate::client_quota::ClientQuotas>,
    pub metrics: BrokerMetrics,
    /// `queued.max.requests`: one permit per request being decoded and handled.
    pub request_slots: Arc<tokio::sync::Semaphore>,
    /// `num.io.threads`: where produce appends and fetch reads touch the disk.
    pub io: Arc<crate::io_pool::IoPool>,
    /// The controller's state and operations; active only while this broker is the controller.
    pub controller: Arc<Controller>,
    /// Follows the ZooKeeper tree into the metadata cache and tells the components; applies
    /// UpdateMetadata.
    pub zk_sync: Arc<ZkSync>,
    /// For the few places that hold `&Broker` and must start tasks that keep it.
    self_ref: std::sync::OnceLock<std::sync::Weak<Broker>>,
    /// The log cleaner, once the log tasks are started.
    pub cleaner: std::sync::OnceLock<Arc<crate::log::cleaner::LogCleaner>>,
    /// Each listener's TLS and SASL settings, and the SCRAM credentials.
    pub security: Arc<crate::security::Security>,
}

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

impl Broker {
    pub async fn start(mut config: BrokerConfig) -> anyhow::Result<Arc<Broker>> {
        // First: a listener that cannot be secured as configured stops the broker before it
        // touches its data or registers.
        let security = Arc::new(crate::security::Security::from_config(&config)?);
        for dir in &config.log_dirs {
            std::fs::create_dir_all(dir)
                .map_err(|e| anyhow::anyhow!("cannot create log dir {}: {e}", dir.display()))?;
        }
        let (dirs, defaults) = (config.log_dirs.clone(), config.log.clone());
        let logs = tokio::task::spawn_blocking(move || LogManager::open(dirs, defaults))
            .await?
            .map_err(|e| anyhow::anyhow!("cannot open log dirs: {e}"))?;
        let store = match &config.zookeeper_connect {
            Some(connect) => ZnodeStore::ZooKeeper(ZkStore::connect(
                connect,
                Duration::from_millis(config.zookeeper_session_timeout_ms),
                Duration::from_millis(config.zookeeper_connection_timeout_ms),
            )?),
            None => ZnodeStore::Embedded(EmbeddedStore::open(config.log_dirs[0].join(EMBEDDED_STORE_FILE))?),
        };
        let store = Arc::new(store);
        for path in zk_data::TOP_LEVEL_PATHS {
            match store.create(path, "", false) {
                Ok(()) | Err(StoreError::NodeExists(_)) => {}
                Err(e) => return Err(anyhow::anyhow!("cannot create {path}: {e}")),
            }
        }
        security.scram.load_all(&store).map_err(|e| anyhow::anyhow!("cannot read SCRAM credentials: {e}"))?;
        if let Some(authorizer) = &security.authorizer {
            for path in crate::security::authorizer::ROOT_PATHS {
                match store.create(path, "", false) {
                    Ok(()) | Err(StoreError::NodeExists(_)) => {}
                    Err(e) => return Err(anyhow::anyhow!("cannot create {path}: {e}")),
                }
            }
            authorizer.load_all(&store).map_err(|e| anyhow::anyhow!("cannot read ACLs: {e}"))?;
        }

        let cluster_id = match store.try_get(zk_data::CLUSTER_ID)?.and_then(|d| zk_data::parse_cluster_id(&d)) {
            Some(id) => id,
            None => {
                let id = zk_data::uuid_to_kafka(zk_data::new_kafka_uuid());
                match store.create(zk_data::CLUSTER_ID, &zk_data::cluster_id_json(&id), false) {
                    Ok(()) => id,
                    // Another broker created it first: use theirs.
                    Err(StoreError::NodeExists(_)) => store
                        .try_get(zk_data::CLUSTER_ID)?
                        .and_then(|d| zk_data::parse_cluster_id(&d))
                        .ok_or_else(|| anyhow::anyhow!("unreadable {}", zk_data::CLUSTER_ID))?,
                    Err(e) => return Err(e.into()),
                }
            }
        };
        config.broker_id = resolve_broker_id(&config, &store)?;
        write_meta_properties(&config, &cluster_id)?;
        let id = config.broker_id;
        register(&config, &store).await?;

        let cache = Arc::new(MetadataCache::default());
        let me: Vec<BrokerInfo> = config
            .advertised_listeners
            .first()
            .map(|e| BrokerInfo {
                id,
                host: e.host.clone(),
                port: e.port,
                rack: config.rack.clone(),
                epoch: -1,
                endpoints: config.advertised_listeners.clone(),
            })
            .into_iter()
            .collect();
        cache.update(|c| {
            c.cluster_id = cluster_id.clone();
            c.controller_id = -1;
            c.brokers = me;
        });

        let dynamic = Arc::new(crate::dynamic_config::DynamicConfigs::new(&config, store.clone()));
        let metrics = BrokerMetrics::new().map_err(|e| anyhow::anyhow!("cannot set up metrics: {e}"))?;
        let handles = ReplicaHandles {
            config: Arc::new(config.clone()),
            effective: {
                let dynamic = dynamic.clone();
                Arc::new(move || dynamic.effective())
            },
            cache: cache.clone(),
            store: store.clone(),
            inter_broker: security.inter_broker.clone(),
        };
        let controller = Controller::new(config.clone(), store.clone(), cache.clone(), security.inter_broker.clone())
            .map_err(|e| anyhow::anyhow!("cannot start the controller: {e}"))?;
        let replicas = Arc::new(ReplicaManager::new(logs, metrics.topics.clone(), metrics.isr.clone(), handles));
        let io = Arc::new(crate::io_pool::IoPool::new(
            config.num_io_threads,
            config.log_dirs.len(),
            metrics.io_jobs.clone(),
            metrics.io_threads.clone(),
        ));
        let groups = Arc::new(GroupCoordinatorService::new(GroupServiceHandles {
            broker_id: id,
            coordinator: crate::config::coordinator_config(&config)?,
            partitions: Arc::new(OffsetsLink { me: id, cache: cache.clone(), replicas: replicas.clone() }),
            creator: Arc::new(OffsetsTopicLink(controller.clone())),
            znodes: Arc::new(StoreLink(store.clone())),
            io: io.clone(),
            offsets_zk_mirror_interval: config.offsets_zk_mirror_interval,
            offsets_zk_mirror_max_writes: config.offsets_zk_mirror_max_writes,
            consumer: crate::config::consumer_group_config(&config)?,
            topics: Arc::new(TopicsLink(cache.clone())),
        }));
        // The group coordinator is not built yet: markers reach it through the broker.
        let markers = Arc::new(MarkerLink(std::sync::OnceLock::new()));
        let txn = TransactionService::new(TransactionHandles {
            coordinator: crate::txn::TransactionCoordinator::new(crate::config::txn_config(&config)?),
            producer_ids: ProducerIdManager::new(id, store.clone()),
            config: Arc::new(config.clone()),
            cache: cache.clone(),
            store: store.clone(),
            partitions: replicas.clone(),
            io: io.clone(),
            inter_broker: security.inter_broker.clone(),
            topic_creator: Arc::new(TopicCreatorLink(controller.clone())),
            markers: markers.clone(),
        });
        let zk_sync = ZkSync::new(&config, store.clone(), cache.clone());
        let broker = Arc::new(Broker {
            controller,
            replicas,
            io,
            groups,
            txn,
            metrics,
            request_slots: Arc::new(tokio::sync::Semaphore::new(
                config.queued_max_requests.min(tokio::sync::Semaphore::MAX_PERMITS),
            )),
            quotas: Arc::new(crate::client_quota::ClientQuotas::new(store.clone(), &config)),
            dynamic,
            config,
            cache,
            store,
            zk_sync,
            self_ref: std::sync::OnceLock::new(),
            cleaner: std::sync::OnceLock::new(),
            security,
        });
        let _ = broker.self_ref.set(Arc::downgrade(&broker));
        let _ = markers.0.set(Arc::downgrade(&broker));
        let local: std::sync::Weak<dyn crate::controller::LocalBroker> = Arc::downgrade(&broker) as _;
        broker.controller.attach(local);
        broker.replicas.set_leadership_listener(Arc::new(BrokerLink(Arc::downgrade(&broker))));
        broker.subscribe_to_metadata();
        broker.subscribe_to_dynamic_configs();
        broker.dynamic.reload().map_err(|e| anyhow::anyhow!("cannot read dynamic broker configs: {e}"))?;
        broker.quotas.reload_client_quotas().map_err(|e| anyhow::anyhow!("cannot read client quotas: {e}"))?;
        if broker.store.is_zookeeper() {
            broker.zk_sync.reconcile().map_err(|e| anyhow::anyhow!("cannot read cluster state from ZooKeeper: {e}"))?;
        } else {
            broker.controller.try_become_controller()?;
            broker.controller.load_topics().map_err(|e| anyhow::anyhow!("cannot load topics: {e}"))?;
        }
        if !broker.store.is_zookeeper() {
            // In ZooKeeper mode each offsets partition is loaded as this broker takes it over.
            broker.groups.load_groups(None);
            broker.txn.load_txns(None);
        }
        tracing::info!(broker_id = id, cluster_id = %cluster_id, zookeeper = broker.store.is_zookeeper(), "broker started");
        Ok(broker)
    }

    pub fn arc(&self) -> Option<Arc<Broker>> {
        self.self_ref.get().and_then(std::sync::Weak::upgrade)
    }

    /// The leader of `key`'s partition of the internal topic `topic` (`__consumer_offsets`
    /// for groups, `__transaction_state` for transactional ids), with its address on
    /// `listener`.
    pub(crate) fn coordinator_in(&self, topic: &str, key: &str, listener: &str) -> Result<(i32, String, u16), i16> {
        let topic = self.cache.topic(topic).ok_or(ErrorCode::CoordinatorNotAvailable.code())?;
        let p = crate::group::partition_for(key, topic.partitions.len() as i32);
        let leader = topic
            .partitions
            .iter()
            .find(|x| x.index == p)
            .map(|x| x.leader)
            .ok_or(ErrorCode::CoordinatorNotAvailable.code())?;
        if leader < 0 {
            return Err(ErrorCode::CoordinatorNotAvailable.code());
        }
        if leader == self.config.broker_id {
            // Named leader but the partition not yet open or its groups still loading: a
            // client sent here now would get COORDINATOR_LOAD_IN_PROGRESS from its first commit,
            // which librdkafka's synchronous commit hands to the application. Not available
            // keeps it asking FindCoordinator, which it retries by itself.
            let loading = topic.name == OFFSETS_TOPIC && self.groups.is_loading(p);
            if loading || self.replicas.partition(&topic.name, p).is_none() {
                return Err(ErrorCode::CoordinatorNotAvailable.code());
            }
            let ep = self.config.advertised_for(listener).ok_or(ErrorCode::CoordinatorNotAvailable.code())?;
            return Ok((leader, ep.host.clone(), ep.port));
        }
        let snapshot = self.cache.snapshot();
        let b = snapshot.brokers.iter().find(|b| b.id == leader).ok_or(ErrorCode::CoordinatorNotAvailable.code())?;
        let (host, port) = b.endpoint_for(listener).ok_or(ErrorCode::CoordinatorNotAvailable.code())?;
        Ok((b.id, host.to_string(), port))
    }

    /// FindCoordinator for a group: the leader of its `__consumer_offsets` partition,
    /// creating the topic on first use as Kafka does.
    pub fn group_coordinator_for(&self, group: &str, listener: &str) -> Result<(i32, String, u16), i16> {
        self.groups.ensure_offsets_topic()?;
        self.coordinator_in(OFFSETS_TOPIC, group, listener)
    }

    /// Where the controller and the metadata sync report deleted partitions.
    pub fn on_partitions_deleted(&self, deleted: &[(String, i32)]) {
        self.groups.on_partitions_deleted(deleted);
    }

    pub fn broker_epoch(&self) -> i64 {
        self.zk_sync.broker_epoch()
    }

    /// Who follows the metadata, in the order a pass tells them (each event has one
    /// subscriber, so the order is the pass's): dynamic configs, client quotas, features,
    /// credentials and ACLs, the replica manager's logs and waiters, and the group
    /// coordinator's offsets of deleted partitions. The controller is also its role.
    fn subscribe_to_metadata(self: &Arc<Self>) {
        let sync = &self.zk_sync;
        sync.set_controller(self.controller.clone());
        sync.subscribe(self.dynamic.clone());
        sync.subscribe(self.quotas.clone());
        sync.subscribe(self.controller.clone());
        sync.subscribe(Arc::new(crate::security::SecurityListener {
            security: self.security.clone(),
            store: self.store.clone(),
        }));
        sync.subscribe(self.replicas.clone());
        sync.subscribe(Arc::new(BrokerLink(Arc::downgrade(self))));
    }

    /// Fencing of a controller request, as Kafka checks it: an older controller epoch than
    /// one already seen, or a broker epoch from before this broker's current registration.
    pub fn check_controller_request(&self, controller_epoch: i32, broker_epoch: i64) -> Result<(), ErrorCode> {
        self.replicas.check_controller_request(controller_epoch, broker_epoch, self.broker_epoch())
    }

    /// The state the metrics scrape reports. Each partition's replica state is read under its
    /// own lock, one partition at a time, and logs through their published stats, so a scrape
    /// of thousands of partitions never holds a lock a request waits for while it formats,
    /// nor waits for an append, nor touches the disk.
    pub fn metrics_sample(&self) -> crate::metrics::StateSample {
        use crate::metrics::{PartitionSample, StateSample, ZooKeeperSample};
        let snapshot = self.cache.snapshot();
        let default_min_isr = self.effective_config().min_insync_replicas.max(1) as usize;
        let partitions = self
            .replicas
            .all_partitions()
            .iter()
            .map(|p| {
                let counts = p.replica_counts();
                let log = p.log_stats();
                let min_isr = snapshot
                    .topics
                    .get(&p.topic)
                    .and_then(|t| t.configs.get("min.insync.replicas"))
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(default_min_isr);
                PartitionSample {
                    topic: p.topic.clone(),
                    partition: p.index,
                    leader: counts.leader,
                    replicas: counts.replicas,
                    isr: counts.isr,
                    min_isr,
                    size_bytes: log.size_bytes(),
                    log_start_offset: log.log_start_offset(),
                    log_end_offset: log.log_end_offset(),
                    segments: log.segments(),
                }
            })
            .collect();
        let active_controller = self.controller.is_controller();
        let (mut offline_partitions, mut global_partitions, mut global_topics) = (0, 0, 0);
        if active_controller {
            // Kafka's controller counts these; other brokers report 0.
            let live: std::collections::HashSet<i32> = snapshot.brokers.iter().map(|b| b.id).collect();
            for t in snapshot.topics.values() {
                let deleting =
                    t.partitions.iter().any(|p| p.leader == crate::replication::control::LEADER_DURING_DELETE);
                if deleting {
                    continue;
                }
                global_topics += 1;
                global_partitions += t.partitions.len() as u64;
                offline_partitions += t.partitions.iter().filter(|p| !live.contains(&p.leader)).count() as u64;
            }
        }
        let zookeeper = match &*self.store {
            ZnodeStore::ZooKeeper(zk) => {
                let (connected, expired_sessions) = zk.session_status();
                Some(ZooKeeperSample { connected, expired_sessions })
            }
            ZnodeStore::Embedded(_) => None,
        };
        let (controller_events_queued, controller_events_processed) = self.controller.event_counts();
        StateSample {
            active_controller,
            partitions,
            offline_partitions,
            global_partitions,
            global_topics,
            controller_events_queued,
            controller_events_processed,
            zookeeper,
        }
    }

    /// Background duties Kafka's LogManager schedules: retention, flush, checkpoints.
    pub fn spawn_log_tasks(self: &Arc<Self>) {
        tokio::spawn(crate::replication::alter_log_dirs::run(self.replicas.clone()));
        self.replicas.spawn_log_dir_failure_handler();
        // The dynamic values read at startup count from the first pass.
        let cleaner = crate::log::cleaner::LogCleaner::start(
            self.replicas.logs_handle(),
            self.effective_config().cleaner.clone(),
        );
        let _ = self.cleaner.set(cleaner.clone());
        self.dynamic.subscribe(move |c| cleaner.reconfigure(c.cleaner.clone()));
        let b = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(b.config.log_retention_check_interval_ms));
            tick.tick().await;
            loop {
                tick.tick().await;
                let b2 = b.clone();
                let moved = tokio::task::spawn_blocking(move || b2.replicas.logs().run_retention(now_ms())).await;
                // Fetch sessions report the new log start offsets in their next answers.
                for (topic, index) in moved.unwrap_or_default() {
                    if let Some(p) = b.replicas.partition(&topic, index) {
                        p.wake();
                    }
                }
            }
        });
        let b = self.clone();
        tokio::spawn(async move {
            let mut tick =
                tokio::time::interval(Duration::from_millis(b.config.log_flush_offset_checkpoint_interval_ms));
            tick.tick().await;
            loop {
                tick.tick().await;
                let b2 = b.clone();
                let r = tokio::task::spawn_blocking(move || {
                    b2.replicas.logs().checkpoint().and_then(|_| b2.replicas.checkpoint_high_watermarks())
                })
                .await;
                if let Ok(Err(e)) = r {
                    tracing::warn!(error = %e, "writing checkpoints failed");
                }
            }
        });
        if self.config.log.flush_interval_ms != u64::MAX {
            let b = self.clone();
            let period = self.config.log_flush_scheduler_interval_ms.min(self.config.log.flush_interval_ms).max(1);
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_millis(period));
                loop {
                    tick.tick().await;
                    // Off the async workers: an fsync may stall for seconds on a slow disk, and
                    // a network worker waiting on it would stall every connection it serves.
                    let b2 = b.clone();
                    let _ = tokio::task::spawn_blocking(move || {
                        for p in b2.replicas.all_partitions() {
                            p.maybe_flush();
                        }
                    })
                    .await;
                }
            });
        }
    }

    /// Every `gregor.ssl.store.check.interval.ms` (30 s; 0: never), looks whether a TLS
    /// listener's keystore or truststore file changed and serves new connections with it, so
    /// a renewed certificate needs no restart.
    pub fn spawn_store_reload(self: &Arc<Self>) {
        let every = self.security.store_check_interval;
        if every.is_zero() || !self.security.has_tls() {
            return;
        }
        let broker = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            loop {
                tick.tick().await;
                let b = broker.clone();
                let _ = tokio::task::spawn_blocking(move || b.security.reload_changed_stores(&b.config.values)).await;
            }
        });
    }

    /// Starts the ISR writer, which reaches the controller in process when it is this broker.
    pub fn spawn_isr_writer(self: &Arc<Self>) {
        self.replicas.spawn_isr_writer(Arc::new(BrokerLink(Arc::downgrade(self))));
    }

    /// Drops followers that stopped keeping up (checked every replica.lag.time.max.ms / 2).
    pub fn spawn_isr_expiry(self: &Arc<Self>) {
        self.replicas.spawn_isr_expiry();
    }

    /// Controlled shutdown as Kafka does it: ask the controller (ControlledShutdown) to move
    /// every leadership this broker holds to another ISR member and take it out of the ISRs,
    /// keep serving until it has, and only then deregister. Retried as Kafka retries
    /// (`controlled.shutdown.max.retries`); a rolling restart then costs clients only
    /// retriable NOT_LEADER errors.
    pub async fn controlled_shutdown(self: &Arc<Self>) {
        let enabled = self.config.values.get("controlled.shutdown.enable").map(String::as_str) != Some("false");
        if !self.store.is_zookeeper() || !enabled {
            return;
        }
        let retries = self.config.controlled_shutdown_max_retries;
        let backoff = self.config.controlled_shutdown_retry_backoff;
        // A departing broker must not look like a caught-up follower.
        self.replicas.begin_shutdown();
        // Kafka spends at most `retries` backoffs waiting; gregor asks again sooner (below) but
        // gives up after the same time.
        let deadline = tokio::time::Instant::now() + backoff * retries;
        for attempt in 0..=retries {
            match self.ask_controlled_shutdown().await {
                Ok(0) => {
                    tracing::info!("controlled shutdown: leadership moved to other replicas");
                    return;
                }
                Ok(remaining) => tracing::info!(remaining, attempt, "controlled shutdown: partitions still led here"),
                Err(e) => tracing::info!(error = %e, attempt, "controlled shutdown request failed"),
            }
            if tokio::time::Instant::now() + backoff > deadline {
                break;
            }
            tokio::time::sleep(backoff.min(Duration::from_millis(500) * (attempt + 1))).await;
        }
        tracing::warn!("controlled shutdown did not complete; shutting down with leaderships still here");
    }

    /// One ControlledShutdown round trip; the number of partitions still led here.
    async fn ask_controlled_shutdown(self: &Arc<Self>) -> anyhow::Result<usize> {
        use crate::protocol::inter_broker::{ControlledShutdownRequest, ControlledShutdownResponse};
        let me = self.config.broker_id;
        let epoch = self.broker_epoch();
        let snapshot = self.cache.snapshot();
        let resp: ControlledShutdownResponse = if self.controller.is_controller() {
            let c = self.controller.clone();
            tokio::task::spawn_blocking(move || c.handle_controlled_shutdown(me, epoch)).await?
        } else {
            let target = snapshot
                .brokers
                .iter()
                .find(|b| b.id == snapshot.controller_id)
                .ok_or_else(|| anyhow::anyhow!("no controller known"))?;
            let client_id = format!("gregor-broker-{me}");
            let mut stream = self.security.inter_broker.connect(&target.host, target.port, &client_id).await?;
            let req = ControlledShutdownRequest { broker_id: me, broker_epoch: epoch };
            let call = crate::protocol::inter_broker::round_trip(
                &mut stream,
                1,
                &client_id,
                &req,
                CONTROLLED_SHUTDOWN_VERSION,
                self.config.socket_request_max_bytes,
            );
            tokio::time::timeout(self.security.inter_broker.request_timeout, call).await??
        };
        if resp.error_code != 0 {
            anyhow::bail!("controller answered error {}", resp.error_code);
        }
        Ok(resp.remaining_partitions.len())
    }

    /// The configuration in force: static values with the dynamic ones over them.
    pub fn effective_config(&self) -> Arc<BrokerConfig> {
        self.dynamic.effective()
    }

    /// What follows a change of the dynamic broker configs: the I/O pool's size and the open
    /// logs' topic defaults. (The cleaner and the listeners' limits subscribe as they start.)
    fn subscribe_to_dynamic_configs(self: &Arc<Self>) {
        let io = self.io.clone();
        self.dynamic.subscribe(move |c| io.resize(c.num_io_threads));
        let me = Arc::downgrade(self);
        self.dynamic.subscribe(move |c| {
            if let Some(b) = me.upgrade() {
                b.apply_topic_defaults(c);
            }
        });
    }

    fn apply_topic_defaults(&self, effective: &BrokerConfig) {
        let snapshot = self.cache.snapshot();
        for p in self.replicas.all_partitions() {
            let overrides = snapshot.topics.get(&p.topic).map(|t| t.configs.clone()).unwrap_or_default();
            match effective.log_config_for(&overrides) {
                Ok(c) => p.set_config(c),
                Err(e) => tracing::warn!(topic = %p.topic, error = %e, "invalid topic config; keeping the log's"),
            }
        }
    }

    pub fn shutdown(&self) {
        // Leaving /brokers/ids and /controller at once lets the others react now rather than
        // after the session timeout.
        let _ = self.store.delete_recursive(&zk_data::broker_path(self.config.broker_id));
        if self.controller.is_controller() {
            let _ = self.store.delete_recursive(zk_data::CONTROLLER);
        }
        if let Err(e) = self.replicas.checkpoint_high_watermarks() {
            tracing::warn!(error = %e, "cannot write high watermark checkpoint");
        }
        if let Some(c) = self.cleaner.get() {
            c.shutdown();
        }
        for p in self.replicas.all_partitions() {
            p.snapshot_producer_state();
        }
        match self.replicas.logs().shutdown() {
            Ok(()) => tracing::info!("logs flushed; clean shutdown recorded"),
            Err(e) => tracing::error!(error = %e, "log shutdown failed; the next start will run recovery"),
        }
    }
}

impl crate::controller::LocalBroker for Broker {
    fn become_leader_or_follower(
        &self,
        req: &crate::protocol::inter_broker::LeaderAndIsrRequest,
    ) -> crate::protocol::inter_broker::LeaderAndIsrResponse {
        self.replicas.become_leader_or_follower(req)
    }

    fn stop_replicas(&self, req: &crate::protocol::inter_broker::StopReplicaRequest) {
        self.replicas.stop_replicas(req);
    }

    fn make_leader(
        &self,
        topic: &str,
        partition: i32,
        topic_id: &str,
        config: crate::log::LogConfig,
    ) -> Result<(), crate::log::LogError> {
        self.replicas.make_leader(topic, partition, topic_id, config).map(|_| ())
    }

    fn remove_partition(&self, topic: &str, partition: i32) -> Result<(), crate::log::LogError> {
        self.replicas.remove_partition(topic, partition)
    }

    fn set_log_config(&self, topic: &str, partition: i32, config: crate::log::LogConfig) {
        if let Some(part) = self.replicas.partition(topic, partition) {
            part.set_config(config);
        }
    }

    fn on_partitions_deleted(&self, deleted: &[(String, i32)]) {
        Broker::on_partitions_deleted(self, deleted);
    }

    fn effective_config(&self) -> Arc<BrokerConfig> {
        Broker::effective_config(self)
    }

    fn saw_controller_epoch(&self, epoch: i32) {
        self.replicas.observe_controller_epoch(epoch);
    }
}

/// `broker.id`, or with `broker.id=-1` the id kept in meta.properties or a new one from
/// `/brokers/seqid` (its version plus `reserved.broker.max.id`), as Kafka does.
fn resolve_broker_id(config: &BrokerConfig, store: &ZnodeStore) -> anyhow::Result<i32> {
    if config.broker_id >= 0 {
        return Ok(config.broker_id);
    }
    for dir in &config.log_dirs {
        if let Ok(text) = std::fs::read_to_string(dir.join("meta.properties")) {
            if let Some(id) = crate::config::parse_properties(&text).get("broker.id").and_then(|v| v.parse().ok()) {
                return Ok(id);
            }
        }
    }
    let generation = config.values.get("broker.id.generation.enable").map(String::as_str) != Some("false");
    if !generation {
        anyhow::bail!("broker.id is -1 and broker.id.generation.enable is false");
    }
    let reserved: i32 = config.values.get("reserved.broker.max.id").and_then(|v| v.parse().ok()).unwrap_or(1000);
    let path = "/brokers/seqid";
    loop {
        let current = store.get_versioned(path)?;
        match current {
            None => match store.create(path, "", false) {
                Ok(()) | Err(StoreError::NodeExists(_)) => continue,
                Err(e) => return Err(e.into()),
            },
            Some((_, version)) => match store.set_if_version(path, "", version) {
                Ok(()) => return Ok(reserved + version + 1),
                Err(StoreError::BadVersion(_)) => continue,
                Err(e) => return Err(e.into()),
            },
        }
    }
}

/// Writes this broker's ephemeral `/brokers/ids/<id>`. A node left by a previous run of the
/// same broker disappears when its session expires, so that case is retried for one session
/// timeout; a live broker with the same id makes startup fail with Kafka's message.
async fn register(config: &BrokerConfig, store: &ZnodeStore) -> anyhow::Result<()> {
    let path = zk_data::broker_path(config.broker_id);
    let data = zk_data::broker_registration_json(&config.advertised_listeners, config.rack.as_deref(), now_ms());
    let give_up = tokio::time::Instant::now() + Duration::from_millis(config.zookeeper_session_timeout_ms + 2000);
    loop {
        match store.create(&path, &data, true) {
            Ok(()) => return Ok(()),
            Err(StoreError::NodeExists(_)) if store.is_zookeeper() && tokio::time::Instant::now() < give_up => {
                tracing::warn!(%path, "broker id is registered by another session; waiting for it to expire");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(StoreError::NodeExists(_)) => {
                anyhow::bail!(
                    "Error while creating ephemeral at {path}, node already exists and owner does not match current session: \
                     another broker is running with broker.id={}",
                    config.broker_id
                )
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// `meta.properties` in each log dir, as a ZooKeeper-mode Kafka writes it.
fn write_meta_properties(config: &BrokerConfig, cluster_id: &str) -> anyhow::Result<()> {
    for dir in &config.log_dirs {
        let path = dir.join("meta.properties");
        if let Ok(existing) = std::fs::read_to_string(&path) {
            let props = crate::config::parse_properties(&existing);
            if let Some(other) = props.get("broker.id").filter(|v| **v != config.broker_id.to_string()) {
                anyhow::bail!(
                    "Stored node id {other} doesn't match previous node id {} in {}",
                    config.broker_id,
                    path.display()
                );
            }
            continue;
        }
        let text = format!("#\n#{}\nversion=0\nbroker.id={}\ncluster.id={}\n", now_ms(), config.broker_id, cluster_id);
        std::fs::write(&path, text)?;
    }
    Ok(())
}

/// What the replica manager sees of the broker's other components: the coordinators that load
/// and drop their state with leadership of their topics' partitions, and the controller.
/// Weak, as the broker owns the replica manager.
struct BrokerLink(std::sync::Weak<Broker>);

impl LeadershipListener for BrokerLink {
    fn before_become_leader(&self, tp: &TopicPartition) {
        let Some(b) = self.0.upgrade() else { return };
        if tp.0 == OFFSETS_TOPIC {
            b.groups.set_loading(tp.1, true);
        }
        if tp.0 == TRANSACTION_STATE_TOPIC {
            b.txn.set_loading(tp.1, true);
        }
    }

    fn on_become_leader(&self, tp: &TopicPartition, new_term: bool) {
        let Some(b) = self.0.upgrade() else { return };
        let offsets = tp.0 == OFFSETS_TOPIC;
        let txn_state = tp.0 == TRANSACTION_STATE_TOPIC;
        if new_term && offsets {
            b.groups.load_groups(Some(tp.1));
        }
        if new_term && txn_state {
            b.txn.load_txns(Some(tp.1));
        }
        if txn_state {
            b.txn.set_loading(tp.1, false);
        }
        if offsets {
            b.groups.set_loading(tp.1, false);
        }
    }

    fn forget_partition(&self, tp: &TopicPartition) {
        if let Some(b) = self.0.upgrade() {
            b.txn.forget_partition(tp);
        }
    }

    fn on_resign(&self, tp: &TopicPartition) {
        let Some(b) = self.0.upgrade() else { return };
        if tp.0 == OFFSETS_TOPIC {
            b.groups.unload_groups(tp.1);
        }
        if tp.0 == TRANSACTION_STATE_TOPIC {
            b.txn.unload_txns(tp.1);
        }
    }
}

/// The group coordinator drops the committed offsets of partitions UpdateMetadata shows
/// deleted, as Kafka's KafkaApis does.
impl MetadataListener for BrokerLink {
    fn on_partitions_deleted(&self, deleted: &[(String, i32)]) {
        if let Some(b) = self.0.upgrade() {
            b.on_partitions_deleted(deleted);
        }
    }
}

impl ControllerGateway for BrokerLink {
    fn broker_epoch(&self) -> i64 {
        self.0.upgrade().map_or(-1, |b| b.broker_epoch())
    }

    fn is_controller(&self) -> bool {
        self.0.upgrade().is_some_and(|b| b.controller.is_controller())
    }

    fn handle_alter_partition(
        &self,
        req: &crate::protocol::inter_broker::AlterPartitionRequest,
    ) -> crate::protocol::inter_broker::AlterPartitionResponse {
        match self.0.upgrade() {
            Some(b) => b.controller.handle_alter_partition(req),
            None => crate::protocol::inter_broker::AlterPartitionResponse {
                error_code: ErrorCode::NotController.code(),
                ..Default::default()
            },
        }
    }
}
