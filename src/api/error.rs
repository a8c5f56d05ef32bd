//! Kafka's error codes (`Errors.java`) and the error type handlers return.

use crate::log::LogError;
use crate::metadata::StoreError;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i16)]
pub enum ErrorCode {
    UnknownServerError = -1,
    None = 0,
    OffsetOutOfRange = 1,
    CorruptMessage = 2,
    UnknownTopicOrPartition = 3,
    LeaderNotAvailable = 5,
    NotLeaderOrFollower = 6,
    BrokerNotAvailable = 8,
    ReplicaNotAvailable = 9,
    RequestTimedOut = 7,
    StaleControllerEpoch = 11,
    MessageTooLarge = 10,
    InvalidTopicException = 17,
    NotEnoughReplicas = 19,
    InvalidRequiredAcks = 21,
    UnsupportedVersion = 35,
    TopicAlreadyExists = 36,
    InvalidPartitions = 37,
    InvalidReplicationFactor = 38,
    InvalidReplicaAssignment = 39,
    InvalidConfig = 40,
    NotController = 41,
    InvalidRequest = 42,
    OperationNotAttempted = 55,
    ReassignmentInProgress = 60,
    KafkaStorageError = 56,
    LogDirNotFound = 57,
    TopicDeletionDisabled = 73,
    FencedLeaderEpoch = 74,
    StaleBrokerEpoch = 77,
    PreferredLeaderNotAvailable = 80,
    EligibleLeadersNotAvailable = 83,
    ElectionNotNeeded = 84,
    NoReassignmentInProgress = 85,
    InvalidRecord = 87,
    UnstableOffsetCommit = 88,
    InvalidUpdateVersion = 95,
    TransactionalIdAuthorizationFailed = 53,
    TransactionalIdNotFound = 105,
    TopicAuthorizationFailed = 29,
    GroupAuthorizationFailed = 30,
    ClusterAuthorizationFailed = 31,
    SecurityDisabled = 54,
    UnknownTopicId = 100,
    InconsistentTopicId = 103,
    IneligibleReplica = 107,
    UnsupportedSaslMechanism = 33,
    ResourceNotFound = 91,
    DuplicateResource = 92,
    UnacceptableCredential = 93,
}

impl ErrorCode {
    pub fn code(self) -> i16 {
        self as i16
    }
}

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
    fn codes_are_the_protocol_crates() {
        use kafka_protocol::ResponseError as R;
        for (ours, theirs) in [
            (ErrorCode::ReplicaNotAvailable, R::ReplicaNotAvailable),
            (ErrorCode::LogDirNotFound, R::LogDirNotFound),
            (ErrorCode::KafkaStorageError, R::KafkaStorageError),
            (ErrorCode::InvalidTopicException, R::InvalidTopicException),
            (ErrorCode::UnstableOffsetCommit, R::UnstableOffsetCommit),
        ] {
            assert_eq!(ours.code(), theirs.code(), "{ours:?}");
        }
    }

    #[test]
    fn long_messages_are_cut_to_what_a_response_carries() {
        let quoted = "é".repeat(40_000);
        let e = ApiError::new(ErrorCode::InvalidRequest, format!("bad: {quoted}"));
        assert!(e.message.len() <= MAX_MESSAGE_BYTES);
        assert!(e.message.starts_with("bad: é"));
        assert_eq!(ApiError::new(ErrorCode::InvalidRequest, "short").message, "short");
    }
}
