//! Consumer group APIs: FindCoordinator, JoinGroup, SyncGroup, Heartbeat, LeaveGroup,
//! OffsetCommit, OffsetFetch, DescribeGroups, ListGroups, DeleteGroups, OffsetDelete. The rules
//! live in `group::coordinator`; this file translates between it and the wire types.

// Kafka 3.9 keeps OffsetCommit/OffsetFetch v0 offsets in ZooKeeper (here: the znode store,
// which is ZooKeeper in a cluster), as the pre-0.8.2 consumers did.
use crate::group::zk_mirror::{is_znode_name, offset_path as zk_offset_path};
use kafka_protocol::messages::delete_groups_response::DeletableGroupResult;
use kafka_protocol::messages::describe_groups_response::{DescribedGroup, DescribedGroupMember};
use kafka_protocol::messages::find_coordinator_response::Coordinator;
use kafka_protocol::messages::join_group_response::JoinGroupResponseMember;
use kafka_protocol::messages::leave_group_response::MemberResponse;
use kafka_protocol::messages::list_groups_response::ListedGroup;
use kafka_protocol::messages::offset_commit_response::{OffsetCommitResponsePartition, OffsetCommitResponseTopic};
use kafka_protocol::messages::offset_delete_response::{OffsetDeleteResponsePartition, OffsetDeleteResponseTopic};
use kafka_protocol::messages::offset_fetch_response::{
    OffsetFetchResponseGroup, OffsetFetchResponsePartition, OffsetFetchResponsePartitions, OffsetFetchResponseTopic,
    OffsetFetchResponseTopics,
};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;

use std::collections::HashSet;
use std::time::Instant;

use super::{Components, RequestContext};
use crate::group::coordinator::{subscribed_topics, CommittedOffset, JoinRequest};
use crate::group::OFFSETS_TOPIC;
use crate::protocol::ErrorCode;
use crate::security::authorizer::{Operation, ResourceType};

fn s(v: impl Into<String>) -> StrBytes {
    StrBytes::from_string(v.into())
}

/// The group checks Kafka makes before it looks for the coordinator: `op` on the group, then
/// whether this broker coordinates it.
fn check_group(ctx: &RequestContext, op: Operation, group: &str) -> Result<(), i16> {
    if !ctx.authorized(op, ResourceType::Group, group) {
        return Err(ErrorCode::GroupAuthorizationFailed.code());
    }
    ctx.components.groups.check_coordinator(group)
}

pub fn find_coordinator(ctx: &RequestContext, req: FindCoordinatorRequest) -> FindCoordinatorResponse {
    let version = ctx.version();
    let keys: Vec<String> = if version >= 4 {
        req.coordinator_keys.iter().map(|k| k.to_string()).collect()
    } else {
        vec![req.key.to_string()]
    };
    let mut r = FindCoordinatorResponse::default();
    for key in keys {
        let mut c = Coordinator::default();
        c.key = s(key.clone());
        c.node_id = BrokerId(-1);
        c.port = -1;
        if req.key_type == 0 && !ctx.authorized(Operation::Describe, ResourceType::Group, &key) {
            c.error_code = ErrorCode::GroupAuthorizationFailed.code();
            c.error_message = Some(s("Group authorization failed."));
        } else if req.key_type == 1 && !ctx.authorized(Operation::Describe, ResourceType::TransactionalId, &key) {
            c.error_code = ErrorCode::TransactionalIdAuthorizationFailed.code();
            c.error_message = Some(s("Transactional Id authorization failed."));
        } else if req.key_type == 1 {
            match ctx.components.txn.txn_coordinator_for(&key, &ctx.listener) {
                Ok((id, host, port)) => {
                    c.node_id = BrokerId(id);
                    c.host = s(host);
                    c.port = port as i32;
                }
                Err(code) => {
                    c.error_code = code;
                    c.error_message = Some(s("The coordinator is not available."));
                }
            }
        } else if req.key_type != 0 {
            c.error_code = ErrorCode::InvalidRequest.code();
            c.error_message = Some(s(format!("Invalid coordinator type {}", req.key_type)));
        } else {
            match group_coordinator_for(&ctx.components, &key, &ctx.listener) {
                Ok((id, host, port)) => {
                    c.node_id = BrokerId(id);
                    c.host = s(host);
                    c.port = port as i32;
                }
                Err(code) => {
                    c.error_code = code;
                    c.error_message = Some(s("The coordinator is not available."));
                }
            }
        }
        r.coordinators.push(c);
    }
    if version < 4 {
        if let Some(c) = r.coordinators.pop() {
            r.error_code = c.error_code;
            r.error_message = c.error_message;
            r.node_id = c.node_id;
            r.host = c.host;
            r.port = c.port;
        }
    }
    r
}

/// FindCoordinator for a group: the leader of its `__consumer_offsets` partition, creating the
/// topic on first use as Kafka does.
fn group_coordinator_for(broker: &Components, group: &str, listener: &str) -> Result<(i32, String, u16), i16> {
    broker.groups.ensure_offsets_topic()?;
    coordinator_in(broker, OFFSETS_TOPIC, group, listener)
}

/// The leader of `key`'s partition of the internal topic `topic`, with its address on
/// `listener`.
fn coordinator_in(broker: &Components, topic: &str, key: &str, listener: &str) -> Result<(i32, String, u16), i16> {
    let topic = broker.cache.topic(topic).ok_or(ErrorCode::CoordinatorNotAvailable.code())?;
    let p = crate::group::partition_for(key, topic.partitions.len() as i32);
    let leader = topic
        .partitions
        .iter()
        .find(|x| x.index == p)
        .map(|x| x.leader)
        .ok_or(ErrorCode::CoordinatorNotAvailable.code())?;
    if leader < 0 {
        return Err(ErrorCode::CoordinatorNotAvailable.code());
    }
    if leader == broker.config.broker_id {
        // Named leader but the partition not yet open or its groups still loading: a
        // client sent here now would get COORDINATOR_LOAD_IN_PROGRESS from its first commit,
        // which librdkafka's synchronous commit hands to the application. Not available
        // keeps it asking FindCoordinator, which it retries by itself.
        let loading = topic.name == OFFSETS_TOPIC && broker.groups.is_loading(p);
        if loading || broker.replicas.partition(&topic.name, p).is_none() {
            return Err(ErrorCode::CoordinatorNotAvailable.code());
        }
        let ep = broker.config.advertised_for(listener).ok_or(ErrorCode::CoordinatorNotAvailable.code())?;
        return Ok((leader, ep.host.clone(), ep.port));
    }
    let snapshot = broker.cache.snapshot();
    let b = snapshot.brokers.iter().find(|b| b.id == leader).ok_or(ErrorCode::CoordinatorNotAvailable.code())?;
    let (host, port) = b.endpoint_for(listener).ok_or(ErrorCode::CoordinatorNotAvailable.code())?;
    Ok((b.id, host.to_string(), port))
}

pub async fn join_group(ctx: &RequestContext, req: JoinGroupRequest) -> JoinGroupResponse {
    let broker = &ctx.components;
    if let Err(code) = check_group(ctx, Operation::Read, req.group_id.0.as_str()) {
        let mut r = JoinGroupResponse::default();
        r.error_code = code;
        r.generation_id = -1;
        r.member_id = req.member_id;
        if ctx.version() < 7 {
            r.protocol_name = Some(StrBytes::default());
        }
        return r;
    }
    let client_id = ctx.header.client_id.as_ref().map(|c| c.to_string()).unwrap_or_default();
    let result = broker
        .groups
        .join(JoinRequest {
            group_id: req.group_id.0.to_string(),
            member_id: req.member_id.to_string(),
            instance_id: req.group_instance_id.map(|i| i.to_string()),
            client_id,
            client_host: ctx.peer.clone(),
            session_timeout_ms: req.session_timeout_ms,
            // v0 has no rebalance timeout: Kafka uses the session timeout.
            rebalance_timeout_ms: if ctx.version() == 0 { req.session_timeout_ms } else { req.rebalance_timeout_ms },
            protocol_type: req.protocol_type.to_string(),
            protocols: req.protocols.into_iter().map(|p| (p.name.to_string(), p.metadata)).collect(),
            require_known_member_id: ctx.version() >= 4,
        })
        .await;
    let mut r = JoinGroupResponse::default();
    r.error_code = result.error_code;
    r.generation_id = result.generation_id;
    r.protocol_type = result.protocol_type.map(s);
    r.protocol_name = result.protocol_name.map(s);
    if ctx.version() < 7 && r.protocol_name.is_none() {
        // Before v7 the field is not nullable.
        r.protocol_name = Some(StrBytes::default());
    }
    r.leader = s(result.leader);
    r.member_id = s(result.member_id);
    r.members = result
        .members
        .into_iter()
        .map(|(id, instance, metadata)| {
            let mut m = JoinGroupResponseMember::default();
            m.member_id = s(id);
            m.group_instance_id = instance.map(s);
            m.metadata = metadata;
            m
        })
        .collect();
    r
}

pub async fn sync_group(ctx: &RequestContext, req: SyncGroupRequest) -> SyncGroupResponse {
    let broker = &ctx.components;
    let group_id = req.group_id.0.to_string();
    let mut r = SyncGroupResponse::default();
    if let Err(code) = check_group(ctx, Operation::Read, &group_id) {
        r.error_code = code;
        return r;
    }
    // v5: the client names the protocol it thinks was chosen; it must match.
    if let (Some(pt), Some(pn)) = (&req.protocol_type, &req.protocol_name) {
        let matches = broker
            .groups
            .with_group(&group_id, |g| {
                g.protocol_type.as_deref() == Some(pt.as_str())
                    && (g.protocol_name.is_none() || g.protocol_name.as_deref() == Some(pn.as_str()))
            })
            .unwrap_or(true);
        if !matches {
            r.error_code = ErrorCode::InconsistentGroupProtocol.code();
            return r;
        }
    }
    let assignments = req.assignments.into_iter().map(|a| (a.member_id.to_string(), a.assignment)).collect();
    let instance = req.group_instance_id.as_ref().map(|i| i.to_string());
    let result = broker
        .groups
        .sync(&group_id, req.generation_id, req.member_id.as_str(), instance.as_deref(), assignments)
        .await;
    r.error_code = result.error_code;
    r.protocol_type = result.protocol_type.map(s);
    r.protocol_name = result.protocol_name.map(s);
    r.assignment = result.assignment;
    r
}

pub fn heartbeat(ctx: &RequestContext, req: HeartbeatRequest) -> HeartbeatResponse {
    let instance = req.group_instance_id.as_ref().map(|i| i.to_string());
    let mut r = HeartbeatResponse::default();
    if let Err(code) = check_group(ctx, Operation::Read, req.group_id.0.as_str()) {
        r.error_code = code;
        return r;
    }
    r.error_code = ctx.components.groups.heartbeat(
        req.group_id.0.as_str(),
        req.generation_id,
        req.member_id.as_str(),
        instance.as_deref(),
    );
    r
}

pub fn leave_group(ctx: &RequestContext, req: LeaveGroupRequest) -> LeaveGroupResponse {
    // v0-2 name one member; v3+ a list (static members by instance id).
    let members: Vec<(String, Option<String>)> = if ctx.version() >= 3 {
        req.members
            .iter()
            .map(|m| (m.member_id.to_string(), m.group_instance_id.as_ref().map(|i| i.to_string())))
            .collect()
    } else {
        vec![(req.member_id.to_string(), None)]
    };
    let mut r = LeaveGroupResponse::default();
    if let Err(code) = check_group(ctx, Operation::Read, req.group_id.0.as_str()) {
        r.error_code = code;
        return r;
    }
    match ctx.components.groups.leave(req.group_id.0.as_str(), &members) {
        Ok(codes) if ctx.version() >= 3 => {
            r.members = members
                .into_iter()
                .zip(codes)
                .map(|((id, instance), code)| {
                    let mut m = MemberResponse::default();
                    m.member_id = s(id);
                    m.group_instance_id = instance.map(s);
                    m.error_code = code;
                    m
                })
                .collect();
        }
        Ok(codes) => r.error_code = codes.first().copied().unwrap_or(ErrorCode::UnknownMemberId.code()),
        Err(code) => r.error_code = code,
    }
    r
}

pub async fn offset_commit(ctx: &RequestContext, req: OffsetCommitRequest) -> OffsetCommitResponse {
    let group_check = check_group(ctx, Operation::Read, req.group_id.0.as_str());
    let unreadable = unreadable_topics(ctx, req.topics.iter().map(|t| t.name.0.as_str()));
    let mut wanted = Vec::new();
    for t in req.topics.iter().filter(|t| !unreadable.contains(t.name.0.as_str())) {
        for p in &t.partitions {
            wanted.push((
                (t.name.0.to_string(), p.partition_index),
                p.committed_offset,
                p.committed_leader_epoch,
                p.committed_metadata.as_ref().map(|m| m.to_string()),
            ));
        }
    }
    let results = match group_check {
        // Nothing left to commit once the unreadable topics are out: the coordinator is not
        // asked (it could create the group), as in Kafka.
        Ok(()) if wanted.is_empty() => Vec::new(),
        Ok(()) => ctx.components.groups.commit_offsets(
            req.group_id.0.as_str(),
            req.generation_id_or_member_epoch,
            req.member_id.as_str(),
            wanted,
        ),
        Err(code) => wanted.into_iter().map(|(tp, ..)| (tp, code)).collect(),
    };
    // A commit counts only once every ISR member of the offsets partition has it (Kafka's
    // offsets.commit.required.acks=-1), so a coordinator failover cannot lose it.
    let mut results = results;
    if results.iter().any(|(_, c)| *c == ErrorCode::None.code())
        && !committed_everywhere(ctx, req.group_id.0.as_str()).await
    {
        for (_, c) in results.iter_mut().filter(|(_, c)| *c == ErrorCode::None.code()) {
            *c = ErrorCode::RequestTimedOut.code();
        }
    }
    let mut r = OffsetCommitResponse::default();
    for t in req.topics {
        let mut tr = OffsetCommitResponseTopic::default();
        let name = t.name.0.to_string();
        for p in t.partitions {
            let mut pr = OffsetCommitResponsePartition::default();
            pr.partition_index = p.partition_index;
            pr.error_code = match group_check {
                Err(code) if code == ErrorCode::GroupAuthorizationFailed.code() => code,
                _ if unreadable.contains(&name) => ErrorCode::TopicAuthorizationFailed.code(),
                _ => results
                    .iter()
                    .find(|((n, i), _)| *n == name && *i == p.partition_index)
                    .map(|(_, c)| *c)
                    .unwrap_or(ErrorCode::UnknownTopicOrPartition.code()),
            };
            tr.partitions.push(pr);
        }
        tr.name = t.name;
        r.topics.push(tr);
    }
    r
}

/// The topics of a request the principal may not READ (commits and offset deletes).
fn unreadable_topics<'a>(
    ctx: &RequestContext,
    names: impl Iterator<Item = &'a str>,
) -> std::collections::HashSet<String> {
    names.filter(|n| !ctx.authorized(Operation::Read, ResourceType::Topic, n)).map(str::to_string).collect()
}

/// Waits until the high watermark of `group`'s offsets partition covers everything appended
/// to it so far.
async fn committed_everywhere(ctx: &RequestContext, group: &str) -> bool {
    let Some(p) = ctx
        .components
        .groups
        .offsets_partition(group)
        .and_then(|p| ctx.components.replicas.partition(OFFSETS_TOPIC, p))
    else {
        return false;
    };
    let target = p.log_end_offset();
    let deadline = Instant::now() + ctx.components.config.offsets_commit_timeout;
    let waiter = std::sync::Arc::new(tokio::sync::Notify::new());
    loop {
        p.watch(&waiter);
        if p.high_watermark() >= target {
            return true;
        }
        let now = Instant::now();
        if now >= deadline || tokio::time::timeout(deadline - now, waiter.notified()).await.is_err() {
            return p.high_watermark() >= target;
        }
    }
}

fn partition_exists(ctx: &RequestContext, topic: &str, partition: i32) -> bool {
    ctx.components.cache.topic(topic).is_some_and(|t| t.partitions.iter().any(|p| p.index == partition))
}

/// OffsetCommit v0: any broker writes the offsets straight to the znode store, no group
/// coordinator involved (Kafka 3.9's `setOrCreateConsumerOffset`).
pub fn offset_commit_v0(ctx: &RequestContext, req: OffsetCommitRequest) -> OffsetCommitResponse {
    let group = req.group_id.0.to_string();
    let group_allowed = ctx.authorized(Operation::Read, ResourceType::Group, &group);
    let mut r = OffsetCommitResponse::default();
    for t in req.topics {
        let mut tr = OffsetCommitResponseTopic::default();
        let name = t.name.0.to_string();
        let topic_allowed = ctx.authorized(Operation::Read, ResourceType::Topic, &name);
        for p in t.partitions {
            let mut pr = OffsetCommitResponsePartition::default();
            pr.partition_index = p.partition_index;
            pr.error_code = if !group_allowed {
                ErrorCode::GroupAuthorizationFailed.code()
            } else if !topic_allowed {
                ErrorCode::TopicAuthorizationFailed.code()
            } else if !partition_exists(ctx, &name, p.partition_index) {
                ErrorCode::UnknownTopicOrPartition.code()
            } else if p
                .committed_metadata
                .as_ref()
                .is_some_and(|m| m.len() > ctx.components.config.offset_metadata_max_bytes)
            {
                ErrorCode::OffsetMetadataTooLarge.code()
            } else if !is_znode_name(&group) {
                ErrorCode::InvalidGroupId.code()
            } else {
                let path = zk_offset_path(&group, &name, p.partition_index);
                match ctx.components.store.set(&path, &p.committed_offset.to_string()) {
                    Ok(()) => ErrorCode::None.code(),
                    Err(e) => {
                        tracing::warn!(%path, error = %e, "cannot store a v0 offset commit");
                        ErrorCode::UnknownServerError.code()
                    }
                }
            };
            tr.partitions.push(pr);
        }
        tr.name = t.name;
        r.topics.push(tr);
    }
    r
}

/// OffsetFetch v0: the offsets OffsetCommit v0 wrote. A partition without one (or of no known
/// topic) answers offset -1 and no error, as Kafka does.
pub fn offset_fetch_v0(ctx: &RequestContext, req: OffsetFetchRequest) -> OffsetFetchResponse {
    let group = req.group_id.0.to_string();
    let group_allowed = ctx.authorized(Operation::Describe, ResourceType::Group, &group);
    let mut r = OffsetFetchResponse::default();
    for t in req.topics.unwrap_or_default() {
        let mut tr = OffsetFetchResponseTopic::default();
        let name = t.name.0.to_string();
        let topic_allowed = ctx.authorized(Operation::Describe, ResourceType::Topic, &name);
        for p in t.partition_indexes {
            let mut pr = OffsetFetchResponsePartition::default();
            pr.partition_index = p;
            pr.committed_offset = -1;
            pr.committed_leader_epoch = -1;
            pr.metadata = Some(StrBytes::default());
            if !group_allowed {
                pr.error_code = ErrorCode::GroupAuthorizationFailed.code();
            } else if !topic_allowed {
                pr.error_code = ErrorCode::TopicAuthorizationFailed.code();
            } else if partition_exists(ctx, &name, p) && is_znode_name(&group) {
                match ctx.components.store.try_get(&zk_offset_path(&group, &name, p)) {
                    Ok(None) => {}
                    Ok(Some(v)) => match v.trim().parse::<i64>() {
                        Ok(o) => pr.committed_offset = o,
                        Err(_) => pr.error_code = ErrorCode::UnknownServerError.code(),
                    },
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot read a v0 offset");
                        pr.error_code = ErrorCode::UnknownServerError.code();
                    }
                }
            }
            tr.partitions.push(pr);
        }
        tr.name = t.name;
        r.topics.push(tr);
    }
    r
}

type Fetched = Vec<((String, i32), Option<CommittedOffset>)>;

/// A group's committed offsets, as far as the principal may DESCRIBE their topics: a named
/// topic it may not is answered TOPIC_AUTHORIZATION_FAILED, and "all topics" leaves such
/// topics out, as Kafka does. The second list holds the refused partitions.
fn group_offsets(
    ctx: &RequestContext,
    group: &str,
    topics: Option<Vec<(String, Vec<i32>)>>,
) -> (Fetched, Vec<(String, i32)>) {
    let may_describe = |t: &str| ctx.authorized(Operation::Describe, ResourceType::Topic, t);
    let mut refused = Vec::new();
    let wanted = topics.map(|ts| {
        let mut wanted = Vec::new();
        for (t, ps) in ts {
            let allowed = may_describe(&t);
            for p in ps {
                match allowed {
                    true => wanted.push((t.clone(), p)),
                    false => refused.push((t.clone(), p)),
                }
            }
        }
        wanted
    });
    let everything = wanted.is_none();
    let mut fetched = ctx.components.groups.fetch_offsets(group, wanted);
    if everything && ctx.components.security.authorizer.is_some() {
        fetched.retain(|((t, _), _)| may_describe(t));
    }
    (fetched, refused)
}

type TopicOffsets = (String, Vec<(i32, Option<CommittedOffset>)>);

fn by_topic(fetched: Fetched) -> Vec<TopicOffsets> {
    let mut out: Vec<TopicOffsets> = Vec::new();
    for ((t, p), o) in fetched {
        match out.iter_mut().find(|(n, _)| *n == t) {
            Some((_, ps)) => ps.push((p, o)),
            None => out.push((t, vec![(p, o)])),
        }
    }
    out
}

pub fn offset_fetch(ctx: &RequestContext, req: OffsetFetchRequest) -> OffsetFetchResponse {
    let mut r = OffsetFetchResponse::default();
    if ctx.version() >= 8 {
        for g in req.groups {
            let topics =
                g.topics.map(|ts| ts.into_iter().map(|t| (t.name.0.to_string(), t.partition_indexes)).collect());
            let mut gr = OffsetFetchResponseGroup::default();
            // v9 names the member and its epoch, checked for consumer-protocol groups.
            let member_check = || {
                let member = g.member_id.as_ref().map(|m| m.as_str());
                ctx.components.groups.validate_offset_fetch(g.group_id.0.as_str(), member, g.member_epoch)
            };
            if let Err(code) =
                check_group(ctx, Operation::Describe, g.group_id.0.as_str()).and_then(|()| member_check())
            {
                gr.error_code = code;
                gr.group_id = g.group_id;
                r.groups.push(gr);
                continue;
            }
            let (fetched, refused) = group_offsets(ctx, g.group_id.0.as_str(), topics);
            let unstable = unstable_partitions(ctx, req.require_stable, g.group_id.0.as_str());
            for (topic, parts) in by_topic(fetched) {
                let mut tr = OffsetFetchResponseTopics::default();
                tr.partitions = parts
                    .into_iter()
                    .map(|(p, o)| {
                        let mut pr = OffsetFetchResponsePartitions::default();
                        pr.partition_index = p;
                        let answer = FetchedOffset::new(unstable.contains(&(topic.clone(), p)), o);
                        pr.committed_offset = answer.offset;
                        pr.committed_leader_epoch = answer.leader_epoch;
                        pr.metadata = Some(s(answer.metadata));
                        pr.error_code = answer.error_code;
                        pr
                    })
                    .collect();
                tr.name = TopicName(s(topic));
                gr.topics.push(tr);
            }
            for (topic, parts) in by_topic(refused.into_iter().map(|tp| (tp, None)).collect()) {
                let mut tr = OffsetFetchResponseTopics::default();
                tr.name = TopicName(s(topic));
                tr.partitions = parts
                    .into_iter()
                    .map(|(p, _)| {
                        let mut pr = OffsetFetchResponsePartitions::default();
                        pr.partition_index = p;
                        pr.committed_offset = -1;
                        pr.committed_leader_epoch = -1;
                        pr.error_code = ErrorCode::TopicAuthorizationFailed.code();
                        pr
                    })
                    .collect();
                gr.topics.push(tr);
            }
            gr.group_id = g.group_id;
            r.groups.push(gr);
        }
        return r;
    }
    if let Err(code) = check_group(ctx, Operation::Describe, req.group_id.0.as_str()) {
        if ctx.version() >= 2 {
            r.error_code = code;
        } else {
            // v1 has no top-level error: report it on every requested partition.
            for t in req.topics.unwrap_or_default() {
                let mut tr = OffsetFetchResponseTopic::default();
                tr.partitions = t
                    .partition_indexes
                    .iter()
                    .map(|&p| {
                        let mut pr = OffsetFetchResponsePartition::default();
                        pr.partition_index = p;
                        pr.committed_offset = -1;
                        pr.error_code = code;
                        pr
                    })
                    .collect();
                tr.name = t.name;
                r.topics.push(tr);
            }
        }
        return r;
    }
    let topics = req.topics.map(|ts| ts.into_iter().map(|t| (t.name.0.to_string(), t.partition_indexes)).collect());
    let (fetched, refused) = group_offsets(ctx, req.group_id.0.as_str(), topics);
    let unstable = unstable_partitions(ctx, req.require_stable, req.group_id.0.as_str());
    for (topic, parts) in by_topic(refused.into_iter().map(|tp| (tp, None)).collect()) {
        let mut tr = OffsetFetchResponseTopic::default();
        tr.name = TopicName(s(topic));
        tr.partitions = parts
            .into_iter()
            .map(|(p, _)| {
                let mut pr = OffsetFetchResponsePartition::default();
                pr.partition_index = p;
                pr.committed_offset = -1;
                pr.committed_leader_epoch = -1;
                pr.error_code = ErrorCode::TopicAuthorizationFailed.code();
                pr
            })
            .collect();
        r.topics.push(tr);
    }
    for (topic, parts) in by_topic(fetched) {
        let mut tr = OffsetFetchResponseTopic::default();
        tr.partitions = parts
            .into_iter()
            .map(|(p, o)| {
                let mut pr = OffsetFetchResponsePartition::default();
                pr.partition_index = p;
                let answer = FetchedOffset::new(unstable.contains(&(topic.clone(), p)), o);
                pr.committed_offset = answer.offset;
                pr.committed_leader_epoch = answer.leader_epoch;
                pr.metadata = Some(s(answer.metadata));
                pr.error_code = answer.error_code;
                pr
            })
            .collect();
        tr.name = TopicName(s(topic));
        r.topics.push(tr);
    }
    r
}

/// One partition's OffsetFetch answer, the same in the per-group (v8+) and older layouts.
struct FetchedOffset {
    offset: i64,
    leader_epoch: i32,
    metadata: String,
    error_code: i16,
}

impl FetchedOffset {
    fn new(unstable: bool, committed: Option<CommittedOffset>) -> FetchedOffset {
        if unstable {
            return FetchedOffset {
                offset: -1,
                leader_epoch: -1,
                metadata: String::new(),
                error_code: ErrorCode::UnstableOffsetCommit.code(),
            };
        }
        match committed {
            Some(o) => {
                FetchedOffset { offset: o.offset, leader_epoch: o.leader_epoch, metadata: o.metadata, error_code: 0 }
            }
            None => FetchedOffset { offset: -1, leader_epoch: -1, metadata: String::new(), error_code: 0 },
        }
    }
}

/// With require_stable (v7+), a partition an open transaction holds an offset for is
/// answered UNSTABLE_OFFSET_COMMIT rather than its last committed offset, so a consumer
/// starting after a crash waits for the transaction's outcome instead of re-reading.
fn unstable_partitions(ctx: &RequestContext, require_stable: bool, group: &str) -> HashSet<(String, i32)> {
    if !require_stable || ctx.version() < 7 {
        return HashSet::new();
    }
    ctx.components.groups.pending_txn_partitions(group)
}

pub fn describe_groups(ctx: &RequestContext, req: DescribeGroupsRequest) -> DescribeGroupsResponse {
    let mut r = DescribeGroupsResponse::default();
    for id in req.groups {
        if let Err(code) = check_group(ctx, Operation::Describe, id.0.as_str()) {
            let mut d = DescribedGroup::default();
            d.error_code = code;
            d.group_id = id;
            d.authorized_operations = i32::MIN;
            r.groups.push(d);
            continue;
        }
        // A consumer-protocol group is not described here (Kafka 4.x: GROUP_ID_NOT_FOUND, "not
        // a classic group"); ConsumerGroupDescribe does. Its offsets keep a classic record
        // that must not show as an Empty classic group.
        let consumer = ctx.components.groups.is_consumer_group(id.0.as_str());
        let described = ctx.components.groups.with_group(id.0.as_str(), |g| {
            let mut d = DescribedGroup::default();
            d.group_state = s(g.state.name());
            d.protocol_type = s(g.protocol_type.clone().unwrap_or_default());
            d.protocol_data = s(g.protocol_name.clone().unwrap_or_default());
            let protocol = g.protocol_name.clone().unwrap_or_default();
            d.members = g
                .members
                .values()
                .map(|m| {
                    let mut dm = DescribedGroupMember::default();
                    dm.member_id = s(m.id.clone());
                    dm.group_instance_id = m.instance_id.clone().map(s);
                    dm.client_id = s(m.client_id.clone());
                    dm.client_host = s(m.client_host.clone());
                    dm.member_metadata =
                        m.protocols.iter().find(|(n, _)| *n == protocol).map(|(_, b)| b.clone()).unwrap_or_default();
                    dm.member_assignment = m.assignment.clone();
                    dm
                })
                .collect();
            d
        });
        let mut d = described.filter(|_| !consumer).unwrap_or_else(|| {
            let mut d = DescribedGroup::default();
            d.group_state = s("Dead");
            if ctx.version() >= 6 {
                d.error_code = ErrorCode::GroupIdNotFound.code();
                if consumer {
                    d.error_message = Some(s(format!("Group {} is not a classic group.", id.0.as_str())));
                }
            }
            d
        });
        d.authorized_operations = match req.include_authorized_operations {
            true => ctx.authorized_operations(ResourceType::Group, id.0.as_str()),
            false => i32::MIN,
        };
        d.group_id = id;
        r.groups.push(d);
    }
    r
}

const GROUP_TYPE_CLASSIC: &str = "classic";
const GROUP_TYPE_CONSUMER: &str = "consumer";

pub fn list_groups(ctx: &RequestContext, req: ListGroupsRequest) -> ListGroupsResponse {
    let states: Vec<String> = req.states_filter.iter().map(|s| s.to_lowercase()).collect();
    let types: Vec<String> = req.types_filter.iter().map(|t| t.to_lowercase()).collect();
    let mut r = ListGroupsResponse::default();
    // DESCRIBE on the cluster lists every group; otherwise those the principal may describe.
    let all_visible = ctx.authorized_cluster(Operation::Describe);
    let consumer: Vec<(String, String, String, &str)> = ctx
        .components
        .groups
        .consumer_groups()
        .list()
        .into_iter()
        .filter(|(id, _)| ctx.components.groups.is_consumer_group(id))
        .map(|(id, state)| (id, GROUP_TYPE_CONSUMER.to_string(), state.name().to_string(), GROUP_TYPE_CONSUMER))
        .collect();
    let consumer_ids: HashSet<String> = consumer.iter().map(|(id, ..)| id.clone()).collect();
    let classic = ctx
        .components
        .groups
        .list()
        .into_iter()
        // A consumer-protocol group's offsets sit in a classic record of its id: one group.
        .filter(|(id, ..)| !consumer_ids.contains(id))
        .map(|(id, protocol_type, state)| (id, protocol_type, state.name().to_string(), GROUP_TYPE_CLASSIC));
    for (id, protocol_type, state, group_type) in classic.chain(consumer) {
        // A type filter (v5) keeps the groups of the types it names.
        if !types.is_empty() && !types.iter().any(|t| t == group_type) {
            continue;
        }
        // Each coordinator lists the groups it coordinates, as Kafka's do.
        if ctx.components.groups.check_coordinator(&id).is_err() {
            continue;
        }
        if !all_visible && !ctx.authorized(Operation::Describe, ResourceType::Group, &id) {
            continue;
        }
        if !states.is_empty() && !states.contains(&state.to_lowercase()) {
            continue;
        }
        let mut g = ListedGroup::default();
        g.group_id = GroupId(s(id));
        g.protocol_type = s(protocol_type);
        g.group_state = s(state);
        g.group_type = s(group_type);
        r.groups.push(g);
    }
    r
}

pub fn delete_groups(ctx: &RequestContext, req: DeleteGroupsRequest) -> DeleteGroupsResponse {
    let mut r = DeleteGroupsResponse::default();
    for id in req.groups_names {
        let mut d = DeletableGroupResult::default();
        d.error_code = match check_group(ctx, Operation::Delete, id.0.as_str()) {
            Ok(()) => ctx.components.groups.delete_group(id.0.as_str()),
            Err(code) => code,
        };
        d.group_id = id;
        r.results.push(d);
    }
    r
}

pub fn offset_delete(ctx: &RequestContext, req: OffsetDeleteRequest) -> OffsetDeleteResponse {
    let unreadable = unreadable_topics(ctx, req.topics.iter().map(|t| t.name.0.as_str()));
    let tps: Vec<(String, i32)> = req
        .topics
        .iter()
        .filter(|t| !unreadable.contains(t.name.0.as_str()))
        .flat_map(|t| t.partitions.iter().map(move |p| (t.name.0.to_string(), p.partition_index)))
        .collect();
    let mut r = OffsetDeleteResponse::default();
    let subscribed = |g: &crate::group::coordinator::Group, topic: &str| {
        g.members.values().any(|m| subscribed_topics(m, g.protocol_name.as_deref()).iter().any(|t| t == topic))
    };
    let deleted = check_group(ctx, Operation::Delete, req.group_id.0.as_str())
        .and_then(|_| ctx.components.groups.delete_offsets(req.group_id.0.as_str(), tps, subscribed));
    match deleted {
        Err(code) => r.error_code = code,
        Ok(results) => {
            for t in req.topics {
                let name = t.name.0.to_string();
                let mut tr = OffsetDeleteResponseTopic::default();
                for p in t.partitions {
                    let mut pr = OffsetDeleteResponsePartition::default();
                    pr.partition_index = p.partition_index;
                    pr.error_code = match unreadable.contains(&name) {
                        true => ErrorCode::TopicAuthorizationFailed.code(),
                        false => results
                            .iter()
                            .find(|((n, i), _)| *n == name && *i == p.partition_index)
                            .map(|(_, c)| *c)
                            .unwrap_or(ErrorCode::None.code()),
                    };
                    tr.partitions.push(pr);
                }
                tr.name = t.name;
                r.topics.push(tr);
            }
        }
    }
    r
}
