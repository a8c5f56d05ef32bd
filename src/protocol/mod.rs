//! Kafka's wire protocol as gregor uses it beside the vendored crate: the error codes.

pub mod error;

pub use error::ErrorCode;
