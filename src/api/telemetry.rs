//! Client telemetry (KIP-714): GetTelemetrySubscriptions, PushTelemetry, ListConfigResources
//! (ListClientMetricsResources before Kafka 4.1), and the CLIENT_METRICS config resource that
//! DescribeConfigs, AlterConfigs and IncrementalAlterConfigs manage. The state is the
//! `client_metrics` component's; this file turns requests into its calls and back.

use std::collections::BTreeMap;

use kafka_protocol::messages::describe_configs_response::DescribeConfigsResourceResult;
use kafka_protocol::messages::list_config_resources_response::ConfigResource;
use kafka_protocol::messages::{
    GetTelemetrySubscriptionsRequest, GetTelemetrySubscriptionsResponse, ListConfigResourcesRequest,
    ListConfigResourcesResponse, PushTelemetryRequest, PushTelemetryResponse,
};
use kafka_protocol::protocol::StrBytes;

use super::RequestContext;
use crate::client_metrics::{subscription, ClientAttributes, Push, ACCEPTED_COMPRESSION_TYPES};
use crate::protocol::{ApiError, ErrorCode};
use crate::security::authorizer::Operation;

/// Kafka's `ConfigResource.Type` ids that ListConfigResources v1 knows.
pub const RESOURCE_TOPIC: i8 = 2;
pub const RESOURCE_BROKER: i8 = 4;
pub const RESOURCE_BROKER_LOGGER: i8 = 8;
pub const RESOURCE_CLIENT_METRICS: i8 = 16;
pub const RESOURCE_GROUP: i8 = 32;

/// DescribeConfigs' `ConfigSource` for a subscription's own value (Kafka's
/// CLIENT_METRICS_CONFIG) and for a key it leaves at its default.
const SOURCE_CLIENT_METRICS: i8 = 7;
const SOURCE_DEFAULT: i8 = 5;

const OP_SET: i8 = 0;
const OP_DELETE: i8 = 1;
const OP_APPEND: i8 = 2;
const OP_SUBTRACT: i8 = 3;

fn attributes(ctx: &RequestContext) -> ClientAttributes {
    let software = ctx.client.software();
    ClientAttributes {
        client_instance_id: String::new(),
        client_id: ctx.header.client_id.as_ref().map(|c| c.to_string()).unwrap_or_default(),
        software_name: software.as_ref().map(|s| s.0.clone()),
        software_version: software.map(|s| s.1),
        source_address: ctx.peer.trim_start_matches('/').to_string(),
        source_port: ctx.client.source_port,
    }
}

pub fn get_telemetry_subscriptions(
    ctx: &RequestContext,
    req: GetTelemetrySubscriptionsRequest,
) -> GetTelemetrySubscriptionsResponse {
    let mut r = GetTelemetrySubscriptionsResponse::default();
    match ctx.components.client_metrics.get_subscriptions(req.client_instance_id, attributes(ctx)) {
        Ok(s) => {
            r.client_instance_id = s.client_instance_id;
            r.subscription_id = s.subscription_id;
            r.accepted_compression_types = ACCEPTED_COMPRESSION_TYPES.to_vec();
            r.push_interval_ms = s.push_interval_ms;
            r.telemetry_max_bytes = s.telemetry_max_bytes;
            // Cumulative, not Kafka's delta: the points are served to Prometheus as they come.
            r.delta_temporality = false;
            r.requested_metrics = s.metrics.into_iter().map(StrBytes::from_string).collect();
        }
        Err(code) => r.error_code = code.code(),
    }
    r
}

pub fn push_telemetry(ctx: &RequestContext, req: PushTelemetryRequest) -> PushTelemetryResponse {
    let mut r = PushTelemetryResponse::default();
    let push = Push {
        client_instance_id: req.client_instance_id,
        subscription_id: req.subscription_id,
        terminating: req.terminating,
        compression_type: req.compression_type,
        metrics: &req.metrics,
    };
    if let Err(code) = ctx.components.client_metrics.push(push, attributes(ctx)) {
        tracing::debug!(error = ?code, client_instance_id = %req.client_instance_id, "push telemetry refused");
        r.error_code = code.code();
    }
    r
}

/// ListConfigResources: v0 (ListClientMetricsResources) lists the client-metrics
/// subscriptions; v1 any of the types Kafka 4.1 knows, all of them when none is named, and
/// UNSUPPORTED_VERSION for a type it does not.
pub fn list_config_resources(ctx: &RequestContext, req: ListConfigResourcesRequest) -> ListConfigResourcesResponse {
    let mut r = ListConfigResourcesResponse::default();
    if let Err(e) = ctx.require_cluster(Operation::DescribeConfigs) {
        r.error_code = e.code;
        return r;
    }
    let supported: &[i8] = if ctx.version() == 0 {
        &[RESOURCE_CLIENT_METRICS]
    } else {
        &[RESOURCE_TOPIC, RESOURCE_BROKER, RESOURCE_BROKER_LOGGER, RESOURCE_CLIENT_METRICS, RESOURCE_GROUP]
    };
    let types: Vec<i8> = if req.resource_types.is_empty() { supported.to_vec() } else { req.resource_types };
    if types.iter().any(|t| !supported.contains(t)) {
        r.error_code = ErrorCode::UnsupportedVersion.code();
        return r;
    }
    let resource = |name: String, resource_type: i8| {
        let mut c = ConfigResource::default();
        c.resource_name = StrBytes::from_string(name);
        c.resource_type = resource_type;
        c
    };
    // Groups have no configs here (Kafka's GROUP configs are KRaft-only): none to list.
    if types.contains(&RESOURCE_CLIENT_METRICS) {
        let names = ctx.components.client_metrics.names();
        r.config_resources.extend(names.into_iter().map(|n| resource(n, RESOURCE_CLIENT_METRICS)));
    }
    let me = ctx.components.config.broker_id;
    if types.contains(&RESOURCE_BROKER_LOGGER) {
        r.config_resources.push(resource(me.to_string(), RESOURCE_BROKER_LOGGER));
    }
    let snapshot = ctx.components.cache.snapshot();
    if types.contains(&RESOURCE_BROKER) {
        let mut ids: Vec<i32> = snapshot.brokers.iter().map(|b| b.id).collect();
        if ids.is_empty() {
            ids.push(me);
        }
        r.config_resources.extend(ids.into_iter().map(|id| resource(id.to_string(), RESOURCE_BROKER)));
    }
    if types.contains(&RESOURCE_TOPIC) {
        r.config_resources.extend(snapshot.topics.keys().map(|t| resource(t.clone(), RESOURCE_TOPIC)));
    }
    r
}

fn config_entry(name: &str, value: String, source: i8) -> DescribeConfigsResourceResult {
    let mut e = DescribeConfigsResourceResult::default();
    e.name = StrBytes::from_string(name.to_string());
    e.value = Some(StrBytes::from_string(value));
    e.config_source = source;
    e.config_type = subscription::config_type(name);
    e
}

/// A subscription's three keys: its own values, the defaults for the rest (an unknown
/// subscription is all defaults, as Kafka describes one).
pub fn describe_client_metrics(
    ctx: &RequestContext,
    name: &str,
    wanted: impl Fn(&str) -> bool,
) -> Result<Vec<DescribeConfigsResourceResult>, ApiError> {
    if name.is_empty() {
        return Err(ApiError::new(ErrorCode::InvalidRequest, "Client metrics subscription name must not be empty"));
    }
    let configs = ctx.components.client_metrics.configs(name).unwrap_or_default();
    Ok(subscription::KEYS
        .iter()
        .filter(|k| wanted(k))
        .map(|&k| match configs.get(k) {
            Some(v) => config_entry(k, v.clone(), SOURCE_CLIENT_METRICS),
            None => config_entry(k, subscription::default_value(k), SOURCE_DEFAULT),
        })
        .collect())
}

/// Validates a subscription's new configs and stores them (none: deletes it).
fn store(
    ctx: &RequestContext,
    name: &str,
    configs: BTreeMap<String, String>,
    validate_only: bool,
) -> Result<(), ApiError> {
    subscription::parse(name, &configs)?;
    if validate_only {
        return Ok(());
    }
    ctx.components.client_metrics.store_subscription(name, &configs).map_err(ApiError::from)
}

/// IncrementalAlterConfigs on a subscription: SET and DELETE on every key, APPEND and
/// SUBTRACT on the list keys (`metrics`, `match`).
pub fn alter_client_metrics(
    ctx: &RequestContext,
    name: &str,
    ops: &[(String, i8, Option<String>)],
    validate_only: bool,
) -> Result<(), ApiError> {
    if name.is_empty() {
        return Err(ApiError::new(ErrorCode::InvalidRequest, "Subscription name can't be empty"));
    }
    let mut configs = ctx.components.client_metrics.configs(name).unwrap_or_default();
    for (key, op, value) in ops {
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
            OP_APPEND | OP_SUBTRACT
                if subscription::KEYS.contains(&key.as_str()) && subscription::config_type(key) == 7 =>
            {
                let items = subscription::list(configs.get(key).map(String::as_str).unwrap_or(""));
                let values = subscription::list(value.as_deref().unwrap_or(""));
                configs.insert(key.clone(), super::configs::list_op(items, values, *op == OP_APPEND));
            }
            _ => {
                return Err(ApiError::new(ErrorCode::InvalidConfig, format!("Operation {op} is not valid for {key}")));
            }
        }
    }
    store(ctx, name, configs, validate_only)
}

/// AlterConfigs on a subscription: its configs become exactly the non-null entries given.
pub fn replace_client_metrics(
    ctx: &RequestContext,
    name: &str,
    entries: &[(String, Option<String>)],
    validate_only: bool,
) -> Result<(), ApiError> {
    let configs = entries.iter().filter_map(|(k, v)| Some((k.clone(), v.clone()?))).collect();
    store(ctx, name, configs, validate_only)
}
