//! The share coordinator's inter-broker APIs (KIP-932): ReadShareGroupState and
//! WriteShareGroupState, sent by the leader of a user partition to the leader of the
//! `__share_group_state` partition its share-partition's state lives on. Cluster action, as
//! every broker-to-broker request.

use kafka_protocol::messages::read_share_group_state_response::{
    PartitionResult as ReadPartition, ReadStateResult, StateBatch as ReadBatch,
};
use kafka_protocol::messages::write_share_group_state_response::{PartitionResult as WritePartition, WriteStateResult};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;

use super::RequestContext;
use crate::protocol::ErrorCode;
use crate::security::authorizer::Operation;
use crate::share::state_log::StateBatch;
use crate::share::{LogPersister, RemoteWrite, SharePartitionKey};

/// The API keys this file serves, listed only while share groups are on.
pub const KEYS: [ApiKey; 2] = [ApiKey::ReadShareGroupState, ApiKey::WriteShareGroupState];

/// This broker's share coordinator, or the code every partition gets without one.
fn coordinator(ctx: &RequestContext) -> Result<&std::sync::Arc<LogPersister>, i16> {
    if !ctx.authorized_cluster(Operation::ClusterAction) {
        return Err(ErrorCode::ClusterAuthorizationFailed.code());
    }
    ctx.components.share.persister().ok_or(ErrorCode::CoordinatorNotAvailable.code())
}

pub async fn read_share_group_state(
    ctx: &RequestContext,
    req: ReadShareGroupStateRequest,
) -> ReadShareGroupStateResponse {
    let persister = coordinator(ctx);
    let group = req.group_id.to_string();
    let mut r = ReadShareGroupStateResponse::default();
    for t in req.topics {
        let mut out = ReadStateResult::default();
        out.topic_id = t.topic_id;
        for p in t.partitions {
            let key: SharePartitionKey = (group.clone(), t.topic_id, p.partition);
            let mut res = ReadPartition::default();
            res.partition = p.partition;
            res.start_offset = -1;
            let read = match persister {
                Ok(persister) => persister.serve_read(&key).await,
                Err(code) => Err(code),
            };
            match read {
                Ok(Some(state)) => {
                    res.state_epoch = state.state_epoch;
                    res.start_offset = state.start_offset;
                    res.state_batches =
                        crate::share::state_log::to_batches(state.offsets.iter().map(|(o, v)| (*o, *v)))
                            .iter()
                            .map(|b| {
                                let mut w = ReadBatch::default();
                                w.first_offset = b.first_offset;
                                w.last_offset = b.last_offset;
                                w.delivery_state = b.delivery_state;
                                w.delivery_count = b.delivery_count;
                                w
                            })
                            .collect();
                }
                Ok(None) => {}
                Err(code) => res.error_code = code,
            }
            out.partitions.push(res);
        }
        r.results.push(out);
    }
    r
}

pub async fn write_share_group_state(
    ctx: &RequestContext,
    req: WriteShareGroupStateRequest,
) -> WriteShareGroupStateResponse {
    let persister = coordinator(ctx);
    let group = req.group_id.to_string();
    let mut r = WriteShareGroupStateResponse::default();
    // Every partition's record is queued first, then one flush makes them durable together.
    let mut queued = Vec::new();
    for t in req.topics {
        let mut out = WriteStateResult::default();
        out.topic_id = t.topic_id;
        for p in t.partitions {
            let key: SharePartitionKey = (group.clone(), t.topic_id, p.partition);
            let mut res = WritePartition::default();
            res.partition = p.partition;
            let write = RemoteWrite {
                index: -1,
                state_epoch: p.state_epoch,
                leader_epoch: p.leader_epoch,
                start_offset: p.start_offset,
                batches: p
                    .state_batches
                    .iter()
                    .map(|b| StateBatch {
                        first_offset: b.first_offset,
                        last_offset: b.last_offset,
                        delivery_state: b.delivery_state,
                        delivery_count: b.delivery_count,
                    })
                    .collect(),
            };
            let queued_ok = match persister {
                Ok(persister) => persister.serve_write(&key, write).await,
                Err(code) => Err(code),
            };
            match queued_ok {
                Ok(()) => queued.push((key, out.partitions.len(), r.results.len())),
                Err(code) => res.error_code = code,
            }
            out.partitions.push(res);
        }
        r.results.push(out);
    }
    if let (Ok(persister), false) = (persister, queued.is_empty()) {
        if let Err(code) = persister.flush_local().await {
            let keys: Vec<SharePartitionKey> = queued.iter().map(|(k, _, _)| k.clone()).collect();
            persister.serve_failed(&keys);
            for (_, p, t) in queued {
                if let Some(res) = r.results.get_mut(t).and_then(|t| t.partitions.get_mut(p)) {
                    res.error_code = code;
                    res.error_message = Some(StrBytes::from_static_str("share-partition state not written"));
                }
            }
        }
    }
    r
}
