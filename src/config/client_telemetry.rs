//! Client telemetry (KIP-714): whether this broker receives the metrics clients push, and the
//! bounds on what it keeps of them.

use std::collections::BTreeMap;

use super::parse::{boolean, in_range, positive, value};
use super::ConfigError;

pub const ENABLE: &str = "gregor.client.telemetry.enable";
pub const MAX_BYTES: &str = "telemetry.max.bytes";
pub const MAX_CLIENTS: &str = "gregor.client.telemetry.max.clients";
pub const MAX_SERIES: &str = "gregor.client.telemetry.max.series";
pub const MAX_SERIES_PER_CLIENT: &str = "gregor.client.telemetry.max.series.per.client";

#[derive(Debug, Clone, PartialEq)]
pub struct ClientTelemetryConfig {
    /// `gregor.client.telemetry.enable`: GetTelemetrySubscriptions and PushTelemetry are served
    /// and advertised (Kafka offers them only when a telemetry receiver plugin is configured).
    pub enabled: bool,
    /// `telemetry.max.bytes`: the largest push accepted, compressed or not (Kafka's key).
    pub max_bytes: i32,
    /// `gregor.client.telemetry.max.clients`: client instances remembered at once (Kafka's
    /// fixed cache size, 16384); the least recently seen goes first.
    pub max_clients: usize,
    /// `gregor.client.telemetry.max.series`: pushed series shown on `/metrics` over all clients.
    pub max_series: usize,
    /// `gregor.client.telemetry.max.series.per.client`: pushed series shown per client instance.
    pub max_series_per_client: usize,
}

impl ClientTelemetryConfig {
    pub(super) fn parse(values: &BTreeMap<String, String>) -> Result<ClientTelemetryConfig, ConfigError> {
        let get = |k: &str| value(values, k);
        Ok(ClientTelemetryConfig {
            enabled: boolean(ENABLE, get(ENABLE))?,
            max_bytes: in_range(MAX_BYTES, get(MAX_BYTES), 1, i64::from(i32::MAX))? as i32,
            max_clients: positive::<usize>(MAX_CLIENTS, get(MAX_CLIENTS))?,
            max_series: in_range(MAX_SERIES, get(MAX_SERIES), 0, i64::from(u32::MAX))? as usize,
            max_series_per_client: in_range(MAX_SERIES_PER_CLIENT, get(MAX_SERIES_PER_CLIENT), 0, i64::from(u32::MAX))?
                as usize,
        })
    }
}
