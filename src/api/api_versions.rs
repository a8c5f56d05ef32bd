//! ApiVersions: the first request every client sends.

use kafka_protocol::messages::api_versions_response::ApiVersion;
use kafka_protocol::messages::{ApiVersionsRequest, ApiVersionsResponse};

use super::{RequestContext, SUPPORTED_APIS};

pub fn supported_list() -> Vec<ApiVersion> {
    SUPPORTED_APIS
        .iter()
        .map(|&(key, min, max)| {
            let mut v = ApiVersion::default();
            v.api_key = key as i16;
            v.min_version = min;
            v.max_version = max;
            v
        })
        .collect()
}

pub fn handle(_ctx: &RequestContext, _req: ApiVersionsRequest) -> ApiVersionsResponse {
    let mut r = ApiVersionsResponse::default();
    r.api_keys = supported_list();
    r.finalized_features_epoch = -1;
    r
}

/// The answer to an ApiVersions version we don't know: error 35 and our list, in v0 layout,
/// so the client can retry with a version we support (as Kafka does).
pub fn unsupported_version_response() -> ApiVersionsResponse {
    let mut r = ApiVersionsResponse::default();
    r.error_code = 35;
    r.api_keys = supported_list();
    r
}
