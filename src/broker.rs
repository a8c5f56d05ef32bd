//! The broker process: its shared state, startup and clean shutdown (Kafka's `KafkaServer`).
//!
//! Startup order: log dirs (recovery), the znode store, cluster id and broker registration,
//! topics from the store, then the listeners. Shutdown reverses it and ends by writing the
//! clean-shutdown marker so the next start skips recovery.

use std::sync::Arc;
use std::time::Duration;

use crate::api::Components;
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
use crate::protocol::internal_topics::{SHARE_GROUP_STATE_TOPIC, TRANSACTION_STATE_TOPIC};
use crate::protocol::ErrorCode;
use crate::replication::alter_partition::ControllerGateway;
use crate::replication::{LeadershipListener, ReplicaHandles, ReplicaManager, TopicPartition};
use crate::txn::{ProducerIdManager, TransactionHandles, TransactionService};

/// Where the embedded store keeps the znode tree, inside the first log dir.
const EMBEDDED_STORE_FILE: &str = "gregor-metadata.json";

mod controlled_shutdown;
mod group_links;
mod registration;
mod share_links;
mod txn_links;
use group_links::OffsetsTopicLink;
use registration::{register, resolve_broker_id, write_meta_properties};
use txn_links::{MarkerLink, TopicCreatorLink};

/// The composition root: builds the components, wires them to each other, starts their
/// tasks and shuts them down. Request handlers get `components()`, never the broker.
pub struct Broker {
    components: Arc<Components>,
    /// The log cleaner, once the log tasks are started.
    cleaner: std::sync::OnceLock<Arc<crate::log::cleaner::LogCleaner>>,
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
        crate::log::fd_cache::configure(config.segment_fd_cache_size, config.open_files_reserved)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        crate::log::index_cache::configure(config.index_mmap_cache_size).map_err(|e| anyhow::anyhow!("{e}"))?;
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
        let group_configs = Arc::new(crate::group::configs::GroupConfigs::new(
            store.clone(),
            crate::config::share_group_config(&config)?,
        ));
        let groups = Arc::new(GroupCoordinatorService::new(GroupServiceHandles {
            broker_id: id,
            coordinator: crate::config::coordinator_config(&config)?,
            partitions: replicas.clone(),
            creator: Arc::new(OffsetsTopicLink(controller.clone())),
            znodes: store.clone(),
            io: io.clone(),
            offsets_zk_mirror_interval: config.offsets_zk_mirror_interval,
            offsets_zk_mirror_max_writes: config.offsets_zk_mirror_max_writes,
            consumer: crate::config::consumer_group_config(&config)?,
            topics: cache.clone(),
            share: crate::config::share_group_config(&config)?,
            group_configs: group_configs.clone(),
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
        let share_persister = crate::share::LogPersister::new(crate::share::PersisterHandles {
            partitions: replicas.clone(),
            topic: Arc::new(share_links::ShareStateTopicLink { controller: controller.clone(), cache: cache.clone() }),
            io: io.clone(),
            write_timeout: config.request_timeout,
            updates_per_snapshot: crate::config::share_group_config(&config)?.update_records_per_snapshot,
            remote: Some(crate::share::RemoteHandles {
                inter_broker: security.inter_broker.clone(),
                client_id: format!("gregor-share-state-{id}"),
                max_bytes: config.socket_request_max_bytes,
            }),
        });
        let components = Arc::new(Components {
            share: Arc::new(crate::share::ShareManager::with_persister(
                crate::config::share_group_config(&config)?,
                Arc::new(share_persister),
                group_configs.clone(),
            )),
            group_configs,
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
            client_metrics: Arc::new(crate::client_metrics::ClientMetricsManager::new(
                store.clone(),
                config.client_telemetry.clone(),
            )),
            dynamic,
            config,
            cache,
            store,
            zk_sync,
            security,
        });
        let broker = Arc::new(Broker { components, cleaner: std::sync::OnceLock::new() });
        let _ = markers.0.set(Arc::downgrade(&broker));
        broker.wire();
        broker.load_state()?;
        tracing::info!(broker_id = id, cluster_id = %cluster_id, zookeeper = broker.components.store.is_zookeeper(), "broker started");
        Ok(broker)
    }

    /// Tells each component of the others it calls back: the controller of the local replicas,
    /// the replica manager of the coordinators, the metadata sync and the dynamic configs of
    /// who follows them.
    fn wire(self: &Arc<Self>) {
        let local: std::sync::Weak<dyn crate::controller::LocalBroker> = Arc::downgrade(self) as _;
        self.components.controller.attach(local);
        self.components.replicas.set_leadership_listener(Arc::new(BrokerLink(Arc::downgrade(self))));
        self.subscribe_to_metadata();
        self.subscribe_to_dynamic_configs();
    }

    /// Reads what the store holds: dynamic configs, client quotas, and the cluster state (from
    /// ZooKeeper, or standalone as its own controller, with the groups and transactions).
    fn load_state(&self) -> anyhow::Result<()> {
        let c = &self.components;
        c.dynamic.reload().map_err(|e| anyhow::anyhow!("cannot read dynamic broker configs: {e}"))?;
        c.quotas.reload_client_quotas().map_err(|e| anyhow::anyhow!("cannot read client quotas: {e}"))?;
        c.client_metrics.reload().map_err(|e| anyhow::anyhow!("cannot read client metrics subscriptions: {e}"))?;
        c.group_configs.reload(None).map_err(|e| anyhow::anyhow!("cannot read group configs: {e}"))?;
        if c.store.is_zookeeper() {
            c.zk_sync.reconcile().map_err(|e| anyhow::anyhow!("cannot read cluster state from ZooKeeper: {e}"))?;
        } else {
            c.controller.try_become_controller()?;
            c.controller.load_topics().map_err(|e| anyhow::anyhow!("cannot load topics: {e}"))?;
        }
        if !c.store.is_zookeeper() {
            // In ZooKeeper mode each offsets partition is loaded as this broker takes it over.
            c.groups.load_groups(None);
            c.txn.load_txns(None);
        }
        Ok(())
    }

    /// What the request handlers are given: the broker's components.
    pub fn components(&self) -> Arc<Components> {
        self.components.clone()
    }

    /// Starts what runs beside the request handlers: the metadata sync, the log tasks, the
    /// group and transaction timers, the ISR expiry and writer, and the TLS store reload.
    pub fn spawn_tasks(self: &Arc<Self>) {
        self.components.zk_sync.spawn();
        self.spawn_log_tasks();
        self.start_group_coordinator();
        self.components.txn.spawn_txn_timer();
        self.spawn_isr_expiry();
        self.spawn_isr_writer();
        self.spawn_store_reload();
    }

    /// The group coordinator's timers (rebalance, session expiry, offsets retention).
    pub fn start_group_coordinator(&self) {
        self.components.groups.start();
    }

    /// The metrics scrape: the registry's counters and the sampled state, in Prometheus' text
    /// format.
    pub fn render_metrics(&self) -> String {
        // The pushed client series (KIP-714) follow the broker's own, in families of their own.
        self.components.metrics.render(&self.metrics_sample()) + &self.components.client_metrics.render()
    }

    /// Where the controller and the metadata sync report deleted partitions.
    fn on_partitions_deleted(&self, deleted: &[(String, i32)]) {
        self.components.groups.on_partitions_deleted(deleted);
    }

    fn broker_epoch(&self) -> i64 {
        self.components.broker_epoch()
    }

    /// Who follows the metadata, in the order a pass tells them (each event has one
    /// subscriber, so the order is the pass's): dynamic configs, client quotas, client-metrics
    /// subscriptions, features,
    /// credentials and ACLs, the replica manager's logs and waiters, and the group
    /// coordinator's offsets of deleted partitions. The controller is also its role.
    fn subscribe_to_metadata(self: &Arc<Self>) {
        let sync = &self.components.zk_sync;
        sync.set_controller(self.components.controller.clone());
        sync.subscribe(self.components.dynamic.clone());
        sync.subscribe(self.components.quotas.clone());
        sync.subscribe(self.components.client_metrics.clone());
        sync.subscribe(self.components.group_configs.clone());
        sync.subscribe(self.components.controller.clone());
        sync.subscribe(Arc::new(crate::security::SecurityListener {
            security: self.components.security.clone(),
            store: self.components.store.clone(),
        }));
        sync.subscribe(self.components.replicas.clone());
        sync.subscribe(Arc::new(BrokerLink(Arc::downgrade(self))));
    }

    /// The state the metrics scrape reports. Each partition's replica state is read under its
    /// own lock, one partition at a time, and logs through their published stats, so a scrape
    /// of thousands of partitions never holds a lock a request waits for while it formats,
    /// nor waits for an append, nor touches the disk.
    fn metrics_sample(&self) -> crate::metrics::StateSample {
        use crate::metrics::{PartitionSample, StateSample, ZooKeeperSample};
        let snapshot = self.components.cache.snapshot();
        let default_min_isr = self.effective_config().min_insync_replicas.max(1) as usize;
        let partitions = self
            .components
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
        let active_controller = self.components.controller.is_controller();
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
        let zookeeper = match &*self.components.store {
            ZnodeStore::ZooKeeper(zk) => {
                let (connected, expired_sessions) = zk.session_status();
                Some(ZooKeeperSample { connected, expired_sessions })
            }
            ZnodeStore::Embedded(_) => None,
        };
        let (controller_events_queued, controller_events_processed) = self.components.controller.event_counts();
        let sample = |s: crate::log::fd_cache::SegmentFileStats| crate::metrics::SegmentFilesSample {
            hits: s.hits,
            misses: s.misses,
            evictions: s.evictions,
            open: s.open,
            capacity: s.capacity,
        };
        let segment_files = sample(crate::log::fd_cache::segment_files().stats());
        let index_maps = sample(crate::log::index_cache::index_maps().stats());
        StateSample {
            active_controller,
            partitions,
            offline_partitions,
            global_partitions,
            global_topics,
            controller_events_queued,
            controller_events_processed,
            zookeeper,
            segment_files,
            index_maps,
        }
    }

    /// Background duties Kafka's LogManager schedules: retention, flush, checkpoints.
    fn spawn_log_tasks(self: &Arc<Self>) {
        tokio::spawn(crate::replication::alter_log_dirs::run(self.components.replicas.clone()));
        self.components.replicas.spawn_log_dir_failure_handler();
        // The dynamic values read at startup count from the first pass.
        let cleaner = crate::log::cleaner::LogCleaner::start(
            self.components.replicas.logs_handle(),
            self.effective_config().cleaner.clone(),
        );
        let _ = self.cleaner.set(cleaner.clone());
        self.components.dynamic.subscribe(move |c| cleaner.reconfigure(c.cleaner.clone()));
        let b = self.clone();
        tokio::spawn(async move {
            let mut tick =
                tokio::time::interval(Duration::from_millis(b.components.config.log_retention_check_interval_ms));
            tick.tick().await;
            loop {
                tick.tick().await;
                let b2 = b.clone();
                let moved =
                    tokio::task::spawn_blocking(move || b2.components.replicas.logs().run_retention(now_ms())).await;
                // Fetch sessions report the new log start offsets in their next answers.
                for (topic, index) in moved.unwrap_or_default() {
                    if let Some(p) = b.components.replicas.partition(&topic, index) {
                        p.wake();
                    }
                }
            }
        });
        let b = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(
                b.components.config.log_flush_offset_checkpoint_interval_ms,
            ));
            tick.tick().await;
            loop {
                tick.tick().await;
                let b2 = b.clone();
                let r = tokio::task::spawn_blocking(move || {
                    b2.components
                        .replicas
                        .logs()
                        .checkpoint()
                        .and_then(|_| b2.components.replicas.checkpoint_high_watermarks())
                })
                .await;
                if let Ok(Err(e)) = r {
                    tracing::warn!(error = %e, "writing checkpoints failed");
                }
            }
        });
        if self.components.config.log.flush_interval_ms != u64::MAX {
            let b = self.clone();
            let period = self
                .components
                .config
                .log_flush_scheduler_interval_ms
                .min(self.components.config.log.flush_interval_ms)
                .max(1);
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_millis(period));
                loop {
                    tick.tick().await;
                    // Off the async workers: an fsync may stall for seconds on a slow disk, and
                    // a network worker waiting on it would stall every connection it serves.
                    let b2 = b.clone();
                    let _ = tokio::task::spawn_blocking(move || {
                        for p in b2.components.replicas.all_partitions() {
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
    fn spawn_store_reload(self: &Arc<Self>) {
        let every = self.components.security.store_check_interval;
        if every.is_zero() || !self.components.security.has_tls() {
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
                let _ = tokio::task::spawn_blocking(move || {
                    b.components.security.reload_changed_stores(&b.components.config.values)
                })
                .await;
            }
        });
    }

    /// Starts the ISR writer, which reaches the controller in process when it is this broker.
    fn spawn_isr_writer(self: &Arc<Self>) {
        self.components.replicas.spawn_isr_writer(Arc::new(BrokerLink(Arc::downgrade(self))));
    }

    /// Drops followers that stopped keeping up (checked every replica.lag.time.max.ms / 2).
    pub fn spawn_isr_expiry(self: &Arc<Self>) {
        self.components.replicas.spawn_isr_expiry();
    }

    /// Controlled shutdown as Kafka does it: see [`controlled_shutdown::controlled_shutdown`].
    pub async fn controlled_shutdown(self: &Arc<Self>) {
        controlled_shutdown::controlled_shutdown(self).await
    }

    /// The configuration in force: static values with the dynamic ones over them.
    pub fn effective_config(&self) -> Arc<BrokerConfig> {
        self.components.effective_config()
    }

    /// Calls `f` with the configuration in force each time the dynamic broker configs change.
    pub fn on_config_change(&self, f: impl Fn(&Arc<BrokerConfig>) + Send + Sync + 'static) {
        self.components.dynamic.subscribe(f);
    }

    /// What follows a change of the dynamic broker configs: the I/O pool's size and the open
    /// logs' topic defaults. (The cleaner and the listeners' limits subscribe as they start.)
    fn subscribe_to_dynamic_configs(self: &Arc<Self>) {
        let io = self.components.io.clone();
        self.components.dynamic.subscribe(move |c| io.resize(c.num_io_threads));
        let me = Arc::downgrade(self);
        self.components.dynamic.subscribe(move |c| {
            if let Some(b) = me.upgrade() {
                b.apply_topic_defaults(c);
            }
        });
    }

    fn apply_topic_defaults(&self, effective: &BrokerConfig) {
        let snapshot = self.components.cache.snapshot();
        for p in self.components.replicas.all_partitions() {
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
        let _ = self.components.store.delete_recursive(&zk_data::broker_path(self.components.config.broker_id));
        if self.components.controller.is_controller() {
            let _ = self.components.store.delete_recursive(zk_data::CONTROLLER);
        }
        if let Err(e) = self.components.replicas.checkpoint_high_watermarks() {
            tracing::warn!(error = %e, "cannot write high watermark checkpoint");
        }
        if let Some(c) = self.cleaner.get() {
            c.shutdown();
        }
        for p in self.components.replicas.all_partitions() {
            p.snapshot_producer_state();
        }
        match self.components.replicas.logs().shutdown() {
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
        self.components.replicas.become_leader_or_follower(req)
    }

    fn stop_replicas(&self, req: &crate::protocol::inter_broker::StopReplicaRequest) {
        self.components.replicas.stop_replicas(req);
    }

    fn make_leader(
        &self,
        topic: &str,
        partition: i32,
        topic_id: &str,
        config: crate::log::LogConfig,
    ) -> Result<(), crate::log::LogError> {
        self.components.replicas.make_leader(topic, partition, topic_id, config).map(|_| ())
    }

    fn remove_partition(&self, topic: &str, partition: i32) -> Result<(), crate::log::LogError> {
        self.components.replicas.remove_partition(topic, partition)
    }

    fn set_log_config(&self, topic: &str, partition: i32, config: crate::log::LogConfig) {
        if let Some(part) = self.components.replicas.partition(topic, partition) {
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
        self.components.replicas.observe_controller_epoch(epoch);
    }
}

/// What the replica manager sees of the broker's other components: the coordinators that load
/// and drop their state with leadership of their topics' partitions, and the controller.
/// Weak, as the broker owns the replica manager.
struct BrokerLink(std::sync::Weak<Broker>);

impl LeadershipListener for BrokerLink {
    fn before_become_leader(&self, tp: &TopicPartition) {
        let Some(b) = self.0.upgrade() else { return };
        if tp.0 == OFFSETS_TOPIC {
            b.components.groups.set_loading(tp.1, true);
        }
        if tp.0 == TRANSACTION_STATE_TOPIC {
            b.components.txn.set_loading(tp.1, true);
        }
    }

    fn on_become_leader(&self, tp: &TopicPartition, new_term: bool) {
        let Some(b) = self.0.upgrade() else { return };
        let offsets = tp.0 == OFFSETS_TOPIC;
        let txn_state = tp.0 == TRANSACTION_STATE_TOPIC;
        if new_term && offsets {
            b.components.groups.load_groups(Some(tp.1));
        }
        if new_term && txn_state {
            b.components.txn.load_txns(Some(tp.1));
        }
        if txn_state {
            b.components.txn.set_loading(tp.1, false);
        }
        if offsets {
            b.components.groups.set_loading(tp.1, false);
        }
    }

    fn forget_partition(&self, tp: &TopicPartition) {
        if let Some(b) = self.0.upgrade() {
            b.components.txn.forget_partition(tp);
        }
    }

    fn on_resign(&self, tp: &TopicPartition) {
        let Some(b) = self.0.upgrade() else { return };
        if tp.0 == OFFSETS_TOPIC {
            b.components.groups.unload_groups(tp.1);
        }
        if tp.0 == TRANSACTION_STATE_TOPIC {
            b.components.txn.unload_txns(tp.1);
        }
        if tp.0 == SHARE_GROUP_STATE_TOPIC {
            b.components.share.on_state_resign(tp.1);
        }
        if let Some(topic) = b.components.cache.topic(&tp.0) {
            b.components.share.on_resign(topic.id, tp.1);
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
        self.0.upgrade().is_some_and(|b| b.components.controller.is_controller())
    }

    fn handle_alter_partition(
        &self,
        req: &crate::protocol::inter_broker::AlterPartitionRequest,
    ) -> crate::protocol::inter_broker::AlterPartitionResponse {
        match self.0.upgrade() {
            Some(b) => b.components.controller.handle_alter_partition(req),
            None => crate::protocol::inter_broker::AlterPartitionResponse {
                error_code: ErrorCode::NotController.code(),
                ..Default::default()
            },
        }
    }
}
