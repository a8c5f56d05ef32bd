//! Kafka's error codes (`Errors.java`): the one place they are declared, and `ApiError`, a code
//! with the message a response carries beside it. This module sits at the bottom of the module
//! graph and imports nothing from the crate, so every layer can use it; the layers above convert
//! their own errors into `ApiError` where those errors are declared.

/// Declares the enum and the list of all its variants together, so the unit test below can
/// check each one against the protocol crate and no variant escapes the check.
macro_rules! error_codes {
    ($($name:ident = $code:literal,)*) => {
        /// A Kafka error code. Names are Kafka's, in the protocol crate's spelling.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(i16)]
        pub enum ErrorCode {
            $($name = $code,)*
        }

        impl ErrorCode {
            /// Every error code, for tests and lookups.
            pub const ALL: &'static [ErrorCode] = &[$(ErrorCode::$name,)*];

            /// The variant for a code read off the wire; `None` for a code Kafka does not define.
            pub const fn from_code(code: i16) -> Option<ErrorCode> {
                match code {
                    $($code => Some(ErrorCode::$name),)*
                    _ => None,
                }
            }
        }
    };
}

error_codes! {
    None = 0,
    UnknownServerError = -1,
    OffsetOutOfRange = 1,
    CorruptMessage = 2,
    UnknownTopicOrPartition = 3,
    InvalidFetchSize = 4,
    LeaderNotAvailable = 5,
    NotLeaderOrFollower = 6,
    RequestTimedOut = 7,
    BrokerNotAvailable = 8,
    ReplicaNotAvailable = 9,
    MessageTooLarge = 10,
    StaleControllerEpoch = 11,
    OffsetMetadataTooLarge = 12,
    NetworkException = 13,
    CoordinatorLoadInProgress = 14,
    CoordinatorNotAvailable = 15,
    NotCoordinator = 16,
    InvalidTopicException = 17,
    RecordListTooLarge = 18,
    NotEnoughReplicas = 19,
    NotEnoughReplicasAfterAppend = 20,
    InvalidRequiredAcks = 21,
    IllegalGeneration = 22,
    InconsistentGroupProtocol = 23,
    InvalidGroupId = 24,
    UnknownMemberId = 25,
    InvalidSessionTimeout = 26,
    RebalanceInProgress = 27,
    InvalidCommitOffsetSize = 28,
    TopicAuthorizationFailed = 29,
    GroupAuthorizationFailed = 30,
    ClusterAuthorizationFailed = 31,
    InvalidTimestamp = 32,
    UnsupportedSaslMechanism = 33,
    IllegalSaslState = 34,
    UnsupportedVersion = 35,
    TopicAlreadyExists = 36,
    InvalidPartitions = 37,
    InvalidReplicationFactor = 38,
    InvalidReplicaAssignment = 39,
    InvalidConfig = 40,
    NotController = 41,
    InvalidRequest = 42,
    UnsupportedForMessageFormat = 43,
    PolicyViolation = 44,
    OutOfOrderSequenceNumber = 45,
    DuplicateSequenceNumber = 46,
    InvalidProducerEpoch = 47,
    InvalidTxnState = 48,
    InvalidProducerIdMapping = 49,
    InvalidTransactionTimeout = 50,
    ConcurrentTransactions = 51,
    TransactionCoordinatorFenced = 52,
    TransactionalIdAuthorizationFailed = 53,
    SecurityDisabled = 54,
    OperationNotAttempted = 55,
    KafkaStorageError = 56,
    LogDirNotFound = 57,
    SaslAuthenticationFailed = 58,
    UnknownProducerId = 59,
    ReassignmentInProgress = 60,
    DelegationTokenAuthDisabled = 61,
    DelegationTokenNotFound = 62,
    DelegationTokenOwnerMismatch = 63,
    DelegationTokenRequestNotAllowed = 64,
    DelegationTokenAuthorizationFailed = 65,
    DelegationTokenExpired = 66,
    InvalidPrincipalType = 67,
    NonEmptyGroup = 68,
    GroupIdNotFound = 69,
    FetchSessionIdNotFound = 70,
    InvalidFetchSessionEpoch = 71,
    ListenerNotFound = 72,
    TopicDeletionDisabled = 73,
    FencedLeaderEpoch = 74,
    UnknownLeaderEpoch = 75,
    UnsupportedCompressionType = 76,
    StaleBrokerEpoch = 77,
    OffsetNotAvailable = 78,
    MemberIdRequired = 79,
    PreferredLeaderNotAvailable = 80,
    GroupMaxSizeReached = 81,
    FencedInstanceId = 82,
    EligibleLeadersNotAvailable = 83,
    ElectionNotNeeded = 84,
    NoReassignmentInProgress = 85,
    GroupSubscribedToTopic = 86,
    InvalidRecord = 87,
    UnstableOffsetCommit = 88,
    ThrottlingQuotaExceeded = 89,
    ProducerFenced = 90,
    ResourceNotFound = 91,
    DuplicateResource = 92,
    UnacceptableCredential = 93,
    InconsistentVoterSet = 94,
    InvalidUpdateVersion = 95,
    FeatureUpdateFailed = 96,
    PrincipalDeserializationFailure = 97,
    SnapshotNotFound = 98,
    PositionOutOfRange = 99,
    UnknownTopicId = 100,
    DuplicateBrokerRegistration = 101,
    BrokerIdNotRegistered = 102,
    InconsistentTopicId = 103,
    InconsistentClusterId = 104,
    TransactionalIdNotFound = 105,
    FetchSessionTopicIdError = 106,
    IneligibleReplica = 107,
    NewLeaderElected = 108,
    OffsetMovedToTieredStorage = 109,
    FencedMemberEpoch = 110,
    UnreleasedInstanceId = 111,
    UnsupportedAssignor = 112,
    StaleMemberEpoch = 113,
    MismatchedEndpointType = 114,
    UnsupportedEndpointType = 115,
    UnknownControllerId = 116,
    UnknownSubscriptionId = 117,
    TelemetryTooLarge = 118,
    InvalidRegistration = 119,
    TransactionAbortable = 120,
    InvalidRecordState = 121,
    ShareSessionNotFound = 122,
    InvalidShareSessionEpoch = 123,
    FencedStateEpoch = 124,
    InvalidVoterKey = 125,
    DuplicateVoter = 126,
    VoterNotFound = 127,
    InvalidRegularExpression = 128,
    RebootstrapRequired = 129,
    StreamsInvalidTopology = 130,
    StreamsInvalidTopologyEpoch = 131,
    StreamsTopologyFenced = 132,
    ShareSessionLimitReached = 133,
}

impl ErrorCode {
    /// The code as it goes on the wire.
    pub const fn code(self) -> i16 {
        self as i16
    }
}

/// An error a request gets back: the code and the message some responses carry beside it.
/// Components that answer requests (the controller's topic operations, the handlers) return it
/// so the code reaches the client unchanged.
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

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::ResponseError;

    #[test]
    fn every_code_and_name_is_the_protocol_crates() {
        for &ours in ErrorCode::ALL {
            let name = format!("{ours:?}");
            match ResponseError::try_from_code(ours.code()) {
                // The crate represents "no error" as the absence of an error.
                None => assert_eq!((ours, ours.code()), (ErrorCode::None, 0)),
                Some(theirs) => {
                    assert!(
                        !matches!(theirs, ResponseError::Unknown(_)),
                        "{name} = {} is not a Kafka error code",
                        ours.code()
                    );
                    assert_eq!(theirs.to_string(), name, "code {}", ours.code());
                }
            }
        }
    }

    #[test]
    fn codes_are_distinct_and_found_by_code() {
        for &e in ErrorCode::ALL {
            assert_eq!(ErrorCode::from_code(e.code()), Some(e));
        }
        assert_eq!(ErrorCode::from_code(i16::MAX), None);
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
