//! Classic consumer group APIs: FindCoordinator, JoinGroup, SyncGroup, Heartbeat, LeaveGroup,
//! DescribeGroups, ListGroups, DeleteGroups (committed offsets are in `offsets`). The rules live
//! in `group::coordinator`; this file translates between it and the wire types.

use kafka_protocol::messages::delete_groups_response::DeletableGroupResult;
use kafka_protocol::messages::describe_groups_response::{DescribedGroup, DescribedGroupMember};
use kafka_protocol::messages::find_coordinator_response::Coordinator;
use kafka_protocol::messages::join_group_response::JoinGroupResponseMember;
use kafka_protocol::messages::leave_group_response::MemberResponse;
use kafka_protocol::messages::list_groups_response::ListedGroup;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;

use std::collections::HashSet;

use super::{Components, RequestContext};
use crate::group::coordinator::JoinRequest;
use crate::group::OFFSETS_TOPIC;
use crate::metadata::CoordinatorAt;
use crate::protocol::ErrorCode;
use crate::security::authorizer::{Operation, ResourceType};

pub(super) fn s(v: impl Into<String>) -> StrBytes {
    StrBytes::from_string(v.into())
}

/// The group checks Kafka makes before it looks for the coordinator: `op` on the group, then
/// whether this broker coordinates it.
pub(super) fn check_group(ctx: &RequestContext, op: Operation, group: &str) -> Result<(), i16> {
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
    let me = broker.config.broker_id;
    match broker.cache.coordinator_at(topic, |n| crate::group::partition_for(key, n), me, listener)? {
        CoordinatorAt::Broker { id, host, port } => Ok((id, host, port)),
        CoordinatorAt::Here { partition } => {
            // Named leader but the partition not yet open or its groups still loading: a
            // client sent here now would get COORDINATOR_LOAD_IN_PROGRESS from its first
            // commit, which librdkafka's synchronous commit hands to the application. Not
            // available keeps it asking FindCoordinator, which it retries by itself.
            let loading = topic == OFFSETS_TOPIC && broker.groups.is_loading(partition);
            if loading || broker.replicas.partition(topic, partition).is_none() {
                return Err(ErrorCode::CoordinatorNotAvailable.code());
            }
            let ep = broker.config.advertised_for(listener).ok_or(ErrorCode::CoordinatorNotAvailable.code())?;
            Ok((me, ep.host.clone(), ep.port))
        }
    }
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
const GROUP_TYPE_SHARE: &str = "share";

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
    let share = ctx
        .components
        .groups
        .share_groups()
        .list()
        .into_iter()
        .map(|(id, state)| (id, GROUP_TYPE_SHARE.to_string(), state.to_string(), GROUP_TYPE_SHARE));
    for (id, protocol_type, state, group_type) in classic.chain(consumer).chain(share) {
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
