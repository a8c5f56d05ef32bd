//! Metadata, DescribeTopicPartitions and DescribeCluster: who the brokers are, which topics
//! exist, who leads what.

use kafka_protocol::messages::describe_cluster_response::DescribeClusterBroker;
use kafka_protocol::messages::describe_topic_partitions_response::{
    Cursor, DescribeTopicPartitionsResponsePartition, DescribeTopicPartitionsResponseTopic,
};
use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::{
    BrokerId, DescribeClusterRequest, DescribeClusterResponse, DescribeTopicPartitionsRequest,
    DescribeTopicPartitionsResponse, MetadataRequest, MetadataResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use uuid::Uuid;

use super::RequestContext;
use crate::controller::validate_topic_name;
use crate::metadata::{BrokerInfo, TopicInfo};
use crate::protocol::internal_topics::is_internal;
use crate::protocol::ErrorCode;
use crate::security::authorizer::{Operation, ResourceType, CLUSTER_NAME};

/// Kafka's "not requested" marker for authorized-operations fields.
const AUTHORIZED_OPERATIONS_OMITTED: i32 = i32::MIN;

/// The brokers as this client must reach them: each at its advertised address for the
/// listener the client came in on; brokers without that listener are left out, as in Kafka.
fn brokers_for(ctx: &RequestContext) -> Vec<BrokerInfo> {
    let snapshot = ctx.components.cache.snapshot();
    let me = ctx.components.config.broker_id;
    snapshot
        .brokers
        .iter()
        .filter_map(|b| {
            let (host, port) = match ctx.components.config.advertised_for(&ctx.listener) {
                Some(ep) if b.id == me => (ep.host.as_str(), ep.port),
                _ => b.endpoint_for(&ctx.listener)?,
            };
            Some(BrokerInfo { host: host.to_string(), port, ..b.clone() })
        })
        .collect()
}

fn topic_response(t: &TopicInfo) -> MetadataResponseTopic {
    let mut out = MetadataResponseTopic::default();
    out.name = Some(TopicName(StrBytes::from_string(t.name.clone())));
    out.topic_id = t.id;
    out.is_internal = t.is_internal();
    out.topic_authorized_operations = AUTHORIZED_OPERATIONS_OMITTED;
    out.partitions = t
        .partitions
        .iter()
        .map(|p| {
            let mut mp = MetadataResponsePartition::default();
            mp.partition_index = p.index;
            if p.leader < 0 {
                mp.error_code = ErrorCode::LeaderNotAvailable.code();
            }
            mp.leader_id = BrokerId(p.leader);
            // Clients fence with it (Fetch, ListOffsets, OffsetForLeaderEpoch check it) and
            // never let it go backwards; the controller only ever increases it.
            mp.leader_epoch = p.leader_epoch;
            mp.replica_nodes = p.replicas.iter().map(|&r| BrokerId(r)).collect();
            mp.isr_nodes = p.isr.iter().map(|&r| BrokerId(r)).collect();
            mp.offline_replicas = p.offline_replicas.iter().map(|&r| BrokerId(r)).collect();
            mp
        })
        .collect();
    out
}

fn error_topic(name: Option<String>, id: Uuid, code: ErrorCode) -> MetadataResponseTopic {
    error_topic_code(name, id, code.code())
}

fn error_topic_code(name: Option<String>, id: Uuid, code: i16) -> MetadataResponseTopic {
    let mut out = MetadataResponseTopic::default();
    out.is_internal = name.as_deref().is_some_and(is_internal);
    out.name = name.map(|n| TopicName(StrBytes::from_string(n)));
    out.topic_id = id;
    out.error_code = code;
    out.topic_authorized_operations = AUTHORIZED_OPERATIONS_OMITTED;
    out
}

/// Whether answering `req` may create topics (auto-creation of a named topic that does not
/// exist): that writes znodes and creates logs under the admin lock, which must not happen on
/// an async worker (the wire fuzzer's stall: Metadata requests waiting there for the lock
/// while a large topic was deleted left no worker to answer anyone for seconds).
pub fn may_create_topics(ctx: &RequestContext, req: &MetadataRequest) -> bool {
    let allow_auto_create = ctx.version() < 4 || req.allow_auto_topic_creation;
    if !(allow_auto_create && ctx.components.config.auto_create_topics_enable) {
        return false;
    }
    let Some(topics) = &req.topics else { return false };
    topics.iter().any(|t| t.name.as_ref().is_some_and(|n| ctx.components.cache.topic(n).is_none()))
}

pub fn handle(ctx: &RequestContext, req: MetadataRequest) -> MetadataResponse {
    let version = ctx.version();
    let broker = &ctx.components;
    // v0: an empty list means all topics; v1+: null means all, empty means none.
    let requested = match req.topics {
        None => None,
        Some(t) if t.is_empty() && version == 0 => None,
        Some(t) => Some(t),
    };
    let allow_auto_create = version < 4 || req.allow_auto_topic_creation;
    let may_describe = |name: &str| ctx.authorized(Operation::Describe, ResourceType::Topic, name);
    let topics: Vec<MetadataResponseTopic> = match requested {
        // All topics: those the principal may not describe are left out, as if absent.
        None => broker
            .cache
            .snapshot()
            .topics
            .values()
            .filter(|t| may_describe(&t.name))
            .map(|t| topic_response(t))
            .collect(),
        Some(list) => list
            .into_iter()
            .map(|rt| {
                let name = rt.name.map(|n| n.0.to_string());
                let Some(name) = name else {
                    return match broker.cache.snapshot().topic_by_id(rt.topic_id) {
                        Some(t) if may_describe(&t.name) => topic_response(t),
                        Some(_) => error_topic(None, rt.topic_id, ErrorCode::TopicAuthorizationFailed),
                        None => error_topic(None, rt.topic_id, ErrorCode::UnknownTopicId),
                    };
                };
                // Named but not describable: refused whether it exists or not.
                if !may_describe(&name) {
                    return error_topic(Some(name), Uuid::nil(), ErrorCode::TopicAuthorizationFailed);
                }
                if let Some(t) = broker.cache.topic(&name) {
                    return topic_response(&t);
                }
                if validate_topic_name(&name).is_err() {
                    return error_topic(Some(name), Uuid::nil(), ErrorCode::InvalidTopicException);
                }
                if !(allow_auto_create && broker.config.auto_create_topics_enable) {
                    return error_topic(Some(name), Uuid::nil(), ErrorCode::UnknownTopicOrPartition);
                }
                // Auto-creation needs CREATE on the cluster or on the topic.
                if !(ctx.authorized_cluster(Operation::Create)
                    || ctx.authorized(Operation::Create, ResourceType::Topic, &name))
                {
                    return error_topic(Some(name), Uuid::nil(), ErrorCode::TopicAuthorizationFailed);
                }
                match broker.controller.auto_create(&name) {
                    Ok(Some(t)) => topic_response(&t),
                    // Kafka answers LEADER_NOT_AVAILABLE until the controller has elected leaders.
                    Ok(None) => error_topic(Some(name), Uuid::nil(), ErrorCode::LeaderNotAvailable),
                    // Another request created it first: serve what exists.
                    Err(_) if broker.cache.topic(&name).is_some() => {
                        broker.cache.topic(&name).map(|t| topic_response(&t)).unwrap_or_default()
                    }
                    // Created a moment ago and not yet in this broker's image: the client
                    // asks again, as it does for a topic still without a leader.
                    Err(e) if e.code == ErrorCode::TopicAlreadyExists.code() => {
                        error_topic(Some(name), Uuid::nil(), ErrorCode::LeaderNotAvailable)
                    }
                    // As Kafka: the reason is the topic's error (INVALID_REPLICATION_FACTOR
                    // while fewer brokers are alive than the topic needs), except a failure of
                    // the metadata store, which is worth a retry.
                    Err(e) if e.code == ErrorCode::UnknownServerError.code() => {
                        tracing::warn!(topic = %name, error = %e, "auto-create failed");
                        error_topic(Some(name), Uuid::nil(), ErrorCode::LeaderNotAvailable)
                    }
                    Err(e) => {
                        tracing::info!(topic = %name, error = %e, "auto-create refused");
                        error_topic_code(Some(name), Uuid::nil(), e.code)
                    }
                }
            })
            .collect(),
    };
    let snapshot = broker.cache.snapshot();
    let mut r = MetadataResponse::default();
    r.brokers = brokers_for(ctx)
        .into_iter()
        .map(|b| {
            let mut mb = MetadataResponseBroker::default();
            mb.node_id = BrokerId(b.id);
            mb.host = StrBytes::from_string(b.host);
            mb.port = b.port as i32;
            mb.rack = b.rack.map(StrBytes::from_string);
            mb
        })
        .collect();
    r.cluster_id = Some(StrBytes::from_string(snapshot.cluster_id.clone()));
    r.controller_id = BrokerId(snapshot.controller_id);
    r.topics = topics;
    r.cluster_authorized_operations = AUTHORIZED_OPERATIONS_OMITTED;
    // Asked for from v8 (the cluster's only until v10): Kafka reports none of the cluster's
    // operations to a principal that may not describe it.
    if version >= 8 && req.include_cluster_authorized_operations {
        r.cluster_authorized_operations = cluster_operations(ctx);
    }
    if version >= 8 && req.include_topic_authorized_operations {
        for t in r.topics.iter_mut() {
            if let Some(name) = &t.name {
                t.topic_authorized_operations = ctx.authorized_operations(ResourceType::Topic, name.0.as_str());
            }
        }
    }
    r
}

fn cluster_operations(ctx: &RequestContext) -> i32 {
    if ctx.authorized_cluster(Operation::Describe) {
        ctx.authorized_operations(ResourceType::Cluster, CLUSTER_NAME)
    } else {
        0
    }
}

pub fn describe_cluster(ctx: &RequestContext, req: DescribeClusterRequest) -> DescribeClusterResponse {
    let snapshot = ctx.components.cache.snapshot();
    let mut r = DescribeClusterResponse::default();
    r.endpoint_type = 1;
    if req.endpoint_type != 1 {
        // A broker serves only broker endpoints. As Kafka's brokers do, asking one for the
        // controllers is a mismatch and any other type is unsupported.
        let mismatch = req.endpoint_type == 2;
        r.error_code =
            if mismatch { ErrorCode::MismatchedEndpointType } else { ErrorCode::UnsupportedEndpointType }.code();
        r.error_message = Some(StrBytes::from_static_str("Only broker endpoints are available"));
        return r;
    }
    r.cluster_id = StrBytes::from_string(snapshot.cluster_id.clone());
    r.controller_id = BrokerId(snapshot.controller_id);
    r.cluster_authorized_operations = match req.include_cluster_authorized_operations {
        true => cluster_operations(ctx),
        false => AUTHORIZED_OPERATIONS_OMITTED,
    };
    r.brokers = brokers_for(ctx)
        .into_iter()
        .map(|b| {
            let mut d = DescribeClusterBroker::default();
            d.broker_id = BrokerId(b.id);
            d.host = StrBytes::from_string(b.host);
            d.port = b.port as i32;
            d.rack = b.rack.map(StrBytes::from_string);
            d
        })
        .collect();
    r
}

/// What Kafka reports as a topic's authorized operations when no authorizer is configured:
/// every operation a topic supports (READ, WRITE, CREATE, DELETE, ALTER, DESCRIBE,
/// DESCRIBE_CONFIGS, ALTER_CONFIGS), as a bit field of their codes.
const TOPIC_OPERATIONS: i32 = (1 << 3) | (1 << 4) | (1 << 5) | (1 << 6) | (1 << 7) | (1 << 8) | (1 << 10) | (1 << 11);

fn dtp_topic(name: &str, code: ErrorCode) -> DescribeTopicPartitionsResponseTopic {
    let mut t = DescribeTopicPartitionsResponseTopic::default();
    t.name = Some(TopicName(StrBytes::from_string(name.to_string())));
    t.error_code = code.code();
    t.is_internal = is_internal(name);
    t.topic_authorized_operations = TOPIC_OPERATIONS;
    t
}

/// DescribeTopicPartitions (KIP-966's API, what Java's `describeTopics` uses from 3.8 when a
/// broker offers it), as Kafka's KRaft brokers answer it: topics in name order from the
/// cursor's, at most `min(response_partition_limit, max.request.partition.size.limit)`
/// partitions, and a cursor at the first partition left out. Work is proportional to the
/// topics and partitions answered, not to the cluster.
pub fn describe_topic_partitions(
    ctx: &RequestContext,
    req: DescribeTopicPartitionsRequest,
) -> DescribeTopicPartitionsResponse {
    let mut r = DescribeTopicPartitionsResponse::default();
    let snapshot = ctx.components.cache.snapshot();
    let cursor = req.cursor.as_ref().map(|c| (c.topic_name.0.to_string(), c.partition_index));
    let from = cursor.as_ref().map(|c| c.0.clone()).unwrap_or_default();
    let fetch_all = req.topics.is_empty();
    let requested: std::collections::BTreeSet<String> =
        req.topics.iter().map(|t| t.name.0.to_string()).filter(|n| *n >= from).collect();
    if !fetch_all && cursor.is_some() && !requested.contains(&from) {
        // Kafka refuses the request: every topic asked for gets the error.
        r.topics = req.topics.iter().map(|t| dtp_topic(t.name.0.as_str(), ErrorCode::InvalidRequest)).collect();
        for t in &mut r.topics {
            t.is_internal = false;
            t.topic_authorized_operations = i32::MIN;
        }
        return r;
    }
    let live: std::collections::HashSet<i32> = brokers_for(ctx).iter().map(|b| b.id).collect();
    let limit = ctx.components.config.max_request_partition_size_limit.min(req.response_partition_limit);
    let mut remaining = i64::from(limit);
    let names: Box<dyn Iterator<Item = &String>> = if fetch_all {
        Box::new(snapshot.topics.range(from.clone()..).map(|(k, _)| k))
    } else {
        Box::new(requested.iter())
    };
    for name in names {
        if remaining == 0 {
            r.next_cursor = Some(cursor_at(name, 0));
            break;
        }
        if remaining < 0 {
            continue;
        }
        if !ctx.authorized(Operation::Describe, ResourceType::Topic, name) {
            // Listed: hidden, as Metadata hides it; named: refused, whether or not it exists.
            if !fetch_all {
                r.topics.push(dtp_topic(name, ErrorCode::TopicAuthorizationFailed));
            }
            continue;
        }
        let Some(topic) = snapshot.topics.get(name) else {
            if !fetch_all {
                let code = if validate_topic_name(name).is_ok() {
                    ErrorCode::UnknownTopicOrPartition
                } else {
                    ErrorCode::InvalidTopicException
                };
                r.topics.push(dtp_topic(name, code));
            }
            continue;
        };
        let start = match &cursor {
            Some((t, p)) if t == name => i64::from(*p),
            _ => 0,
        };
        let count = topic.partitions.len() as i64;
        let upper = count.min(start.saturating_add(remaining));
        let mut out = dtp_topic(name, ErrorCode::None);
        out.topic_id = topic.id;
        out.topic_authorized_operations = ctx.authorized_operations(ResourceType::Topic, name);
        for p in topic.partitions.iter().filter(|p| i64::from(p.index) >= start && i64::from(p.index) < upper) {
            let mut dp = DescribeTopicPartitionsResponsePartition::default();
            dp.partition_index = p.index;
            dp.leader_id = BrokerId(if live.contains(&p.leader) { p.leader } else { -1 });
            dp.leader_epoch = p.leader_epoch;
            dp.replica_nodes = p.replicas.iter().map(|&b| BrokerId(b)).collect();
            dp.isr_nodes = p.isr.iter().map(|&b| BrokerId(b)).collect();
            // ZooKeeper mode has no eligible leader replicas (KIP-966 is KRaft's).
            dp.eligible_leader_replicas = Some(Vec::new());
            dp.last_known_elr = Some(Vec::new());
            dp.offline_replicas = p
                .replicas
                .iter()
                .filter(|b| !live.contains(b) || p.offline_replicas.contains(b))
                .map(|&b| BrokerId(b))
                .collect();
            out.partitions.push(dp);
        }
        out.partitions.sort_by_key(|p| p.partition_index);
        remaining -= out.partitions.len() as i64;
        r.topics.push(out);
        if upper < count {
            r.next_cursor = Some(cursor_at(name, upper as i32));
            break;
        }
    }
    r
}

fn cursor_at(topic: &str, partition: i32) -> Cursor {
    let mut c = Cursor::default();
    c.topic_name = TopicName(StrBytes::from_string(topic.to_string()));
    c.partition_index = partition;
    c
}
