//! Topic administration: CreateTopics, DeleteTopics, CreatePartitions, DeleteRecords. In
//! ZooKeeper mode Kafka serves the first three on the controller only; standalone, this broker
//! is the controller.

use std::collections::BTreeMap;

use kafka_protocol::messages::create_partitions_response::CreatePartitionsTopicResult;
use kafka_protocol::messages::create_topics_response::{CreatableTopicConfigs, CreatableTopicResult};
use kafka_protocol::messages::delete_records_response::{DeleteRecordsPartitionResult, DeleteRecordsTopicResult};
use kafka_protocol::messages::delete_topics_response::DeletableTopicResult;
use kafka_protocol::messages::{
    CreatePartitionsRequest, CreatePartitionsResponse, CreateTopicsRequest, CreateTopicsResponse, DeleteRecordsRequest,
    DeleteRecordsResponse, DeleteTopicsRequest, DeleteTopicsResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;

use super::configs::{topic_config_entries, ConfigEntry};
use super::RequestContext;
use crate::controller::TopicRequest;
use crate::protocol::{ApiError, ErrorCode};
use crate::security::authorizer::{Operation, ResourceType};

fn refused(what: &str) -> ApiError {
    ApiError::new(ErrorCode::TopicAuthorizationFailed, format!("Authorization failed: {what}"))
}

/// What CreateTopics reports for a created (or validated) topic.
type Created = (i32, i16, BTreeMap<String, String>, Option<uuid::Uuid>);

pub fn create_topics(ctx: &RequestContext, req: CreateTopicsRequest) -> CreateTopicsResponse {
    let broker = &ctx.components;
    let mut r = CreateTopicsResponse::default();
    let mut seen = std::collections::HashSet::new();
    // Each topic's answer: decided while planning (an error, or validate_only), or by the
    // one batch that creates every planned topic.
    let mut answers: Vec<(CreatableTopicResult, Option<Result<Created, ApiError>>)> = Vec::new();
    let mut planned: Vec<usize> = Vec::new();
    let mut to_create: Vec<TopicRequest> = Vec::new();
    // Entries that passed the request's own checks, planned together below.
    let mut checking: Vec<usize> = Vec::new();
    let mut to_plan: Vec<TopicRequest> = Vec::new();
    let mut budget = PartitionBudget::new(&broker.config);
    // CREATE on the cluster covers every topic; otherwise each needs CREATE of its own.
    let may_create_any = ctx.authorized_cluster(Operation::Create);
    for t in req.topics {
        let name = t.name.0.to_string();
        let mut out = CreatableTopicResult::default();
        out.name = t.name.clone();
        out.num_partitions = -1;
        out.replication_factor = -1;
        if !seen.insert(name.clone()) {
            let e = ApiError::new(ErrorCode::InvalidRequest, format!("Duplicate topic name {name} in request"));
            answers.push((out, Some(Err(e))));
            continue;
        }
        if !may_create_any && !ctx.authorized(Operation::Create, ResourceType::Topic, &name) {
            answers.push((out, Some(Err(refused("CREATE on the topic or the cluster")))));
            continue;
        }
        let configs: BTreeMap<String, String> =
            t.configs.iter().filter_map(|c| c.value.as_ref().map(|v| (c.name.to_string(), v.to_string()))).collect();
        let assignment: BTreeMap<i32, Vec<i32>> =
            t.assignments.iter().map(|a| (a.partition_index, a.broker_ids.iter().map(|b| b.0).collect())).collect();
        if !assignment.is_empty() && (t.num_partitions != -1 || t.replication_factor != -1) {
            let e = ApiError::new(
                ErrorCode::InvalidRequest,
                "Both numPartitions or replicationFactor and replicasAssignments were set.",
            );
            answers.push((out, Some(Err(e))));
            continue;
        }
        if let Err(e) = broker.controller.check_controller() {
            answers.push((out, Some(Err(e))));
            continue;
        }
        checking.push(answers.len());
        answers.push((out, None));
        to_plan.push(TopicRequest {
            name: name.clone(),
            num_partitions: t.num_partitions,
            replication_factor: t.replication_factor,
            assignment,
            configs,
        });
    }
    let validate_only = req.validate_only;
    for (i, plan) in checking.into_iter().zip(broker.controller.plan_topics(to_plan)) {
        let plan = plan.and_then(|plan| {
            budget.claim(plan.num_partitions)?;
            Ok(plan)
        });
        let out = &mut answers[i].1;
        match plan {
            Ok(plan) if validate_only => {
                *out = Some(Ok((plan.num_partitions, plan.replication_factor, plan.configs, None)))
            }
            Ok(plan) => {
                planned.push(i);
                to_create.push(plan);
            }
            Err(e) => *out = Some(Err(e)),
        }
    }
    let shapes: Vec<(i32, i16)> = to_create.iter().map(|p| (p.num_partitions, p.replication_factor)).collect();
    for ((i, (np, rf)), result) in planned.into_iter().zip(shapes).zip(broker.controller.create_topics(to_create)) {
        answers[i].1 = Some(result.map(|info| (np, rf, info.configs.clone(), Some(info.id))));
    }
    for (mut out, answer) in answers {
        match answer {
            // Kafka reports the created topic's configs only to who may describe them.
            Some(Ok((np, rf, _, id)))
                if !ctx.authorized(Operation::DescribeConfigs, ResourceType::Topic, out.name.0.as_str()) =>
            {
                out.num_partitions = np;
                out.replication_factor = rf;
                out.topic_id = id.unwrap_or_default();
                out.topic_config_error_code = ErrorCode::TopicAuthorizationFailed.code();
                out.configs = None;
            }
            Some(Ok((np, rf, configs, id))) => {
                out.num_partitions = np;
                out.replication_factor = rf;
                out.topic_id = id.unwrap_or_default();
                out.configs = Some(
                    topic_config_entries(broker, &configs)
                        .into_iter()
                        .map(|e: ConfigEntry| {
                            let mut c = CreatableTopicConfigs::default();
                            c.name = StrBytes::from_static_str(e.name);
                            c.value = Some(StrBytes::from_string(e.value));
                            c.config_source = e.source;
                            c
                        })
                        .collect(),
                );
            }
            Some(Err(e)) => {
                out.error_code = e.code;
                out.error_message = Some(StrBytes::from_string(e.message));
            }
            None => out.error_code = ErrorCode::UnknownServerError.code(),
        }
        r.topics.push(out);
    }
    r
}

/// Deletes on the blocking pool (a topic's logs and znodes go with it: thousands of files
/// for a large topic, which on an async worker stalled every connection queued behind it),
/// then waits on the runtime for the deletions to be seen. `Err`: the deletion task failed.
pub async fn delete_topics(ctx: &RequestContext, req: DeleteTopicsRequest) -> Result<DeleteTopicsResponse, String> {
    let timeout_ms = req.timeout_ms;
    let mut r = super::off_runtime(ctx, move |c| delete_topics_now(c, req)).await?;
    wait_for_deletions(&ctx.components, &mut r, timeout_ms).await;
    Ok(r)
}

fn delete_topics_now(ctx: &RequestContext, req: DeleteTopicsRequest) -> DeleteTopicsResponse {
    let broker = &ctx.components;
    // v0-5 name topics in `topic_names`; v6 in `topics`, by name or by id.
    let mut targets: Vec<(Option<String>, uuid::Uuid)> =
        req.topic_names.iter().map(|n| (Some(n.0.to_string()), uuid::Uuid::nil())).collect();
    targets.extend(req.topics.iter().map(|t| (t.name.as_ref().map(|n| n.0.to_string()), t.topic_id)));
    let mut r = DeleteTopicsResponse::default();
    for (name, id) in targets {
        let mut out = DeletableTopicResult::default();
        out.topic_id = id;
        out.name = name.clone().map(|n| TopicName(StrBytes::from_string(n)));
        let by_id = name.is_none();
        let resolved =
            match name {
                Some(n) => Ok(n),
                None => broker.cache.snapshot().topic_by_id(id).map(|t| t.name.clone()).ok_or_else(|| {
                    ApiError::new(ErrorCode::UnknownTopicId, "This server does not host this topic ID.")
                }),
            };
        // A topic named by id that the principal may not describe stays unknown to it.
        let resolved = resolved.and_then(|n| {
            if by_id && !ctx.authorized(Operation::Describe, ResourceType::Topic, &n) {
                Err(ApiError::new(ErrorCode::UnknownTopicId, "This server does not host this topic ID."))
            } else if !ctx.authorized(Operation::Delete, ResourceType::Topic, &n) {
                Err(refused("DELETE on the topic"))
            } else {
                Ok(n)
            }
        });
        match broker
            .controller
            .check_controller()
            .and(resolved)
            .and_then(|n| broker.controller.delete_topic(&n).map(|id| (n, id)))
        {
            Ok((n, id)) => {
                out.name = Some(TopicName(StrBytes::from_string(n)));
                out.topic_id = id;
            }
            Err(e) => {
                out.error_code = e.code;
                out.error_message = Some(StrBytes::from_string(e.message));
            }
        }
        r.responses.push(out);
    }
    r
}

async fn wait_for_deletions(broker: &crate::api::Components, r: &mut DeleteTopicsResponse, timeout_ms: i32) {
    // In ZooKeeper mode the controller deletes on its next pass; answer once this broker's
    // image no longer has the topic (or at the request's timeout, with REQUEST_TIMED_OUT, as
    // Kafka does). The image, not the replicas: a broker holding none of the topic's replicas
    // sees no change of its own.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_millis(timeout_ms.max(0) as u64);
    for out in r.responses.iter_mut().filter(|o| o.error_code == 0) {
        let Some(name) = out.name.as_ref().map(|n| n.0.to_string()) else { continue };
        loop {
            let changed = broker.cache.changed();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if broker.cache.topic(&name).is_none() {
                break;
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                if broker.cache.topic(&name).is_some() {
                    out.error_code = ErrorCode::RequestTimedOut.code();
                }
                break;
            }
        }
    }
}

/// What is left of `gregor.max.partitions.per.request` for the rest of one request, so many
/// topics of allowed size cannot together ask for an unbounded number of partitions.
struct PartitionBudget {
    max: i64,
    left: i64,
}

impl PartitionBudget {
    fn new(config: &crate::config::BrokerConfig) -> PartitionBudget {
        PartitionBudget { max: config.max_partitions_per_request, left: config.max_partitions_per_request }
    }

    fn claim(&mut self, partitions: i32) -> Result<(), ApiError> {
        if i64::from(partitions) > self.left {
            return Err(ApiError::new(
                ErrorCode::InvalidPartitions,
                format!("This request asks for more than gregor.max.partitions.per.request ({}) partitions.", self.max),
            ));
        }
        self.left -= i64::from(partitions.max(0));
        Ok(())
    }
}

pub fn create_partitions(ctx: &RequestContext, req: CreatePartitionsRequest) -> CreatePartitionsResponse {
    let mut r = CreatePartitionsResponse::default();
    // Counted by the total asked for, an upper bound of what each topic adds.
    let mut budget = PartitionBudget::new(&ctx.components.config);
    for t in req.topics {
        let mut out = CreatePartitionsTopicResult::default();
        let name = t.name.0.to_string();
        let manual: Option<Vec<Vec<i32>>> =
            t.assignments.as_ref().map(|a| a.iter().map(|x| x.broker_ids.iter().map(|b| b.0).collect()).collect());
        let allowed = match ctx.authorized(Operation::Alter, ResourceType::Topic, &name) {
            true => Ok(()),
            false => Err(refused("ALTER on the topic")),
        };
        let result = allowed
            .and_then(|_| ctx.components.controller.check_partition_bound(t.count))
            .and_then(|_| budget.claim(t.count))
            .and_then(|_| {
                ctx.components.controller.check_controller().and_then(|_| {
                    ctx.components.controller.create_partitions(&name, t.count, manual, req.validate_only)
                })
            });
        if let Err(e) = result {
            out.error_code = e.code;
            out.error_message = Some(StrBytes::from_string(e.message));
        }
        out.name = t.name;
        r.results.push(out);
    }
    r
}

pub fn delete_records(ctx: &RequestContext, req: DeleteRecordsRequest) -> DeleteRecordsResponse {
    let mut r = DeleteRecordsResponse::default();
    for t in req.topics {
        let name = t.name.0.to_string();
        let may_delete = ctx.authorized(Operation::Delete, ResourceType::Topic, &name);
        let mut tr = DeleteRecordsTopicResult::default();
        for p in t.partitions {
            let mut pr = DeleteRecordsPartitionResult::default();
            pr.partition_index = p.partition_index;
            pr.low_watermark = -1;
            if !may_delete {
                pr.error_code = ErrorCode::TopicAuthorizationFailed.code();
                tr.partitions.push(pr);
                continue;
            }
            match ctx.components.replicas.partition(&name, p.partition_index) {
                None => pr.error_code = super::not_led_error(&ctx.components, &name, p.partition_index),
                Some(part) => {
                    let hw = part.high_watermark();
                    // -1 means "up to the high watermark", as Kafka defines it.
                    let target = if p.offset == -1 { hw } else { p.offset };
                    if target < 0 || target > hw {
                        pr.error_code = ErrorCode::OffsetOutOfRange.code();
                    } else {
                        match part.delete_records_before(target) {
                            Ok(low) => pr.low_watermark = low,
                            Err(e) => pr.error_code = e.kafka_code(),
                        }
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
