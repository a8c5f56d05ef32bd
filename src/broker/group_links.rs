//! The group coordinator's narrow handles over the broker's other components: the offsets
//! partitions (metadata image and replica manager), the controller's topic creation, the store.

use std::sync::Arc;

use crate::controller::Controller;
use crate::group::service::{GroupZnodes, OffsetsPartitions, OffsetsTopicCreator};
use crate::group::OFFSETS_TOPIC;
use crate::metadata::{MetadataCache, ZnodeStore};
use crate::protocol::ErrorCode;
use crate::replication::ReplicaManager;

/// `__consumer_offsets` for the group coordinator: the metadata image and the replica manager.
pub(crate) struct OffsetsLink {
    pub(crate) me: i32,
    pub(crate) cache: Arc<MetadataCache>,
    pub(crate) replicas: Arc<ReplicaManager>,
}

impl OffsetsPartitions for OffsetsLink {
    fn partition_count(&self) -> Option<i32> {
        Some(self.cache.topic(OFFSETS_TOPIC)?.partitions.len() as i32)
    }

    fn leads_in_image(&self, p: i32) -> bool {
        self.cache
            .topic(OFFSETS_TOPIC)
            .is_some_and(|t| t.partitions.iter().any(|x| x.index == p && x.leader == self.me))
    }

    fn is_local_leader(&self, p: i32) -> bool {
        self.replicas.partition(OFFSETS_TOPIC, p).is_some()
    }

    fn append(&self, p: i32, batch: bytes::Bytes) -> Result<(), i16> {
        let partition = self.replicas.partition(OFFSETS_TOPIC, p).ok_or(ErrorCode::NotCoordinator.code())?;
        match partition.append(batch, u32::MAX).error_code {
            0 => Ok(()),
            code => Err(code),
        }
    }

    fn log_range(&self, p: i32) -> Option<(i64, i64)> {
        let partition = self.replicas.partition(OFFSETS_TOPIC, p)?;
        Some((partition.log_start_offset(), partition.log_end_offset()))
    }

    fn read(&self, p: i32, offset: i64, max_bytes: usize) -> Result<bytes::Bytes, i16> {
        let partition = self.replicas.partition(OFFSETS_TOPIC, p).ok_or(ErrorCode::NotCoordinator.code())?;
        let read = partition.read_to_log_end(offset, max_bytes);
        match read.error_code {
            0 => Ok(read.records),
            code => Err(code),
        }
    }

    fn topic_partition_exists(&self, topic: &str, partition: i32) -> bool {
        self.cache.topic(topic).is_some_and(|t| t.partitions.iter().any(|p| p.index == partition))
    }
}

/// The group coordinator's way to have `__consumer_offsets` created.
pub(crate) struct OffsetsTopicLink(pub(crate) Arc<Controller>);

impl OffsetsTopicCreator for OffsetsTopicLink {
    fn create_offsets_topic(&self) -> Result<bool, (i16, String)> {
        self.0.auto_create(OFFSETS_TOPIC).map(|t| t.is_some()).map_err(|e| (e.code, e.to_string()))
    }
}

/// The znode store as the group coordinator's mirrors write it.
pub(crate) struct StoreLink(pub(crate) Arc<ZnodeStore>);

impl GroupZnodes for StoreLink {
    fn is_zookeeper(&self) -> bool {
        self.0.is_zookeeper()
    }

    fn upsert_many(&self, writes: &[(String, String)]) -> Result<(), String> {
        self.0.upsert_many(writes).map_err(|e| e.to_string())
    }

    fn delete_recursive(&self, path: &str) -> Result<(), String> {
        self.0.delete_recursive(path).map_err(|e| e.to_string())
    }

    fn put_ephemeral(&self, path: &str, data: &str) -> Result<(), String> {
        self.0.put_ephemeral(path, data).map_err(|e| e.to_string())
    }

    fn delete_own_ephemerals(&self, path: &str) -> Result<(), String> {
        self.0.delete_own_ephemerals(path).map_err(|e| e.to_string())
    }
}

/// The topics the consumer protocol's subscriptions name, from the metadata image.
pub(crate) struct TopicsLink(pub(crate) Arc<MetadataCache>);

impl crate::group::consumer::TopicsView for TopicsLink {
    fn topic(&self, name: &str) -> Option<(uuid::Uuid, i32)> {
        let t = self.0.topic(name)?;
        Some((t.id, t.partitions.len() as i32))
    }

    fn name(&self, id: uuid::Uuid) -> Option<String> {
        self.0.snapshot().topic_by_id(id).map(|t| t.name.clone())
    }
}
