//! Produce: validate each partition's batches and append them as they are.

use kafka_protocol::messages::produce_response::{PartitionProduceResponse, TopicProduceResponse};
use kafka_protocol::messages::{ProduceRequest, ProduceResponse};

use super::error::ErrorCode;
use super::RequestContext;

pub fn handle(ctx: &RequestContext, req: ProduceRequest) -> Option<ProduceResponse> {
    let broker = &ctx.broker;
    let acks = req.acks;
    let valid_acks = matches!(acks, -1..=1);
    let transactional = req.transactional_id.is_some();
    let mut appended = false;
    let mut responses = Vec::with_capacity(req.topic_data.len());
    for topic in req.topic_data {
        let name = topic.name.0.to_string();
        let info = broker.cache.topic(&name);
        let mut partitions = Vec::with_capacity(topic.partition_data.len());
        for pd in topic.partition_data {
            let mut out = PartitionProduceResponse::default();
            out.index = pd.index;
            out.base_offset = -1;
            out.log_append_time_ms = -1;
            out.log_start_offset = -1;
            let code = if !valid_acks {
                ErrorCode::InvalidRequiredAcks.code()
            } else if transactional {
                // Transactions are not implemented; refuse rather than write records that
                // read_committed consumers would treat as committed.
                ErrorCode::TransactionalIdAuthorizationFailed.code()
            } else {
                let max_bytes = info
                    .as_ref()
                    .and_then(|t| t.configs.get("max.message.bytes"))
                    .and_then(|v| v.parse::<u32>().ok())
                    .unwrap_or(broker.config.log.max_message_bytes);
                match (broker.replicas.partition(&name, pd.index), pd.records) {
                    (None, _) => {
                        if info.as_ref().is_some_and(|t| t.partitions.iter().any(|p| p.index == pd.index)) {
                            ErrorCode::NotLeaderOrFollower.code()
                        } else {
                            ErrorCode::UnknownTopicOrPartition.code()
                        }
                    }
                    (Some(_), None) => ErrorCode::CorruptMessage.code(),
                    (Some(p), Some(records)) => {
                        let result = p.append(records, 0, max_bytes);
                        if result.error_code == 0 {
                            appended = true;
                        }
                        out.base_offset = result.base_offset;
                        out.log_start_offset = result.log_start_offset;
                        result.error_code
                    }
                }
            };
            out.error_code = code;
            partitions.push(out);
        }
        let mut tr = TopicProduceResponse::default();
        tr.name = topic.name;
        tr.partition_responses = partitions;
        responses.push(tr);
    }
    if appended {
        broker.replicas.notify_appended();
    }
    if acks == 0 {
        return None;
    }
    let mut r = ProduceResponse::default();
    r.responses = responses;
    Some(r)
}
