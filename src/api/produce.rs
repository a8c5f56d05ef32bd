//! Produce: validate each partition's batches and append them as they are. With acks=all the
//! answer waits until the high watermark passes the write, i.e. every ISR member has it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kafka_protocol::messages::produce_request::TopicProduceData;
use kafka_protocol::messages::produce_response::{
    BatchIndexAndErrorMessage, PartitionProduceResponse, TopicProduceResponse,
};
use kafka_protocol::messages::{ProduceRequest, ProduceResponse};

use bytes::Bytes;
use kafka_protocol::protocol::StrBytes;
use tokio::sync::Notify;

use super::RequestContext;
use crate::protocol::ErrorCode;
use crate::replication::{Partition, ProduceResult};
use crate::security::authorizer::{Operation, ResourceType};

/// Where the answer of an append that passed validation goes.
struct Append {
    topic: usize,
    slot: usize,
    min_isr: usize,
}

/// A write that must reach the whole ISR before it is acknowledged.
struct Pending {
    topic: usize,
    slot: usize,
    partition: Arc<Partition>,
    last_offset: i64,
    min_isr: usize,
}

pub async fn handle(ctx: &RequestContext, req: ProduceRequest) -> Option<ProduceResponse> {
    let broker = &ctx.components;
    let acks = req.acks;
    let transactional = req.transactional_id.is_some();
    let txn_id: String = req.transactional_id.as_ref().map(|t| t.0.to_string()).unwrap_or_default();
    let remote = if transactional { verify_remote(ctx, &txn_id, &req).await } else { HashMap::new() };
    let produced: usize = req
        .topic_data
        .iter()
        .flat_map(|t| t.partition_data.iter())
        .map(|p| p.records.as_ref().map_or(0, |r| r.len()))
        .sum();
    let txn = Txn { transactional, id: &txn_id, remote: &remote };
    let Validated { mut responses, appends, writes, may_block } = validate(ctx, req.topic_data, acks, &txn);
    let pending = if writes.is_empty() {
        Vec::new()
    } else {
        append_all(ctx, &mut responses, appends, writes, may_block, acks).await
    };
    if !pending.is_empty() {
        ctx.park();
        let _parked = broker.metrics.park_produce();
        let deadline = Instant::now() + Duration::from_millis(req.timeout_ms.max(0) as u64);
        for w in &pending {
            let code = wait_committed(w, deadline).await;
            if let Some(out) = responses.get_mut(w.topic).and_then(|t| t.partition_responses.get_mut(w.slot)) {
                out.error_code = code;
            }
        }
    }
    // producer_byte_rate: the answer waits out the throttle time, which mutes the connection
    // (one request in flight each), and names it so the client backs off too (KIP-219).
    let (user, client) = super::quotas::quota_identity(ctx);
    let throttle =
        broker.quotas.record(crate::client_quota::PRODUCER_BYTE_RATE, user, &client, produced, broker.quotas.window());
    if !throttle.is_zero() {
        tokio::time::sleep(throttle).await;
    }
    if acks == 0 {
        return None;
    }
    let mut r = ProduceResponse::default();
    r.responses = responses;
    r.throttle_time_ms = throttle.as_millis().min(i32::MAX as u128) as i32;
    Some(r)
}

/// A transactional produce's id and what the remote coordinators said of its partitions
/// (empty and unused for a produce that is not transactional).
struct Txn<'a> {
    transactional: bool,
    id: &'a str,
    remote: &'a HashMap<(String, i32), i16>,
}

/// An append that passed validation: the partition, the records, the size limit, and the
/// transaction's marker count it was verified at.
type Write = (Arc<Partition>, Bytes, u32, Option<u64>);

/// What validation made of a request: the answer with the refusals in it, and the appends.
struct Validated {
    responses: Vec<TopicProduceResponse>,
    /// Where each append's answer goes, in the order of `writes`.
    appends: Vec<Append>,
    writes: Vec<Write>,
    /// Some append may roll a segment or fsync.
    may_block: bool,
}

/// Checks each partition's batches (acks, authorization, leadership, min.insync.replicas, the
/// batch, its transaction) and answers those refused; the others are appended together later.
fn validate(ctx: &RequestContext, topic_data: Vec<TopicProduceData>, acks: i16, txn: &Txn<'_>) -> Validated {
    let broker = &ctx.components;
    let valid_acks = matches!(acks, -1..=1);
    let effective = broker.effective_config();
    let mut v = Validated {
        responses: Vec::with_capacity(topic_data.len()),
        appends: Vec::new(),
        writes: Vec::new(),
        may_block: false,
    };
    for (ti, topic) in topic_data.into_iter().enumerate() {
        let name = topic.name.0.to_string();
        // Kafka answers a topic the principal may not write to before looking it up, so
        // whether it exists is not revealed.
        let may_write = ctx.authorized(Operation::Write, ResourceType::Topic, &name);
        let info = broker.cache.topic(&name);
        let config = |key: &str| info.as_ref().and_then(|t| t.configs.get(key).cloned());
        let max_bytes =
            config("max.message.bytes").and_then(|v| v.parse::<u32>().ok()).unwrap_or(effective.log.max_message_bytes);
        let compacted = match config("cleanup.policy") {
            Some(p) => p.split(',').any(|x| x.trim() == "compact"),
            None => effective.log.compact,
        };
        let min_isr = config("min.insync.replicas")
            .and_then(|v| v.parse::<usize>().ok())
            .unwrap_or(effective.min_insync_replicas.max(1) as usize);
        let mut partitions = Vec::with_capacity(topic.partition_data.len());
        for pd in topic.partition_data {
            let mut out = PartitionProduceResponse::default();
            out.index = pd.index;
            out.base_offset = -1;
            out.log_append_time_ms = -1;
            out.log_start_offset = -1;
            let code = if !valid_acks {
                ErrorCode::InvalidRequiredAcks.code()
            } else if !may_write {
                ErrorCode::TopicAuthorizationFailed.code()
            } else if txn.transactional && !ctx.authorized(Operation::Write, ResourceType::TransactionalId, txn.id) {
                ErrorCode::TransactionalIdAuthorizationFailed.code()
            } else {
                match (broker.replicas.partition(&name, pd.index), pd.records) {
                    (None, _) => {
                        if broker.replicas.logs().is_offline_partition(&name, pd.index) {
                            ErrorCode::KafkaStorageError.code()
                        } else if info.as_ref().is_some_and(|t| t.partitions.iter().any(|p| p.index == pd.index)) {
                            ErrorCode::NotLeaderOrFollower.code()
                        } else {
                            ErrorCode::UnknownTopicOrPartition.code()
                        }
                    }
                    (Some(_), None) => ErrorCode::CorruptMessage.code(),
                    // Below min.insync.replicas an acks=all write is refused before it is written.
                    (Some(p), Some(_)) if acks == -1 && p.isr().len() < min_isr => ErrorCode::NotEnoughReplicas.code(),
                    (Some(p), Some(records)) => match up_convert(ctx, records).and_then(|r| {
                        let verified = if txn.transactional {
                            txn_verified(ctx, txn.id, &p, (&name, pd.index), &r, txn.remote)?
                        } else {
                            None
                        };
                        Ok((r, verified))
                    }) {
                        Err(code) => code,
                        Ok((records, _))
                            if compacted && refuse_keyless(ctx, &name, pd.index, &records, max_bytes, &mut out) =>
                        {
                            out.error_code
                        }
                        Ok((records, verified_at)) => {
                            v.appends.push(Append { topic: ti, slot: partitions.len(), min_isr });
                            v.may_block = v.may_block || p.append_may_block(&records);
                            v.writes.push((p, records, max_bytes, verified_at));
                            0
                        }
                    },
                }
            };
            out.error_code = code;
            partitions.push(out);
        }
        let mut tr = TopicProduceResponse::default();
        tr.name = topic.name;
        tr.partition_responses = partitions;
        v.responses.push(tr);
    }
    v
}

/// Appends what passed validation and puts each result in its answer. The writes acks=all
/// must wait for, those the high watermark has not passed yet, are returned.
async fn append_all(
    ctx: &RequestContext,
    responses: &mut [TopicProduceResponse],
    appends: Vec<Append>,
    writes: Vec<Write>,
    may_block: bool,
    acks: i16,
) -> Vec<Pending> {
    let broker = &ctx.components;
    let dirs = if may_block { broker.replicas.log_dirs_of(writes.iter().map(|w| &*w.0)) } else { Vec::new() };
    let append_all = move || {
        writes
            .into_iter()
            .map(|(p, records, max_bytes, verified_at)| (p.append_verified(records, max_bytes, verified_at), p))
            .collect::<Vec<_>>()
    };
    // When one of them may roll a segment or fsync, all of the request's appends go to the
    // I/O pool in one hop, so no network worker waits on the disk. Otherwise they are
    // page-cache writes, done here: a hop costs two thread switches, several times the
    // write of a small request.
    let results = if !may_block {
        append_all()
    } else {
        match broker.io.run_on(dirs, append_all).await {
            Ok(results) => results,
            Err(e) => {
                tracing::error!(error = %e, "produce appends failed");
                Vec::new()
            }
        }
    };
    let mut results: std::vec::IntoIter<(ProduceResult, Arc<Partition>)> = results.into_iter();
    let mut pending = Vec::new();
    for a in appends {
        // Taken first, so that results and answers stay paired whatever is skipped.
        let result = results.next();
        let Some(out) = responses.get_mut(a.topic).and_then(|t| t.partition_responses.get_mut(a.slot)) else {
            continue;
        };
        let Some((result, p)) = result else {
            // The job died: whether its writes happened is unknown, so none is acknowledged.
            out.error_code = ErrorCode::UnknownServerError.code();
            continue;
        };
        out.base_offset = result.base_offset;
        out.log_start_offset = result.log_start_offset;
        out.log_append_time_ms = result.log_append_time;
        out.error_code = result.error_code;
        if result.error_code == 0 && acks == -1 && p.high_watermark() <= result.last_offset {
            pending.push(Pending {
                topic: a.topic,
                slot: a.slot,
                partition: p,
                last_offset: result.last_offset,
                min_isr: a.min_isr,
            });
        }
    }
    pending
}

/// A transactional produce must belong to an ongoing transaction that added the partition.
/// Ok: the producer's marker count on the partition before the check, for the append to
/// hold the write to (None for a write that is not transactional).
fn txn_verified(
    ctx: &RequestContext,
    txn_id: &str,
    partition: &Partition,
    (topic, index): (&str, i32),
    records: &[u8],
    remote: &HashMap<(String, i32), i16>,
) -> Result<Option<u64>, i16> {
    let Some(h) = crate::log::BatchHeader::parse(records) else { return Ok(None) };
    if !h.is_transactional() {
        return Ok(None);
    }
    let markers = partition.txn_markers_of(h.producer_id);
    let tp = (topic.to_string(), index);
    ctx.components.txn.verify_txn_produce(txn_id, h.producer_id, h.producer_epoch, &tp, remote)?;
    Ok(Some(markers))
}

/// Before any append: the transactional batches for partitions this broker leads whose
/// transaction is coordinated on another broker and not yet confirmed there are verified
/// with that coordinator in one round trip (KIP-890 part 1). The answer per partition.
async fn verify_remote(ctx: &RequestContext, txn_id: &str, req: &ProduceRequest) -> HashMap<(String, i32), i16> {
    let mut producer = None;
    let mut tps = Vec::new();
    for t in &req.topic_data {
        for pd in &t.partition_data {
            let Some(h) = pd.records.as_deref().and_then(crate::log::BatchHeader::parse) else { continue };
            if !h.is_transactional() || ctx.components.replicas.partition(&t.name.0, pd.index).is_none() {
                continue;
            }
            producer.get_or_insert((h.producer_id, h.producer_epoch));
            tps.push((t.name.0.to_string(), pd.index));
        }
    }
    let Some((pid, epoch)) = producer else { return HashMap::new() };
    ctx.components.txn.needs_remote_verification(txn_id, pid, epoch, &mut tps);
    if tps.is_empty() {
        return HashMap::new();
    }
    ctx.components.txn.verify_with_coordinator(txn_id, pid, epoch, &tps).await
}

/// Kafka's rule for compacted topics: every record needs a key, since compaction keeps the
/// last record per key. A batch with a keyless record is refused whole (its keyed records
/// too), each keyless record named in `record_errors` (Produce v8+). Returns whether it
/// refused; a payload that fails other validation is left to the append to answer.
fn refuse_keyless(
    ctx: &RequestContext,
    topic: &str,
    partition: i32,
    records: &[u8],
    max_bytes: u32,
    out: &mut PartitionProduceResponse,
) -> bool {
    let Ok(headers) = crate::log::validate_batches(records, max_bytes) else {
        return false;
    };
    let keyless =
        match crate::log::batch::keyless_records(records, &headers, ctx.components.config.socket_request_max_bytes) {
            Ok(k) => k,
            Err(e) => {
                tracing::info!(topic, partition, error = %e, "rejected produce to a compacted topic");
                out.error_code = e.kafka_code();
                return true;
            }
        };
    if keyless.is_empty() {
        return false;
    }
    let per_record =
        format!("Compacted topic cannot accept message without key in topic partition {topic}-{partition}");
    let shown: Vec<String> =
        keyless.iter().take(3).map(|i| format!("RecordError(batchIndex={i}, message='{per_record}')")).collect();
    out.error_code = ErrorCode::InvalidRecord.code();
    out.error_message = Some(StrBytes::from_string(format!(
        "One or more records have been rejected due to {} record errors in total, and only showing the first three \
         errors at most: [{}]",
        keyless.len(),
        shown.join(", ")
    )));
    out.record_errors = keyless
        .into_iter()
        .map(|i| {
            let mut e = BatchIndexAndErrorMessage::default();
            e.batch_index = i;
            e.batch_index_error_message = Some(StrBytes::from_string(per_record.clone()));
            e
        })
        .collect();
    true
}

/// Produce v0-v2 carry message sets of format v0/v1: they become one v2 batch before the log
/// sees them (as in Kafka 3.x, which stores v2 only). A v2 batch sent with an old version is
/// taken as it is, as Kafka does. A decompressed set may be no larger than the largest request
/// this broker accepts.
fn up_convert(ctx: &RequestContext, records: bytes::Bytes) -> Result<bytes::Bytes, i16> {
    if ctx.version() >= 3 || crate::log::legacy::first_magic(&records).is_none_or(|m| m >= 2) {
        return Ok(records);
    }
    crate::log::legacy::to_record_batch(&records, ctx.components.config.socket_request_max_bytes)
        .map(|batch| {
            let records = crate::log::batch::BatchHeader::parse(&batch).map_or(0, |h| h.records_count.max(0));
            ctx.components.metrics.conversions.produce.inc_by(records as u64);
            bytes::Bytes::from(batch)
        })
        .map_err(|e| {
            tracing::debug!(error = %e, "old-format message set refused");
            e.kafka_code()
        })
}

/// Waits, woken by its partition's high-watermark moves and role changes, until `w` is committed or the request times out.
async fn wait_committed(w: &Pending, deadline: Instant) -> i16 {
    let waiter = Arc::new(Notify::new());
    loop {
        // Before the check: a move in between leaves a permit, and the wait returns at once.
        w.partition.watch(&waiter);
        if w.partition.high_watermark() > w.last_offset {
            // Committed, but if the ISR shrank below the minimum meanwhile Kafka says so.
            return if w.partition.isr().len() < w.min_isr {
                ErrorCode::NotEnoughReplicasAfterAppend.code()
            } else {
                0
            };
        }
        if !w.partition.is_leader() {
            return ErrorCode::NotLeaderOrFollower.code();
        }
        let now = Instant::now();
        if now >= deadline || tokio::time::timeout(deadline - now, waiter.notified()).await.is_err() {
            return if w.partition.high_watermark() > w.last_offset { 0 } else { ErrorCode::RequestTimedOut.code() };
        }
    }
}
