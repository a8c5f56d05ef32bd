//! This broker's view of the cluster: brokers, topics, partition leaders. Readers take a
//! snapshot (`Arc`) so a Metadata response is built from one consistent state even while the
//! controller changes it. Every published change wakes the waiters of [`MetadataCache::changed`]:
//! admin requests that answer once the cluster reaches a state wait on it, whatever replicas
//! this broker holds.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use uuid::Uuid;

use crate::sync::RwLockExt;

#[derive(Debug, Clone)]
pub struct BrokerInfo {
    pub id: i32,
    pub host: String,
    pub port: u16,
    pub rack: Option<String>,
    /// The czxid of its `/brokers/ids/<id>` znode (Kafka's broker epoch); -1 where unknown.
    pub epoch: i64,
    /// Every endpoint it registered, for the controller to pass on in UpdateMetadata.
    pub endpoints: Vec<crate::config::Endpoint>,
}

impl BrokerInfo {
    /// Where a client that came in on `listener` reaches this broker. A client on one
    /// listener must never be handed another's address (an external client cannot resolve an
    /// internal name), so a broker without that listener has none, as in Kafka. `host`/`port`
    /// (the inter-broker address) stand in only when no endpoint list is known.
    pub fn endpoint_for(&self, listener: &str) -> Option<(&str, u16)> {
        if self.endpoints.is_empty() {
            return Some((&self.host, self.port));
        }
        self.endpoints.iter().find(|e| e.listener_name == listener).map(|e| (e.host.as_str(), e.port))
    }
}

#[derive(Debug, Clone)]
pub struct PartitionInfo {
    pub index: i32,
    pub leader: i32,
    pub leader_epoch: i32,
    pub replicas: Vec<i32>,
    pub isr: Vec<i32>,
    /// The version of the partition's state znode (Kafka's partition epoch).
    pub partition_epoch: i32,
    /// A reassignment in flight: replicas joining and leaving (`replicas` holds both). Only
    /// the controller's image has them (UpdateMetadata does not carry them).
    pub adding_replicas: Vec<i32>,
    pub removing_replicas: Vec<i32>,
    /// Replicas on dead brokers or in offline log dirs, as the controller's UpdateMetadata
    /// last said (empty in the controller's own image).
    pub offline_replicas: Vec<i32>,
}

impl PartitionInfo {
    /// The replicas a reassignment in flight moves the partition to (else its replicas).
    pub fn target_replicas(&self) -> Vec<i32> {
        self.replicas.iter().copied().filter(|r| !self.removing_replicas.contains(r)).collect()
    }

    pub fn is_being_reassigned(&self) -> bool {
        !self.adding_replicas.is_empty() || !self.removing_replicas.is_empty()
    }
}

#[derive(Debug, Clone)]
pub struct TopicInfo {
    pub name: String,
    pub id: Uuid,
    pub partitions: Vec<PartitionInfo>,
    /// Per-topic overrides from `/config/topics/<t>`.
    pub configs: BTreeMap<String, String>,
}

impl TopicInfo {
    pub fn is_internal(&self) -> bool {
        crate::protocol::internal_topics::is_internal(&self.name)
    }
}

#[derive(Debug, Clone, Default)]
pub struct ClusterSnapshot {
    pub cluster_id: String,
    pub controller_id: i32,
    pub brokers: Vec<BrokerInfo>,
    pub topics: BTreeMap<String, Arc<TopicInfo>>,
    /// The version of the enabled `/feature` znode (ApiVersions' finalized-features epoch);
    /// None, reported as -1, until one has been read.
    pub finalized_features_epoch: Option<i64>,
}

impl ClusterSnapshot {
    pub fn topic_by_id(&self, id: Uuid) -> Option<&Arc<TopicInfo>> {
        self.topics.values().find(|t| t.id == id)
    }
}

#[derive(Default)]
pub struct MetadataCache {
    inner: RwLock<Arc<ClusterSnapshot>>,
    changed: tokio::sync::Notify,
}

/// Where the coordinator of a key is: the partition of an internal topic the key hashes to,
/// led here or by another broker (with that broker's address on the asked listener).
#[derive(Debug, PartialEq)]
pub enum CoordinatorAt {
    Here { partition: i32 },
    Broker { id: i32, host: String, port: u16 },
}

impl MetadataCache {
    /// The coordinator of the key that `partition_of` maps to a partition of `topic` (it is
    /// given the partition count): COORDINATOR_NOT_AVAILABLE while the topic, the partition
    /// or its leader is unknown, or the leader has no `listener`.
    pub fn coordinator_at(
        &self,
        topic: &str,
        partition_of: impl FnOnce(i32) -> i32,
        me: i32,
        listener: &str,
    ) -> Result<CoordinatorAt, i16> {
        let unavailable = crate::protocol::ErrorCode::CoordinatorNotAvailable.code();
        let snapshot = self.snapshot();
        let topic = snapshot.topics.get(topic).ok_or(unavailable)?;
        let partition = partition_of(topic.partitions.len() as i32);
        let leader = topic.partitions.iter().find(|x| x.index == partition).map(|x| x.leader).ok_or(unavailable)?;
        if leader < 0 {
            return Err(unavailable);
        }
        if leader == me {
            return Ok(CoordinatorAt::Here { partition });
        }
        let b = snapshot.brokers.iter().find(|b| b.id == leader).ok_or(unavailable)?;
        let (host, port) = b.endpoint_for(listener).ok_or(unavailable)?;
        Ok(CoordinatorAt::Broker { id: b.id, host: host.to_string(), port })
    }

    pub fn snapshot(&self) -> Arc<ClusterSnapshot> {
        self.inner.read_unpoisoned().clone()
    }

    /// Applies `f` to a copy of the current state and publishes the result.
    pub fn update(&self, f: impl FnOnce(&mut ClusterSnapshot)) {
        let mut guard = self.inner.write_unpoisoned();
        let mut next = (**guard).clone();
        f(&mut next);
        *guard = Arc::new(next);
        drop(guard);
        self.changed.notify_waiters();
    }

    /// A future that completes at the next published change. Create it (and `enable` it)
    /// *before* checking the condition, so a change between the check and the wait is seen.
    pub fn changed(&self) -> tokio::sync::futures::Notified<'_> {
        self.changed.notified()
    }

    pub fn topic(&self, name: &str) -> Option<Arc<TopicInfo>> {
        self.snapshot().topics.get(name).cloned()
    }
}
