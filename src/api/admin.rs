//! Cluster administration beyond topics and configs: ElectLeaders and partition reassignment
//! (served by the controller, as in ZooKeeper-mode Kafka), DescribeLogDirs and
//! AlterReplicaLogDirs (each broker describes and moves its own replicas' logs).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use kafka_protocol::messages::alter_partition_reassignments_response::{
    ReassignablePartitionResponse, ReassignableTopicResponse,
};
use kafka_protocol::messages::alter_replica_log_dirs_response::{
    AlterReplicaLogDirPartitionResult, AlterReplicaLogDirTopicResult,
};
use kafka_protocol::messages::describe_log_dirs_response::{
    DescribeLogDirsPartition, DescribeLogDirsResult, DescribeLogDirsTopic,
};
use kafka_protocol::messages::elect_leaders_response::{PartitionResult, ReplicaElectionResult};
use kafka_protocol::messages::list_partition_reassignments_response::{
    OngoingPartitionReassignment, OngoingTopicReassignment,
};
use kafka_protocol::messages::{
    AlterPartitionReassignmentsRequest, AlterPartitionReassignmentsResponse, AlterReplicaLogDirsRequest,
    AlterReplicaLogDirsResponse, BrokerId, DescribeLogDirsRequest, DescribeLogDirsResponse, DescribeProducersRequest,
    DescribeProducersResponse, ElectLeadersRequest, ElectLeadersResponse, ListPartitionReassignmentsRequest,
    ListPartitionReassignmentsResponse, ProducerId, TopicName,
};
use kafka_protocol::protocol::StrBytes;

use super::RequestContext;
use crate::controller::election::ElectionType;
use crate::protocol::{ApiError, ErrorCode};
use crate::security::authorizer::{Operation, ResourceType};

type Outcome = ((String, i32), Result<(i32, i32), ApiError>);

/// Whether an elected leader is not yet in this broker's image.
fn not_yet_seen(snapshot: &crate::metadata::cache::ClusterSnapshot, ((t, p), res): &Outcome) -> bool {
    let Ok((leader, epoch)) = res else { return false };
    let now = snapshot.topics.get(t).and_then(|t| t.partitions.iter().find(|x| x.index == *p));
    now.is_none_or(|x| !(x.leader == *leader && x.leader_epoch >= *epoch))
}

/// Decides and writes the elections (blocking: ZooKeeper reads and writes).
fn run_elections(ctx: &RequestContext, req: &ElectLeadersRequest) -> Result<Vec<Outcome>, ErrorCode> {
    let broker = &ctx.components;
    let kind = match (ctx.version(), req.election_type) {
        (0, _) | (_, 0) => ElectionType::Preferred,
        (_, 1) => ElectionType::Unclean,
        _ => return Err(ErrorCode::InvalidRequest),
    };
    let snapshot = broker.cache.snapshot();
    let wanted: Vec<(String, i32)> = match &req.topic_partitions {
        Some(list) => {
            let mut seen = BTreeSet::new();
            list.iter()
                .flat_map(|t| t.partitions.iter().map(move |&p| (t.topic.0.to_string(), p)))
                .filter(|tp| seen.insert(tp.clone()))
                .collect()
        }
        None => {
            snapshot.topics.values().flat_map(|t| t.partitions.iter().map(move |p| (t.name.clone(), p.index))).collect()
        }
    };
    if let Err(e) = broker.controller.check_controller() {
        return Ok(wanted.into_iter().map(|tp| (tp, Err(e.clone()))).collect());
    }
    let results = broker.controller.elect_leaders(kind, &wanted);
    Ok(wanted.into_iter().zip(results).collect())
}

pub async fn elect_leaders(ctx: &RequestContext, req: ElectLeadersRequest) -> Result<ElectLeadersResponse, String> {
    let mut r = ElectLeadersResponse::default();
    if !ctx.authorized_cluster(Operation::Alter) {
        let code = ErrorCode::ClusterAuthorizationFailed.code();
        r.error_code = code;
        for t in req.topic_partitions.iter().flatten() {
            let mut out = ReplicaElectionResult::default();
            out.topic = t.topic.clone();
            out.partition_result = t
                .partitions
                .iter()
                .map(|&p| {
                    let mut pr = PartitionResult::default();
                    pr.partition_id = p;
                    pr.error_code = code;
                    pr
                })
                .collect();
            r.replica_election_results.push(out);
        }
        return Ok(r);
    }
    let all = req.topic_partitions.is_none();
    let deadline = Instant::now() + Duration::from_millis(req.timeout_ms.max(0) as u64);
    let c = ctx.clone();
    let outcomes = tokio::task::spawn_blocking(move || run_elections(&c, &req))
        .await
        .map_err(|e| format!("admin request failed: {e}"))?;
    let mut outcomes = match outcomes {
        Ok(o) => o,
        Err(code) => {
            r.error_code = code.code();
            return Ok(r);
        }
    };
    // As Kafka's DelayedElectLeader: answer once this broker's image shows each new leader
    // (the controller's pass has told the brokers), or at the timeout with REQUEST_TIMED_OUT.
    loop {
        let changed = ctx.components.cache.changed();
        tokio::pin!(changed);
        changed.as_mut().enable();
        let snapshot = ctx.components.cache.snapshot();
        if !outcomes.iter().any(|o| not_yet_seen(&snapshot, o)) {
            break;
        }
        if tokio::time::timeout_at(deadline.into(), changed).await.is_err() {
            let snapshot = ctx.components.cache.snapshot();
            for o in outcomes.iter_mut().filter(|o| not_yet_seen(&snapshot, o)) {
                o.1 = Err(ApiError::new(ErrorCode::RequestTimedOut, "Timed out waiting for the leader election"));
            }
            break;
        }
    }
    for ((topic, partition), res) in outcomes {
        let mut pr = PartitionResult::default();
        pr.partition_id = partition;
        if let Err(e) = res {
            // Asked for every partition, Kafka leaves out those that needed no election.
            if all && e.code == ErrorCode::ElectionNotNeeded.code() {
                continue;
            }
            pr.error_code = e.code;
            pr.error_message = Some(StrBytes::from_string(e.message));
        }
        match r.replica_election_results.iter_mut().find(|x| x.topic.0.as_str() == topic) {
            Some(t) => t.partition_result.push(pr),
            None => {
                let mut t = ReplicaElectionResult::default();
                t.topic = TopicName(StrBytes::from_string(topic));
                t.partition_result.push(pr);
                r.replica_election_results.push(t);
            }
        }
    }
    Ok(r)
}

/// Total and usable bytes of the file system holding `dir`; -1 each when unknown, as Kafka
/// reports them.
fn volume_bytes(dir: &std::path::Path) -> (i64, i64) {
    use std::os::unix::ffi::OsStrExt;
    let Ok(path) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else { return (-1, -1) };
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::zeroed();
    // SAFETY: `path` is a NUL-terminated string and `st` points to writable memory of the
    // right size; statvfs only writes into it.
    let rc = unsafe { libc::statvfs(path.as_ptr(), st.as_mut_ptr()) };
    if rc != 0 {
        return (-1, -1);
    }
    // SAFETY: statvfs returned 0, so it filled the struct.
    let st = unsafe { st.assume_init() };
    let block = st.f_frsize as i64;
    (block.saturating_mul(st.f_blocks as i64), block.saturating_mul(st.f_bavail as i64))
}

pub fn describe_log_dirs(ctx: &RequestContext, req: DescribeLogDirsRequest) -> DescribeLogDirsResponse {
    let broker = &ctx.components;
    let wanted: Option<BTreeSet<(String, i32)>> = req
        .topics
        .as_ref()
        .map(|ts| ts.iter().flat_map(|t| t.partitions.iter().map(move |&p| (t.topic.0.to_string(), p))).collect());
    let mut r = DescribeLogDirsResponse::default();
    if !ctx.authorized_cluster(Operation::Describe) {
        r.error_code = ErrorCode::ClusterAuthorizationFailed.code();
        return r;
    }
    let futures = broker.replicas.logs().future_placement();
    for (dir_idx, (dir, online, keys)) in broker.replicas.logs().placement().into_iter().enumerate() {
        let mut out = DescribeLogDirsResult::default();
        out.log_dir = StrBytes::from_string(dir.display().to_string());
        (out.total_bytes, out.usable_bytes) = if online { volume_bytes(dir) } else { (-1, -1) };
        if !online {
            out.error_code = ErrorCode::KafkaStorageError.code();
            r.results.push(out);
            continue;
        }
        for (topic, partition) in keys {
            if wanted.as_ref().is_some_and(|w| !w.contains(&(topic.clone(), partition))) {
                continue;
            }
            let Some(part) = broker.replicas.hosted(&topic, partition) else { continue };
            let mut p = DescribeLogDirsPartition::default();
            p.partition_index = partition;
            p.partition_size = part.log_stats().size_bytes().min(i64::MAX as u64) as i64;
            // Kafka's lag of a current replica: how far its end is below the high watermark.
            p.offset_lag = (part.high_watermark() - part.log_stats().log_end_offset()).max(0);
            push_partition(&mut out, topic, p);
        }
        // A move in progress: its future replica, with how far it is behind the current one.
        for (_, (topic, partition), stats) in futures.iter().filter(|f| f.0 == dir_idx) {
            if wanted.as_ref().is_some_and(|w| !w.contains(&(topic.clone(), *partition))) {
                continue;
            }
            let Some(part) = broker.replicas.hosted(topic, *partition) else { continue };
            let mut p = DescribeLogDirsPartition::default();
            p.partition_index = *partition;
            p.partition_size = stats.size_bytes().min(i64::MAX as u64) as i64;
            p.offset_lag = (part.log_stats().log_end_offset() - stats.log_end_offset()).max(0);
            p.is_future_key = true;
            push_partition(&mut out, topic.clone(), p);
        }
        r.results.push(out);
    }
    r
}

fn push_partition(out: &mut DescribeLogDirsResult, topic: String, p: DescribeLogDirsPartition) {
    match out.topics.iter_mut().find(|t| t.name.0.as_str() == topic) {
        Some(t) => t.partitions.push(p),
        None => {
            let mut t = DescribeLogDirsTopic::default();
            t.name = TopicName(StrBytes::from_string(topic));
            t.partitions.push(p);
            out.topics.push(t);
        }
    }
}

/// The index in `log.dirs` of the directory a client names: Kafka compares absolute paths.
fn log_dir_index(dirs: &[std::path::PathBuf], named: &str) -> Option<usize> {
    dirs.iter().position(|d| d.as_os_str() == named || std::path::absolute(d).is_ok_and(|a| a.as_os_str() == named))
}

/// AlterReplicaLogDirs (blocking: it creates directories). Each broker moves its own replicas.
pub fn alter_replica_log_dirs(ctx: &RequestContext, req: AlterReplicaLogDirsRequest) -> AlterReplicaLogDirsResponse {
    use crate::replication::alter_log_dirs::AlterDirError;
    let replicas = &ctx.components.replicas;
    let mut r = AlterReplicaLogDirsResponse::default();
    // Without ALTER on the cluster every partition is refused, as Kafka answers.
    let allowed = ctx.authorized_cluster(Operation::Alter);
    for dir in req.dirs {
        let idx = log_dir_index(replicas.logs().dirs(), dir.path.as_str());
        for t in dir.topics {
            let topic = t.name.0.to_string();
            let mut results = Vec::with_capacity(t.partitions.len());
            for p in t.partitions {
                if !allowed {
                    let mut pr = AlterReplicaLogDirPartitionResult::default();
                    pr.partition_index = p;
                    pr.error_code = ErrorCode::ClusterAuthorizationFailed.code();
                    results.push(pr);
                    continue;
                }
                let outcome = match idx {
                    None => Err(AlterDirError::DirNotFound),
                    Some(i) => replicas.alter_log_dir(&topic, p, i),
                };
                let code = match &outcome {
                    Ok(()) => ErrorCode::None,
                    Err(AlterDirError::DirNotFound) => ErrorCode::LogDirNotFound,
                    Err(AlterDirError::Storage(_)) => ErrorCode::KafkaStorageError,
                    Err(AlterDirError::NoReplica) => ErrorCode::ReplicaNotAvailable,
                    Err(AlterDirError::NameTooLong) => ErrorCode::InvalidTopicException,
                };
                if let Err(e) = outcome {
                    tracing::info!(topic = %topic, partition = p, dir = %dir.path.as_str(), error = ?e, "log dir move refused");
                }
                let mut pr = AlterReplicaLogDirPartitionResult::default();
                pr.partition_index = p;
                pr.error_code = code.code();
                results.push(pr);
            }
            match r.results.iter_mut().find(|x| x.topic_name.0.as_str() == topic) {
                Some(x) => x.partitions.extend(results),
                None => {
                    let mut x = AlterReplicaLogDirTopicResult::default();
                    x.topic_name = t.name;
                    x.partitions = results;
                    r.results.push(x);
                }
            }
        }
    }
    r
}

fn broker_ids(ids: &[i32]) -> Vec<BrokerId> {
    ids.iter().map(|&i| BrokerId(i)).collect()
}

/// AlterPartitionReassignments (blocking: ZooKeeper reads and writes). Answered once each move
/// is started (or finished, when nothing needs copying), as Kafka's controller answers.
pub fn alter_partition_reassignments(
    ctx: &RequestContext,
    req: AlterPartitionReassignmentsRequest,
) -> AlterPartitionReassignmentsResponse {
    let mut r = AlterPartitionReassignmentsResponse::default();
    // null on success, as Kafka answers (the crate's default is an empty string)
    r.error_message = None;
    if let Err(e) = ctx.require_cluster(Operation::Alter).and_then(|()| ctx.components.controller.check_controller()) {
        r.error_code = e.code;
        r.error_message = Some(StrBytes::from_string(e.message));
        return r;
    }
    let wanted: Vec<crate::controller::reassign::ReassignmentRequest> = req
        .topics
        .iter()
        .flat_map(|t| {
            t.partitions.iter().map(move |p| {
                let target = p.replicas.as_ref().map(|rs| rs.iter().map(|b| b.0).collect::<Vec<i32>>());
                (t.name.0.to_string(), p.partition_index, target)
            })
        })
        .collect();
    let results = ctx.components.controller.alter_reassignments(&wanted);
    for ((topic, partition, _), res) in wanted.into_iter().zip(results) {
        let mut pr = ReassignablePartitionResponse::default();
        pr.partition_index = partition;
        pr.error_message = None;
        if let Err(e) = res {
            pr.error_code = e.code;
            pr.error_message = Some(StrBytes::from_string(e.message));
        }
        match r.responses.iter_mut().find(|t| t.name.0.as_str() == topic) {
            Some(t) => t.partitions.push(pr),
            None => {
                let mut t = ReassignableTopicResponse::default();
                t.name = TopicName(StrBytes::from_string(topic));
                t.partitions.push(pr);
                r.responses.push(t);
            }
        }
    }
    r
}

/// ListPartitionReassignments: the controller's reassignments in flight.
pub fn list_partition_reassignments(
    ctx: &RequestContext,
    req: ListPartitionReassignmentsRequest,
) -> ListPartitionReassignmentsResponse {
    let mut r = ListPartitionReassignmentsResponse::default();
    r.error_message = None;
    if let Err(e) = ctx.require_cluster(Operation::Describe).and_then(|()| ctx.components.controller.check_controller())
    {
        r.error_code = e.code;
        r.error_message = Some(StrBytes::from_string(e.message));
        return r;
    }
    let only: Option<std::collections::BTreeMap<String, BTreeSet<i32>>> = req
        .topics
        .as_ref()
        .map(|ts| ts.iter().map(|t| (t.name.0.to_string(), t.partition_indexes.iter().copied().collect())).collect());
    for (topic, partition, replicas, adding, removing) in ctx.components.controller.list_reassignments(only.as_ref()) {
        let mut p = OngoingPartitionReassignment::default();
        p.partition_index = partition;
        p.replicas = broker_ids(&replicas);
        p.adding_replicas = broker_ids(&adding);
        p.removing_replicas = broker_ids(&removing);
        match r.topics.iter_mut().find(|t| t.name.0.as_str() == topic) {
            Some(t) => t.partitions.push(p),
            None => {
                let mut t = OngoingTopicReassignment::default();
                t.name = TopicName(StrBytes::from_string(topic));
                t.partitions.push(p);
                r.topics.push(t);
            }
        }
    }
    r
}

/// DescribeProducers: the producers each partition's replica here has state for. Any replica
/// answers, leader or follower, from its own producer state (Kafka's ReplicaManager looks the
/// partition up with getPartitionOrError, not as leader), so that `kafka-transactions
/// find-hanging --broker-id` can ask each broker about every partition it hosts.
pub fn describe_producers(ctx: &RequestContext, req: DescribeProducersRequest) -> DescribeProducersResponse {
    let broker = &ctx.components;
    let mut r = DescribeProducersResponse::default();
    for t in req.topics {
        let name = t.name.0.to_string();
        let may_read = ctx.authorized(Operation::Read, ResourceType::Topic, &name);
        let mut out = kafka_protocol::messages::describe_producers_response::TopicResponse::default();
        for index in t.partition_indexes {
            let mut pr = kafka_protocol::messages::describe_producers_response::PartitionResponse::default();
            pr.partition_index = index;
            if !may_read {
                pr.error_code = ErrorCode::TopicAuthorizationFailed.code();
                out.partitions.push(pr);
                continue;
            }
            match broker.replicas.hosted(&name, index) {
                Some(p) => {
                    pr.active_producers = p
                        .active_producers()
                        .into_iter()
                        .map(|a| {
                            let mut s = kafka_protocol::messages::describe_producers_response::ProducerState::default();
                            s.producer_id = ProducerId(a.producer_id);
                            s.producer_epoch = i32::from(a.epoch);
                            s.last_sequence = a.last_sequence;
                            s.last_timestamp = a.last_timestamp;
                            s.coordinator_epoch = a.coordinator_epoch;
                            s.current_txn_start_offset = a.txn_start_offset;
                            s
                        })
                        .collect();
                }
                None => pr.error_code = super::not_led_error(broker, &name, index),
            }
            out.partitions.push(pr);
        }
        out.name = t.name;
        r.topics.push(out);
    }
    r
}
