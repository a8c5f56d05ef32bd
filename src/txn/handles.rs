//! What the transaction service needs from the rest of the broker, as narrow traits that the
//! composition root (`broker`) implements over the replica manager, the controller and the
//! group coordinator. `txn` stays below them: it names none of those modules.

use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::Notify;

/// One partition this broker leads, as the coordinator uses it: its own `__transaction_state`
/// partitions (state appends and loads) and any partition a marker goes to.
pub trait TxnPartition: Send + Sync {
    /// Replicas in the ISR, for the `min.insync.replicas` check before a state write.
    fn isr_len(&self) -> usize;
    /// Appends one batch; (error code, last offset). Called on the I/O pool when
    /// [`TxnPartition::append_may_block`] says so, else inline.
    fn append(&self, batch: Bytes) -> (i16, i64);
    /// Whether appending `batch` could wait on the disk beyond a page-cache write: a segment
    /// roll or an fsync due, or the log busy with another write.
    fn append_may_block(&self, batch: &[u8]) -> bool;
    /// [`TxnPartition::append_may_block`] for a COMMIT or ABORT marker.
    fn marker_may_block(&self) -> bool;
    /// Wakes `waiter` on the next high-watermark move or role change.
    fn watch(&self, waiter: &Arc<Notify>);
    fn high_watermark(&self) -> i64;
    fn is_leader(&self) -> bool;
    fn leader_epoch(&self) -> i32;
    fn log_start_offset(&self) -> i64;
    fn log_end_offset(&self) -> i64;
    /// Up to `max_bytes` of whole batches from `offset` to the log end; None on an error.
    fn read(&self, offset: i64, max_bytes: usize) -> Option<Bytes>;
    /// Writes a COMMIT or ABORT marker for `producer_id`: the partition's error code and the
    /// marker's offset.
    fn write_marker(&self, producer_id: i64, epoch: i16, commit: bool, coordinator_epoch: i32) -> (i16, i64);
}

/// The partitions led here (the replica manager).
pub trait LocalPartitions: Send + Sync {
    /// `topic`-`index` if this broker leads it.
    fn leader_partition(&self, topic: &str, index: i32) -> Option<Arc<dyn TxnPartition>>;
    /// The error for a partition not led here: an offline log dir, another leader, or none.
    fn not_led_error(&self, topic: &str, index: i32) -> i16;
}

/// Creating `__transaction_state` on first use (the controller, or the request to it).
pub trait TransactionTopicCreator: Send + Sync {
    /// Ok(true) once created, Ok(false) when the creation cannot go ahead yet; an error says
    /// why it failed (another broker creating it, too few brokers).
    fn create_transaction_state_topic(&self) -> Result<bool, String>;
}

/// Told when a marker lands on a partition led here: the group coordinator settles the
/// offsets a transaction committed to `__consumer_offsets`.
pub trait MarkerListener: Send + Sync {
    fn on_marker_written(&self, topic: &str, partition: i32, producer_id: i64, commit: bool);
}
