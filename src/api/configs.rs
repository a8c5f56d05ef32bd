//! DescribeConfigs, AlterConfigs and IncrementalAlterConfigs for topics (and DescribeConfigs
//! for the broker).

use std::collections::BTreeMap;

use kafka_protocol::messages::describe_configs_response::{DescribeConfigsResourceResult, DescribeConfigsResult};
use kafka_protocol::messages::incremental_alter_configs_response::AlterConfigsResourceResponse;
use kafka_protocol::messages::{
    AlterConfigsRequest, AlterConfigsResponse, DescribeConfigsRequest, DescribeConfigsResponse,
    IncrementalAlterConfigsRequest, IncrementalAlterConfigsResponse,
};
use kafka_protocol::protocol::StrBytes;

use super::error::{ApiError, ErrorCode};
use super::RequestContext;
use crate::config::{BrokerConfig, TOPIC_CONFIGS};

const RESOURCE_TOPIC: i8 = 2;
const RESOURCE_BROKER: i8 = 4;
/// DescribeConfigs config sources (Kafka's `ConfigSource`).
const SOURCE_TOPIC: i8 = 1;
const SOURCE_STATIC_BROKER: i8 = 4;
const SOURCE_DEFAULT: i8 = 5;

const OP_SET: i8 = 0;
const OP_DELETE: i8 = 1;
const OP_APPEND: i8 = 2;
const OP_SUBTRACT: i8 = 3;

pub struct ConfigEntry {
    pub name: &'static str,
    pub value: String,
    pub source: i8,
}

/// Every topic-level key with its effective value and where that value comes from.
pub fn topic_config_entries(config: &BrokerConfig, overrides: &BTreeMap<String, String>) -> Vec<ConfigEntry> {
    TOPIC_CONFIGS
        .iter()
        .map(|&(name, _)| match overrides.get(name) {
            Some(v) => ConfigEntry { name, value: v.clone(), source: SOURCE_TOPIC },
            None => ConfigEntry { name, value: config.topic_default(name).unwrap_or_default(), source: SOURCE_DEFAULT },
        })
        .collect()
}

/// Kafka's `ConfigType` for DescribeConfigs v3+.
fn config_type(name: &str) -> i8 {
    if is_sensitive(name) {
        return 9;
    }
    match name {
        "unclean.leader.election.enable" | "message.downconversion.enable" => 1,
        "compression.type" | "message.timestamp.type" => 2,
        "cleanup.policy" => 7,
        "index.interval.bytes"
        | "max.message.bytes"
        | "min.insync.replicas"
        | "segment.bytes"
        | "segment.index.bytes" => 3,
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

pub fn describe_configs(ctx: &RequestContext, req: DescribeConfigsRequest) -> DescribeConfigsResponse {
    let broker = &ctx.broker;
    let mut r = DescribeConfigsResponse::default();
    for res in req.resources {
        let mut out = DescribeConfigsResult::default();
        out.resource_type = res.resource_type;
        out.resource_name = res.resource_name.clone();
        let wanted =
            |name: &str| res.configuration_keys.as_ref().is_none_or(|keys| keys.iter().any(|k| k.as_str() == name));
        match res.resource_type {
            RESOURCE_TOPIC => match broker.cache.topic(res.resource_name.as_str()) {
                Some(t) => {
                    out.configs = topic_config_entries(&broker.config, &t.configs)
                        .into_iter()
                        .filter(|e| wanted(e.name))
                        .map(|e| entry(e.name, e.value, e.source))
                        .collect();
                }
                None => {
                    out.error_code = ErrorCode::UnknownTopicOrPartition.code();
                    out.error_message = Some(StrBytes::from_static_str("Topic does not exist"));
                }
            },
            RESOURCE_BROKER
                if res.resource_name.is_empty()
                    || res.resource_name.as_str() == broker.config.broker_id.to_string() =>
            {
                out.configs = broker
                    .config
                    .values
                    .iter()
                    .filter(|(k, _)| wanted(k))
                    .map(|(k, v)| entry(k, v.clone(), SOURCE_STATIC_BROKER))
                    .collect();
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
    let broker = &ctx.broker;
    let topic = broker
        .cache
        .topic(name)
        .ok_or_else(|| ApiError::new(ErrorCode::UnknownTopicOrPartition, format!("Topic {name} does not exist")))?;
    let mut configs = topic.configs.clone();
    for (key, op, value) in ops {
        let current = configs.get(key).cloned().or_else(|| broker.config.topic_default(key)).unwrap_or_default();
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
                let mut items = list(&current);
                for v in list(value.as_deref().unwrap_or("")) {
                    if *op == OP_APPEND && !items.contains(&v) {
                        items.push(v);
                    } else if *op == OP_SUBTRACT {
                        items.retain(|x| *x != v);
                    }
                }
                configs.insert(key.clone(), items.join(","));
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
    if validate_only {
        return Ok(());
    }
    broker.set_topic_configs(name, configs)
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
        let result = match res.resource_type {
            RESOURCE_TOPIC => alter_topic(ctx, res.resource_name.as_str(), &ops, req.validate_only),
            _ => Err(ApiError::new(ErrorCode::InvalidRequest, "Only topic configs can be altered")),
        };
        if let Err(e) = result {
            out.error_code = e.code;
            out.error_message = Some(StrBytes::from_string(e.message));
        }
        r.responses.push(out);
    }
    r
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
    let broker = &ctx.broker;
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
    broker.set_topic_configs(name, configs)
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
        let result = match res.resource_type {
            RESOURCE_TOPIC => replace_topic_configs(ctx, res.resource_name.as_str(), &entries, req.validate_only),
            _ => Err(ApiError::new(ErrorCode::InvalidRequest, "Only topic configs can be altered")),
        };
        if let Err(e) = result {
            out.error_code = e.code;
            out.error_message = Some(StrBytes::from_string(e.message));
        }
        r.responses.push(out);
    }
    r
}
