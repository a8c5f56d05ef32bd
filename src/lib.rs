//! gregor: a broker that Kafka clients, tools and ZooKeeper take for Apache Kafka.
//!
//! Modules are named after their Kafka counterparts (see DESIGN.md): `network` is the
//! SocketServer, `api` KafkaApis, `log` the storage layer, `metadata` the znode tree and
//! metadata cache, `controller` the KafkaController, `replication` the ReplicaManager, `txn`
//! producer ids and idempotence, `security` TLS and SASL authentication, `metrics` Kafka's metrics as Prometheus reads them.

pub mod api;
pub mod broker;
pub mod client_metrics;
pub mod client_quota;
pub mod config;
pub mod controller;
pub mod dynamic_config;
pub mod group;
pub mod io_pool;
pub mod log;
pub mod metadata;
pub mod metrics;
pub mod network;
pub mod protocol;
pub mod replication;
pub mod security;
pub mod share;
pub mod sync;
pub mod txn;
