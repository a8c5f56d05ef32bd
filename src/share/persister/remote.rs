//! Share-partition state whose `__share_group_state` partition another broker leads, and the
//! other side of it.
//!
//! As a user partition's leader: the state is read with ReadShareGroupState when the
//! share-partition is first served here, and each step's changes go to the coordinator with
//! WriteShareGroupState, answered once the coordinator's ISR has them.
//!
//! As the share coordinator (the leader of a state partition): those requests are answered from
//! and appended to the local log. The state of each key is kept as the log has it, so that a
//! write that calls for a snapshot can write the whole state. A write from a leader epoch older
//! than one already written is fenced, as Kafka's coordinator fences it.

use std::collections::BTreeMap;
use std::time::Duration;

use kafka_protocol::messages::{
    read_share_group_state_request, write_share_group_state_request, ApiKey, ReadShareGroupStateRequest,
    ReadShareGroupStateResponse, WriteShareGroupStateRequest, WriteShareGroupStateResponse,
};
use kafka_protocol::protocol::StrBytes;

use super::{replay, Loaded, LogPersister, SharePartition, SharePartitionKey};
use crate::protocol::internal_topics::SHARE_GROUP_STATE_TOPIC;
use crate::protocol::ErrorCode;
use crate::security::client::InterBrokerClient;
use crate::share::state_log::{self, ReplayedState, StateBatch, StateValue, SNAPSHOT, UPDATE};
use crate::sync::MutexExt;

/// How this broker reaches other brokers' share coordinators.
pub struct RemoteHandles {
    /// The inter-broker listener's protocol (TLS, SASL), as every broker-to-broker request.
    pub inter_broker: std::sync::Arc<InterBrokerClient>,
    pub client_id: String,
    /// `socket.request.max.bytes`: the largest answer read.
    pub max_bytes: usize,
}

/// A share-partition served here whose state another broker's coordinator keeps.
pub(super) struct RemoteKey {
    index: i32,
    leader_epoch: i32,
    state_epoch: i32,
    /// Nothing written yet, or the last write may be lost: the next carries the whole state.
    first: bool,
}

/// One WriteShareGroupState partition: what a step changed.
#[derive(Debug, Clone)]
pub struct RemoteWrite {
    pub index: i32,
    pub state_epoch: i32,
    pub leader_epoch: i32,
    pub start_offset: i64,
    pub batches: Vec<StateBatch>,
}

/// A key's state on its coordinator, as its state partition's log has it.
pub(super) struct Served {
    pub(super) index: i32,
    state: Option<ReplayedState>,
}

impl LogPersister {
    /// Reads `key`'s state from the coordinator on broker `leader`.
    pub(super) async fn load_remote(&self, key: &SharePartitionKey, index: i32, leader: i32, epoch: i32) -> Loaded {
        let mut p = read_share_group_state_request::PartitionData::default();
        p.partition = key.2;
        p.leader_epoch = epoch;
        let mut t = read_share_group_state_request::ReadStateData::default();
        t.topic_id = key.1;
        t.partitions = vec![p];
        let mut req = ReadShareGroupStateRequest::default();
        req.group_id = StrBytes::from_string(key.0.clone());
        req.topics = vec![t];
        let resp: ReadShareGroupStateResponse = match self.call(leader, ApiKey::ReadShareGroupState, &req).await {
            Ok(r) => r,
            Err(code) => {
                tracing::debug!(
                    group = key.0,
                    partition = key.2,
                    leader,
                    error = code,
                    "cannot read share-partition state"
                );
                return Loaded::NotReady;
            }
        };
        let Some(found) = resp.results.iter().flat_map(|t| t.partitions.iter()).find(|p| p.partition == key.2) else {
            return Loaded::NotReady;
        };
        if found.error_code != ErrorCode::None.code() {
            tracing::debug!(
                group = key.0,
                partition = key.2,
                leader,
                error = found.error_code,
                "share coordinator refused a read"
            );
            return Loaded::NotReady;
        }
        let state = (found.start_offset >= 0).then(|| {
            let batches = found.state_batches.iter().map(|b| StateBatch {
                first_offset: b.first_offset,
                last_offset: b.last_offset,
                delivery_state: b.delivery_state,
                delivery_count: b.delivery_count,
            });
            let mut s = ReplayedState {
                start_offset: found.start_offset,
                state_epoch: found.state_epoch,
                ..Default::default()
            };
            s.apply(
                SNAPSHOT,
                &StateValue {
                    snapshot_epoch: 0,
                    state_epoch: found.state_epoch,
                    leader_epoch: epoch,
                    start_offset: found.start_offset,
                    create_timestamp: 0,
                    write_timestamp: 0,
                    batches: batches.collect(),
                },
            );
            s
        });
        let k = RemoteKey { index, leader_epoch: epoch, state_epoch: found.state_epoch, first: state.is_none() };
        self.remote.lock_unpoisoned().insert(key.clone(), k);
        Loaded::Durable(state)
    }

    /// Queues a step's changes of a share-partition whose coordinator is elsewhere; false if
    /// `key` is not one.
    pub(super) fn changed_remote(&self, key: &SharePartitionKey, p: &mut SharePartition) -> bool {
        let mut remote = self.remote.lock_unpoisoned();
        let Some(k) = remote.get_mut(key) else { return false };
        let changes = p.take_changes();
        let batches = if k.first { state_log::to_batches(p.persisted()) } else { state_log::to_batches(changes) };
        k.first = false;
        let write = RemoteWrite {
            index: k.index,
            state_epoch: k.state_epoch,
            leader_epoch: k.leader_epoch,
            start_offset: p.start_offset(),
            batches,
        };
        drop(remote);
        self.pending_remote.lock_unpoisoned().push((key.clone(), write));
        true
    }

    /// Sends queued writes, one request per coordinator and group, and waits for every answer.
    pub(super) async fn flush_remote(&self, queued: Vec<(SharePartitionKey, RemoteWrite)>) -> Result<(), i16> {
        let leaders = self.h.topic.leaders().unwrap_or_default();
        // Writes of one key stay in order within a request: Kafka applies them in order.
        let mut requests: BTreeMap<(i32, String), (WriteShareGroupStateRequest, Vec<SharePartitionKey>)> =
            BTreeMap::new();
        let mut result = Ok(());
        for (key, w) in queued {
            let Some(&leader) = leaders.get(w.index as usize).filter(|l| **l >= 0) else {
                result = Err(ErrorCode::CoordinatorNotAvailable.code());
                continue;
            };
            let (req, keys) = requests.entry((leader, key.0.clone())).or_insert_with(|| {
                let mut r = WriteShareGroupStateRequest::default();
                r.group_id = StrBytes::from_string(key.0.clone());
                (r, Vec::new())
            });
            keys.push(key.clone());
            let mut p = write_share_group_state_request::PartitionData::default();
            p.partition = key.2;
            p.state_epoch = w.state_epoch;
            p.leader_epoch = w.leader_epoch;
            p.start_offset = w.start_offset;
            p.state_batches = w.batches.iter().map(to_wire_batch).collect();
            match req.topics.iter_mut().find(|t| t.topic_id == key.1) {
                Some(t) => t.partitions.push(p),
                None => {
                    let mut t = write_share_group_state_request::WriteStateData::default();
                    t.topic_id = key.1;
                    t.partitions = vec![p];
                    req.topics.push(t);
                }
            }
        }
        for ((leader, _), (req, keys)) in requests {
            let resp: WriteShareGroupStateResponse = match self.call(leader, ApiKey::WriteShareGroupState, &req).await {
                Ok(r) => r,
                Err(code) => {
                    self.write_whole_next(&keys);
                    result = Err(code);
                    continue;
                }
            };
            let refused = resp.results.iter().flat_map(|t| t.partitions.iter()).find(|p| p.error_code != 0);
            if let Some(p) = refused {
                tracing::warn!(leader, error = p.error_code, "share coordinator refused a state write");
                self.write_whole_next(&keys);
                result = Err(ErrorCode::CoordinatorNotAvailable.code());
            }
        }
        result
    }

    /// After a write that may be lost (a coordinator moving, say), the next write of these
    /// share-partitions carries their whole state, not only the next step's changes.
    fn write_whole_next(&self, keys: &[SharePartitionKey]) {
        let mut remote = self.remote.lock_unpoisoned();
        for k in keys {
            if let Some(r) = remote.get_mut(k) {
                r.first = true;
            }
        }
    }

    async fn call<Req, Resp>(&self, leader: i32, key: ApiKey, req: &Req) -> Result<Resp, i16>
    where
        Req: kafka_protocol::protocol::Encodable + kafka_protocol::protocol::HeaderVersion,
        Resp: kafka_protocol::protocol::Decodable + kafka_protocol::protocol::HeaderVersion,
    {
        let unavailable = ErrorCode::CoordinatorNotAvailable.code();
        let Some(r) = &self.h.remote else { return Err(unavailable) };
        let Some((host, port)) = self.h.topic.address(leader) else { return Err(unavailable) };
        let call = crate::txn::pooled_round_trip::<_, Resp>(
            &r.inter_broker,
            &host,
            port,
            &r.client_id,
            key,
            0,
            req,
            r.max_bytes,
        );
        let timeout = self.h.write_timeout.max(Duration::from_millis(1));
        match tokio::time::timeout(timeout, call).await {
            Ok(Ok(resp)) => Ok(resp),
            Ok(Err(e)) => {
                tracing::debug!(leader, error = %e, "share coordinator request failed");
                Err(unavailable)
            }
            Err(_) => Err(ErrorCode::RequestTimedOut.code()),
        }
    }

    /// The state partition of `key` if this broker leads it, else NOT_COORDINATOR.
    fn coordinated_here(
        &self,
        key: &SharePartitionKey,
    ) -> Result<(i32, std::sync::Arc<dyn crate::txn::handles::TxnPartition>), i16> {
        let not_here = ErrorCode::NotCoordinator.code();
        let leaders = self.h.topic.leaders().ok_or(not_here)?;
        let index = crate::group::partition_for(&state_log::coordinator_key(key), leaders.len() as i32);
        let partition = self.h.partitions.leader_partition(SHARE_GROUP_STATE_TOPIC, index).ok_or(not_here)?;
        Ok((index, partition))
    }

    /// Loads `key`'s state from the log into `served` unless it is there.
    async fn serve_load(&self, key: &SharePartitionKey) -> Result<(), i16> {
        let (index, partition) = self.coordinated_here(key)?;
        if self.served.lock_unpoisoned().contains_key(key) {
            return Ok(());
        }
        let k = key.clone();
        let state = self
            .h
            .io
            .run(move || replay(&*partition, &k))
            .await
            .map_err(|_| ErrorCode::CoordinatorLoadInProgress.code())?;
        self.served.lock_unpoisoned().entry(key.clone()).or_insert(Served { index, state });
        Ok(())
    }

    /// ReadShareGroupState for one share-partition: its state, None if nothing was written.
    pub async fn serve_read(&self, key: &SharePartitionKey) -> Result<Option<ReplayedState>, i16> {
        self.serve_load(key).await?;
        let served = self.served.lock_unpoisoned();
        Ok(served.get(key).and_then(|s| s.state.clone()))
    }

    /// WriteShareGroupState for one share-partition: queues its record (an update, or a
    /// snapshot of the merged state when there is none yet or enough updates followed the
    /// last). [`LogPersister::flush`] makes it durable.
    pub async fn serve_write(&self, key: &SharePartitionKey, w: RemoteWrite) -> Result<(), i16> {
        self.serve_load(key).await?;
        let mut served = self.served.lock_unpoisoned();
        let Some(s) = served.get_mut(key) else { return Err(ErrorCode::CoordinatorLoadInProgress.code()) };
        let now = crate::log::now_ms();
        let mut value = StateValue {
            snapshot_epoch: 0,
            state_epoch: w.state_epoch,
            leader_epoch: w.leader_epoch,
            start_offset: w.start_offset,
            create_timestamp: now,
            write_timestamp: now,
            batches: w.batches,
        };
        let record_type = match &mut s.state {
            Some(state) if w.leader_epoch < state.leader_epoch => return Err(ErrorCode::FencedLeaderEpoch.code()),
            Some(state) if state.updates_since_snapshot < self.h.updates_per_snapshot => {
                value.snapshot_epoch = state.snapshot_epoch;
                value.create_timestamp = state.create_timestamp;
                state.apply(UPDATE, &value);
                UPDATE
            }
            Some(state) => {
                let mut merged = state.clone();
                value.snapshot_epoch = state.snapshot_epoch;
                merged.apply(UPDATE, &value);
                value.snapshot_epoch = state.snapshot_epoch.saturating_add(1);
                value.create_timestamp = state.create_timestamp;
                value.start_offset = merged.start_offset;
                value.batches = state_log::to_batches(merged.offsets.iter().map(|(o, v)| (*o, *v)));
                state.apply(SNAPSHOT, &value);
                SNAPSHOT
            }
            None => {
                let mut state = ReplayedState::default();
                state.apply(SNAPSHOT, &value);
                s.state = Some(state);
                SNAPSHOT
            }
        };
        let record = (s.index, state_log::encode_key(record_type, key), value.encode(record_type));
        drop(served);
        self.pending.lock_unpoisoned().push(record);
        Ok(())
    }

    /// Forgets what `serve_write` assumed written after a flush that failed: the next request
    /// reads the log again.
    pub fn serve_failed(&self, keys: &[SharePartitionKey]) {
        let mut served = self.served.lock_unpoisoned();
        for k in keys {
            served.remove(k);
        }
    }
}

fn to_wire_batch(b: &StateBatch) -> write_share_group_state_request::StateBatch {
    let mut w = write_share_group_state_request::StateBatch::default();
    w.first_offset = b.first_offset;
    w.last_offset = b.last_offset;
    w.delivery_state = b.delivery_state;
    w.delivery_count = b.delivery_count;
    w
}
