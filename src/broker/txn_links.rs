//! The transaction service's narrow handles over the broker's other components: the replica
//! manager's partitions, the controller's topic creation, the group coordinator's offsets.

use std::sync::{Arc, OnceLock, Weak};

use super::Broker;
use crate::controller::Controller;
use crate::protocol::internal_topics::TRANSACTION_STATE_TOPIC;
use crate::replication::partition::Partition;
use crate::replication::ReplicaManager;
use crate::txn::handles::{LocalPartitions, MarkerListener, TransactionTopicCreator, TxnPartition};

/// The group coordinator as the transaction service sees it: told of each marker, it settles
/// the offsets a transaction committed. Weak, as the broker owns the service.
pub(super) struct MarkerLink(pub(super) OnceLock<Weak<Broker>>);

impl MarkerListener for MarkerLink {
    fn on_marker_written(&self, topic: &str, partition: i32, producer_id: i64, commit: bool) {
        if topic != crate::group::OFFSETS_TOPIC {
            return;
        }
        if let Some(b) = self.0.get().and_then(Weak::upgrade) {
            b.components.groups.complete_txn_offsets(producer_id, partition, commit);
        }
    }
}

/// `__transaction_state` created on first use by the controller (or forwarded to it).
pub(super) struct TopicCreatorLink(pub(super) Arc<Controller>);

impl TransactionTopicCreator for TopicCreatorLink {
    fn create_transaction_state_topic(&self) -> Result<bool, String> {
        self.0.auto_create(TRANSACTION_STATE_TOPIC).map(|t| t.is_some()).map_err(|e| e.to_string())
    }
}

impl LocalPartitions for ReplicaManager {
    fn leader_partition(&self, topic: &str, index: i32) -> Option<Arc<dyn TxnPartition>> {
        self.partition(topic, index).map(|p| p as Arc<dyn TxnPartition>)
    }

    fn not_led_error(&self, topic: &str, index: i32) -> i16 {
        ReplicaManager::not_led_error(self, topic, index)
    }
}

impl TxnPartition for Partition {
    fn isr_len(&self) -> usize {
        self.isr().len()
    }

    fn append(&self, batch: bytes::Bytes) -> (i16, i64) {
        // The coordinator's own records: no size limit but the frame's.
        let r = Partition::append(self, batch, u32::MAX);
        (r.error_code, r.last_offset)
    }

    fn append_may_block(&self, batch: &[u8]) -> bool {
        Partition::append_may_block(self, batch)
    }

    fn marker_may_block(&self) -> bool {
        // A marker batch is 78 bytes (a 61-byte header and one control record); a bound above
        // it errs towards the pool at a segment's edge.
        Partition::write_may_block(self, 128, 1)
    }

    fn watch(&self, waiter: &Arc<tokio::sync::Notify>) {
        Partition::watch(self, waiter)
    }

    fn high_watermark(&self) -> i64 {
        Partition::high_watermark(self)
    }

    fn is_leader(&self) -> bool {
        Partition::is_leader(self)
    }

    fn leader_epoch(&self) -> i32 {
        self.role().1
    }

    fn log_start_offset(&self) -> i64 {
        Partition::log_start_offset(self)
    }

    fn log_end_offset(&self) -> i64 {
        Partition::log_end_offset(self)
    }

    fn read(&self, offset: i64, max_bytes: usize) -> Option<bytes::Bytes> {
        let r = self.read_to_log_end(offset, max_bytes);
        (r.error_code == 0).then_some(r.records)
    }

    fn write_marker(&self, producer_id: i64, epoch: i16, commit: bool, coordinator_epoch: i32) -> (i16, i64) {
        Partition::write_marker(self, producer_id, epoch, commit, coordinator_epoch)
    }
}
