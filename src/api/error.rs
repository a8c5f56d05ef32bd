//! The error type handlers return.

use crate::log::LogError;
use crate::metadata::StoreError;
use crate::protocol::ErrorCode;

#[derive(Debug, Clone)]
pub struct ApiError {
    pub code: i16,
    pub message: String,
}

/// The longest error message sent: messages may quote what a request sent, and a string the
/// response cannot carry (an int16 length in the classic versions) would fail the whole
/// response and close the connection instead of answering with the error code.
const MAX_MESSAGE_BYTES: usize = 1024;

impl ApiError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> ApiError {
        let mut message = message.into();
        if message.len() > MAX_MESSAGE_BYTES {
            let mut end = MAX_MESSAGE_BYTES;
            while !message.is_char_boundary(end) {
                end -= 1;
            }
            message.truncate(end);
        }
        ApiError { code: code.code(), message }
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "error {}: {}", self.code, self.message)
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> ApiError {
        tracing::error!(error = %e, "metadata store failure");
        ApiError::new(ErrorCode::UnknownServerError, e.to_string())
    }
}

impl From<LogError> for ApiError {
    fn from(e: LogError) -> ApiError {
        ApiError { code: e.kafka_code(), message: e.to_string() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_messages_are_cut_to_what_a_response_carries() {
        let quoted = "é".repeat(40_000);
        let e = ApiError::new(ErrorCode::InvalidRequest, format!("bad: {quoted}"));
        assert!(e.message.len() <= MAX_MESSAGE_BYTES);
        assert!(e.message.starts_with("bad: é"));
        assert_eq!(ApiError::new(ErrorCode::InvalidRequest, "short").message, "short");
    }
}
