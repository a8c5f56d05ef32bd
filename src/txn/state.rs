//! Kafka's transaction states (`TransactionState`) and what the coordinator keeps per
//! transactional id (`TransactionMetadata`).

use std::collections::BTreeSet;

use super::txn_log::TxnLogValue;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TxnState {
    Empty,
    Ongoing,
    PrepareCommit,
    PrepareAbort,
    CompleteCommit,
    CompleteAbort,
    Dead,
    PrepareEpochFence,
}

impl TxnState {
    /// The code stored in `__transaction_state`.
    pub fn code(self) -> i8 {
        match self {
            TxnState::Empty => 0,
            TxnState::Ongoing => 1,
            TxnState::PrepareCommit => 2,
            TxnState::PrepareAbort => 3,
            TxnState::CompleteCommit => 4,
            TxnState::CompleteAbort => 5,
            TxnState::Dead => 6,
            TxnState::PrepareEpochFence => 7,
        }
    }

    pub fn from_code(code: i8) -> Option<TxnState> {
        Some(match code {
            0 => TxnState::Empty,
            1 => TxnState::Ongoing,
            2 => TxnState::PrepareCommit,
            3 => TxnState::PrepareAbort,
            4 => TxnState::CompleteCommit,
            5 => TxnState::CompleteAbort,
            6 => TxnState::Dead,
            7 => TxnState::PrepareEpochFence,
            _ => return None,
        })
    }

    /// The name DescribeTransactions and ListTransactions report.
    pub fn name(self) -> &'static str {
        match self {
            TxnState::Empty => "Empty",
            TxnState::Ongoing => "Ongoing",
            TxnState::PrepareCommit => "PrepareCommit",
            TxnState::PrepareAbort => "PrepareAbort",
            TxnState::CompleteCommit => "CompleteCommit",
            TxnState::CompleteAbort => "CompleteAbort",
            TxnState::Dead => "Dead",
            TxnState::PrepareEpochFence => "PrepareEpochFence",
        }
    }

    /// Markers are being written: every request but a retry of the same end waits.
    pub fn is_preparing(self) -> bool {
        matches!(self, TxnState::PrepareCommit | TxnState::PrepareAbort | TxnState::PrepareEpochFence)
    }
}

/// One transactional id, as the coordinator of its `__transaction_state` partition knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxnMetadata {
    pub producer_id: i64,
    pub epoch: i16,
    pub timeout_ms: i32,
    pub state: TxnState,
    pub partitions: BTreeSet<(String, i32)>,
    pub last_update_ms: i64,
    pub start_ms: i64,
    /// A new state is being written to the log: until it is, this one stands and other
    /// requests are answered CONCURRENT_TRANSACTIONS (Kafka's `pendingState`).
    pub pending: bool,
    /// The producer id before the last write, and the epoch a producer that asked for the
    /// current one by naming its own held (-1 when the current epoch fenced the holder of the
    /// previous one): a retried bump whose answer was lost names these and gets the current
    /// id and epoch again (KIP-360). Not in the log's v0 value, so a new coordinator starts
    /// without them, as Kafka's does.
    pub last_producer_id: i64,
    pub last_epoch: i16,
}

impl TxnMetadata {
    pub fn to_value(&self) -> TxnLogValue {
        TxnLogValue {
            producer_id: self.producer_id,
            producer_epoch: self.epoch,
            timeout_ms: self.timeout_ms,
            state: self.state,
            partitions: self.partitions.iter().cloned().collect(),
            last_update_ms: self.last_update_ms,
            start_ms: self.start_ms,
        }
    }

    pub fn from_value(v: &TxnLogValue) -> TxnMetadata {
        TxnMetadata {
            producer_id: v.producer_id,
            epoch: v.producer_epoch,
            timeout_ms: v.timeout_ms,
            state: v.state,
            partitions: v.partitions.iter().cloned().collect(),
            last_update_ms: v.last_update_ms,
            start_ms: v.start_ms,
            pending: false,
            last_producer_id: -1,
            last_epoch: -1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_roundtrip() {
        for c in 0..8 {
            assert_eq!(TxnState::from_code(c).map(TxnState::code), Some(c));
        }
        assert_eq!(TxnState::from_code(8), None);
    }
}
