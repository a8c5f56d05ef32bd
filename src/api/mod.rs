//! Request handlers, one file per API family (Kafka's `KafkaApis`, split up), and the table of
//! API keys and versions this broker implements, which is also what ApiVersions advertises.

mod acls;
mod admin;
mod api_versions;
mod components;
mod configs;
mod consumer_group;
mod fetch;
mod group;
pub mod inter_broker;
pub mod legacy;
mod metadata;
mod offsets;
mod produce;
mod producer_id;
mod quotas;
mod scram_credentials;
mod share;
mod share_state;
mod telemetry;
mod topics;
mod txn;

use std::sync::Arc;

use kafka_protocol::messages::{ApiKey, RequestHeader, RequestKind, ResponseKind};

use crate::protocol::{ApiError, ErrorCode};
use crate::security::authorizer::{Operation, ResourceType, Session, CLUSTER_NAME};
use crate::sync::MutexExt;

/// Every API key gregor serves with the versions it really implements, within Kafka 3.9's. The
/// `kafka-protocol` crate decodes the newer ones, `legacy` the older (checked by a test).
pub const SUPPORTED_APIS: &[(ApiKey, i16, i16)] = &[
    (ApiKey::Produce, 0, 11),
    // v17 adds only a follower's directory id (KIP-853, a tagged field): served as v16.
    (ApiKey::Fetch, 0, 17),
    (ApiKey::ListOffsets, 0, 8),
    (ApiKey::Metadata, 0, 12),
    (ApiKey::ApiVersions, 0, 4),
    (ApiKey::CreateTopics, 0, 7),
    (ApiKey::DeleteTopics, 0, 6),
    (ApiKey::DeleteRecords, 0, 2),
    (ApiKey::InitProducerId, 0, 4),
    (ApiKey::DescribeConfigs, 0, 4),
    (ApiKey::CreatePartitions, 0, 3),
    (ApiKey::AlterConfigs, 0, 2),
    (ApiKey::DescribeLogDirs, 1, 4),
    (ApiKey::AlterReplicaLogDirs, 0, 2),
    (ApiKey::IncrementalAlterConfigs, 0, 1),
    (ApiKey::ElectLeaders, 0, 2),
    (ApiKey::AlterPartitionReassignments, 0, 0),
    (ApiKey::ListPartitionReassignments, 0, 0),
    (ApiKey::DescribeClientQuotas, 0, 1),
    (ApiKey::AlterClientQuotas, 0, 1),
    (ApiKey::DescribeProducers, 0, 0),
    (ApiKey::DescribeCluster, 0, 1),
    // KRaft-only in Kafka 3.9 (not advertised by its ZooKeeper-mode brokers); served because
    // Java clients 3.8+ use it when offered and fall back to Metadata otherwise.
    (ApiKey::DescribeTopicPartitions, 0, 0),
    (ApiKey::OffsetCommit, 0, 9),
    (ApiKey::OffsetFetch, 0, 9),
    (ApiKey::FindCoordinator, 0, 4),
    (ApiKey::JoinGroup, 0, 9),
    (ApiKey::Heartbeat, 0, 4),
    (ApiKey::LeaveGroup, 0, 5),
    (ApiKey::SyncGroup, 0, 5),
    (ApiKey::DescribeGroups, 0, 5),
    (ApiKey::ListGroups, 0, 5),
    (ApiKey::DeleteGroups, 0, 2),
    (ApiKey::OffsetDelete, 0, 0),
    // The consumer group protocol (KIP-848) at Kafka 4.x's versions; offered only while
    // `group.coordinator.rebalance.protocols` names `consumer` (see `served_versions`).
    (ApiKey::ConsumerGroupHeartbeat, 0, 1),
    (ApiKey::ConsumerGroupDescribe, 0, 1),
    (ApiKey::OffsetForLeaderEpoch, 0, 4),
    // Share groups (KIP-932) at Kafka 4.1+'s versions; offered only while
    // `group.coordinator.rebalance.protocols` names `share` (see `served_versions`).
    (ApiKey::ShareGroupHeartbeat, 1, 1),
    (ApiKey::ShareGroupDescribe, 1, 1),
    (ApiKey::ShareFetch, 1, 1),
    (ApiKey::ShareAcknowledge, 1, 1),
    // The share coordinator's, between brokers (see `share_state`).
    (ApiKey::ReadShareGroupState, 0, 0),
    (ApiKey::WriteShareGroupState, 0, 0),
    // Answered on the connection itself (network): they change who the connection is.
    (ApiKey::SaslHandshake, 0, 1),
    (ApiKey::SaslAuthenticate, 0, 2),
    (ApiKey::DescribeAcls, 1, 3),
    (ApiKey::CreateAcls, 1, 3),
    (ApiKey::DeleteAcls, 1, 3),
    (ApiKey::DescribeUserScramCredentials, 0, 0),
    (ApiKey::AlterUserScramCredentials, 0, 0),
    // Transactions (KIP-98) as Kafka 3.9 serves them to clients that do not use KIP-890's
    // transactions v2: the versions whose semantics are implemented.
    (ApiKey::AddPartitionsToTxn, 0, 4),
    (ApiKey::AddOffsetsToTxn, 0, 3),
    (ApiKey::EndTxn, 0, 3),
    (ApiKey::TxnOffsetCommit, 0, 3),
    (ApiKey::WriteTxnMarkers, 1, 1),
    (ApiKey::DescribeTransactions, 0, 0),
    (ApiKey::ListTransactions, 0, 1),
    // Client telemetry (KIP-714), as Kafka 4.x serves it; 71 and 72 only with
    // `gregor.client.telemetry.enable` (see `served_versions`). 74 is Kafka 4.1's
    // ListConfigResources, ListClientMetricsResources before it (v0).
    (ApiKey::GetTelemetrySubscriptions, 0, 0),
    (ApiKey::PushTelemetry, 0, 0),
    (ApiKey::ListConfigResources, 0, 1),
];

/// The APIs Kafka serves only when a telemetry receiver is configured.
const TELEMETRY_APIS: &[ApiKey] = &[ApiKey::GetTelemetrySubscriptions, ApiKey::PushTelemetry];

pub use api_versions::unsupported_version_response as api_versions_unsupported;
pub use components::Components;

/// The error for a partition this broker does not lead: NOT_LEADER_OR_FOLLOWER if the
/// partition exists (the client refreshes metadata and finds the leader), else
/// UNKNOWN_TOPIC_OR_PARTITION.
pub fn not_led_error(components: &Components, topic: &str, partition: i32) -> i16 {
    components.replicas.not_led_error(topic, partition)
}

pub fn supported_versions(key: ApiKey) -> Option<(i16, i16)> {
    SUPPORTED_APIS.iter().find(|(k, _, _)| *k == key).map(|&(_, min, max)| (min, max))
}

/// The versions of `key` this broker serves as configured: [`SUPPORTED_APIS`] less the
/// telemetry APIs when client telemetry is off and the consumer group protocol's when it is
/// (then they are neither listed nor answered).
pub fn served_versions(broker: &Components, key: ApiKey) -> Option<(i16, i16)> {
    if TELEMETRY_APIS.contains(&key) && !broker.client_metrics.enabled() {
        return None;
    }
    // The consumer group protocol's APIs, as unknown to clients as to Kafka 3.x when
    // `group.coordinator.rebalance.protocols` leaves out `consumer`.
    if consumer_group::KEYS.contains(&key) && !broker.groups.consumer_groups().config().enabled {
        return None;
    }
    if (share::KEYS.contains(&key) || share_state::KEYS.contains(&key))
        && !broker.groups.share_groups().config().enabled
    {
        return None;
    }
    supported_versions(key)
}

/// What a connection's client said about itself (ApiVersions v3+) and where it connects from:
/// what KIP-714's subscriptions match clients on. Shared by the connection's requests.
#[derive(Debug, Default)]
pub struct ClientInformation {
    pub source_port: Option<u16>,
    software: std::sync::Mutex<Option<(String, String)>>,
}

impl ClientInformation {
    pub fn new(source_port: Option<u16>) -> ClientInformation {
        ClientInformation { source_port, software: Default::default() }
    }

    /// The client's software name and version, once it has sent ApiVersions v3+.
    pub fn software(&self) -> Option<(String, String)> {
        self.software.lock_unpoisoned().clone()
    }

    fn set_software(&self, name: &str, version: &str) {
        *self.software.lock_unpoisoned() = Some((name.to_string(), version.to_string()));
    }
}

/// What the connection knows about one request.
#[derive(Clone)]
pub struct RequestContext {
    /// The broker's components, shared by every request.
    pub components: Arc<Components>,
    /// The listener the client connected on: Metadata answers with its advertised address.
    pub listener: Arc<str>,
    pub header: RequestHeader,
    /// The client's address, as DescribeGroups reports it (Kafka's `/ip` form).
    pub peer: String,
    /// This request's `queued.max.requests` slot, held while it is decoded and handled (shared
    /// by the clones that carry the request onto the blocking pool).
    pub slot: Arc<std::sync::Mutex<Option<RequestSlot>>>,
    /// Who the connection authenticated as: `User:ANONYMOUS` on PLAINTEXT, on SSL without a
    /// client certificate, and never otherwise past authentication.
    pub principal: Arc<crate::security::KafkaPrincipal>,
    /// Whether the response goes to a socket as it is encoded (plaintext), so a Fetch may
    /// leave large record sets in their files for the writer to send with sendfile.
    pub sendfile: bool,
    /// The file ranges behind a Fetch response's placeholders, for the response writer.
    pub file_ranges: Arc<std::sync::Mutex<crate::log::zero_copy::FileRanges>>,
    /// The client's software and source port, for client telemetry.
    pub client: Arc<ClientInformation>,
}

/// A `queued.max.requests` permit, and the request's place in the count of those handled.
pub type RequestSlot = (tokio::sync::OwnedSemaphorePermit, crate::metrics::GaugeGuard);

impl RequestContext {
    /// Gives the request's slot back while it waits in a purgatory: a parked request costs a
    /// waker, not handler capacity, as Kafka's purgatories hold requests outside its queue.
    pub fn park(&self) {
        self.slot.lock_unpoisoned().take();
    }

    pub fn version(&self) -> i16 {
        self.header.request_api_version
    }

    /// The client's IP address, for host-based checks.
    pub fn client_ip(&self) -> Option<std::net::IpAddr> {
        self.peer.trim_start_matches('/').parse().ok()
    }

    /// Whether this request's principal may do `op` on the resource: always without an
    /// authorizer, as in Kafka. Reads the ACL snapshot only.
    pub fn authorized(&self, op: Operation, resource_type: ResourceType, name: &str) -> bool {
        let Some(authorizer) = &self.components.security.authorizer else { return true };
        let session = Session { principal: &self.principal, host: self.client_ip() };
        let allowed = authorizer.authorize(&session, op, resource_type, name);
        if !allowed {
            tracing::debug!(principal = %self.principal, ?op, ?resource_type, %name, "denied");
        }
        allowed
    }

    pub fn authorized_cluster(&self, op: Operation) -> bool {
        self.authorized(op, ResourceType::Cluster, CLUSTER_NAME)
    }

    /// `op` on the cluster, or the error a whole request is refused with.
    pub fn require_cluster(&self, op: Operation) -> Result<(), ApiError> {
        match self.authorized_cluster(op) {
            true => Ok(()),
            false => Err(ApiError::new(ErrorCode::ClusterAuthorizationFailed, "Cluster authorization failed.")),
        }
    }

    /// `op` on at least one resource of the type (InitProducerId's WRITE on any topic).
    pub fn authorized_any(&self, op: Operation, resource_type: ResourceType) -> bool {
        let Some(authorizer) = &self.components.security.authorizer else { return true };
        authorizer.authorize_any(&Session { principal: &self.principal, host: self.client_ip() }, op, resource_type)
    }

    /// The bit field of allowed operations that Metadata, DescribeCluster and DescribeGroups
    /// report: every operation of the type without an authorizer, as Kafka reports.
    pub fn authorized_operations(&self, resource_type: ResourceType, name: &str) -> i32 {
        match &self.components.security.authorizer {
            Some(a) => a.authorized_operations(
                &Session { principal: &self.principal, host: self.client_ip() },
                resource_type,
                name,
            ),
            None => resource_type.supported_operations().iter().fold(0, |bits, op| bits | (1 << op.code())),
        }
    }
}

/// Runs one decoded request. `Ok(None)` means no response is sent (Produce with acks=0);
/// `Err` closes the connection with that reason.
pub async fn handle(ctx: &RequestContext, request: RequestKind) -> Result<Option<ResponseKind>, String> {
    let response = match request {
        RequestKind::ApiVersions(r) => ResponseKind::ApiVersions(api_versions::handle(ctx, r)),
        RequestKind::Metadata(r) if metadata::may_create_topics(ctx, &r) => {
            ResponseKind::Metadata(off_runtime(ctx, move |c| metadata::handle(c, r)).await?)
        }
        RequestKind::Metadata(r) => ResponseKind::Metadata(metadata::handle(ctx, r)),
        RequestKind::Produce(r) => return Ok(produce::handle(ctx, r).await.map(ResponseKind::Produce)),
        RequestKind::Fetch(r) => ResponseKind::Fetch(fetch::handle(ctx, r).await),
        RequestKind::ListOffsets(r) => ResponseKind::ListOffsets(fetch::list_offsets(ctx, r)),
        RequestKind::CreateTopics(r) => {
            ResponseKind::CreateTopics(off_runtime(ctx, move |c| topics::create_topics(c, r)).await?)
        }
        RequestKind::DeleteTopics(r) => ResponseKind::DeleteTopics(topics::delete_topics(ctx, r).await?),
        RequestKind::CreatePartitions(r) => {
            ResponseKind::CreatePartitions(off_runtime(ctx, move |c| topics::create_partitions(c, r)).await?)
        }
        RequestKind::DeleteRecords(r) => {
            ResponseKind::DeleteRecords(off_runtime(ctx, move |c| topics::delete_records(c, r)).await?)
        }
        RequestKind::DescribeConfigs(r) => ResponseKind::DescribeConfigs(configs::describe_configs(ctx, r)),
        RequestKind::AlterConfigs(r) => {
            ResponseKind::AlterConfigs(off_runtime(ctx, move |c| configs::alter_configs(c, r)).await?)
        }
        RequestKind::IncrementalAlterConfigs(r) => ResponseKind::IncrementalAlterConfigs(
            off_runtime(ctx, move |c| configs::incremental_alter_configs(c, r)).await?,
        ),
        RequestKind::ElectLeaders(r) => ResponseKind::ElectLeaders(admin::elect_leaders(ctx, r).await?),
        RequestKind::AlterPartitionReassignments(r) => ResponseKind::AlterPartitionReassignments(
            off_runtime(ctx, move |c| admin::alter_partition_reassignments(c, r)).await?,
        ),
        RequestKind::ListPartitionReassignments(r) => {
            ResponseKind::ListPartitionReassignments(admin::list_partition_reassignments(ctx, r))
        }
        RequestKind::DescribeClientQuotas(r) => {
            ResponseKind::DescribeClientQuotas(off_runtime(ctx, move |c| quotas::describe_client_quotas(c, r)).await?)
        }
        RequestKind::AlterClientQuotas(r) => {
            ResponseKind::AlterClientQuotas(off_runtime(ctx, move |c| quotas::alter_client_quotas(c, r)).await?)
        }
        RequestKind::DescribeProducers(r) => ResponseKind::DescribeProducers(admin::describe_producers(ctx, r)),
        RequestKind::DescribeLogDirs(r) => ResponseKind::DescribeLogDirs(admin::describe_log_dirs(ctx, r)),
        RequestKind::AlterReplicaLogDirs(r) => {
            ResponseKind::AlterReplicaLogDirs(off_runtime(ctx, move |c| admin::alter_replica_log_dirs(c, r)).await?)
        }
        RequestKind::DescribeCluster(r) => ResponseKind::DescribeCluster(metadata::describe_cluster(ctx, r)),
        RequestKind::DescribeTopicPartitions(r) => {
            ResponseKind::DescribeTopicPartitions(metadata::describe_topic_partitions(ctx, r))
        }
        RequestKind::InitProducerId(r) if r.transactional_id.is_some() => {
            ResponseKind::InitProducerId(txn::init_producer_id(ctx, r).await)
        }
        RequestKind::InitProducerId(r) => ResponseKind::InitProducerId(producer_id::init_producer_id(ctx, r).await),
        RequestKind::AddPartitionsToTxn(r) => {
            ResponseKind::AddPartitionsToTxn(txn::add_partitions_to_txn(ctx, r).await)
        }
        RequestKind::AddOffsetsToTxn(r) => ResponseKind::AddOffsetsToTxn(txn::add_offsets_to_txn(ctx, r).await),
        RequestKind::EndTxn(r) => ResponseKind::EndTxn(txn::end_txn(ctx, r).await),
        RequestKind::TxnOffsetCommit(r) => ResponseKind::TxnOffsetCommit(txn::txn_offset_commit(ctx, r).await),
        RequestKind::WriteTxnMarkers(r) => ResponseKind::WriteTxnMarkers(txn::write_txn_markers(ctx, r).await),
        RequestKind::ListTransactions(r) => ResponseKind::ListTransactions(txn::list_transactions(ctx, r)),
        RequestKind::DescribeTransactions(r) => ResponseKind::DescribeTransactions(txn::describe_transactions(ctx, r)),
        RequestKind::OffsetForLeaderEpoch(r) => {
            ResponseKind::OffsetForLeaderEpoch(fetch::offset_for_leader_epoch(ctx, r))
        }
        RequestKind::FindCoordinator(r) => {
            ResponseKind::FindCoordinator(off_runtime(ctx, move |c| group::find_coordinator(c, r)).await?)
        }
        RequestKind::JoinGroup(r) => ResponseKind::JoinGroup(group::join_group(ctx, r).await),
        RequestKind::SyncGroup(r) => ResponseKind::SyncGroup(group::sync_group(ctx, r).await),
        RequestKind::Heartbeat(r) => ResponseKind::Heartbeat(group::heartbeat(ctx, r)),
        RequestKind::LeaveGroup(r) => ResponseKind::LeaveGroup(group::leave_group(ctx, r)),
        RequestKind::OffsetCommit(r) => ResponseKind::OffsetCommit(offsets::offset_commit(ctx, r).await),
        RequestKind::OffsetFetch(r) => ResponseKind::OffsetFetch(offsets::offset_fetch(ctx, r)),
        RequestKind::DescribeGroups(r) => ResponseKind::DescribeGroups(group::describe_groups(ctx, r)),
        RequestKind::ListGroups(r) => ResponseKind::ListGroups(group::list_groups(ctx, r)),
        RequestKind::DeleteGroups(r) => ResponseKind::DeleteGroups(group::delete_groups(ctx, r)),
        RequestKind::OffsetDelete(r) => ResponseKind::OffsetDelete(offsets::offset_delete(ctx, r)),
        RequestKind::ConsumerGroupHeartbeat(r) => ResponseKind::ConsumerGroupHeartbeat(
            off_runtime(ctx, move |c| consumer_group::consumer_group_heartbeat(c, r)).await?,
        ),
        RequestKind::ConsumerGroupDescribe(r) => {
            ResponseKind::ConsumerGroupDescribe(consumer_group::consumer_group_describe(ctx, r))
        }
        RequestKind::ShareGroupHeartbeat(r) => ResponseKind::ShareGroupHeartbeat(share::share_group_heartbeat(ctx, r)),
        RequestKind::ShareGroupDescribe(r) => ResponseKind::ShareGroupDescribe(share::share_group_describe(ctx, r)),
        RequestKind::ShareFetch(r) => ResponseKind::ShareFetch(share::share_fetch(ctx, r).await),
        RequestKind::ShareAcknowledge(r) => ResponseKind::ShareAcknowledge(share::share_acknowledge(ctx, r).await),
        RequestKind::ReadShareGroupState(r) => {
            ResponseKind::ReadShareGroupState(share_state::read_share_group_state(ctx, r).await)
        }
        RequestKind::WriteShareGroupState(r) => {
            ResponseKind::WriteShareGroupState(share_state::write_share_group_state(ctx, r).await)
        }
        RequestKind::DescribeAcls(r) => ResponseKind::DescribeAcls(acls::describe_acls(ctx, r)),
        RequestKind::CreateAcls(r) => {
            ResponseKind::CreateAcls(off_runtime(ctx, move |c| acls::create_acls(c, r)).await?)
        }
        RequestKind::DeleteAcls(r) => {
            ResponseKind::DeleteAcls(off_runtime(ctx, move |c| acls::delete_acls(c, r)).await?)
        }
        RequestKind::GetTelemetrySubscriptions(r) => {
            ResponseKind::GetTelemetrySubscriptions(telemetry::get_telemetry_subscriptions(ctx, r))
        }
        RequestKind::PushTelemetry(r) => ResponseKind::PushTelemetry(telemetry::push_telemetry(ctx, r)),
        RequestKind::ListConfigResources(r) => {
            ResponseKind::ListConfigResources(telemetry::list_config_resources(ctx, r))
        }
        RequestKind::DescribeUserScramCredentials(r) => {
            ResponseKind::DescribeUserScramCredentials(scram_credentials::describe(ctx, r))
        }
        RequestKind::AlterUserScramCredentials(r) => {
            ResponseKind::AlterUserScramCredentials(off_runtime(ctx, move |c| scram_credentials::alter(c, r)).await?)
        }
        other => {
            // The network layer only decodes keys from SUPPORTED_APIS, so this is a bug in the
            // table, not bad input.
            return Err(format!("no handler for {:?}", std::mem::discriminant(&other)));
        }
    };
    Ok(Some(response))
}

/// Runs an admin request on the blocking pool. Such requests write znodes and create, delete
/// or truncate logs (10,000 new partitions is a minute of file creation and fsyncs); on an
/// async worker they would stall every connection whose task is queued behind it.
pub(crate) async fn off_runtime<T: Send + 'static>(
    ctx: &RequestContext,
    f: impl FnOnce(&RequestContext) -> T + Send + 'static,
) -> Result<T, String> {
    let c = ctx.clone();
    // The request's span (connection, peer, API) goes along, so what it logs says who asked.
    let span = tracing::Span::current();
    tokio::task::spawn_blocking(move || span.in_scope(|| f(&c))).await.map_err(|e| format!("admin request failed: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advertised_ranges_are_decodable() {
        for &(key, min, max) in SUPPORTED_APIS {
            let crate_range = key.valid_versions();
            assert!(max <= crate_range.max, "{key:?} {min}-{max} vs {crate_range}");
            for v in min..crate_range.min {
                assert!(legacy::serves(key, v), "{key:?} v{v} is advertised but neither codec has it");
            }
            assert!(min <= max);
        }
    }
}
