//! ApiVersions: the first request every client sends.

use kafka_protocol::messages::api_versions_response::{ApiVersion, FinalizedFeatureKey, SupportedFeatureKey};
use kafka_protocol::messages::{ApiVersionsRequest, ApiVersionsResponse};
use kafka_protocol::protocol::StrBytes;

use super::Components;
use super::{served_versions, RequestContext, SUPPORTED_APIS};
use crate::protocol::ErrorCode;

/// The client APIs and, in a ZooKeeper cluster, the inter-broker ones, as a ZooKeeper-mode
/// Kafka lists both. Standalone there is no other broker to talk to.
pub fn supported_list(broker: &Components) -> Vec<ApiVersion> {
    let cluster = broker.store.is_zookeeper();
    let inter_broker = crate::protocol::inter_broker::INTER_BROKER_APIS.iter().copied().filter(|_| cluster);
    let mut all: Vec<(i16, i16, i16)> = SUPPORTED_APIS
        .iter()
        .filter_map(|&(key, _, _)| served_versions(broker, key).map(|(min, max)| (key as i16, min, max)))
        .chain(inter_broker)
        .collect();
    all.sort_by_key(|(key, _, _)| *key);
    all.into_iter()
        .map(|(key, min, max)| {
            let mut v = ApiVersion::default();
            v.api_key = key;
            v.min_version = min;
            v.max_version = max;
            v
        })
        .collect()
}

/// Kafka's rule for client_software_name/version (v3+): alphanumerics, '.', '-', starting and
/// ending with an alphanumeric.
fn valid_software_field(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'.' || *c == b'-')
}

pub fn handle(ctx: &RequestContext, req: ApiVersionsRequest) -> ApiVersionsResponse {
    let mut r = ApiVersionsResponse::default();
    if ctx.version() >= 3
        && !(valid_software_field(&req.client_software_name) && valid_software_field(&req.client_software_version))
    {
        r.error_code = ErrorCode::InvalidRequest.code();
        return r;
    }
    if ctx.version() >= 3 {
        ctx.client.set_software(&req.client_software_name, &req.client_software_version);
    }
    r.api_keys = supported_list(&ctx.components);
    // A ZooKeeper-mode Kafka supports and finalizes no features (see controller::features);
    // the epoch is that of `/feature`.
    r.finalized_features_epoch = ctx.components.cache.snapshot().finalized_features_epoch.unwrap_or(-1);
    if ctx.components.groups.consumer_groups().config().enabled {
        feature(&mut r, "group.version", 1, 1);
    }
    if ctx.components.groups.share_groups().config().enabled {
        feature(&mut r, "share.version", 1, 1);
    }
    r
}

/// A feature as Kafka 4.x lists it where it is on: supported from 0, finalized at `level`
/// (`group.version` with the consumer protocol, `share.version` with share groups). This
/// broker's own setting decides, as there is no KRaft quorum to finalize it cluster-wide.
fn feature(r: &mut ApiVersionsResponse, name: &'static str, max: i16, level: i16) {
    let name = StrBytes::from_static_str(name);
    let mut supported = SupportedFeatureKey::default();
    supported.name = name.clone();
    supported.min_version = 0;
    supported.max_version = max;
    r.supported_features.push(supported);
    let mut finalized = FinalizedFeatureKey::default();
    finalized.name = name;
    finalized.min_version_level = level;
    finalized.max_version_level = level;
    r.finalized_features.push(finalized);
}

/// The answer to an ApiVersions version we don't know: error 35 and our list, in v0 layout,
/// so the client can retry with a version we support (as Kafka does).
pub fn unsupported_version_response(broker: &Components) -> ApiVersionsResponse {
    let mut r = ApiVersionsResponse::default();
    r.error_code = ErrorCode::UnsupportedVersion.code();
    r.api_keys = supported_list(broker);
    r
}

#[cfg(test)]
mod tests {
    #[test]
    fn software_fields_follow_kafkas_pattern() {
        for ok in ["librdkafka", "2.0.2", "apache-kafka-java", "a"] {
            assert!(super::valid_software_field(ok), "{ok}");
        }
        for bad in ["", "-x", "x-", "a b", "x_y", "é"] {
            assert!(!super::valid_software_field(bad), "{bad}");
        }
    }
}
