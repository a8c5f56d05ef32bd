//! Share-partition state made durable in `__share_group_state` (KIP-932's share coordinator,
//! in-process): the leader of a user partition reads a share-partition's state back when it
//! first serves it, and writes a record for each change.
//!
//! A step of [`super::ShareManager`] decides under its lock and calls [`LogPersister::changed`],
//! which only encodes the record and queues it. The request that made the step then awaits
//! [`LogPersister::flush`], which appends the queue (on the I/O pool when the append may wait
//! on the disk) and waits until the partition's ISR has it, so an acknowledgement is answered
//! once it is durable. Records are appended in the order the steps queued them: one flush
//! appends at a time.
//!
//! The state of a share-partition lives on the `__share_group_state` partition its key
//! ("group:topicId:partition") hashes to, and the broker that leads that partition is its
//! share coordinator. A broker serving a user partition whose state partition another broker
//! leads reads and writes the state there, with ReadShareGroupState and WriteShareGroupState
//! ([`remote`]), as Kafka's persister does.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

use super::partition::SharePartition;
use super::state_log::{self, ReplayedState, StateValue, SNAPSHOT, UPDATE};
use super::SharePartitionKey;
use crate::io_pool::IoPool;
use crate::log::batch::{encode_batch, BatchHeader, BatchOptions, SimpleRecord};
use crate::protocol::internal_topics::SHARE_GROUP_STATE_TOPIC;
use crate::protocol::ErrorCode;
use crate::sync::MutexExt;
use crate::txn::handles::{LocalPartitions, TxnPartition};

mod remote;
pub use remote::{RemoteHandles, RemoteWrite};
use remote::{RemoteKey, Served};

/// What the persister needs to know of `__share_group_state` beyond the partitions led here.
pub trait StateTopic: Send + Sync {
    /// The leader of each partition (-1: none), from the metadata image; None while the topic
    /// does not exist.
    fn leaders(&self) -> Option<Vec<i32>>;
    /// Creates the topic as the share coordinator does on first use (a ZooKeeper write: called
    /// on the blocking pool). Err is the Kafka error code creation failed with.
    fn create(&self) -> Result<(), i16>;
    /// Where broker `id` takes inter-broker requests, from the metadata image.
    fn address(&self, id: i32) -> Option<(String, u16)>;
}

/// The handles the persister is built from, wired by the broker.
pub struct PersisterHandles {
    pub partitions: Arc<dyn LocalPartitions>,
    pub topic: Arc<dyn StateTopic>,
    pub io: Arc<IoPool>,
    /// How long a write waits for the ISR (Kafka's coordinators: `request.timeout.ms`).
    pub write_timeout: Duration,
    /// `share.coordinator.snapshot.update.records.per.snapshot`
    pub updates_per_snapshot: u32,
    /// How to reach other brokers' share coordinators; None: state led elsewhere stays in
    /// memory.
    pub remote: Option<RemoteHandles>,
}

/// What loading a share-partition found.
#[derive(Debug)]
pub enum Loaded {
    /// Its state is written here: what was read back (None: nothing yet).
    Durable(Option<ReplayedState>),
    /// Its state partition is led by another broker, or the topic cannot be created: the
    /// share-partition is kept in memory only.
    Memory,
    /// Not now: the topic is being created or its partition has no leader yet.
    NotReady,
}

/// What the next record of a durable share-partition carries.
struct Written {
    index: i32,
    snapshot_epoch: i32,
    state_epoch: i32,
    leader_epoch: i32,
    create_timestamp: i64,
    /// The start offset last written.
    start_offset: i64,
    /// None until the first snapshot is written.
    updates_since_snapshot: Option<u32>,
}

pub struct LogPersister {
    h: PersisterHandles,
    written: Mutex<HashMap<SharePartitionKey, Written>>,
    /// Records queued by steps, in order: (state partition, key, value).
    pending: Mutex<Vec<(i32, Bytes, Bytes)>>,
    /// Held while a flush appends, so queued records reach the log in order.
    appending: tokio::sync::Mutex<()>,
    /// Held while queued writes go to other brokers' coordinators, so that they arrive in
    /// order. Never held with `appending`, nor by a coordinator answering another broker.
    sending: tokio::sync::Mutex<()>,
    /// State partitions already reported as led elsewhere (one log line each).
    warned: Mutex<HashSet<i32>>,
    /// Share-partitions served here whose state partition another broker leads.
    remote: Mutex<HashMap<SharePartitionKey, RemoteKey>>,
    /// Their writes queued by steps, in order.
    pending_remote: Mutex<Vec<(SharePartitionKey, RemoteWrite)>>,
    /// As the share coordinator of the state partitions led here: the state of each key other
    /// brokers read or wrote, as the log has it.
    served: Mutex<HashMap<SharePartitionKey, Served>>,
}

impl LogPersister {
    pub fn new(h: PersisterHandles) -> LogPersister {
        LogPersister {
            h,
            written: Mutex::new(HashMap::new()),
            pending: Mutex::new(Vec::new()),
            appending: tokio::sync::Mutex::new(()),
            sending: tokio::sync::Mutex::new(()),
            warned: Mutex::new(HashSet::new()),
            remote: Mutex::new(HashMap::new()),
            pending_remote: Mutex::new(Vec::new()),
            served: Mutex::new(HashMap::new()),
        }
    }

    /// Reads back the state of `key`, whose user partition this broker leads at `leader_epoch`.
    pub async fn load(&self, key: &SharePartitionKey, leader_epoch: i32) -> Loaded {
        let leaders = match self.h.topic.leaders() {
            Some(l) => l,
            None => {
                let topic = self.h.topic.clone();
                match tokio::task::spawn_blocking(move || topic.create()).await {
                    Ok(Err(code)) if code == ErrorCode::InvalidReplicationFactor.code() => {
                        tracing::warn!(
                            topic = SHARE_GROUP_STATE_TOPIC,
                            "cannot create the share-group state topic with too few brokers \
                             (share.coordinator.state.topic.replication.factor): share-partition state is kept in memory"
                        );
                        return Loaded::Memory;
                    }
                    Ok(_) => {}
                    Err(_) => return Loaded::NotReady,
                }
                match self.h.topic.leaders() {
                    Some(l) => l,
                    None => return Loaded::NotReady,
                }
            }
        };
        let index = crate::group::partition_for(&state_log::coordinator_key(key), leaders.len() as i32);
        let Some(partition) = self.h.partitions.leader_partition(SHARE_GROUP_STATE_TOPIC, index) else {
            let leader = leaders.get(index as usize).copied().unwrap_or(-1);
            if leader < 0 {
                return Loaded::NotReady;
            }
            if self.h.remote.is_some() {
                return self.load_remote(key, index, leader, leader_epoch).await;
            }
            if self.warned.lock_unpoisoned().insert(index) {
                tracing::warn!(
                    partition = index,
                    leader,
                    "share-partition state on a {SHARE_GROUP_STATE_TOPIC} partition led by another broker is kept in memory"
                );
            }
            return Loaded::Memory;
        };
        // Written from here from now on: what this broker cached as a coordinator is stale.
        self.served.lock_unpoisoned().remove(key);
        self.remote.lock_unpoisoned().remove(key);
        let k = key.clone();
        let read = self.h.io.run(move || replay(&*partition, &k)).await;
        let Ok(found) = read else { return Loaded::NotReady };
        let w = match &found {
            Some(s) => Written {
                index,
                snapshot_epoch: s.snapshot_epoch,
                state_epoch: s.state_epoch,
                leader_epoch,
                create_timestamp: s.create_timestamp,
                start_offset: s.start_offset,
                updates_since_snapshot: Some(s.updates_since_snapshot),
            },
            None => Written {
                index,
                snapshot_epoch: -1,
                state_epoch: 0,
                leader_epoch,
                create_timestamp: crate::log::now_ms(),
                start_offset: -1,
                updates_since_snapshot: None,
            },
        };
        self.written.lock_unpoisoned().insert(key.clone(), w);
        Loaded::Durable(found)
    }

    /// Stops writing the state of `keys` (their user partition is no longer led here).
    pub fn forget(&self, keys: &[SharePartitionKey]) {
        let mut written = self.written.lock_unpoisoned();
        let mut remote = self.remote.lock_unpoisoned();
        for k in keys {
            written.remove(k);
            remote.remove(k);
        }
    }

    /// Stops writing to state partition `index` (no longer led here): the keys it held.
    pub fn forget_state_partition(&self, index: i32) -> Vec<SharePartitionKey> {
        let mut written = self.written.lock_unpoisoned();
        let gone: Vec<SharePartitionKey> =
            written.iter().filter(|(_, w)| w.index == index).map(|(k, _)| k.clone()).collect();
        for k in &gone {
            written.remove(k);
        }
        self.served.lock_unpoisoned().retain(|_, s| s.index != index);
        gone
    }

    /// Queues the record for what a step changed in `p` (called with the share-partitions'
    /// lock held: no I/O). A ShareUpdate with the changed offsets, or a ShareSnapshot of the
    /// whole state when the share-partition has none yet or enough updates followed the last.
    pub fn changed(&self, key: &SharePartitionKey, p: &mut SharePartition) {
        if self.changed_remote(key, p) {
            return;
        }
        let changes = p.take_changes();
        let mut written = self.written.lock_unpoisoned();
        let Some(w) = written.get_mut(key) else { return };
        if changes.is_empty() && w.updates_since_snapshot.is_some() && p.start_offset() == w.start_offset {
            return;
        }
        let snapshot = w.updates_since_snapshot.is_none_or(|n| n >= self.h.updates_per_snapshot);
        let (record_type, batches) = if snapshot {
            w.snapshot_epoch = w.snapshot_epoch.saturating_add(1);
            w.updates_since_snapshot = Some(0);
            (SNAPSHOT, state_log::to_batches(p.persisted()))
        } else {
            w.updates_since_snapshot = w.updates_since_snapshot.map(|n| n.saturating_add(1));
            (UPDATE, state_log::to_batches(changes))
        };
        let now = crate::log::now_ms();
        w.start_offset = p.start_offset();
        let value = StateValue {
            snapshot_epoch: w.snapshot_epoch,
            state_epoch: w.state_epoch,
            leader_epoch: w.leader_epoch,
            start_offset: p.start_offset(),
            create_timestamp: w.create_timestamp,
            write_timestamp: now,
            batches,
        };
        let record = (w.index, state_log::encode_key(record_type, key), value.encode(record_type));
        drop(written);
        self.pending.lock_unpoisoned().push(record);
    }

    /// Appends what the steps queued and waits until each state partition's ISR has it.
    /// Err: some of it may not be durable (the partition moved, the disk failed, or the ISR
    /// did not catch up in time).
    pub async fn flush(&self) -> Result<(), i16> {
        let remote_result = {
            let _order = self.sending.lock().await;
            let remote = std::mem::take(&mut *self.pending_remote.lock_unpoisoned());
            if remote.is_empty() {
                Ok(())
            } else {
                self.flush_remote(remote).await
            }
        };
        self.flush_local().await.and(remote_result)
    }

    /// Appends what was queued for the state partitions led here, and waits for their ISRs.
    /// The share coordinator's request handlers flush only this: a handler that also sent
    /// this broker's own remote writes could wait on a broker that waits on it.
    pub async fn flush_local(&self) -> Result<(), i16> {
        let order = self.appending.lock().await;
        let queued = std::mem::take(&mut *self.pending.lock_unpoisoned());
        if queued.is_empty() {
            return Ok(());
        }
        let mut by_partition: BTreeMap<i32, Vec<(Bytes, Bytes)>> = BTreeMap::new();
        for (index, k, v) in queued {
            by_partition.entry(index).or_default().push((k, v));
        }
        let mut result = Ok(());
        let mut appended = Vec::new();
        for (index, records) in by_partition {
            let Some(partition) = self.h.partitions.leader_partition(SHARE_GROUP_STATE_TOPIC, index) else {
                result = Err(ErrorCode::NotCoordinator.code());
                continue;
            };
            let now = crate::log::now_ms();
            let simple: Vec<SimpleRecord<'_>> = records
                .iter()
                .map(|(k, v)| SimpleRecord { timestamp: now, key: Some(k), value: Some(v), headers: vec![] })
                .collect();
            let batch = Bytes::from(encode_batch(&BatchOptions::default(), &simple));
            // The produce path's rule: a page-cache write is done here, as the hop to the I/O
            // pool costs more than the write; one that may roll or fsync goes to the pool.
            let written = if partition.append_may_block(&batch) {
                let part = partition.clone();
                self.h.io.run(move || part.append(batch)).await
            } else {
                Ok(partition.append(batch))
            };
            match written {
                Ok((0, last)) => appended.push((index, partition, last)),
                Ok((code, _)) => {
                    tracing::warn!(partition = index, error = code, "cannot write share-partition state");
                    self.snapshot_next(index);
                    result = Err(ErrorCode::CoordinatorNotAvailable.code());
                }
                Err(_) => {
                    self.snapshot_next(index);
                    result = Err(ErrorCode::CoordinatorNotAvailable.code());
                }
            }
        }
        drop(order);
        let deadline = Instant::now() + self.h.write_timeout;
        for (index, partition, last) in appended {
            if let Err(code) = replicated(&*partition, last, deadline).await {
                self.snapshot_next(index);
                result = Err(code);
            }
        }
        result
    }

    /// After a write to state partition `index` that may be lost, the next record of each of
    /// its share-partitions is a whole snapshot: an update only carries what its step changed,
    /// so the changes of the lost one would otherwise never reach the log.
    fn snapshot_next(&self, index: i32) {
        for w in self.written.lock_unpoisoned().values_mut().filter(|w| w.index == index) {
            w.updates_since_snapshot = None;
        }
    }
}

/// Waits until `partition`'s high watermark passes `last`.
async fn replicated(partition: &dyn TxnPartition, last: i64, deadline: Instant) -> Result<(), i16> {
    let waiter = Arc::new(tokio::sync::Notify::new());
    loop {
        // Registered before each check: a move in between leaves a permit.
        partition.watch(&waiter);
        if partition.high_watermark() > last {
            return Ok(());
        }
        if !partition.is_leader() {
            return Err(ErrorCode::NotCoordinator.code());
        }
        if tokio::time::timeout_at(deadline, waiter.notified()).await.is_err() {
            return match partition.high_watermark() > last {
                true => Ok(()),
                false => Err(ErrorCode::RequestTimedOut.code()),
            };
        }
    }
}

/// The state of `key` from its state partition's log: the last snapshot and the updates since
/// (None: no record of it). Reads the partition from its start: a disk read, on the I/O pool.
fn replay(partition: &dyn TxnPartition, key: &SharePartitionKey) -> Option<ReplayedState> {
    let mut state: Option<ReplayedState> = None;
    let mut offset = partition.log_start_offset();
    let end = partition.log_end_offset();
    while offset < end {
        let Some(records) = partition.read(offset, 1 << 20).filter(|r| !r.is_empty()) else { break };
        let mut buf = &records[..];
        let mut next = offset;
        while let Some(h) = BatchHeader::parse(buf) {
            let size = h.total_size();
            if size > buf.len() || size == 0 {
                break;
            }
            for kv in crate::group::offsets_log::batch_records(&buf[..size]) {
                let Some((record_type, k)) = state_log::decode_key(&kv.key) else { continue };
                if &k != key {
                    continue;
                }
                match kv.value.as_deref().and_then(|v| StateValue::decode(record_type, v)) {
                    // A tombstone (DeleteShareGroupState) forgets the share-partition.
                    None if kv.value.is_none() => state = None,
                    None => tracing::warn!(offset = h.base_offset, "skipping a malformed share-partition state record"),
                    Some(v) => {
                        // An update before any snapshot has nothing to apply to.
                        if record_type == SNAPSHOT || state.is_some() {
                            state.get_or_insert_with(ReplayedState::default).apply(record_type, &v);
                        }
                    }
                }
            }
            next = h.next_offset();
            buf = &buf[size..];
        }
        if next <= offset {
            break;
        }
        offset = next;
    }
    state
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::share::partition::{AckBatch, Limits};

    /// A `__share_group_state` partition in memory: appends batches, serves them back.
    #[derive(Default)]
    struct MemLog {
        /// (last offset, batch)
        batches: Mutex<Vec<(i64, Vec<u8>)>>,
        next: Mutex<i64>,
    }

    impl TxnPartition for MemLog {
        fn isr_len(&self) -> usize {
            1
        }
        fn append(&self, batch: Bytes) -> (i16, i64) {
            let mut next = self.next.lock_unpoisoned();
            let mut b = batch.to_vec();
            let count = i32::from_be_bytes([b[57], b[58], b[59], b[60]]) as i64;
            b[..8].copy_from_slice(&next.to_be_bytes());
            *next += count;
            self.batches.lock_unpoisoned().push((*next - 1, b));
            (0, *next - 1)
        }
        fn append_may_block(&self, batch: &[u8]) -> bool {
            // Both paths are taken: odd-sized batches go through the pool.
            batch.len() % 2 == 1
        }
        fn marker_may_block(&self) -> bool {
            false
        }
        fn watch(&self, _: &Arc<tokio::sync::Notify>) {}
        fn high_watermark(&self) -> i64 {
            *self.next.lock_unpoisoned()
        }
        fn is_leader(&self) -> bool {
            true
        }
        fn leader_epoch(&self) -> i32 {
            0
        }
        fn log_start_offset(&self) -> i64 {
            0
        }
        fn log_end_offset(&self) -> i64 {
            *self.next.lock_unpoisoned()
        }
        fn read(&self, offset: i64, _: usize) -> Option<Bytes> {
            let batches = self.batches.lock_unpoisoned();
            let from = batches.iter().filter(|(last, _)| *last >= offset);
            Some(Bytes::from(from.flat_map(|(_, b)| b.clone()).collect::<Vec<u8>>()))
        }
        fn write_marker(&self, _: i64, _: i16, _: bool, _: i32) -> (i16, i64) {
            (0, 0)
        }
    }

    struct Local(Arc<MemLog>);
    impl LocalPartitions for Local {
        fn leader_partition(&self, topic: &str, _: i32) -> Option<Arc<dyn TxnPartition>> {
            (topic == SHARE_GROUP_STATE_TOPIC).then(|| self.0.clone() as Arc<dyn TxnPartition>)
        }
        fn not_led_error(&self, _: &str, _: i32) -> i16 {
            ErrorCode::NotLeaderOrFollower.code()
        }
    }

    struct Topic;
    impl StateTopic for Topic {
        fn leaders(&self) -> Option<Vec<i32>> {
            Some(vec![0])
        }
        fn create(&self) -> Result<(), i16> {
            Ok(())
        }
        fn address(&self, _: i32) -> Option<(String, u16)> {
            None
        }
    }

    fn persister(log: &Arc<MemLog>, updates_per_snapshot: u32) -> LogPersister {
        LogPersister::new(PersisterHandles {
            partitions: Arc::new(Local(log.clone())),
            topic: Arc::new(Topic),
            io: Arc::new(IoPool::new(
                1,
                1,
                prometheus::IntCounter::new("jobs", "jobs").unwrap(),
                prometheus::IntGauge::new("threads", "threads").unwrap(),
            )),
            write_timeout: Duration::from_secs(1),
            updates_per_snapshot,
            remote: None,
        })
    }

    fn limits() -> Limits {
        Limits { lock_duration: Duration::from_secs(30), delivery_count_limit: 3, max_in_flight: 100 }
    }

    /// The record type of each record in `log`, in order.
    fn record_types(log: &MemLog) -> Vec<i16> {
        log.batches
            .lock_unpoisoned()
            .iter()
            .flat_map(|(_, b)| crate::group::offsets_log::batch_records(b))
            .filter_map(|kv| state_log::decode_key(&kv.key).map(|(t, _)| t))
            .collect()
    }

    fn key() -> SharePartitionKey {
        ("g".into(), uuid::Uuid::from_bytes([1; 16]), 0)
    }

    async fn reload(log: &Arc<MemLog>) -> SharePartition {
        let p = persister(log, 2);
        match p.load(&key(), 0).await {
            Loaded::Durable(Some(s)) => SharePartition::from_persisted(s.start_offset, &s.offsets, &limits()),
            other => panic!("{other:?}"),
        }
    }

    /// A share-partition written through snapshots and updates comes back as it was, with
    /// acquired records available again and their delivery counts kept.
    #[tokio::test]
    async fn state_written_is_state_read_back() {
        let log = Arc::new(MemLog::default());
        let p = persister(&log, 2);
        assert!(matches!(p.load(&key(), 0).await, Loaded::Durable(None)));
        let (l, now) = (limits(), Instant::now());
        let mut sp = SharePartition::new(10);
        p.changed(&key(), &mut sp);
        sp.acquire_new("a", 10, 19, 100, &[], now, &l);
        p.changed(&key(), &mut sp);
        let ack = AckBatch { first_offset: 10, last_offset: 14, types: vec![1] };
        sp.acknowledge("a", &[ack], now, &l).unwrap();
        p.changed(&key(), &mut sp);
        sp.acknowledge("a", &[AckBatch { first_offset: 16, last_offset: 16, types: vec![3] }], now, &l).unwrap();
        p.changed(&key(), &mut sp);
        p.flush().await.unwrap();
        // Snapshot, update, update, then a snapshot again (2 updates per snapshot).
        assert_eq!(record_types(&log), vec![SNAPSHOT, UPDATE, UPDATE, SNAPSHOT]);
        let back = reload(&log).await;
        assert_eq!(back.start_offset(), 15);
        assert_eq!(back.next_offset(), 20);
        assert_eq!(back.first_available(), Some(15));
        assert_eq!(back.state_of(15), Some((crate::share::partition::RecordState::Available, 1)));
        assert_eq!(back.state_of(16), Some((crate::share::partition::RecordState::Archived, 1)));
        // An update after the snapshot is applied too.
        let p = persister(&log, 2);
        assert!(matches!(p.load(&key(), 0).await, Loaded::Durable(Some(_))));
        let mut sp = back;
        assert_eq!(sp.acquire_available("b", 15, 19, 100, &[], now, &l), vec![(15, 15, 2), (17, 19, 2)]);
        sp.acknowledge("b", &[AckBatch { first_offset: 15, last_offset: 15, types: vec![1] }], now, &l).unwrap();
        p.changed(&key(), &mut sp);
        p.flush().await.unwrap();
        let back = reload(&log).await;
        assert_eq!(back.start_offset(), 17);
        assert_eq!(back.state_of(17), Some((crate::share::partition::RecordState::Available, 2)));
        // Once the state partition is led elsewhere nothing more is written from here.
        assert_eq!(p.forget_state_partition(0), vec![key()]);
        let batches = log.batches.lock_unpoisoned().len();
        sp.acknowledge("b", &[AckBatch { first_offset: 17, last_offset: 17, types: vec![1] }], now, &l).unwrap();
        p.changed(&key(), &mut sp);
        p.flush().await.unwrap();
        assert_eq!(log.batches.lock_unpoisoned().len(), batches);
    }

    fn write(leader_epoch: i32, start_offset: i64, batches: Vec<(i64, i64, i8, i16)>) -> RemoteWrite {
        RemoteWrite {
            index: -1,
            state_epoch: 0,
            leader_epoch,
            start_offset,
            batches: batches
                .into_iter()
                .map(|(f, l, s, c)| state_log::StateBatch {
                    first_offset: f,
                    last_offset: l,
                    delivery_state: s,
                    delivery_count: c,
                })
                .collect(),
        }
    }

    /// As a share coordinator: writes from another broker merge into the state, a snapshot
    /// follows every `updates_per_snapshot` updates, a new coordinator reads the same state
    /// back from the log, and a write from an older leader epoch is fenced.
    #[tokio::test]
    async fn a_coordinator_merges_remote_writes_and_fences_older_leaders() {
        let log = Arc::new(MemLog::default());
        let p = persister(&log, 2);
        assert_eq!(p.serve_read(&key()).await, Ok(None));
        p.serve_write(&key(), write(3, 10, vec![(10, 19, 1, 1)])).await.unwrap();
        p.serve_write(&key(), write(3, 12, vec![(12, 13, 2, 1)])).await.unwrap();
        p.serve_write(&key(), write(3, 15, vec![])).await.unwrap();
        p.serve_write(&key(), write(4, 15, vec![(16, 16, 4, 1)])).await.unwrap();
        p.flush().await.unwrap();
        assert_eq!(record_types(&log), vec![SNAPSHOT, UPDATE, UPDATE, SNAPSHOT]);
        let want = |s: Option<ReplayedState>| {
            let s = s.unwrap();
            (s.start_offset, s.offsets.into_iter().collect::<Vec<_>>())
        };
        let expected = (15, vec![(15, (1, 1)), (16, (4, 1)), (17, (1, 1)), (18, (1, 1)), (19, (1, 1))]);
        assert_eq!(want(p.serve_read(&key()).await.unwrap()), expected);
        // A new coordinator (this one restarted) replays the log to the same state.
        let again = persister(&log, 2);
        assert_eq!(want(again.serve_read(&key()).await.unwrap()), expected);
        assert_eq!(again.serve_write(&key(), write(3, 19, vec![])).await, Err(ErrorCode::FencedLeaderEpoch.code()));
    }
}
