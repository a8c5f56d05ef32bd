//! Producer ids and idempotence: which producer ids exist and, per partition, which sequence
//! numbers each producer has written, so retried batches are written once.

pub mod producer_id;
pub mod producer_state;

pub use producer_id::ProducerIdManager;
pub use producer_state::{ProducerStateManager, SequenceCheck};
