//! Producer ids and transactions: which producer ids exist, and the transaction coordinator,
//! which keeps each transactional id's state in `__transaction_state` and ends transactions with
//! markers. The per-partition producer state lives with the log (`log::producer_state`).

pub mod coordinator;
pub mod handles;
mod inter_broker;
pub mod producer_id;
pub mod service;
#[cfg(test)]
mod service_tests;
pub mod state;
pub mod txn_log;

pub use coordinator::TransactionCoordinator;
pub use inter_broker::pooled_round_trip;
pub use producer_id::ProducerIdManager;
pub use service::{TransactionHandles, TransactionService};
