//! Kafka's wire protocol as gregor uses it beside the vendored crate: the error codes, the
//! error a request gets back, the inter-broker (ZooKeeper-mode controller) messages the crate
//! no longer carries with the round trip that sends them, the hand-written readers and writers
//! for the classic encodings of the versions it dropped, and the names of the coordinators'
//! internal topics. It imports nothing from the rest of the crate, so every layer can use it.

pub mod error;
pub mod inter_broker;
pub mod internal_topics;
pub mod wire;

pub use error::{ApiError, ErrorCode};
