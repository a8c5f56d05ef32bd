//! What the request handlers are given of the broker: its components, each behind an `Arc`,
//! built once at start by the composition root (`broker`) and shared by every connection.
//! Handlers reach the components through this, never through `Broker`, so `api` depends on the
//! components it uses and not on how they are started or shut down.

use std::sync::Arc;

use crate::client_quota::ClientQuotas;
use crate::config::BrokerConfig;
use crate::controller::Controller;
use crate::dynamic_config::DynamicConfigs;
use crate::group::GroupCoordinatorService;
use crate::io_pool::IoPool;
use crate::metadata::{MetadataCache, ZkSync, ZnodeStore};
use crate::metrics::BrokerMetrics;
use crate::replication::ReplicaManager;
use crate::security::Security;
use crate::txn::TransactionService;

pub struct Components {
    /// The static configuration; what is in force is `effective_config()`.
    pub config: BrokerConfig,
    pub dynamic: Arc<DynamicConfigs>,
    pub cache: Arc<MetadataCache>,
    pub store: Arc<ZnodeStore>,
    /// The replicas hosted here, their fetchers, and the ISR writer.
    pub replicas: Arc<ReplicaManager>,
    /// The group coordinator and what it does on this broker.
    pub groups: Arc<GroupCoordinatorService>,
    /// Share-partitions led here and the share sessions of their consumers (KIP-932).
    pub share: Arc<crate::share::ShareManager>,
    /// Groups' own configs (config resource type GROUP), from `/config/groups`.
    pub group_configs: Arc<crate::group::configs::GroupConfigs>,
    /// Producer ids and transactions.
    pub txn: Arc<TransactionService>,
    /// Client quotas from `/config/users` and `/config/clients`, and their byte counts.
    pub quotas: Arc<ClientQuotas>,
    /// Client-metrics subscriptions and the client instances that push telemetry (KIP-714).
    pub client_metrics: Arc<crate::client_metrics::ClientMetricsManager>,
    pub metrics: BrokerMetrics,
    /// `queued.max.requests`: one permit per request being decoded and handled.
    pub request_slots: Arc<tokio::sync::Semaphore>,
    /// `num.io.threads`: where produce appends and fetch reads touch the disk.
    pub io: Arc<IoPool>,
    /// The controller's state and operations; active only while this broker is the controller.
    pub controller: Arc<Controller>,
    /// Follows the ZooKeeper tree into the metadata cache and tells the components; applies
    /// UpdateMetadata.
    pub zk_sync: Arc<ZkSync>,
    /// Each listener's TLS and SASL settings, the SCRAM credentials and the authorizer.
    pub security: Arc<Security>,
}

impl Components {
    /// The configuration in force: static values with the dynamic ones over them.
    pub fn effective_config(&self) -> Arc<BrokerConfig> {
        self.dynamic.effective()
    }

    /// This broker's epoch: the version of its current registration in ZooKeeper.
    pub fn broker_epoch(&self) -> i64 {
        self.zk_sync.broker_epoch()
    }
}
