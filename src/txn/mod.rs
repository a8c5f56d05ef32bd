//! Producer ids, idempotence and transactions: which producer ids exist; per partition, which
//! sequence numbers each producer has written (so retried batches are written once) and which
//! transactions are open or were aborted; and the transaction coordinator, which keeps each
//! transactional id's state in `__transaction_state` and ends transactions with markers.

pub mod coordinator;
pub mod producer_id;
pub mod producer_state;
pub mod service;
pub mod snapshot;
pub mod state;
pub mod txn_log;

pub use coordinator::TransactionCoordinator;
pub use producer_id::ProducerIdManager;
pub use producer_state::{ProducerStateManager, SequenceCheck};
