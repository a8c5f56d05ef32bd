//! Metadata and DescribeCluster: who the brokers are, which topics exist, who leads what.

use kafka_protocol::messages::describe_cluster_response::DescribeClusterBroker;
use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::{
    BrokerId, DescribeClusterRequest, DescribeClusterResponse, MetadataRequest, MetadataResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use uuid::Uuid;

use super::error::ErrorCode;
use super::RequestContext;
use crate::controller::auto_create::is_internal;
use crate::controller::validate_topic_name;
use crate::metadata::{BrokerInfo, TopicInfo};
use crate::security::authorizer::{Operation, ResourceType, CLUSTER_NAME};

/// Kafka's "not requested" marker for authorized-operations fields.
const AUTHORIZED_OPERATIONS_OMITTED: i32 = i32::MIN;

/// The brokers as this client must reach them: each at its advertised address for the
/// listener the client came in on; brokers without that listener are left out, as in Kafka.
fn brokers_for(ctx: &RequestContext) -> Vec<BrokerInfo> {
    let snapshot = ctx.broker.cache.snapshot();
    let me = ctx.broker.config.broker_id;
    snapshot
        .brokers
        .iter()
        .filter_map(|b| {
            let (host, port) = match ctx.broker.config.advertised_for(&ctx.listener) {
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
    if !(allow_auto_create && ctx.broker.config.auto_create_topics_enable) {
        return false;
    }
    let Some(topics) = &req.topics else { return false };
    topics.iter().any(|t| t.name.as_ref().is_some_and(|n| ctx.broker.cache.topic(n).is_none()))
}

pub fn handle(ctx: &RequestContext, req: MetadataRequest) -> MetadataResponse {
    let version = ctx.version();
    let broker = &ctx.broker;
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
                match broker.auto_create(&name) {
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
    let snapshot = ctx.broker.cache.snapshot();
    let mut r = DescribeClusterResponse::default();
    r.endpoint_type = 1;
    if req.endpoint_type != 1 {
        // Only broker endpoints exist in ZooKeeper mode (Kafka: UNSUPPORTED_ENDPOINT_TYPE).
        r.error_code = 119;
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
