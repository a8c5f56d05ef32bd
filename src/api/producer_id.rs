//! InitProducerId: ids for idempotent producers (Java producers are idempotent by default).

use kafka_protocol::messages::{InitProducerIdRequest, InitProducerIdResponse, ProducerId};

use super::RequestContext;
use crate::protocol::ErrorCode;
use crate::security::authorizer::{Operation, ResourceType};

pub async fn init_producer_id(ctx: &RequestContext, req: InitProducerIdRequest) -> InitProducerIdResponse {
    let mut r = InitProducerIdResponse::default();
    r.producer_id = ProducerId(-1);
    r.producer_epoch = -1;
    // Kafka 3.x: an idempotent producer needs IDEMPOTENT_WRITE on the cluster or WRITE on
    // some topic.
    if req.transactional_id.is_none()
        && !ctx.authorized_cluster(Operation::IdempotentWrite)
        && !ctx.authorized_any(Operation::Write, ResourceType::Topic)
    {
        r.error_code = ErrorCode::ClusterAuthorizationFailed.code();
        return r;
    }
    // A producer id without an epoch, or the reverse, is malformed. Otherwise Kafka 3.9 gives an
    // idempotent producer a new id whatever it held: nothing here knows the old id's epoch, and
    // bumping whatever epoch the client names would let it claim any producer id.
    if (req.producer_id.0 == -1) != (req.producer_epoch == -1) {
        r.error_code = ErrorCode::InvalidRequest.code();
        return r;
    }
    match ctx.components.txn.next_producer_id().await {
        Ok(id) => {
            r.producer_id = ProducerId(id);
            r.producer_epoch = 0;
        }
        Err(e) => {
            tracing::error!(error = %e, "cannot allocate a producer id");
            r.error_code = ErrorCode::UnknownServerError.code();
        }
    }
    r
}
