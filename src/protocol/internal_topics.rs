//! The coordinators' own topics (Kafka's `Topic` in its clients' internals). Their names sit at
//! the bottom of the module graph because the controller creates them, the coordinators write
//! them, and the metadata cache and the Metadata API mark them internal.

pub const OFFSETS_TOPIC: &str = "__consumer_offsets";
pub const TRANSACTION_STATE_TOPIC: &str = "__transaction_state";
/// Share-partition state (KIP-932), written by the share coordinator.
pub const SHARE_GROUP_STATE_TOPIC: &str = "__share_group_state";

/// Kafka's `Topic.isInternal`.
pub fn is_internal(name: &str) -> bool {
    name == OFFSETS_TOPIC || name == TRANSACTION_STATE_TOPIC || name == SHARE_GROUP_STATE_TOPIC
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_the_coordinators_topics_are_internal() {
        assert!(super::is_internal("__consumer_offsets"));
        assert!(super::is_internal("__transaction_state"));
        assert!(super::is_internal("__share_group_state"));
        assert!(!super::is_internal("__consumer_offsets2"));
        assert!(!super::is_internal("_consumer_offsets"));
    }
}
