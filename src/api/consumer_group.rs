//! The consumer group protocol's own APIs (KIP-848): ConsumerGroupHeartbeat and
//! ConsumerGroupDescribe. The rules live in `group::consumer`; this file translates between it
//! and the wire types. Both are offered only while `group.coordinator.rebalance.protocols`
//! names `consumer`.

use std::collections::BTreeSet;

use kafka_protocol::messages::consumer_group_describe_response::{
    Assignment as DescribedAssignment, DescribedGroup, Member, TopicPartitions as DescribedTopicPartitions,
};
use kafka_protocol::messages::consumer_group_heartbeat_response::{Assignment, TopicPartitions};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;

use super::RequestContext;
use crate::group::consumer::{self, ConsumerGroup, HeartbeatRequest};
use crate::protocol::ErrorCode;
use crate::security::authorizer::{Operation, ResourceType};

fn s(v: impl Into<String>) -> StrBytes {
    StrBytes::from_string(v.into())
}

/// The API keys this file serves, which ApiVersions lists only while the protocol is on.
pub const KEYS: [ApiKey; 2] = [ApiKey::ConsumerGroupHeartbeat, ApiKey::ConsumerGroupDescribe];

pub fn consumer_group_heartbeat(
    ctx: &RequestContext,
    req: ConsumerGroupHeartbeatRequest,
) -> ConsumerGroupHeartbeatResponse {
    let mut r = ConsumerGroupHeartbeatResponse::default();
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
    let owned = req.topic_partitions.map(|tps| {
        let mut a = consumer::Assignment::new();
        for tp in tps {
            a.entry(tp.topic_id).or_default().extend(tp.partitions);
        }
        a
    });
    let result = ctx.components.groups.consumer_heartbeat(HeartbeatRequest {
        version: ctx.version(),
        group_id: group,
        member_id: req.member_id.to_string(),
        member_epoch: req.member_epoch,
        instance_id: req.instance_id.map(|i| i.to_string()),
        rack_id: req.rack_id.map(|i| i.to_string()),
        rebalance_timeout_ms: req.rebalance_timeout_ms,
        subscribed_topic_names: req.subscribed_topic_names.map(|ts| ts.into_iter().map(|t| t.0.to_string()).collect()),
        subscribed_topic_regex: req.subscribed_topic_regex.map(|r| r.to_string()),
        server_assignor: req.server_assignor.map(|a| a.to_string()),
        owned,
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

fn described_assignment(ctx: &RequestContext, a: &consumer::Assignment) -> DescribedAssignment {
    let snapshot = ctx.components.cache.snapshot();
    let mut out = DescribedAssignment::default();
    out.topic_partitions = a
        .iter()
        .map(|(id, ps)| {
            let mut tp = DescribedTopicPartitions::default();
            tp.topic_id = *id;
            tp.topic_name = TopicName(s(snapshot.topic_by_id(*id).map(|t| t.name.clone()).unwrap_or_default()));
            tp.partitions = ps.iter().copied().collect();
            tp
        })
        .collect();
    out
}

fn describe_one(ctx: &RequestContext, g: &ConsumerGroup) -> DescribedGroup {
    let mut d = DescribedGroup::default();
    d.group_state = s(g.state().name());
    d.group_epoch = g.epoch;
    d.assignment_epoch = g.assignment_epoch;
    d.assignor_name = s(g.assignor.clone());
    let empty = consumer::Assignment::new();
    d.members = g
        .members
        .values()
        .map(|m| {
            let mut dm = Member::default();
            dm.member_id = s(m.id.clone());
            dm.instance_id = m.instance_id.clone().map(s);
            dm.rack_id = m.rack_id.clone().map(s);
            dm.member_epoch = m.epoch;
            dm.client_id = s(m.client_id.clone());
            dm.client_host = s(m.client_host.clone());
            dm.subscribed_topic_names = m.subscribed_topic_names.iter().map(|t| TopicName(s(t.clone()))).collect();
            dm.subscribed_topic_regex = m.subscribed_topic_regex.clone().map(s);
            dm.assignment = described_assignment(ctx, &m.assigned);
            dm.target_assignment = described_assignment(ctx, g.target.get(&m.id).unwrap_or(&empty));
            // v1: 1 is a member of the consumer protocol (0 would be a classic one).
            dm.member_type = 1;
            dm
        })
        .collect();
    d
}

pub fn consumer_group_describe(
    ctx: &RequestContext,
    req: ConsumerGroupDescribeRequest,
) -> ConsumerGroupDescribeResponse {
    let mut r = ConsumerGroupDescribeResponse::default();
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
        let mut d = match refused {
            Some(code) => {
                let mut d = DescribedGroup::default();
                d.error_code = code;
                d
            }
            None => match ctx
                .components
                .groups
                .is_consumer_group(&group)
                .then(|| ctx.components.groups.consumer_groups().with_group(&group, |g| describe_one(ctx, g)))
                .flatten()
            {
                Some(d) => d,
                None => {
                    let classic = ctx.components.groups.with_group(&group, |_| ()).is_some();
                    let mut d = DescribedGroup::default();
                    d.error_code = ErrorCode::GroupIdNotFound.code();
                    d.error_message = Some(s(if classic {
                        format!("Group {group} is not a consumer group.")
                    } else {
                        format!("Group {group} not found.")
                    }));
                    d
                }
            },
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
