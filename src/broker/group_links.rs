//! The group coordinator's narrow handles over the broker's other components: the offsets
//! partitions (the replica manager, with its metadata image), the controller's topic creation,
//! the store.

use std::sync::Arc;

use crate::controller::Controller;
use crate::group::service::{GroupZnodes, OffsetsPartitions, OffsetsTopicCreator};
use crate::group::OFFSETS_TOPIC;
use crate::metadata::ZnodeStore;
use crate::protocol::ErrorCode;
use crate::replication::ReplicaManager;

/// `__consumer_offsets` for the group coordinator: the replica manager's partitions, and the
/// metadata image and broker id it was built with. A trait impl rather than a link struct, so
/// that the group coordinator's tests wire it as the broker does without naming `broker`.
impl OffsetsPartitions for ReplicaManager {
    fn partition_count(&self) -> Option<i32> {
        Some(self.handles().cache.topic(OFFSETS_TOPIC)?.partitions.len() as i32)
    }

    fn leads_in_image(&self, p: i32) -> bool {
        let me = self.handles().config.broker_id;
        self.handles()
            .cache
            .topic(OFFSETS_TOPIC)
            .is_some_and(|t| t.partitions.iter().any(|x| x.index == p && x.leader == me))
    }

    fn is_local_leader(&self, p: i32) -> bool {
        self.partition(OFFSETS_TOPIC, p).is_some()
    }

    fn append(&self, p: i32, batch: bytes::Bytes) -> Result<(), i16> {
        let partition = self.partition(OFFSETS_TOPIC, p).ok_or(ErrorCode::NotCoordinator.code())?;
        match partition.append(batch, u32::MAX).error_code {
            0 => Ok(()),
            code => Err(code),
        }
    }

    fn append_may_block(&self, p: i32, len: usize) -> bool {
        self.partition(OFFSETS_TOPIC, p).is_some_and(|partition| partition.write_may_block(len, 1))
    }

    fn log_range(&self, p: i32) -> Option<(i64, i64)> {
        let partition = self.partition(OFFSETS_TOPIC, p)?;
        Some((partition.log_start_offset(), partition.log_end_offset()))
    }

    fn read(&self, p: i32, offset: i64, max_bytes: usize) -> Result<bytes::Bytes, i16> {
        let partition = self.partition(OFFSETS_TOPIC, p).ok_or(ErrorCode::NotCoordinator.code())?;
        let read = partition.read_to_log_end(offset, max_bytes);
        match read.error_code {
            0 => Ok(read.records),
            code => Err(code),
        }
    }

    fn topic_partition_exists(&self, topic: &str, partition: i32) -> bool {
        self.handles().cache.topic(topic).is_some_and(|t| t.partitions.iter().any(|p| p.index == partition))
    }
}

/// The group coordinator's way to have `__consumer_offsets` created.
pub(crate) struct OffsetsTopicLink(pub(crate) Arc<Controller>);

impl OffsetsTopicCreator for OffsetsTopicLink {
    fn create_offsets_topic(&self) -> Result<bool, (i16, String)> {
        self.0.auto_create(OFFSETS_TOPIC).map(|t| t.is_some()).map_err(|e| (e.code, e.to_string()))
    }
}

/// The znode store as the group coordinator's mirrors write it. (The store's own methods of
/// the same names are called by path: a bare `self.x()` would still pick them, but the reader
/// should not have to know that.)
impl GroupZnodes for ZnodeStore {
    fn is_zookeeper(&self) -> bool {
        ZnodeStore::is_zookeeper(self)
    }

    fn upsert_many(&self, writes: &[(String, String)]) -> Result<(), String> {
        ZnodeStore::upsert_many(self, writes).map_err(|e| e.to_string())
    }

    fn delete_recursive(&self, path: &str) -> Result<(), String> {
        ZnodeStore::delete_recursive(self, path).map_err(|e| e.to_string())
    }

    fn put_ephemeral(&self, path: &str, data: &str) -> Result<(), String> {
        ZnodeStore::put_ephemeral(self, path, data).map_err(|e| e.to_string())
    }

    fn delete_own_ephemerals(&self, path: &str) -> Result<(), String> {
        ZnodeStore::delete_own_ephemerals(self, path).map_err(|e| e.to_string())
    }
}

/// The topics the consumer protocol's subscriptions name, from the metadata image.
impl crate::group::consumer::TopicsView for crate::metadata::MetadataCache {
    fn topic(&self, name: &str) -> Option<(uuid::Uuid, i32)> {
        let t = crate::metadata::MetadataCache::topic(self, name)?;
        Some((t.id, t.partitions.len() as i32))
    }

    fn name(&self, id: uuid::Uuid) -> Option<String> {
        self.snapshot().topic_by_id(id).map(|t| t.name.clone())
    }

    fn names(&self) -> Vec<String> {
        self.snapshot().topics.keys().cloned().collect()
    }
}
