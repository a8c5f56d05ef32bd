//! The old versions of Kafka 3.9's API table that the `kafka-protocol` crate cannot decode: it
//! carries Kafka 4.x's schemas, from which KIP-896 removed them. Each old request is read here
//! into the crate's type for the existing handler (the handler sees the real version in the
//! request header and answers as Kafka does for it), or handled here when Kafka gives the old
//! version a meaning of its own; the answer is written here in the old layout.
//!
//! Where an old layout equals a newer one the crate knows, the crate's codec is used at that
//! version (noted at each use), so only genuinely different layouts are written by hand.

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::offset_commit_request::{OffsetCommitRequestPartition, OffsetCommitRequestTopic};
use kafka_protocol::messages::offset_for_leader_epoch_request::{OffsetForLeaderPartition, OffsetForLeaderTopic};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    ApiKey, BrokerId, CreateTopicsRequest, DeleteTopicsRequest, DescribeConfigsRequest, FetchRequest, GroupId,
    ListOffsetsRequest, OffsetCommitRequest, OffsetFetchRequest, OffsetForLeaderEpochRequest, ProduceRequest,
    TopicName,
};
use kafka_protocol::protocol::{Decodable, Encodable};

use super::RequestContext;
use crate::protocol::wire::{Put, Reader, WireResult};

/// The lowest version Kafka 3.9 serves, for each API whose old versions are read here. The
/// versions from there up to the crate's lowest are this module's.
const LOWEST: &[(ApiKey, i16)] = &[
    (ApiKey::Produce, 0),
    (ApiKey::Fetch, 0),
    (ApiKey::ListOffsets, 0),
    (ApiKey::OffsetCommit, 0),
    (ApiKey::OffsetFetch, 0),
    (ApiKey::CreateTopics, 0),
    (ApiKey::DeleteTopics, 0),
    (ApiKey::DescribeConfigs, 0),
    (ApiKey::OffsetForLeaderEpoch, 0),
    (ApiKey::AlterReplicaLogDirs, 0),
];

pub fn lowest(key: ApiKey) -> Option<i16> {
    LOWEST.iter().find(|(k, _)| *k == key).map(|&(_, v)| v)
}

/// Whether `version` of `key` is read and written here rather than by the crate.
pub fn serves(key: ApiKey, version: i16) -> bool {
    lowest(key).is_some_and(|lo| version >= lo && version < key.valid_versions().min)
}

/// A decoded old request.
pub enum LegacyRequest {
    /// Produce v0-v2: message sets of format v0/v1, converted by the handler.
    Produce(ProduceRequest),
    /// Fetch v0-v3: answered with message sets of format v0 (Fetch v0/v1) or v1 (v2/v3).
    Fetch(FetchRequest),
    /// ListOffsets v0: a list of offsets per partition, up to a count.
    ListOffsetsV0(ListOffsetsRequest, Vec<i32>),
    OffsetCommit(OffsetCommitRequest),
    OffsetFetch(OffsetFetchRequest),
    CreateTopics(CreateTopicsRequest),
    DeleteTopics(DeleteTopicsRequest),
    DescribeConfigs(DescribeConfigsRequest),
    OffsetForLeaderEpoch(OffsetForLeaderEpochRequest),
    AlterReplicaLogDirs(kafka_protocol::messages::AlterReplicaLogDirsRequest),
}

fn crate_decode<T: Decodable>(mut body: Bytes, version: i16) -> WireResult<T> {
    T::decode(&mut body, version).map_err(|e| e.to_string())
}

/// `body` with `extra` appended: an old request that lacks only trailing fields of a newer
/// version is that version with the fields at their defaults.
fn with_suffix(body: Bytes, extra: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(body.len() + extra.len());
    b.extend_from_slice(&body);
    b.extend_from_slice(extra);
    b.freeze()
}

pub fn decode(key: ApiKey, version: i16, body: Bytes) -> WireResult<LegacyRequest> {
    Ok(match key {
        ApiKey::Produce => LegacyRequest::Produce(decode_produce(body)?),
        ApiKey::Fetch => LegacyRequest::Fetch(decode_fetch(body, version)?),
        ApiKey::ListOffsets => {
            let (req, max_counts) = decode_list_offsets_v0(body)?;
            LegacyRequest::ListOffsetsV0(req, max_counts)
        }
        ApiKey::OffsetCommit => LegacyRequest::OffsetCommit(decode_offset_commit(body, version)?),
        // v0 is v1 on the wire; only where the offsets live differs.
        ApiKey::OffsetFetch => LegacyRequest::OffsetFetch(crate_decode(body, 1)?),
        // v1 is v2 on the wire (v2 changed the response only); v0 lacks validate_only.
        ApiKey::CreateTopics => LegacyRequest::CreateTopics(match version {
            0 => crate_decode(with_suffix(body, &[0]), 2)?,
            _ => crate_decode(body, 2)?,
        }),
        // v0 is v1 on the wire (v1 added the response's throttle time).
        ApiKey::DeleteTopics => LegacyRequest::DeleteTopics(crate_decode(body, 1)?),
        // v0 is v1 without include_synonyms.
        ApiKey::DescribeConfigs => LegacyRequest::DescribeConfigs(crate_decode(with_suffix(body, &[0]), 1)?),
        ApiKey::OffsetForLeaderEpoch => LegacyRequest::OffsetForLeaderEpoch(decode_offset_for_leader_epoch(body)?),
        // v0 is v1 on the wire both ways (v1 changed only how throttling is done).
        ApiKey::AlterReplicaLogDirs => LegacyRequest::AlterReplicaLogDirs(crate_decode(body, 1)?),
        other => return Err(format!("no old-version codec for {other:?}")),
    })
}

/// Runs a decoded old request; the answer is the response body in the old layout.
pub async fn handle(ctx: &RequestContext, request: LegacyRequest) -> Result<Option<Bytes>, String> {
    let version = ctx.version();
    let mut out = BytesMut::with_capacity(256);
    let encoded = match request {
        LegacyRequest::Produce(req) => {
            let Some(r) = super::produce::handle(ctx, req).await else { return Ok(None) };
            for_each_counted(&mut out, &r.responses, |out, t| {
                out.string(t.name.0.as_str());
                for_each_counted(out, &t.partition_responses, |out, p| {
                    out.put_i32(p.index);
                    out.put_i16(p.error_code);
                    out.put_i64(p.base_offset);
                    if version >= 2 {
                        out.put_i64(p.log_append_time_ms);
                    }
                });
            });
            if version >= 1 {
                out.put_i32(r.throttle_time_ms);
            }
            Ok(())
        }
        LegacyRequest::Fetch(req) => {
            let r = super::fetch::handle(ctx, req).await;
            if version >= 1 {
                out.put_i32(r.throttle_time_ms);
            }
            for_each_counted(&mut out, &r.responses, |out, t| {
                out.string(t.topic.0.as_str());
                for_each_counted(out, &t.partitions, |out, p| {
                    out.put_i32(p.partition_index);
                    out.put_i16(p.error_code);
                    out.put_i64(p.high_watermark);
                    out.nullable_bytes(Some(p.records.as_deref().unwrap_or_default()));
                });
            });
            Ok(())
        }
        LegacyRequest::ListOffsetsV0(req, max_counts) => {
            encode_list_offsets_v0(&super::fetch::list_offsets_v0(ctx, req, &max_counts), &mut out);
            Ok(())
        }
        LegacyRequest::OffsetCommit(req) => {
            let r = if version == 0 {
                super::off_runtime(ctx, move |c| super::offsets::offset_commit_v0(c, req)).await?
            } else {
                super::offsets::offset_commit(ctx, req).await
            };
            // v0 and v1 answer in v2's layout (v3 added the throttle time).
            r.encode(&mut out, 2)
        }
        LegacyRequest::OffsetFetch(req) => {
            let r = super::off_runtime(ctx, move |c| super::offsets::offset_fetch_v0(c, req)).await?;
            // v0's answer is v1's.
            r.encode(&mut out, 1)
        }
        LegacyRequest::CreateTopics(req) => {
            let r = super::off_runtime(ctx, move |c| super::topics::create_topics(c, req)).await?;
            for_each_counted(&mut out, &r.topics, |out, t| {
                out.string(t.name.0.as_str());
                out.put_i16(t.error_code);
                if version >= 1 {
                    out.nullable_string(t.error_message.as_deref());
                }
            });
            Ok(())
        }
        LegacyRequest::DeleteTopics(req) => {
            let r = super::topics::delete_topics(ctx, req).await?;
            for_each_counted(&mut out, &r.responses, |out, t| {
                out.string(t.name.as_ref().map(|n| n.0.as_str()).unwrap_or(""));
                out.put_i16(t.error_code);
            });
            Ok(())
        }
        LegacyRequest::DescribeConfigs(req) => {
            encode_describe_configs_v0(&super::configs::describe_configs(ctx, req), &mut out);
            Ok(())
        }
        LegacyRequest::AlterReplicaLogDirs(req) => {
            let r = super::off_runtime(ctx, move |c| super::admin::alter_replica_log_dirs(c, req)).await?;
            r.encode(&mut out, 1)
        }
        LegacyRequest::OffsetForLeaderEpoch(req) => {
            let r = super::fetch::offset_for_leader_epoch(ctx, req);
            for_each_counted(&mut out, &r.topics, |out, t| {
                out.string(t.topic.0.as_str());
                for_each_counted(out, &t.partitions, |out, p| {
                    out.put_i16(p.error_code);
                    out.put_i32(p.partition);
                    if version >= 1 {
                        out.put_i32(p.leader_epoch);
                    }
                    out.put_i64(p.end_offset);
                });
            });
            Ok(())
        }
    };
    encoded.map_err(|e| format!("response encoding failed: {e}"))?;
    Ok(Some(out.freeze()))
}

fn for_each_counted<T>(out: &mut BytesMut, items: &[T], mut f: impl FnMut(&mut BytesMut, &T)) {
    out.count(items.len());
    for item in items {
        f(out, item);
    }
}

/// Produce v0-v2 are v3 without the transactional id.
fn decode_produce(body: Bytes) -> WireResult<ProduceRequest> {
    let mut r = Reader::new(body);
    let mut req = ProduceRequest::default();
    req.acks = r.i16()?;
    req.timeout_ms = r.i32()?;
    req.topic_data = r.array(6, |r| {
        let mut t = TopicProduceData::default();
        t.name = TopicName(r.string()?);
        t.partition_data = r.array(8, |r| {
            let mut p = PartitionProduceData::default();
            p.index = r.i32()?;
            p.records = r.nullable_bytes()?;
            Ok(p)
        })?;
        Ok(t)
    })?;
    Ok(req)
}

/// Fetch v0-v3: no isolation level (read_uncommitted), no sessions; v3 adds the response
/// size limit (before it, unlimited).
fn decode_fetch(body: Bytes, version: i16) -> WireResult<FetchRequest> {
    let mut r = Reader::new(body);
    let mut req = FetchRequest::default();
    req.replica_id = BrokerId(r.i32()?);
    req.max_wait_ms = r.i32()?;
    req.min_bytes = r.i32()?;
    req.max_bytes = if version >= 3 { r.i32()? } else { i32::MAX };
    req.isolation_level = 0;
    req.session_id = 0;
    req.session_epoch = -1;
    req.topics = r.array(6, |r| {
        let mut t = FetchTopic::default();
        t.topic = TopicName(r.string()?);
        t.partitions = r.array(16, |r| {
            let mut p = FetchPartition::default();
            p.partition = r.i32()?;
            p.fetch_offset = r.i64()?;
            p.partition_max_bytes = r.i32()?;
            Ok(p)
        })?;
        Ok(t)
    })?;
    Ok(req)
}

/// ListOffsets v0: `replica_id`, then per partition a timestamp and how many offsets to list.
/// The counts travel beside the request, one per partition in request order.
fn decode_list_offsets_v0(body: Bytes) -> WireResult<(ListOffsetsRequest, Vec<i32>)> {
    let mut r = Reader::new(body);
    let mut req = ListOffsetsRequest::default();
    req.replica_id = BrokerId(r.i32()?);
    let mut counts = Vec::new();
    req.topics = r.array(6, |r| {
        let mut t = ListOffsetsTopic::default();
        t.name = TopicName(r.string()?);
        t.partitions = r.array(16, |r| {
            let mut p = ListOffsetsPartition::default();
            p.partition_index = r.i32()?;
            p.timestamp = r.i64()?;
            p.current_leader_epoch = -1;
            counts.push(r.i32()?);
            Ok(p)
        })?;
        Ok(t)
    })?;
    Ok((req, counts))
}

fn encode_list_offsets_v0(r: &super::fetch::OldStyleOffsets, out: &mut BytesMut) {
    for_each_counted(out, r, |out, (name, partitions)| {
        out.string(name);
        for_each_counted(out, partitions, |out, (index, error, offsets)| {
            out.put_i32(*index);
            out.put_i16(*error);
            for_each_counted(out, offsets, |out, o| out.put_i64(*o));
        });
    });
}

/// OffsetCommit v0 (group, then per partition offset and metadata) and v1 (adds generation,
/// member id and a per-partition commit timestamp, which Kafka 3.9 no longer uses: the commit
/// time is always the broker's).
fn decode_offset_commit(body: Bytes, version: i16) -> WireResult<OffsetCommitRequest> {
    let mut r = Reader::new(body);
    let mut req = OffsetCommitRequest::default();
    req.group_id = GroupId(r.string()?);
    req.generation_id_or_member_epoch = -1;
    if version >= 1 {
        req.generation_id_or_member_epoch = r.i32()?;
        req.member_id = r.string()?;
    }
    req.retention_time_ms = -1;
    req.topics = r.array(6, |r| {
        let mut t = OffsetCommitRequestTopic::default();
        t.name = TopicName(r.string()?);
        t.partitions = r.array(14, |r| {
            let mut p = OffsetCommitRequestPartition::default();
            p.partition_index = r.i32()?;
            p.committed_offset = r.i64()?;
            if version >= 1 {
                let _commit_timestamp = r.i64()?;
            }
            p.committed_leader_epoch = -1;
            p.committed_metadata = r.nullable_string()?;
            Ok(p)
        })?;
        Ok(t)
    })?;
    Ok(req)
}

/// OffsetForLeaderEpoch v0/v1 requests are v2's without the current leader epoch (-1: no
/// fencing, as Kafka treats them).
fn decode_offset_for_leader_epoch(body: Bytes) -> WireResult<OffsetForLeaderEpochRequest> {
    let mut r = Reader::new(body);
    let mut req = OffsetForLeaderEpochRequest::default();
    req.replica_id = BrokerId(-2);
    req.topics = r.array(6, |r| {
        let mut t = OffsetForLeaderTopic::default();
        t.topic = TopicName(r.string()?);
        t.partitions = r.array(8, |r| {
            let mut p = OffsetForLeaderPartition::default();
            p.partition = r.i32()?;
            p.current_leader_epoch = -1;
            p.leader_epoch = r.i32()?;
            Ok(p)
        })?;
        Ok(t)
    })?;
    Ok(req)
}

/// Config source DEFAULT_CONFIG: v0 has only an is_default flag where v1 has the source.
const DEFAULT_CONFIG: i8 = 5;

fn encode_describe_configs_v0(r: &kafka_protocol::messages::DescribeConfigsResponse, out: &mut BytesMut) {
    out.put_i32(r.throttle_time_ms);
    for_each_counted(out, &r.results, |out, res| {
        out.put_i16(res.error_code);
        out.nullable_string(res.error_message.as_deref());
        out.put_i8(res.resource_type);
        out.string(res.resource_name.as_str());
        for_each_counted(out, &res.configs, |out, c| {
            out.string(c.name.as_str());
            out.nullable_string(c.value.as_deref());
            out.put_u8(c.read_only as u8);
            out.put_u8((c.config_source == DEFAULT_CONFIG) as u8);
            out.put_u8(c.is_sensitive as u8);
        });
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn old_versions_are_those_below_the_crate() {
        assert!(serves(ApiKey::ListOffsets, 0));
        assert!(!serves(ApiKey::ListOffsets, 1));
        assert!(serves(ApiKey::OffsetCommit, 1));
        assert!(!serves(ApiKey::OffsetCommit, 2));
        assert!(!serves(ApiKey::Metadata, 0));
        assert!(!serves(ApiKey::ListOffsets, -1));
    }

    #[test]
    fn list_offsets_v0_keeps_each_partitions_count() {
        let mut b = BytesMut::new();
        b.put_i32(-1);
        b.count(1);
        b.string("t");
        b.count(2);
        for (p, n) in [(0, 5), (3, 1)] {
            b.put_i32(p);
            b.put_i64(-1);
            b.put_i32(n);
        }
        let (req, counts) = decode_list_offsets_v0(b.freeze()).unwrap();
        assert_eq!(req.topics[0].partitions[1].partition_index, 3);
        assert_eq!(counts, vec![5, 1]);
    }

    #[test]
    fn offset_commit_v1_reads_generation_member_and_skips_the_timestamp() {
        let mut b = BytesMut::new();
        b.string("g");
        b.put_i32(7);
        b.string("m");
        b.count(1);
        b.string("t");
        b.count(1);
        b.put_i32(2);
        b.put_i64(42);
        b.put_i64(123456);
        b.nullable_string(Some("meta"));
        let req = decode_offset_commit(b.freeze(), 1).unwrap();
        assert_eq!(req.generation_id_or_member_epoch, 7);
        assert_eq!(req.member_id.as_str(), "m");
        let p = &req.topics[0].partitions[0];
        assert_eq!((p.partition_index, p.committed_offset), (2, 42));
        assert_eq!(p.committed_metadata.as_deref(), Some("meta"));
    }

    #[test]
    fn fetch_v2_has_no_response_size_limit_and_v3_reads_it() {
        let body = |v3: bool| {
            let mut b = BytesMut::new();
            b.put_i32(-1);
            b.put_i32(500);
            b.put_i32(1);
            if v3 {
                b.put_i32(1000);
            }
            b.count(1);
            b.string("t");
            b.count(1);
            b.put_i32(0);
            b.put_i64(17);
            b.put_i32(4096);
            b.freeze()
        };
        let v2 = decode_fetch(body(false), 2).unwrap();
        assert_eq!((v2.max_wait_ms, v2.min_bytes, v2.max_bytes), (500, 1, i32::MAX));
        let v3 = decode_fetch(body(true), 3).unwrap();
        assert_eq!(v3.max_bytes, 1000);
        let p = &v3.topics[0].partitions[0];
        assert_eq!((p.fetch_offset, p.partition_max_bytes, p.current_leader_epoch), (17, 4096, -1));
        assert!(decode_fetch(body(false), 3).is_err());
    }

    #[test]
    fn truncated_requests_are_errors() {
        let mut b = BytesMut::new();
        b.string("g");
        b.count(1);
        assert!(decode_offset_commit(b.freeze(), 0).is_err());
        assert!(decode(ApiKey::CreateTopics, 0, Bytes::from_static(&[0, 0, 0, 9])).is_err());
    }
}
