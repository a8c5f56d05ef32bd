//! Transaction APIs: InitProducerId with a transactional id, AddPartitionsToTxn,
//! AddOffsetsToTxn, EndTxn, TxnOffsetCommit, WriteTxnMarkers, ListTransactions and
//! DescribeTransactions. The rules live in `txn`; this file translates between them and the
//! wire types and checks ACLs as Kafka does.

use std::time::Instant;

use bytes::Bytes;
use kafka_protocol::messages::add_partitions_to_txn_response::{
    AddPartitionsToTxnPartitionResult, AddPartitionsToTxnTopicResult,
};
use kafka_protocol::messages::describe_transactions_response::{TopicData, TransactionState};
use kafka_protocol::messages::list_transactions_response::TransactionState as ListedTransaction;
use kafka_protocol::messages::txn_offset_commit_response::{
    TxnOffsetCommitResponsePartition, TxnOffsetCommitResponseTopic,
};
use kafka_protocol::messages::write_txn_markers_response::{
    WritableTxnMarkerPartitionResult, WritableTxnMarkerResult, WritableTxnMarkerTopicResult,
};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;

use super::RequestContext;
use crate::group::coordinator::{CommittedOffset, PendingTxnOffset};
use crate::group::offsets_log::{OffsetValue, OffsetsKey};
use crate::group::OFFSETS_TOPIC;
use crate::log::batch::{encode_batch, BatchOptions, SimpleRecord, TRANSACTIONAL_BIT};
use crate::protocol::ErrorCode;
use crate::security::authorizer::{Operation, ResourceType};

fn s(v: impl Into<String>) -> StrBytes {
    StrBytes::from_string(v.into())
}

/// Before KIP-588 (request versions below 2) clients knew a fenced producer as
/// INVALID_PRODUCER_EPOCH.
fn fenced_for(version: i16, code: i16) -> i16 {
    if code == ErrorCode::ProducerFenced.code() && version < 2 {
        ErrorCode::InvalidProducerEpoch.code()
    } else {
        code
    }
}

pub async fn init_producer_id(ctx: &RequestContext, req: InitProducerIdRequest) -> InitProducerIdResponse {
    let mut r = InitProducerIdResponse::default();
    r.producer_id = ProducerId(-1);
    r.producer_epoch = -1;
    let Some(id) = req.transactional_id.as_ref().map(|t| t.0.to_string()) else {
        return r;
    };
    if !ctx.authorized(Operation::Write, ResourceType::TransactionalId, &id) {
        r.error_code = ErrorCode::TransactionalIdAuthorizationFailed.code();
        return r;
    }
    // Kafka 3.x refuses an empty transactional id (only a null one is an idempotent
    // producer's), as its producer client does.
    if id.is_empty() {
        r.error_code = ErrorCode::InvalidRequest.code();
        return r;
    }
    let expected = match (req.producer_id.0, req.producer_epoch) {
        (-1, -1) => None,
        (-1, _) | (_, -1) => {
            r.error_code = ErrorCode::InvalidRequest.code();
            return r;
        }
        (pid, epoch) => Some((pid, epoch)),
    };
    let (code, pid, epoch) =
        ctx.components.txn.init_transactional_producer(&id, req.transaction_timeout_ms, expected).await;
    // PRODUCER_FENCED came with v4 (KIP-588); older clients know the fencing as this.
    r.error_code = if code == ErrorCode::ProducerFenced.code() && ctx.version() < 4 {
        ErrorCode::InvalidProducerEpoch.code()
    } else {
        code
    };
    if code == 0 {
        r.producer_id = ProducerId(pid);
        r.producer_epoch = epoch;
    }
    r
}

/// AddPartitionsToTxn v0-v3: one transaction; every partition gets the one outcome, or the
/// partitions refused before the coordinator is asked get theirs and the rest
/// OPERATION_NOT_ATTEMPTED.
pub async fn add_partitions_to_txn(ctx: &RequestContext, req: AddPartitionsToTxnRequest) -> AddPartitionsToTxnResponse {
    let version = ctx.version();
    if version >= 4 {
        return add_partitions_for_brokers(ctx, req).await;
    }
    let id = req.v3_and_below_transactional_id.0.to_string();
    let wanted: Vec<(String, i32)> = req
        .v3_and_below_topics
        .iter()
        .flat_map(|t| t.partitions.iter().map(move |p| (t.name.0.to_string(), *p)))
        .collect();
    let mut per: Vec<((String, i32), i16)> = Vec::with_capacity(wanted.len());
    if !ctx.authorized(Operation::Write, ResourceType::TransactionalId, &id) {
        per = wanted.into_iter().map(|tp| (tp, ErrorCode::TransactionalIdAuthorizationFailed.code())).collect();
    } else {
        let refused: Vec<((String, i32), i16)> = wanted
            .iter()
            .filter_map(|(t, p)| {
                if !ctx.authorized(Operation::Write, ResourceType::Topic, t) {
                    Some(((t.clone(), *p), ErrorCode::TopicAuthorizationFailed.code()))
                } else if !partition_exists(ctx, t, *p) {
                    Some(((t.clone(), *p), ErrorCode::UnknownTopicOrPartition.code()))
                } else {
                    None
                }
            })
            .collect();
        if refused.is_empty() {
            let code = match ctx
                .components
                .txn
                .add_partitions_to_txn(&id, req.v3_and_below_producer_id.0, req.v3_and_below_producer_epoch, &wanted)
                .await
            {
                Ok(()) => 0,
                Err(code) => fenced_for(version, code),
            };
            per = wanted.into_iter().map(|tp| (tp, code)).collect();
        } else {
            for tp in wanted {
                let code = refused
                    .iter()
                    .find(|(r, _)| *r == tp)
                    .map(|(_, c)| *c)
                    .unwrap_or(ErrorCode::OperationNotAttempted.code());
                per.push((tp, code));
            }
        }
    }
    let mut r = AddPartitionsToTxnResponse::default();
    r.results_by_topic_v3_and_below = topic_results(per);
    r
}

/// AddPartitionsToTxn v4+, the batched form brokers send: a partition leader asks with
/// verify_only whether a producer's transaction added partitions before appending its
/// transactional batch (KIP-890 part 1). Only brokers may send it (CLUSTER_ACTION).
async fn add_partitions_for_brokers(
    ctx: &RequestContext,
    req: AddPartitionsToTxnRequest,
) -> AddPartitionsToTxnResponse {
    let mut r = AddPartitionsToTxnResponse::default();
    if !ctx.authorized_cluster(Operation::ClusterAction) {
        r.error_code = ErrorCode::ClusterAuthorizationFailed.code();
        return r;
    }
    for txn in req.transactions {
        let id = txn.transactional_id.0.to_string();
        let (pid, epoch) = (txn.producer_id.0, txn.producer_epoch);
        let tps: Vec<(String, i32)> =
            txn.topics.iter().flat_map(|t| t.partitions.iter().map(move |p| (t.name.0.to_string(), *p))).collect();
        let per: Vec<((String, i32), i16)> = match ctx.components.txn.check_txn_coordinator(&id) {
            Err(code) => tps.into_iter().map(|tp| (tp, code)).collect(),
            Ok(_) if txn.verify_only => ctx.components.txn.coordinator().verify_only(&id, pid, epoch, &tps),
            Ok(_) => {
                let code = match ctx.components.txn.add_partitions_to_txn(&id, pid, epoch, &tps).await {
                    Ok(()) => 0,
                    Err(code) => code,
                };
                tps.into_iter().map(|tp| (tp, code)).collect()
            }
        };
        let mut result = add_partitions_to_txn_response::AddPartitionsToTxnResult::default();
        result.transactional_id = txn.transactional_id;
        result.topic_results = topic_results(per);
        r.results_by_transaction.push(result);
    }
    r
}

fn topic_results(per: Vec<((String, i32), i16)>) -> Vec<AddPartitionsToTxnTopicResult> {
    let mut out: Vec<AddPartitionsToTxnTopicResult> = Vec::new();
    for ((topic, p), code) in per {
        let mut pr = AddPartitionsToTxnPartitionResult::default();
        pr.partition_index = p;
        pr.partition_error_code = code;
        match out.iter_mut().find(|t| t.name.0.as_str() == topic) {
            Some(t) => t.results_by_partition.push(pr),
            None => {
                let mut t = AddPartitionsToTxnTopicResult::default();
                t.name = TopicName(s(topic));
                t.results_by_partition.push(pr);
                out.push(t);
            }
        }
    }
    out
}

fn partition_exists(ctx: &RequestContext, topic: &str, partition: i32) -> bool {
    ctx.components.cache.topic(topic).is_some_and(|t| t.partitions.iter().any(|p| p.index == partition))
}

/// AddOffsetsToTxn: the group's `__consumer_offsets` partition joins the transaction.
pub async fn add_offsets_to_txn(ctx: &RequestContext, req: AddOffsetsToTxnRequest) -> AddOffsetsToTxnResponse {
    let mut r = AddOffsetsToTxnResponse::default();
    let id = req.transactional_id.0.to_string();
    let group = req.group_id.0.to_string();
    if !ctx.authorized(Operation::Write, ResourceType::TransactionalId, &id) {
        r.error_code = ErrorCode::TransactionalIdAuthorizationFailed.code();
        return r;
    }
    if !ctx.authorized(Operation::Read, ResourceType::Group, &group) {
        r.error_code = ErrorCode::GroupAuthorizationFailed.code();
        return r;
    }
    // Before any group was coordinated the offsets topic does not exist yet: the partition is
    // the one FindCoordinator's creation of it will give the group (Kafka hashes over
    // offsets.topic.num.partitions here too). Refusing would leave a Java producer, which asks
    // for the group's coordinator only after this answer, retrying forever.
    let p = ctx
        .components
        .groups
        .offsets_partition(&group)
        .unwrap_or_else(|| crate::group::partition_for(&group, ctx.components.config.offsets_topic.num_partitions));
    let tps = [(OFFSETS_TOPIC.to_string(), p)];
    r.error_code =
        match ctx.components.txn.add_partitions_to_txn(&id, req.producer_id.0, req.producer_epoch, &tps).await {
            Ok(()) => 0,
            Err(code) => fenced_for(ctx.version(), code),
        };
    r
}

pub async fn end_txn(ctx: &RequestContext, req: EndTxnRequest) -> EndTxnResponse {
    let mut r = EndTxnResponse::default();
    r.producer_id = ProducerId(-1);
    r.producer_epoch = -1;
    let id = req.transactional_id.0.to_string();
    if !ctx.authorized(Operation::Write, ResourceType::TransactionalId, &id) {
        r.error_code = ErrorCode::TransactionalIdAuthorizationFailed.code();
        return r;
    }
    let code = ctx.components.txn.end_txn(&id, req.producer_id.0, req.producer_epoch, req.committed).await;
    r.error_code = fenced_for(ctx.version(), code);
    r
}

/// TxnOffsetCommit, to the group coordinator: the offsets are written to `__consumer_offsets`
/// as part of the producer's transaction and become the group's only when its COMMIT marker
/// arrives there.
pub async fn txn_offset_commit(ctx: &RequestContext, req: TxnOffsetCommitRequest) -> TxnOffsetCommitResponse {
    let id = req.transactional_id.0.to_string();
    let group = req.group_id.0.to_string();
    let broker = &ctx.components;
    let common = if !ctx.authorized(Operation::Write, ResourceType::TransactionalId, &id) {
        Some(ErrorCode::TransactionalIdAuthorizationFailed.code())
    } else if !ctx.authorized(Operation::Read, ResourceType::Group, &group) {
        Some(ErrorCode::GroupAuthorizationFailed.code())
    } else {
        broker.groups.check_coordinator(&group).err()
    };
    let mut results: Vec<((String, i32), i16)> = Vec::new();
    let mut wanted: Vec<PendingTxnOffset> = Vec::new();
    let now = crate::log::now_ms();
    for t in &req.topics {
        let name = t.name.0.to_string();
        let readable = ctx.authorized(Operation::Read, ResourceType::Topic, &name);
        for p in &t.partitions {
            let tp = (name.clone(), p.partition_index);
            let metadata = p.committed_metadata.as_ref().map(|m| m.to_string()).unwrap_or_default();
            let code = match common {
                Some(c) => c,
                None if !readable => ErrorCode::TopicAuthorizationFailed.code(),
                None if !partition_exists(ctx, &name, p.partition_index) => ErrorCode::UnknownTopicOrPartition.code(),
                None if metadata.len() > broker.config.offset_metadata_max_bytes => {
                    ErrorCode::OffsetMetadataTooLarge.code()
                }
                None => {
                    wanted.push(PendingTxnOffset {
                        group: group.clone(),
                        tp: tp.clone(),
                        offset: CommittedOffset {
                            offset: p.committed_offset,
                            leader_epoch: p.committed_leader_epoch,
                            metadata,
                            commit_timestamp: now,
                        },
                    });
                    0
                }
            };
            results.push((tp, code));
        }
    }
    if !wanted.is_empty() {
        let code = write_txn_offsets(ctx, &group, req.producer_id.0, req.producer_epoch, wanted).await;
        for (_, c) in results.iter_mut().filter(|(_, c)| *c == 0) {
            *c = code;
        }
    }
    let mut r = TxnOffsetCommitResponse::default();
    for ((topic, p), code) in results {
        let mut pr = TxnOffsetCommitResponsePartition::default();
        pr.partition_index = p;
        pr.error_code = code;
        match r.topics.iter_mut().find(|t| t.name.0.as_str() == topic) {
            Some(t) => t.partitions.push(pr),
            None => {
                let mut t = TxnOffsetCommitResponseTopic::default();
                t.name = TopicName(s(topic));
                t.partitions.push(pr);
                r.topics.push(t);
            }
        }
    }
    r
}

/// Appends the offsets as one transactional batch of the producer to the group's offsets
/// partition, waits for its ISR, then holds them pending the marker.
async fn write_txn_offsets(
    ctx: &RequestContext,
    group: &str,
    producer_id: i64,
    epoch: i16,
    offsets: Vec<PendingTxnOffset>,
) -> i16 {
    let broker = &ctx.components;
    let Some(p) = broker.groups.offsets_partition(group) else { return ErrorCode::NotCoordinator.code() };
    let Some(partition) = broker.replicas.partition(OFFSETS_TOPIC, p) else { return ErrorCode::NotCoordinator.code() };
    let records: Vec<(Bytes, Bytes)> = offsets
        .iter()
        .map(|o| {
            let key = OffsetsKey::Offset { group: group.to_string(), topic: o.tp.0.clone(), partition: o.tp.1 };
            let value = OffsetValue {
                offset: o.offset.offset,
                leader_epoch: o.offset.leader_epoch,
                metadata: o.offset.metadata.clone(),
                commit_timestamp: o.offset.commit_timestamp,
            };
            (key.encode(), value.encode())
        })
        .collect();
    let ts = crate::log::now_ms();
    let simple: Vec<SimpleRecord<'_>> = records
        .iter()
        .map(|(k, v)| SimpleRecord { timestamp: ts, key: Some(k), value: Some(v), headers: vec![] })
        .collect();
    let opts =
        BatchOptions { attributes: TRANSACTIONAL_BIT, producer_id, producer_epoch: epoch, ..BatchOptions::default() };
    let batch = Bytes::from(encode_batch(&opts, &simple));
    let part = partition.clone();
    let result = match tokio::task::spawn_blocking(move || part.append(batch, u32::MAX)).await {
        Ok(r) => r,
        Err(_) => return ErrorCode::CoordinatorNotAvailable.code(),
    };
    match result.error_code {
        0 => {}
        6 => return ErrorCode::NotCoordinator.code(),
        47 => return ErrorCode::InvalidProducerEpoch.code(),
        code => {
            tracing::warn!(group, error = code, "cannot write transactional offsets");
            return ErrorCode::CoordinatorNotAvailable.code();
        }
    }
    broker.groups.add_txn_offsets(producer_id, p, offsets);
    let deadline = Instant::now() + broker.config.offsets_commit_timeout;
    // Woken by this partition's high-watermark moves; registered before each check.
    let waiter = std::sync::Arc::new(tokio::sync::Notify::new());
    loop {
        partition.watch(&waiter);
        if partition.high_watermark() > result.last_offset {
            return 0;
        }
        let now = Instant::now();
        if now >= deadline || tokio::time::timeout(deadline - now, waiter.notified()).await.is_err() {
            return if partition.high_watermark() > result.last_offset { 0 } else { ErrorCode::RequestTimedOut.code() };
        }
    }
}

/// WriteTxnMarkers, from a transaction coordinator (or `kafka-transactions abort`): a marker
/// on each named partition this broker leads.
pub async fn write_txn_markers(ctx: &RequestContext, req: WriteTxnMarkersRequest) -> WriteTxnMarkersResponse {
    let allowed = ctx.authorized_cluster(Operation::ClusterAction);
    let mut r = WriteTxnMarkersResponse::default();
    for m in req.markers {
        let tps: Vec<(String, i32)> =
            m.topics.iter().flat_map(|t| t.partition_indexes.iter().map(move |p| (t.name.0.to_string(), *p))).collect();
        let results = if allowed {
            ctx.components
                .txn
                .write_markers(m.producer_id.0, m.producer_epoch, m.transaction_result, m.coordinator_epoch, tps)
                .await
        } else {
            tps.into_iter().map(|tp| (tp, ErrorCode::ClusterAuthorizationFailed.code())).collect()
        };
        let mut mr = WritableTxnMarkerResult::default();
        mr.producer_id = m.producer_id;
        for ((topic, p), code) in results {
            let mut pr = WritableTxnMarkerPartitionResult::default();
            pr.partition_index = p;
            pr.error_code = code;
            match mr.topics.iter_mut().find(|t| t.name.0.as_str() == topic) {
                Some(t) => t.partitions.push(pr),
                None => {
                    let mut t = WritableTxnMarkerTopicResult::default();
                    t.name = TopicName(s(topic));
                    t.partitions.push(pr);
                    mr.topics.push(t);
                }
            }
        }
        r.markers.push(mr);
    }
    r
}

/// ListTransactions: the transactional ids this broker coordinates.
pub fn list_transactions(ctx: &RequestContext, req: ListTransactionsRequest) -> ListTransactionsResponse {
    let mut r = ListTransactionsResponse::default();
    let states: Vec<String> = req.state_filters.iter().map(|s| s.to_string()).collect();
    let known = [
        "Empty",
        "Ongoing",
        "PrepareCommit",
        "PrepareAbort",
        "CompleteCommit",
        "CompleteAbort",
        "Dead",
        "PrepareEpochFence",
    ];
    r.unknown_state_filters = states.iter().filter(|s| !known.contains(&s.as_str())).map(|x| s(x.clone())).collect();
    let now = crate::log::now_ms();
    let mut all = ctx.components.txn.coordinator().all();
    all.sort_by(|a, b| a.0.cmp(&b.0));
    for (id, m) in all {
        if m.epoch < 0 || ctx.components.txn.check_txn_coordinator(&id).is_err() {
            continue;
        }
        if !states.is_empty() && !states.iter().any(|s| s == m.state.name()) {
            continue;
        }
        if !req.producer_id_filters.is_empty() && !req.producer_id_filters.iter().any(|p| p.0 == m.producer_id) {
            continue;
        }
        // v1: only transactions running longer than the filter.
        if req.duration_filter >= 0 && (m.start_ms < 0 || now - m.start_ms < req.duration_filter) {
            continue;
        }
        if !ctx.authorized(Operation::Describe, ResourceType::TransactionalId, &id) {
            continue;
        }
        let mut t = ListedTransaction::default();
        t.transactional_id = TransactionalId(s(id));
        t.producer_id = ProducerId(m.producer_id);
        t.transaction_state = s(m.state.name());
        r.transaction_states.push(t);
    }
    r
}

pub fn describe_transactions(ctx: &RequestContext, req: DescribeTransactionsRequest) -> DescribeTransactionsResponse {
    let mut r = DescribeTransactionsResponse::default();
    for id in req.transactional_ids {
        let name = id.0.to_string();
        let mut t = TransactionState::default();
        t.producer_id = ProducerId(-1);
        t.producer_epoch = -1;
        t.transaction_start_time_ms = -1;
        t.transaction_state = s("");
        if !ctx.authorized(Operation::Describe, ResourceType::TransactionalId, &name) {
            t.error_code = ErrorCode::TransactionalIdAuthorizationFailed.code();
        } else if let Err(code) = ctx.components.txn.check_txn_coordinator(&name) {
            t.error_code = code;
        } else {
            match ctx.components.txn.coordinator().get(&name).filter(|m| m.epoch >= 0) {
                None => t.error_code = ErrorCode::TransactionalIdNotFound.code(),
                Some(m) => {
                    t.transaction_state = s(m.state.name());
                    t.transaction_timeout_ms = m.timeout_ms;
                    t.transaction_start_time_ms = m.start_ms;
                    t.producer_id = ProducerId(m.producer_id);
                    t.producer_epoch = m.epoch;
                    for (topic, p) in m.partitions {
                        match t.topics.iter_mut().find(|x: &&mut TopicData| x.topic.0.as_str() == topic) {
                            Some(x) => x.partitions.push(p),
                            None => {
                                let mut x = TopicData::default();
                                x.topic = TopicName(s(topic));
                                x.partitions.push(p);
                                t.topics.push(x);
                            }
                        }
                    }
                }
            }
        }
        t.transactional_id = id;
        r.transaction_states.push(t);
    }
    r
}
