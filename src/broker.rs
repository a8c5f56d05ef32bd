//! The broker process: its shared state, startup and clean shutdown (Kafka's `KafkaServer`).
//!
//! Startup order: log dirs (recovery), the znode store, cluster id and broker registration,
//! topics from the store, then the listeners. Shutdown reverses it and ends by writing the
//! clean-shutdown marker so the next start skips recovery.

use std::sync::Arc;
use std::time::Duration;

use crate::config::BrokerConfig;
use crate::group::coordinator::CoordinatorConfig;
use crate::group::GroupCoordinator;
use crate::log::LogManager;
use crate::metadata::{zk_data, BrokerInfo, EmbeddedStore, MetadataCache};
use crate::replication::ReplicaManager;
use crate::txn::ProducerIdManager;

/// Where the embedded store keeps the znode tree, inside the first log dir.
const EMBEDDED_STORE_FILE: &str = "gregor-metadata.json";

pub struct Broker {
    pub config: BrokerConfig,
    pub cache: MetadataCache,
    pub store: Arc<EmbeddedStore>,
    pub replicas: ReplicaManager,
    pub producer_ids: ProducerIdManager,
    pub groups: GroupCoordinator,
    pub controller_epoch: i32,
    /// Serializes topic creation, deletion and partition changes (the controller's event queue).
    pub admin_lock: std::sync::Mutex<()>,
}

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

impl Broker {
    pub fn start(config: BrokerConfig) -> anyhow::Result<Arc<Broker>> {
        if config.zookeeper_connect.is_some() {
            anyhow::bail!(
                "zookeeper.connect is set, but this build of gregor runs standalone only; remove zookeeper.connect"
            );
        }
        for dir in &config.log_dirs {
            std::fs::create_dir_all(dir)
                .map_err(|e| anyhow::anyhow!("cannot create log dir {}: {e}", dir.display()))?;
        }
        let logs = LogManager::open(config.log_dirs.clone(), config.log.clone())
            .map_err(|e| anyhow::anyhow!("cannot open log dirs: {e}"))?;
        let store = Arc::new(EmbeddedStore::open(config.log_dirs[0].join(EMBEDDED_STORE_FILE))?);

        let cluster_id = match store.get(zk_data::CLUSTER_ID).and_then(|d| zk_data::parse_cluster_id(&d)) {
            Some(id) => id,
            None => {
                let id = zk_data::uuid_to_kafka(zk_data::new_kafka_uuid());
                store.set(zk_data::CLUSTER_ID, &zk_data::cluster_id_json(&id))?;
                id
            }
        };
        write_meta_properties(&config, &cluster_id)?;

        let id = config.broker_id;
        store
            .create(
                &zk_data::broker_path(id),
                &zk_data::broker_registration_json(&config.advertised_listeners, config.rack.as_deref(), now_ms()),
                true,
            )
            .map_err(|e| anyhow::anyhow!("cannot register broker {id}: {e}"))?;
        let controller_epoch =
            store.get(zk_data::CONTROLLER_EPOCH).and_then(|d| d.trim().parse::<i32>().ok()).unwrap_or(0) + 1;
        store.set(zk_data::CONTROLLER_EPOCH, &controller_epoch.to_string())?;
        store.create(zk_data::CONTROLLER, &zk_data::controller_json(id, now_ms()), true)?;

        let cache = MetadataCache::default();
        let brokers: Vec<BrokerInfo> = config
            .advertised_listeners
            .first()
            .map(|e| BrokerInfo { id, host: e.host.clone(), port: e.port, rack: config.rack.clone() })
            .into_iter()
            .collect();
        cache.update(|c| {
            c.cluster_id = cluster_id.clone();
            c.controller_id = id;
            c.brokers = brokers;
        });

        let broker = Arc::new(Broker {
            replicas: ReplicaManager::new(id, logs),
            producer_ids: ProducerIdManager::new(id, store.clone()),
            groups: GroupCoordinator::new(coordinator_config(&config)?),
            config,
            cache,
            store,
            controller_epoch,
            admin_lock: std::sync::Mutex::new(()),
        });
        broker.load_topics().map_err(|e| anyhow::anyhow!("cannot load topics: {e}"))?;
        broker.load_groups();
        tracing::info!(broker_id = id, cluster_id = %cluster_id, "broker started");
        Ok(broker)
    }

    /// Background duties Kafka's LogManager schedules: retention, flush, checkpoints.
    pub fn spawn_log_tasks(self: &Arc<Self>) {
        let b = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(b.config.log_retention_check_interval_ms));
            tick.tick().await;
            loop {
                tick.tick().await;
                let b2 = b.clone();
                let _ = tokio::task::spawn_blocking(move || b2.replicas.logs().run_retention(now_ms())).await;
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
                let r = tokio::task::spawn_blocking(move || b2.replicas.logs().checkpoint()).await;
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
                    for p in b.replicas.all_partitions() {
                        p.maybe_flush();
                    }
                }
            });
        }
    }

    pub fn shutdown(&self) {
        let _ = self.store.delete_recursive(&zk_data::broker_path(self.config.broker_id));
        match self.replicas.logs().shutdown() {
            Ok(()) => tracing::info!("logs flushed; clean shutdown recorded"),
            Err(e) => tracing::error!(error = %e, "log shutdown failed; the next start will run recovery"),
        }
    }
}

fn coordinator_config(config: &BrokerConfig) -> anyhow::Result<CoordinatorConfig> {
    let get = |k: &str| -> anyhow::Result<i64> {
        let v = config.values.get(k).map(String::as_str).unwrap_or("");
        v.parse::<i64>().map_err(|_| anyhow::anyhow!("invalid value {v:?} for configuration {k}: not a number"))
    };
    Ok(CoordinatorConfig {
        initial_rebalance_delay: Duration::from_millis(get("group.initial.rebalance.delay.ms")?.max(0) as u64),
        min_session_timeout_ms: get("group.min.session.timeout.ms")? as i32,
        max_session_timeout_ms: get("group.max.session.timeout.ms")? as i32,
    })
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
