//! Committed offsets: OffsetCommit, OffsetFetch (v0 from the znode store, as Kafka 3.9 keeps
//! them for the pre-0.8.2 consumers) and OffsetDelete. The group's rules live in
//! `group::coordinator` and `group::consumer`; this file translates between them and the wire.

use crate::group::zk_mirror::{is_znode_name, offset_path as zk_offset_path};
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

use super::group::{check_group, s};
use super::RequestContext;
use crate::group::coordinator::{subscribed_topics, CommittedOffset};
use crate::group::OFFSETS_TOPIC;
use crate::protocol::ErrorCode;
use crate::security::authorizer::{Operation, ResourceType};

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
        Ok(()) if ctx.components.groups.commit_may_block(req.group_id.0.as_str(), &wanted) => {
            let groups = ctx.components.groups.clone();
            let (group, generation, member) =
                (req.group_id.0.to_string(), req.generation_id_or_member_epoch, req.member_id.to_string());
            let code = ErrorCode::CoordinatorNotAvailable.code();
            let tps: Vec<_> = wanted.iter().map(|(tp, ..)| tp.clone()).collect();
            match ctx.components.io.run(move || groups.commit_offsets(&group, generation, &member, wanted)).await {
                Ok(results) => results,
                // The job died: whether the commit was written is unknown; the client retries.
                Err(_) => tps.into_iter().map(|tp| (tp, code)).collect(),
            }
        }
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
