//! Share groups' APIs (KIP-932): ShareGroupHeartbeat and ShareGroupDescribe on the group's
//! coordinator, ShareFetch and ShareAcknowledge on the partitions' leaders. The rules live in
//! `group::share` and `share`; this file translates between them and the wire types. All four
//! are offered only while `group.coordinator.rebalance.protocols` names `share`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use kafka_protocol::messages::share_acknowledge_response::{
    PartitionData as AckPartitionData, ShareAcknowledgeTopicResponse,
};
use kafka_protocol::messages::share_fetch_response::{AcquiredRecords, PartitionData, ShareFetchableTopicResponse};
use kafka_protocol::messages::share_group_describe_response::{
    Assignment as DescribedAssignment, DescribedGroup, Member, TopicPartitions as DescribedTopicPartitions,
};
use kafka_protocol::messages::share_group_heartbeat_response::{Assignment, TopicPartitions};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use tokio::time::{Duration, Instant};
use uuid::Uuid;

use super::RequestContext;
use crate::group::share::{ShareGroup, ShareHeartbeatRequest};
use crate::protocol::ErrorCode;
use crate::security::authorizer::{Operation, ResourceType};
use crate::share::AckBatch;

fn s(v: impl Into<String>) -> StrBytes {
    StrBytes::from_string(v.into())
}

/// The API keys this file serves, which ApiVersions lists only while share groups are on.
pub const KEYS: [ApiKey; 4] =
    [ApiKey::ShareGroupHeartbeat, ApiKey::ShareGroupDescribe, ApiKey::ShareFetch, ApiKey::ShareAcknowledge];

pub fn share_group_heartbeat(ctx: &RequestContext, req: ShareGroupHeartbeatRequest) -> ShareGroupHeartbeatResponse {
    let mut r = ShareGroupHeartbeatResponse::default();
    r.member_epoch = -1;
    let group = req.group_id.0.to_string();
    let refused = if !ctx.authorized(Operation::Read, ResourceType::Group, &group) {
        Some(ErrorCode::GroupAuthorizationFailed.code())
    } else {
        ctx.components.groups.check_coordinator(&group).err()
    };
    if let Some(code) = refused {
        r.error_code = code;
        return r;
    }
    let result = ctx.components.groups.share_heartbeat(ShareHeartbeatRequest {
        group_id: group,
        member_id: req.member_id.to_string(),
        member_epoch: req.member_epoch,
        rack_id: req.rack_id.map(|i| i.to_string()),
        subscribed_topic_names: req.subscribed_topic_names.map(|ts| ts.into_iter().map(|t| t.0.to_string()).collect()),
        client_id: ctx.header.client_id.as_ref().map(|c| c.to_string()).unwrap_or_default(),
        client_host: ctx.peer.clone(),
    });
    r.error_code = result.error_code;
    r.error_message = result.error_message.map(s);
    r.member_id = result.member_id.map(s);
    r.member_epoch = result.member_epoch;
    r.heartbeat_interval_ms = result.heartbeat_interval_ms;
    r.assignment = result.assignment.map(|a| {
        let mut out = Assignment::default();
        out.topic_partitions = a
            .into_iter()
            .map(|(id, ps)| {
                let mut tp = TopicPartitions::default();
                tp.topic_id = id;
                tp.partitions = ps.into_iter().collect();
                tp
            })
            .collect();
        out
    });
    r
}

fn describe_one(ctx: &RequestContext, g: &ShareGroup) -> DescribedGroup {
    let snapshot = ctx.components.cache.snapshot();
    let mut d = DescribedGroup::default();
    d.group_state = s(g.state_name());
    d.group_epoch = g.epoch;
    d.assignment_epoch = g.epoch;
    d.assignor_name = s("simple");
    d.members = g
        .members
        .values()
        .map(|m| {
            let mut dm = Member::default();
            dm.member_id = s(m.id.clone());
            dm.rack_id = m.rack_id.clone().map(s);
            dm.member_epoch = m.epoch;
            dm.client_id = s(m.client_id.clone());
            dm.client_host = s(m.client_host.clone());
            dm.subscribed_topic_names = m.subscribed_topic_names.iter().map(|t| TopicName(s(t.clone()))).collect();
            let mut a = DescribedAssignment::default();
            a.topic_partitions = m
                .assigned
                .iter()
                .map(|(id, ps)| {
                    let mut tp = DescribedTopicPartitions::default();
                    tp.topic_id = *id;
                    tp.topic_name = TopicName(s(snapshot.topic_by_id(*id).map(|t| t.name.clone()).unwrap_or_default()));
                    tp.partitions = ps.iter().copied().collect();
                    tp
                })
                .collect();
            dm.assignment = a;
            dm
        })
        .collect();
    d
}

pub fn share_group_describe(ctx: &RequestContext, req: ShareGroupDescribeRequest) -> ShareGroupDescribeResponse {
    let mut r = ShareGroupDescribeResponse::default();
    let mut seen = BTreeSet::new();
    for id in req.group_ids {
        if !seen.insert(id.0.to_string()) {
            continue;
        }
        let group = id.0.to_string();
        let refused = if !ctx.authorized(Operation::Describe, ResourceType::Group, &group) {
            Some(ErrorCode::GroupAuthorizationFailed.code())
        } else {
            ctx.components.groups.check_coordinator(&group).err()
        };
        let found = || ctx.components.groups.share_groups().with_group(&group, |g| describe_one(ctx, g));
        let mut d = match refused.map(Err).unwrap_or_else(|| found().ok_or(ErrorCode::GroupIdNotFound.code())) {
            Ok(d) => d,
            Err(code) => {
                let mut d = DescribedGroup::default();
                d.error_code = code;
                if code == ErrorCode::GroupIdNotFound.code() {
                    let other = ctx.components.groups.is_consumer_group(&group)
                        || ctx.components.groups.with_group(&group, |_| ()).is_some();
                    d.error_message = Some(s(if other {
                        format!("Group {group} is not a share group.")
                    } else {
                        format!("Group {group} not found.")
                    }));
                }
                d
            }
        };
        d.authorized_operations = match req.include_authorized_operations && d.error_code == 0 {
            true => ctx.authorized_operations(ResourceType::Group, &group),
            false => i32::MIN,
        };
        d.group_id = id;
        r.groups.push(d);
    }
    r
}

/// A request's group and member: both required on the partition leader.
fn member_of(
    ctx: &RequestContext,
    group: &Option<GroupId>,
    member: &Option<StrBytes>,
) -> Result<(String, String), i16> {
    let (Some(group), Some(member)) = (group, member) else { return Err(ErrorCode::InvalidRequest.code()) };
    if group.is_empty() || member.is_empty() {
        return Err(ErrorCode::InvalidRequest.code());
    }
    if !ctx.authorized(Operation::Read, ResourceType::Group, group.as_str()) {
        return Err(ErrorCode::GroupAuthorizationFailed.code());
    }
    Ok((group.to_string(), member.to_string()))
}

/// The partition if it is led here and the principal may read its topic; else the error.
fn led_partition(
    ctx: &RequestContext,
    topic_id: Uuid,
    partition: i32,
) -> Result<Arc<crate::replication::Partition>, i16> {
    let name = ctx.components.cache.snapshot().topic_by_id(topic_id).map(|t| t.name.clone());
    let Some(name) = name else { return Err(ErrorCode::UnknownTopicId.code()) };
    if !ctx.authorized(Operation::Read, ResourceType::Topic, &name) {
        return Err(ErrorCode::TopicAuthorizationFailed.code());
    }
    ctx.components
        .replicas
        .partition(&name, partition)
        .ok_or_else(|| super::not_led_error(&ctx.components, &name, partition))
}

fn ack_batches(batches: impl IntoIterator<Item = (i64, i64, Vec<i8>)>) -> Vec<AckBatch> {
    batches
        .into_iter()
        .map(|(first_offset, last_offset, types)| AckBatch { first_offset, last_offset, types })
        .collect()
}

/// Applies one partition's acknowledgements; the error code they get (0: applied).
fn acknowledge_partition(
    ctx: &RequestContext,
    group: &str,
    member: &str,
    topic_id: Uuid,
    partition: i32,
    batches: &[AckBatch],
) -> i16 {
    if let Err(code) = led_partition(ctx, topic_id, partition) {
        return code;
    }
    match ctx.components.share.acknowledge(&(group.to_string(), topic_id, partition), member, batches) {
        Ok(()) => 0,
        Err(code) => code,
    }
}

pub async fn share_fetch(ctx: &RequestContext, req: ShareFetchRequest) -> ShareFetchResponse {
    let mut r = ShareFetchResponse::default();
    let share = &ctx.components.share;
    r.acquisition_lock_timeout_ms = share.config().record_lock_duration_ms;
    let (group, member) = match member_of(ctx, &req.group_id, &req.member_id) {
        Ok(gm) => gm,
        Err(code) => {
            r.error_code = code;
            return r;
        }
    };
    r.acquisition_lock_timeout_ms = share.lock_duration_ms(&group);
    let has_acks = req.topics.iter().flat_map(|t| &t.partitions).any(|p| !p.acknowledgement_batches.is_empty());
    if req.share_session_epoch == 0 && has_acks {
        r.error_code = ErrorCode::InvalidRequest.code();
        r.error_message = Some(s("Acknowledge data present on initial share fetch request."));
        return r;
    }
    let added: Vec<(Uuid, i32)> =
        req.topics.iter().flat_map(|t| t.partitions.iter().map(move |p| (t.topic_id, p.partition_index))).collect();
    let forgotten: Vec<(Uuid, i32)> =
        req.forgotten_topics_data.iter().flat_map(|t| t.partitions.iter().map(move |p| (t.topic_id, *p))).collect();
    let session = match share.fetch_session(&group, &member, req.share_session_epoch, &added, &forgotten) {
        Ok(partitions) => partitions,
        Err(code) => {
            r.error_code = code;
            return r;
        }
    };
    // Each partition's answer, in (topic, partition) order.
    let mut out: BTreeMap<(Uuid, i32), PartitionData> = BTreeMap::new();
    let mut acked = Vec::new();
    for t in &req.topics {
        for p in &t.partitions {
            let d = entry(&mut out, (t.topic_id, p.partition_index));
            if !p.acknowledgement_batches.is_empty() {
                acked.push((t.topic_id, p.partition_index));
                let batches = ack_batches(
                    p.acknowledgement_batches
                        .iter()
                        .map(|b| (b.first_offset, b.last_offset, b.acknowledge_types.clone())),
                );
                d.acknowledge_error_code =
                    acknowledge_partition(ctx, &group, &member, t.topic_id, p.partition_index, &batches);
            }
        }
    }
    if req.share_session_epoch == -1 {
        share.close_session(&group, &member);
        flush(ctx, &acked, &mut out).await;
        return finish(r, out);
    }
    let limits = (
        usize::try_from(req.max_records).ok().filter(|n| *n > 0).unwrap_or(500),
        usize::try_from(req.max_bytes).ok().filter(|n| *n > 0).unwrap_or(52_428_800),
    );
    let deadline = Instant::now() + Duration::from_millis(req.max_wait_ms.max(0) as u64);
    let min_bytes = usize::try_from(req.min_bytes).unwrap_or(0);
    let waiter = Arc::new(tokio::sync::Notify::new());
    loop {
        load_round(ctx, &group, &session).await;
        // MinBytes, as Kafka's delayed share fetch: nothing is acquired (and locked) while
        // less than that could be handed out and MaxWaitMs has not run out.
        let (got, keys) = match Instant::now() < deadline && !enough_bytes(ctx, &group, &session, min_bytes, &waiter) {
            true => (false, session.iter().map(|&(t, p)| (group.clone(), t, p)).collect()),
            false => acquire_round(ctx, &group, &member, &session, limits, &waiter, &mut out),
        };
        if got || Instant::now() >= deadline || session.is_empty() {
            break;
        }
        // Nothing to hand out: wait for new records or for a lock to run out.
        let until = share.next_lock_expiry(&keys).map_or(deadline, |t| t.min(deadline));
        ctx.park();
        let _ = tokio::time::timeout_at(until, waiter.notified()).await;
    }
    flush(ctx, &acked, &mut out).await;
    finish(r, out)
}

/// Whether the session's share-partitions led here could hand out `min_bytes` now. `waiter`
/// is registered with each partition before it is looked at, so a record produced meanwhile
/// wakes the wait.
fn enough_bytes(
    ctx: &RequestContext,
    group: &str,
    session: &[(Uuid, i32)],
    min_bytes: usize,
    waiter: &Arc<tokio::sync::Notify>,
) -> bool {
    if min_bytes <= 1 {
        return true;
    }
    let mut total = 0;
    for &(topic_id, index) in session {
        let Ok(partition) = led_partition(ctx, topic_id, index) else { continue };
        partition.watch(waiter);
        let key = (group.to_string(), topic_id, index);
        total += ctx.components.share.fetchable_bytes(&key, &*partition, min_bytes - total);
        if total >= min_bytes {
            return true;
        }
    }
    false
}

/// Loads the session's share-partitions this broker leads that it has not served yet.
async fn load_round(ctx: &RequestContext, group: &str, session: &[(Uuid, i32)]) {
    let share = &ctx.components.share;
    for &(topic_id, index) in session {
        let key = (group.to_string(), topic_id, index);
        if !share.needs_load(&key) {
            continue;
        }
        if let Ok(partition) = led_partition(ctx, topic_id, index) {
            share.ensure_loaded(&key, &*partition).await;
        }
    }
}

/// Makes the request's state changes durable before it is answered: acknowledgements that
/// cannot be written get the error instead of success.
async fn flush(ctx: &RequestContext, acked: &[(Uuid, i32)], out: &mut BTreeMap<(Uuid, i32), PartitionData>) {
    if let Err(code) = ctx.components.share.flush().await {
        for key in acked {
            let d = entry(out, *key);
            if d.acknowledge_error_code == 0 {
                d.acknowledge_error_code = code;
            }
        }
    }
}

fn entry(out: &mut BTreeMap<(Uuid, i32), PartitionData>, key: (Uuid, i32)) -> &mut PartitionData {
    out.entry(key).or_insert_with(|| {
        let mut p = PartitionData::default();
        p.partition_index = key.1;
        p.current_leader.leader_id = -1;
        p.current_leader.leader_epoch = -1;
        p
    })
}

/// One pass over the session's partitions, acquiring for `member` within (records, bytes).
/// Whether anything was acquired, and the share-partitions looked at. `waiter` is registered
/// with each partition before it is looked at, so a record produced meanwhile wakes the wait.
fn acquire_round(
    ctx: &RequestContext,
    group: &str,
    member: &str,
    session: &[(Uuid, i32)],
    (mut records_left, mut bytes_left): (usize, usize),
    waiter: &Arc<tokio::sync::Notify>,
    out: &mut BTreeMap<(Uuid, i32), PartitionData>,
) -> (bool, Vec<crate::share::SharePartitionKey>) {
    let mut got = false;
    let mut keys = Vec::new();
    for &(topic_id, index) in session {
        let key = (topic_id, index);
        let partition = match led_partition(ctx, topic_id, index) {
            Ok(p) => p,
            Err(code) => {
                entry(out, key).error_code = code;
                continue;
            }
        };
        partition.watch(waiter);
        let share_key = (group.to_string(), topic_id, index);
        if records_left > 0 && bytes_left > 0 {
            match ctx.components.share.acquire(&share_key, member, &*partition, records_left, bytes_left) {
                Ok(Some(acquired)) => {
                    got = true;
                    let n: i64 = acquired.ranges.iter().map(|(f, l, _)| l - f + 1).sum();
                    records_left = records_left.saturating_sub(n as usize);
                    bytes_left = bytes_left.saturating_sub(acquired.records.len());
                    let d = entry(out, key);
                    d.records = Some(acquired.records);
                    d.acquired_records = acquired
                        .ranges
                        .iter()
                        .map(|&(first, last, count)| {
                            let mut a = AcquiredRecords::default();
                            a.first_offset = first;
                            a.last_offset = last;
                            a.delivery_count = count;
                            a
                        })
                        .collect();
                }
                Ok(None) => {}
                Err(code) => entry(out, key).error_code = code,
            }
        }
        keys.push(share_key);
    }
    (got, keys)
}

fn finish(mut r: ShareFetchResponse, out: BTreeMap<(Uuid, i32), PartitionData>) -> ShareFetchResponse {
    let mut topics: BTreeMap<Uuid, Vec<PartitionData>> = BTreeMap::new();
    for ((topic_id, _), d) in out {
        topics.entry(topic_id).or_default().push(d);
    }
    r.responses = topics
        .into_iter()
        .map(|(topic_id, partitions)| {
            let mut t = ShareFetchableTopicResponse::default();
            t.topic_id = topic_id;
            t.partitions = partitions;
            t
        })
        .collect();
    r
}

pub async fn share_acknowledge(ctx: &RequestContext, req: ShareAcknowledgeRequest) -> ShareAcknowledgeResponse {
    let mut r = ShareAcknowledgeResponse::default();
    let share = &ctx.components.share;
    let (group, member) = match member_of(ctx, &req.group_id, &req.member_id) {
        Ok(gm) => gm,
        Err(code) => {
            r.error_code = code;
            return r;
        }
    };
    if let Err(code) = share.acknowledge_session(&group, &member, req.share_session_epoch) {
        r.error_code = code;
        return r;
    }
    for t in &req.topics {
        let mut topic = ShareAcknowledgeTopicResponse::default();
        topic.topic_id = t.topic_id;
        for p in &t.partitions {
            let batches = ack_batches(
                p.acknowledgement_batches.iter().map(|b| (b.first_offset, b.last_offset, b.acknowledge_types.clone())),
            );
            let mut d = AckPartitionData::default();
            d.partition_index = p.partition_index;
            d.current_leader.leader_id = -1;
            d.current_leader.leader_epoch = -1;
            d.error_code = acknowledge_partition(ctx, &group, &member, t.topic_id, p.partition_index, &batches);
            topic.partitions.push(d);
        }
        r.responses.push(topic);
    }
    if req.share_session_epoch == -1 {
        share.close_session(&group, &member);
    }
    if let Err(code) = share.flush().await {
        for d in r.responses.iter_mut().flat_map(|t| t.partitions.iter_mut()).filter(|d| d.error_code == 0) {
            d.error_code = code;
        }
    }
    r
}
