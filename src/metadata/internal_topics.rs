//! Names of the internal topics the coordinators keep their state in, known to the layers
//! that create them (controller), serve them (replication) and use them (the coordinators).

/// Where the transaction coordinator keeps each transactional id's state.
pub const TRANSACTION_STATE_TOPIC: &str = "__transaction_state";
