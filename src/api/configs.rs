//! DescribeConfigs, AlterConfigs and IncrementalAlterConfigs for topics and for the broker's
//! dynamic configs (this broker's `/config/brokers/<id>`, or the cluster-wide `<default>`);
//! client-metrics subscriptions are handed to `telemetry`.

use std::collections::BTreeMap;

use kafka_protocol::messages::describe_configs_response::{DescribeConfigsResourceResult, DescribeConfigsResult};
use kafka_protocol::messages::incremental_alter_configs_response::AlterConfigsResourceResponse;
use kafka_protocol::messages::{
    AlterConfigsRequest, AlterConfigsResponse, DescribeConfigsRequest, DescribeConfigsResponse,
    IncrementalAlterConfigsRequest, IncrementalAlterConfigsResponse,
};
use kafka_protocol::protocol::StrBytes;

use super::RequestContext;
use crate::api::Components;
use crate::config::{is_dynamic_broker_config, is_dynamic_in_kafka_only, is_per_broker_only, TOPIC_CONFIGS};
use crate::dynamic_config::{DynamicValues, DEFAULT_ENTITY};
use crate::protocol::{ApiError, ErrorCode};
use crate::security::authorizer::{Operation, ResourceType};

const RESOURCE_TOPIC: i8 = 2;
const RESOURCE_BROKER: i8 = 4;
/// Kafka 4.x's GROUP config resource (KIP-848/KIP-932 group configs).
const RESOURCE_GROUP: i8 = 32;
use super::telemetry::RESOURCE_CLIENT_METRICS;
/// DescribeConfigs config sources (Kafka's `ConfigSource`).
const SOURCE_TOPIC: i8 = 1;
const SOURCE_DYNAMIC_DEFAULT_BROKER: i8 = crate::dynamic_config::SOURCE_DYNAMIC_DEFAULT_BROKER;
const SOURCE_DEFAULT: i8 = 5;

const OP_SET: i8 = 0;
const OP_DELETE: i8 = 1;
const OP_APPEND: i8 = 2;
const OP_SUBTRACT: i8 = 3;

pub struct ConfigEntry {
    pub name: &'static str,
    pub value: String,
    pub source: i8,
    /// (name, value, source) of every value that applies, highest precedence first.
    pub synonyms: Vec<(String, String, i8)>,
}

/// Every topic-level key with its effective value and where that value comes from: the
/// topic's override, else the broker key it defaults to, at that key's own source (dynamic,
/// static or default), as Kafka reports them.
pub fn topic_config_entries(broker: &Components, overrides: &BTreeMap<String, String>) -> Vec<ConfigEntry> {
    let effective = broker.effective_config();
    let dynamic = broker.dynamic.values();
    TOPIC_CONFIGS
        .iter()
        .map(|&(name, broker_key)| {
            let mut synonyms: Vec<(String, String, i8)> = dynamic
                .sources(&broker.config, broker_key)
                .into_iter()
                .map(|(v, source)| (broker_key.to_string(), v, source))
                .collect();
            let default_source = synonyms.first().map(|s| s.2).unwrap_or(SOURCE_DEFAULT);
            match overrides.get(name) {
                Some(v) => {
                    synonyms.insert(0, (name.to_string(), v.clone(), SOURCE_TOPIC));
                    ConfigEntry { name, value: v.clone(), source: SOURCE_TOPIC, synonyms }
                }
                None => ConfigEntry {
                    name,
                    value: effective.topic_default(name).unwrap_or_default(),
                    source: default_source,
                    synonyms,
                },
            }
        })
        .collect()
}

/// Kafka's `ConfigType` for DescribeConfigs v3+.
fn config_type(name: &str) -> i8 {
    if is_sensitive(name) {
        return 9;
    }
    match name {
        "unclean.leader.election.enable"
        | "preallocate"
        | "message.downconversion.enable"
        | "remote.storage.enable"
        | "remote.log.copy.disable"
        | "remote.log.delete.on.disable" => 1,
        "compression.type" | "message.timestamp.type" | "message.format.version" => 2,
        "cleanup.policy" | "leader.replication.throttled.replicas" | "follower.replication.throttled.replicas" => 7,
        "min.cleanable.dirty.ratio" => 6,
        "index.interval.bytes"
        | "max.message.bytes"
        | "min.insync.replicas"
        | "segment.bytes"
        | "segment.index.bytes"
        | "compression.gzip.level"
        | "compression.lz4.level"
        | "compression.zstd.level" => 3,
        _ => 5,
    }
}

/// Keys whose values are secrets (Kafka's PASSWORD-typed configs): described with a null
/// value and `is_sensitive`, as Kafka describes them, never in clear to whoever asks.
pub fn is_sensitive(name: &str) -> bool {
    name.contains("password")
        || name.ends_with("sasl.jaas.config")
        || name.ends_with(".secret")
        || name.ends_with("secret.key")
        || name.ends_with("master.key")
        || name.ends_with("ssl.keystore.key")
        || name.ends_with("ssl.keystore.certificate.chain")
        || name.ends_with("ssl.truststore.certificates")
}

fn entry(name: &str, value: String, source: i8) -> DescribeConfigsResourceResult {
    let mut e = DescribeConfigsResourceResult::default();
    e.name = StrBytes::from_string(name.to_string());
    e.is_sensitive = is_sensitive(name);
    e.value = (!e.is_sensitive).then(|| StrBytes::from_string(value));
    e.config_source = source;
    e.config_type = config_type(name);
    e
}

fn with_synonyms(
    mut e: DescribeConfigsResourceResult,
    synonyms: Vec<(String, String, i8)>,
    include: bool,
) -> DescribeConfigsResourceResult {
    use kafka_protocol::messages::describe_configs_response::DescribeConfigsSynonym;
    if include {
        e.synonyms = synonyms
            .into_iter()
            .map(|(name, value, source)| {
                let mut s = DescribeConfigsSynonym::default();
                s.value = (!is_sensitive(&name)).then(|| StrBytes::from_string(value));
                s.name = StrBytes::from_string(name);
                s.source = source;
                s
            })
            .collect();
    }
    e
}

/// This broker's configs: each key's effective value at its source; only the dynamically
/// updatable keys are writable (`broker.id` and the rest are read-only).
fn broker_entries(
    broker: &Components,
    dynamic: &DynamicValues,
    include_synonyms: bool,
) -> Vec<DescribeConfigsResourceResult> {
    let effective = broker.effective_config();
    effective
        .values
        .iter()
        .map(|(k, v)| {
            let synonyms: Vec<(String, String, i8)> =
                dynamic.sources(&broker.config, k).into_iter().map(|(val, s)| (k.clone(), val, s)).collect();
            let source = synonyms.first().map(|s| s.2).unwrap_or(SOURCE_DEFAULT);
            let mut e = entry(k, v.clone(), source);
            e.read_only = !is_dynamic_broker_config(k);
            with_synonyms(e, synonyms, include_synonyms)
        })
        .collect()
}

/// Kafka's check for a config resource: `op` on the topic, or on the cluster for a broker or
/// broker logger, each refused with its own error.
fn config_access(ctx: &RequestContext, resource_type: i8, name: &str, op: Operation) -> Result<(), ApiError> {
    const RESOURCE_BROKER_LOGGER: i8 = 8;
    match resource_type {
        RESOURCE_TOPIC if !ctx.authorized(op, ResourceType::Topic, name) => {
            Err(ApiError::new(ErrorCode::TopicAuthorizationFailed, "Topic authorization failed."))
        }
        RESOURCE_GROUP if !ctx.authorized(op, ResourceType::Group, name) => {
            Err(ApiError::new(ErrorCode::GroupAuthorizationFailed, "Group authorization failed."))
        }
        RESOURCE_BROKER | RESOURCE_BROKER_LOGGER | RESOURCE_CLIENT_METRICS if !ctx.authorized_cluster(op) => {
            Err(ApiError::new(ErrorCode::ClusterAuthorizationFailed, "Cluster authorization failed."))
        }
        _ => Ok(()),
    }
}

pub fn describe_configs(ctx: &RequestContext, req: DescribeConfigsRequest) -> DescribeConfigsResponse {
    let broker = &ctx.components;
    let mut r = DescribeConfigsResponse::default();
    for res in req.resources {
        let mut out = DescribeConfigsResult::default();
        out.resource_type = res.resource_type;
        out.resource_name = res.resource_name.clone();
        let wanted =
            |name: &str| res.configuration_keys.as_ref().is_none_or(|keys| keys.iter().any(|k| k.as_str() == name));
        if let Err(e) = config_access(ctx, res.resource_type, res.resource_name.as_str(), Operation::DescribeConfigs) {
            out.error_code = e.code;
            out.error_message = Some(StrBytes::from_string(e.message));
            r.results.push(out);
            continue;
        }
        match res.resource_type {
            RESOURCE_TOPIC => match broker.cache.topic(res.resource_name.as_str()) {
                Some(t) => {
                    out.configs = topic_config_entries(broker, &t.configs)
                        .into_iter()
                        .filter(|e| wanted(e.name))
                        .map(|e| with_synonyms(entry(e.name, e.value, e.source), e.synonyms, req.include_synonyms))
                        .collect();
                }
                None => {
                    out.error_code = ErrorCode::UnknownTopicOrPartition.code();
                    out.error_message = Some(StrBytes::from_static_str("Topic does not exist"));
                }
            },
            // The cluster-wide entity lists only what is set in it, as Kafka's does.
            RESOURCE_BROKER if res.resource_name.is_empty() => {
                out.configs = broker
                    .dynamic
                    .values()
                    .cluster
                    .into_iter()
                    .filter(|(k, _)| wanted(k))
                    .map(|(k, v)| {
                        let mut e = entry(&k, v.clone(), SOURCE_DYNAMIC_DEFAULT_BROKER);
                        e.read_only = !is_dynamic_broker_config(&k);
                        with_synonyms(e, vec![(k, v, SOURCE_DYNAMIC_DEFAULT_BROKER)], req.include_synonyms)
                    })
                    .collect();
            }
            RESOURCE_BROKER if res.resource_name.as_str() == broker.config.broker_id.to_string() => {
                let dynamic = broker.dynamic.values();
                out.configs = broker_entries(broker, &dynamic, req.include_synonyms)
                    .into_iter()
                    .filter(|e| wanted(e.name.as_str()))
                    .collect();
            }
            RESOURCE_GROUP => match group_entries(ctx, res.resource_name.as_str(), req.include_synonyms) {
                Ok(entries) => out.configs = entries.into_iter().filter(|e| wanted(e.name.as_str())).collect(),
                Err(e) => {
                    out.error_code = e.code;
                    out.error_message = Some(StrBytes::from_string(e.message));
                }
            },
            RESOURCE_CLIENT_METRICS => {
                match super::telemetry::describe_client_metrics(ctx, res.resource_name.as_str(), wanted) {
                    Ok(configs) => out.configs = configs,
                    Err(e) => {
                        out.error_code = e.code;
                        out.error_message = Some(StrBytes::from_string(e.message));
                    }
                }
            }
            _ => {
                out.error_code = ErrorCode::InvalidRequest.code();
                out.error_message = Some(StrBytes::from_static_str("Unsupported resource"));
            }
        }
        r.results.push(out);
    }
    r
}

fn alter_topic(
    ctx: &RequestContext,
    name: &str,
    ops: &[(String, i8, Option<String>)],
    validate_only: bool,
) -> Result<(), ApiError> {
    let broker = &ctx.components;
    let topic = broker
        .cache
        .topic(name)
        .ok_or_else(|| ApiError::new(ErrorCode::UnknownTopicOrPartition, format!("Topic {name} does not exist")))?;
    let mut configs = topic.configs.clone();
    for (key, op, value) in ops {
        let current =
            configs.get(key).cloned().or_else(|| broker.effective_config().topic_default(key)).unwrap_or_default();
        let list =
            |s: &str| s.split(',').map(str::trim).filter(|x| !x.is_empty()).map(str::to_string).collect::<Vec<_>>();
        match *op {
            OP_SET => {
                let v = value
                    .clone()
                    .ok_or_else(|| ApiError::new(ErrorCode::InvalidRequest, format!("Null value for {key}")))?;
                configs.insert(key.clone(), v);
            }
            OP_DELETE => {
                configs.remove(key);
            }
            OP_APPEND | OP_SUBTRACT if config_type(key) == 7 => {
                let items = list_op(list(&current), list(value.as_deref().unwrap_or("")), *op == OP_APPEND);
                configs.insert(key.clone(), items);
            }
            _ => {
                return Err(ApiError::new(ErrorCode::InvalidConfig, format!("Operation {op} is not valid for {key}")));
            }
        }
        if let Some(v) = configs.get(key) {
            broker
                .config
                .validate_topic_config(key, v)
                .map_err(|e| ApiError::new(ErrorCode::InvalidConfig, e.to_string()))?;
        }
    }
    broker.config.log_config_for(&configs).map_err(|e| ApiError::new(ErrorCode::InvalidConfig, e.to_string()))?;
    if validate_only {
        return Ok(());
    }
    broker.controller.set_topic_configs(name, configs)
}

pub fn incremental_alter_configs(
    ctx: &RequestContext,
    req: IncrementalAlterConfigsRequest,
) -> IncrementalAlterConfigsResponse {
    let mut r = IncrementalAlterConfigsResponse::default();
    for res in req.resources {
        let mut out = AlterConfigsResourceResponse::default();
        out.resource_type = res.resource_type;
        out.resource_name = res.resource_name.clone();
        let ops: Vec<(String, i8, Option<String>)> = res
            .configs
            .iter()
            .map(|c| (c.name.to_string(), c.config_operation, c.value.as_ref().map(|v| v.to_string())))
            .collect();
        let allowed = config_access(ctx, res.resource_type, res.resource_name.as_str(), Operation::AlterConfigs);
        let result = allowed.and_then(|()| match res.resource_type {
            RESOURCE_TOPIC => alter_topic(ctx, res.resource_name.as_str(), &ops, req.validate_only),
            RESOURCE_BROKER => alter_broker(ctx, res.resource_name.as_str(), &ops, req.validate_only),
            RESOURCE_GROUP => alter_group(ctx, res.resource_name.as_str(), &ops, req.validate_only),
            RESOURCE_CLIENT_METRICS => {
                super::telemetry::alter_client_metrics(ctx, res.resource_name.as_str(), &ops, req.validate_only)
            }
            _ => Err(ApiError::new(
                ErrorCode::InvalidRequest,
                "Only topic, broker, group and client-metrics configs can be altered",
            )),
        });
        if let Err(e) = result {
            out.error_code = e.code;
            out.error_message = Some(StrBytes::from_string(e.message));
        }
        r.responses.push(out);
    }
    r
}

/// The dynamic entity a BROKER resource names: "" is the cluster-wide `<default>`, otherwise
/// it must be this broker's id (each broker stores its own, as Kafka's does).
fn broker_entity(broker: &Components, name: &str) -> Result<String, ApiError> {
    if name.is_empty() {
        return Ok(DEFAULT_ENTITY.to_string());
    }
    let me = broker.config.broker_id;
    if name != me.to_string() {
        return Err(ApiError::new(
            ErrorCode::InvalidRequest,
            format!("Unexpected broker id, expected {me} or empty string, but received {name}"),
        ));
    }
    Ok(name.to_string())
}

/// Validates and stores a broker entity's new dynamic configs.
fn store_broker_entity(
    ctx: &RequestContext,
    entity: &str,
    configs: BTreeMap<String, String>,
    validate_only: bool,
) -> Result<(), ApiError> {
    let broker = &ctx.components;
    // Kafka's broker-config refusals are ConfigExceptions, answered INVALID_REQUEST with the
    // resource named (ZkAdminManager).
    let what = if entity == DEFAULT_ENTITY {
        "the cluster default broker configs".to_string()
    } else {
        format!("broker {entity}")
    };
    let invalid = |m: String| ApiError::new(ErrorCode::InvalidRequest, format!("Invalid config value for {what}: {m}"));
    let not_live: Vec<&str> = configs.keys().map(String::as_str).filter(|k| is_dynamic_in_kafka_only(k)).collect();
    if !not_live.is_empty() {
        return Err(invalid(format!("gregor cannot apply these configs without a restart: {not_live:?}")));
    }
    let fixed: Vec<&str> = configs.keys().map(String::as_str).filter(|k| !is_dynamic_broker_config(k)).collect();
    if !fixed.is_empty() {
        return Err(invalid(format!("Cannot update these configs dynamically: {fixed:?}")));
    }
    if entity == DEFAULT_ENTITY {
        let own: Vec<&str> = configs.keys().map(String::as_str).filter(|k| is_per_broker_only(k)).collect();
        if !own.is_empty() {
            return Err(invalid(format!(
                "Cannot update these configs at default cluster level, broker id must be specified: {own:?}"
            )));
        }
    }
    // Kafka (ZooKeeper mode) stores a password config only encrypted with
    // `password.encoder.secret`; gregor has no such encoder, so it answers as Kafka does
    // without one rather than keep a secret in clear in ZooKeeper.
    if configs.keys().any(|k| is_sensitive(k)) {
        return Err(invalid("Password encoder secret not configured".to_string()));
    }
    // Checked on its own (another entity may hide a bad value here) and merged with what
    // the other entity holds now, which is what will be in force.
    broker.config.with_dynamic(&configs).map_err(|e| invalid(e.to_string()))?;
    let mut values = broker.dynamic.values();
    if entity == DEFAULT_ENTITY {
        values.cluster = configs.clone();
    } else {
        values.broker = configs.clone();
    }
    let mut merged = values.cluster.clone();
    merged.extend(values.broker);
    let next = broker.config.with_dynamic(&merged).map_err(|e| invalid(e.to_string()))?;
    let current = broker.effective_config();
    // Kafka's LogCleaner.validateReconfiguration: the thread count moves by at most a factor of two.
    let (now, then) = (current.cleaner.threads, next.cleaner.threads);
    if then < now / 2 || then > now * 2 {
        return Err(invalid(format!(
            "log.cleaner.threads can change from {now} to between half and double that, not {then}"
        )));
    }
    thread_count_change("num.io.threads", current.num_io_threads, next.num_io_threads).map_err(invalid)?;
    if validate_only {
        return Ok(());
    }
    broker.dynamic.store(entity, &configs).map_err(ApiError::from)
}

/// Kafka's DynamicThreadPool.validateReconfiguration, with its messages: a pool's thread count
/// may change to between half and double the one in force.
fn thread_count_change(key: &str, now: usize, then: usize) -> Result<(), String> {
    if then == now {
        return Ok(());
    }
    let failed = format!("Dynamic thread count update validation failed for {key}={then}");
    if then == 0 {
        return Err(format!("{failed}, value should be at least 1"));
    }
    if then < now / 2 {
        return Err(format!("{failed}, value should be at least half the current value {now}"));
    }
    if then > now.saturating_mul(2) {
        return Err(format!("{failed}, value should not be greater than double the current value {now}"));
    }
    Ok(())
}

fn current_broker_entity(ctx: &RequestContext, entity: &str) -> Result<BTreeMap<String, String>, ApiError> {
    let data = ctx.components.store.try_get(&crate::dynamic_config::entity_path(entity))?;
    Ok(data.map(|d| crate::metadata::zk_data::parse_topic_config(&d)).unwrap_or_default())
}

fn alter_broker(
    ctx: &RequestContext,
    name: &str,
    ops: &[(String, i8, Option<String>)],
    validate_only: bool,
) -> Result<(), ApiError> {
    let entity = broker_entity(&ctx.components, name)?;
    let mut configs = current_broker_entity(ctx, &entity)?;
    for (key, op, value) in ops {
        match (*op, value) {
            (OP_SET, Some(v)) => {
                configs.insert(key.clone(), v.clone());
            }
            (OP_DELETE, _) => {
                configs.remove(key);
            }
            (OP_SET, None) => {
                return Err(ApiError::new(ErrorCode::InvalidRequest, format!("Null value for {key}")));
            }
            _ => {
                return Err(ApiError::new(ErrorCode::InvalidConfig, format!("Operation {op} is not valid for {key}")));
            }
        }
    }
    store_broker_entity(ctx, &entity, configs, validate_only)
}

/// AlterConfigs (the pre-incremental API): the resource's overrides become exactly the
/// entries given, as Kafka's `ConfigAdminManager` sets them; entries with a null value are
/// left out, so they fall back to the default.
fn replace_topic_configs(
    ctx: &RequestContext,
    name: &str,
    entries: &[(String, Option<String>)],
    validate_only: bool,
) -> Result<(), ApiError> {
    let broker = &ctx.components;
    if broker.cache.topic(name).is_none() {
        return Err(ApiError::new(ErrorCode::UnknownTopicOrPartition, format!("Topic {name} does not exist")));
    }
    let mut configs = BTreeMap::new();
    for (key, value) in entries {
        let Some(v) = value else { continue };
        broker
            .config
            .validate_topic_config(key, v)
            .map_err(|e| ApiError::new(ErrorCode::InvalidConfig, e.to_string()))?;
        configs.insert(key.clone(), v.clone());
    }
    if validate_only {
        return Ok(());
    }
    broker.controller.set_topic_configs(name, configs)
}

pub fn alter_configs(ctx: &RequestContext, req: AlterConfigsRequest) -> AlterConfigsResponse {
    use kafka_protocol::messages::alter_configs_response::AlterConfigsResourceResponse;
    let mut r = AlterConfigsResponse::default();
    for res in req.resources {
        let mut out = AlterConfigsResourceResponse::default();
        out.resource_type = res.resource_type;
        out.resource_name = res.resource_name.clone();
        let entries: Vec<(String, Option<String>)> =
            res.configs.iter().map(|c| (c.name.to_string(), c.value.as_ref().map(|v| v.to_string()))).collect();
        let allowed = config_access(ctx, res.resource_type, res.resource_name.as_str(), Operation::AlterConfigs);
        let result = allowed.and_then(|()| match res.resource_type {
            RESOURCE_TOPIC => replace_topic_configs(ctx, res.resource_name.as_str(), &entries, req.validate_only),
            RESOURCE_BROKER => broker_entity(&ctx.components, res.resource_name.as_str()).and_then(|entity| {
                let configs = entries.iter().filter_map(|(k, v)| Some((k.clone(), v.clone()?))).collect();
                store_broker_entity(ctx, &entity, configs, req.validate_only)
            }),
            RESOURCE_GROUP => {
                let configs = entries.iter().filter_map(|(k, v)| Some((k.clone(), v.clone()?))).collect();
                store_group(ctx, res.resource_name.as_str(), configs, req.validate_only)
            }
            RESOURCE_CLIENT_METRICS => {
                super::telemetry::replace_client_metrics(ctx, res.resource_name.as_str(), &entries, req.validate_only)
            }
            _ => Err(ApiError::new(
                ErrorCode::InvalidRequest,
                "Only topic, broker, group and client-metrics configs can be altered",
            )),
        });
        if let Err(e) = result {
            out.error_code = e.code;
            out.error_message = Some(StrBytes::from_string(e.message));
        }
        r.responses.push(out);
    }
    r
}

/// IncrementalAlterConfigs' APPEND (each value not already there, at the end) or SUBTRACT
/// (every occurrence removed) on a list-typed config, as Kafka applies them.
pub(super) fn list_op(mut items: Vec<String>, values: Vec<String>, append: bool) -> String {
    for v in values {
        if append && !items.contains(&v) {
            items.push(v);
        } else if !append {
            items.retain(|x| *x != v);
        }
    }
    items.join(",")
}

/// Kafka's source for a group's own override (`ConfigSource.GROUP_CONFIG`).
const SOURCE_GROUP: i8 = 8;

fn group_name(name: &str) -> Result<&str, ApiError> {
    match name {
        "" => Err(ApiError::new(ErrorCode::InvalidRequest, "Default group resources are not allowed.")),
        n => Ok(n),
    }
}

/// A group's configs: each name's value in force, the group's own at GROUP_CONFIG, else the
/// default (with the broker key it comes from as a synonym).
fn group_entries(
    ctx: &RequestContext,
    name: &str,
    include_synonyms: bool,
) -> Result<Vec<DescribeConfigsResourceResult>, ApiError> {
    let group = group_name(name)?;
    let configs = &ctx.components.group_configs;
    Ok(configs
        .entries(group)
        .into_iter()
        .map(|(key, value, own, default)| {
            let source = if own { SOURCE_GROUP } else { SOURCE_DEFAULT };
            let mut synonyms = vec![(key.to_string(), value.clone(), source)];
            let broker_key = crate::group::configs::NAMES.iter().find(|(n, _)| *n == key).and_then(|(_, b)| *b);
            if let (true, Some(b)) = (own, broker_key) {
                synonyms.push((b.to_string(), default, SOURCE_DEFAULT));
            }
            let mut e = with_synonyms(entry(key, value, source), synonyms, include_synonyms);
            e.config_type = if key.ends_with(".ms") { 3 } else { 2 };
            e
        })
        .collect())
}

/// IncrementalAlterConfigs on a group: SET and DELETE only (no group config is a list), the
/// result checked whole as Kafka's `GroupConfig.validate` does.
fn alter_group(
    ctx: &RequestContext,
    name: &str,
    ops: &[(String, i8, Option<String>)],
    validate_only: bool,
) -> Result<(), ApiError> {
    let group = group_name(name)?;
    let configs = &ctx.components.group_configs;
    configs.update(group, validate_only, |mut current| {
        for (key, op, value) in ops {
            match (*op, value) {
                (OP_SET, Some(v)) => {
                    current.insert(key.clone(), v.clone());
                }
                (OP_DELETE, _) => {
                    current.remove(key);
                }
                (OP_SET, None) => {
                    return Err(ApiError::new(ErrorCode::InvalidRequest, format!("Null value for {key}")));
                }
                _ => {
                    return Err(ApiError::new(
                        ErrorCode::InvalidConfig,
                        format!("Operation {op} is not valid for {key}: it is not a list"),
                    ));
                }
            }
        }
        configs.validate(&current).map_err(|m| ApiError::new(ErrorCode::InvalidConfig, m))?;
        Ok(current)
    })
}

/// AlterConfigs on a group: its overrides become exactly `configs`.
fn store_group(
    ctx: &RequestContext,
    name: &str,
    configs: BTreeMap<String, String>,
    validate_only: bool,
) -> Result<(), ApiError> {
    let group = group_name(name)?;
    let group_configs = &ctx.components.group_configs;
    group_configs.validate(&configs).map_err(|m| ApiError::new(ErrorCode::InvalidConfig, m))?;
    group_configs.update(group, validate_only, |_| Ok::<_, ApiError>(configs.clone()))
}
