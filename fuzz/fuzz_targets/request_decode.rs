//! Every request decoder: the header and body of any API key and version the broker can be
//! sent, by the protocol crate's codecs, our codecs of the versions it dropped
//! (`api::legacy`) and of the inter-broker APIs (`protocol::inter_broker`). A decoder may
//! refuse its input; it must not panic or allocate beyond what the input can justify.
#![no_main]
use bytes::{Bytes, BytesMut};
use gregor::protocol::inter_broker::{self as messages, Message};
use kafka_protocol::messages::{ApiKey, RequestHeader, RequestKind};
use kafka_protocol::protocol::{Decodable, Encodable};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < 4 {
        return;
    }
    let key = i16::from_be_bytes([data[0], data[1]]);
    let version = i16::from_be_bytes([data[2], data[3]]);
    let mut frame = Bytes::copy_from_slice(data);
    if gregor::api::inter_broker::is_inter_broker(key) {
        inter_broker(key, version, frame);
        return;
    }
    let Ok(api) = ApiKey::try_from(key) else { return };
    if gregor::api::legacy::serves(api, version) {
        if RequestHeader::decode(&mut frame, api.request_header_version(version)).is_ok() {
            let _ = gregor::api::legacy::decode(api, version, frame);
        }
        return;
    }
    let versions = api.valid_versions();
    if version < versions.min || version > versions.max {
        return;
    }
    let Ok(header) = RequestHeader::decode(&mut frame, api.request_header_version(version)) else { return };
    let Ok(request) = RequestKind::decode(api, &mut frame, version) else { return };
    // What was decoded must encode again at its version (the broker re-encodes nothing, but
    // the crate's invariants are what its handlers rely on).
    let mut out = BytesMut::new();
    let _ = header.encode(&mut out, api.request_header_version(version));
    let _ = request.encode(&mut out, version);
});

fn inter_broker(key: i16, version: i16, mut frame: Bytes) {
    if !messages::is_supported(key, version) {
        return;
    }
    if messages::decode_request_header(&mut frame).is_err() {
        return;
    }
    let mut out = BytesMut::new();
    match key {
        messages::LEADER_AND_ISR => {
            if let Ok(r) = messages::LeaderAndIsrRequest::decode(&mut frame, version) {
                let _ = r.encode(&mut out, version);
            }
        }
        messages::UPDATE_METADATA => {
            if let Ok(r) = messages::UpdateMetadataRequest::decode(&mut frame, version) {
                let _ = r.encode(&mut out, version);
            }
        }
        messages::STOP_REPLICA => {
            if let Ok(r) = messages::StopReplicaRequest::decode(&mut frame, version) {
                let _ = r.encode(&mut out, version);
            }
        }
        messages::CONTROLLED_SHUTDOWN => {
            if let Ok(r) = messages::ControlledShutdownRequest::decode(&mut frame, version) {
                let _ = r.encode(&mut out, version);
            }
        }
        messages::ALTER_PARTITION => {
            if let Ok(r) = messages::AlterPartitionRequest::decode(&mut frame, version) {
                let _ = r.encode(&mut out, version);
            }
        }
        _ => {}
    }
}
