//! Cluster metadata: the znode tree in Kafka's layout and the cache served to clients.
//!
//! ZooKeeper (or, standalone, the embedded store) holds the durable truth in exactly the paths
//! and JSON Kafka 3.x writes; [`MetadataCache`] is this broker's in-memory view of it, the only
//! thing the request path reads.

pub mod cache;
pub mod listener;
pub mod store;
pub mod update_metadata;
pub mod zk_data;
pub mod zk_multi;
pub mod zk_store;
pub mod zk_sync;

#[cfg(test)]
mod unit_tests;

pub use cache::{BrokerInfo, CoordinatorAt, MetadataCache, PartitionInfo, TopicInfo};
pub use listener::{ControllerRole, MetadataListener};
pub use store::{EmbeddedStore, StoreError, ZnodeStore};
pub use zk_sync::ZkSync;
