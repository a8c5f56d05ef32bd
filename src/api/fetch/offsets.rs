//! ListOffsets (and its v0 form) and OffsetForLeaderEpoch: where a consumer or a follower
//! should start, by timestamp or by leader epoch.

use super::*;

pub fn list_offsets(ctx: &RequestContext, req: ListOffsetsRequest) -> ListOffsetsResponse {
    let mut r = ListOffsetsResponse::default();
    // isolation_level (v2+): read_committed consumers' "latest" is the last stable offset.
    let committed = ctx.version() >= 2 && req.isolation_level == 1;
    for t in req.topics {
        let name = t.name.0.to_string();
        let may_describe = ctx.authorized(Operation::Describe, ResourceType::Topic, &name);
        let mut tr = ListOffsetsTopicResponse::default();
        for p in t.partitions {
            let mut pr = ListOffsetsPartitionResponse::default();
            pr.partition_index = p.partition_index;
            pr.timestamp = -1;
            pr.offset = -1;
            pr.leader_epoch = -1;
            if !may_describe {
                pr.error_code = ErrorCode::TopicAuthorizationFailed.code();
                tr.partitions.push(pr);
                continue;
            }
            let led = ctx.components.replicas.partition(&name, p.partition_index);
            let fenced = led.as_ref().and_then(|part| part.check_epoch(p.current_leader_epoch).err());
            match (led, fenced) {
                (None, _) => pr.error_code = crate::api::not_led_error(&ctx.components, &name, p.partition_index),
                (Some(_), Some(code)) => pr.error_code = code,
                (Some(part), None) => match p.timestamp {
                    LATEST_TIMESTAMP => {
                        pr.offset = if committed { part.last_stable_offset() } else { part.high_watermark() };
                        pr.leader_epoch = part.latest_epoch();
                    }
                    EARLIEST_TIMESTAMP => {
                        pr.offset = part.log_start_offset();
                        pr.leader_epoch = part.epoch_for_offset(pr.offset);
                    }
                    MAX_TIMESTAMP => match part.offset_of_max_timestamp() {
                        Ok(Some((offset, timestamp))) => {
                            pr.offset = offset;
                            pr.timestamp = timestamp;
                            pr.leader_epoch = part.epoch_for_offset(offset);
                        }
                        Ok(None) => {}
                        Err(e) => pr.error_code = e.kafka_code(),
                    },
                    ts => match part.offset_for_timestamp(ts) {
                        Ok(Some((offset, timestamp))) => {
                            pr.offset = offset;
                            pr.timestamp = timestamp;
                            pr.leader_epoch = part.epoch_for_offset(offset);
                        }
                        Ok(None) => {}
                        Err(e) => pr.error_code = e.kafka_code(),
                    },
                },
            }
            if ctx.version() < 4 {
                // The field exists from v4; the crate refuses to encode it below.
                pr.leader_epoch = -1;
            }
            tr.partitions.push(pr);
        }
        tr.name = t.name;
        r.topics.push(tr);
    }
    r
}

/// Per topic, per partition: (index, error code, offsets).
pub type OldStyleOffsets = Vec<(String, Vec<(i32, i16, Vec<i64>)>)>;

/// ListOffsets v0: for each partition up to `max_counts[i]` offsets (the i-th partition of the
/// request, in order), as Kafka 3.9 still answers it from the segments' first offsets.
pub fn list_offsets_v0(ctx: &RequestContext, req: ListOffsetsRequest, max_counts: &[i32]) -> OldStyleOffsets {
    let from_consumer = req.replica_id.0 == -1;
    let mut counts = max_counts.iter().copied();
    let mut out = Vec::with_capacity(req.topics.len());
    for t in req.topics {
        let name = t.name.0.to_string();
        let may_describe = ctx.authorized(Operation::Describe, ResourceType::Topic, &name);
        let mut parts = Vec::with_capacity(t.partitions.len());
        for p in t.partitions {
            let max = counts.next().unwrap_or(0);
            if !may_describe {
                parts.push((p.partition_index, ErrorCode::TopicAuthorizationFailed.code(), Vec::new()));
                continue;
            }
            match ctx.components.replicas.partition(&name, p.partition_index) {
                None => parts.push((
                    p.partition_index,
                    crate::api::not_led_error(&ctx.components, &name, p.partition_index),
                    Vec::new(),
                )),
                Some(part) => {
                    parts.push((p.partition_index, 0, part.legacy_offsets_before(p.timestamp, max, from_consumer)))
                }
            }
        }
        out.push((name, parts));
    }
    out
}

/// OffsetForLeaderEpoch: where a leader epoch ends in the leader's log, so a replica or a
/// consumer (KIP-320) can find where its log diverged.
pub fn offset_for_leader_epoch(ctx: &RequestContext, req: OffsetForLeaderEpochRequest) -> OffsetForLeaderEpochResponse {
    let mut r = OffsetForLeaderEpochResponse::default();
    // Kafka: a principal with CLUSTER_ACTION (a follower) may ask about any topic, others
    // need DESCRIBE on each.
    let cluster_action = ctx.authorized_cluster(Operation::ClusterAction);
    for t in req.topics {
        let name = t.topic.0.to_string();
        let may_describe = cluster_action || ctx.authorized(Operation::Describe, ResourceType::Topic, &name);
        let mut tr = OffsetForLeaderTopicResult::default();
        for p in t.partitions {
            let mut e = EpochEndOffset::default();
            e.partition = p.partition;
            e.leader_epoch = -1;
            e.end_offset = -1;
            if !may_describe {
                e.error_code = ErrorCode::TopicAuthorizationFailed.code();
                tr.partitions.push(e);
                continue;
            }
            match ctx.components.replicas.partition(&name, p.partition) {
                None => e.error_code = crate::api::not_led_error(&ctx.components, &name, p.partition),
                Some(part) => match part.check_epoch(p.current_leader_epoch) {
                    Err(code) => e.error_code = code,
                    Ok(()) => {
                        let (epoch, end) = part.end_offset_for_epoch(p.leader_epoch);
                        e.leader_epoch = epoch;
                        e.end_offset = end;
                    }
                },
            }
            tr.partitions.push(e);
        }
        tr.topic = t.topic;
        r.topics.push(tr);
    }
    r
}
