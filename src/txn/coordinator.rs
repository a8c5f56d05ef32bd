//! The transaction coordinator's rules (Kafka's `TransactionCoordinator` and
//! `TransactionStateManager`), without I/O: each request is one step taken under the lock,
//! which checks the request against the transaction's state and, when the state must change,
//! marks the transaction pending and returns the new state for the caller to write to
//! `__transaction_state`. Only once that write is replicated does the caller apply it
//! ([`TransactionCoordinator::complete_write`]); meanwhile other requests for the id are told
//! CONCURRENT_TRANSACTIONS, so the log's order is the order applied.

use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, MutexGuard};

use super::state::{TxnMetadata, TxnState};
use crate::protocol::ErrorCode;
use crate::sync::MutexExt;

pub use crate::config::TxnConfig;

/// What InitProducerId must do next.
#[derive(Debug, PartialEq, Eq)]
pub enum InitStep {
    /// Allocate a producer id, then ask again with it.
    NeedProducerId,
    /// Write this state, then answer with its producer id and epoch.
    Write(TxnMetadata),
    /// The previous incarnation left a transaction open: write this (PrepareAbort, epoch
    /// bumped so the old producer is fenced), then complete the abort. The client is told
    /// CONCURRENT_TRANSACTIONS and retries, as Kafka answers.
    AbortFirst(TxnMetadata),
}

pub struct TransactionCoordinator {
    config: TxnConfig,
    txns: Mutex<HashMap<String, TxnMetadata>>,
    /// `__transaction_state` partitions being loaded.
    loading: Mutex<HashSet<i32>>,
    /// The leader epoch of each `__transaction_state` partition led here: the coordinator
    /// epoch its markers carry.
    epochs: Mutex<HashMap<i32, i32>>,
    /// On the partition-leader side: the producers (id -> epoch) whose coordinator on another
    /// broker confirmed that their ongoing transaction added the partition. Kept until the
    /// partition's marker for the producer, so each partition costs one round trip per
    /// transaction rather than one per produce.
    verified: Mutex<HashMap<(String, i32), HashMap<i64, i16>>>,
    /// Per partition, how often its confirmations were forgotten (a marker, a leadership
    /// change). A confirmation asked for before a marker and answered after it would let a
    /// late write land behind the marker, with no marker left to end it: it is kept only if
    /// this count did not move while it was asked. Locked before `verified`.
    forgotten: Mutex<HashMap<(String, i32), u64>>,
}

fn guard<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Each step below leaves the map consistent before anything that could panic.
    m.lock_unpoisoned()
}

/// The next epoch, or None when the epoch space is spent and a new producer id is needed.
fn next_epoch(epoch: i16) -> Option<i16> {
    (epoch < i16::MAX - 1).then_some(epoch + 1)
}

impl TransactionCoordinator {
    pub fn new(config: TxnConfig) -> TransactionCoordinator {
        TransactionCoordinator {
            config,
            txns: Mutex::new(HashMap::new()),
            loading: Mutex::new(HashSet::new()),
            epochs: Mutex::new(HashMap::new()),
            verified: Mutex::new(HashMap::new()),
            forgotten: Mutex::new(HashMap::new()),
        }
    }

    pub fn config(&self) -> &TxnConfig {
        &self.config
    }

    pub fn set_loading(&self, partition: i32, loading: bool) {
        let mut l = guard(&self.loading);
        if loading {
            l.insert(partition);
        } else {
            l.remove(&partition);
        }
    }

    pub fn is_loading(&self, partition: i32) -> bool {
        guard(&self.loading).contains(&partition)
    }

    pub fn coordinator_epoch(&self, partition: i32) -> Option<i32> {
        guard(&self.epochs).get(&partition).copied()
    }

    pub fn get(&self, id: &str) -> Option<TxnMetadata> {
        guard(&self.txns).get(id).cloned()
    }

    /// Whether a transactional produce of `pid`/`epoch` to `tp` belongs to an ongoing
    /// transaction that added the partition (KIP-890's check, made where the state is).
    pub fn verify_partition(&self, id: &str, pid: i64, epoch: i16, tp: &(String, i32)) -> Result<(), i16> {
        let txns = guard(&self.txns);
        let Some(m) = txns.get(id) else { return Err(ErrorCode::InvalidTxnState.code()) };
        if m.producer_id == pid && epoch < m.epoch {
            return Err(ErrorCode::InvalidProducerEpoch.code());
        }
        if m.producer_id == pid && m.epoch == epoch && m.state == TxnState::Ongoing && m.partitions.contains(tp) {
            Ok(())
        } else {
            Err(ErrorCode::InvalidTxnState.code())
        }
    }

    /// AddPartitionsToTxn v4 with verify_only, from a partition leader: per partition, whether
    /// the producer's ongoing transaction added it. Errors as Kafka's coordinator answers them
    /// (the leader turns them into what the producer understands).
    pub fn verify_only(&self, id: &str, pid: i64, epoch: i16, tps: &[(String, i32)]) -> Vec<((String, i32), i16)> {
        let txns = guard(&self.txns);
        let all = |code: i16| tps.iter().map(|tp| (tp.clone(), code)).collect();
        let Some(m) = txns.get(id) else { return all(ErrorCode::InvalidProducerIdMapping.code()) };
        if m.producer_id != pid {
            return all(ErrorCode::InvalidProducerIdMapping.code());
        }
        if m.epoch != epoch {
            return all(ErrorCode::ProducerFenced.code());
        }
        if matches!(m.state, TxnState::PrepareCommit | TxnState::PrepareAbort) {
            return all(ErrorCode::ConcurrentTransactions.code());
        }
        tps.iter()
            .map(|tp| {
                let code = if m.state == TxnState::Ongoing && m.partitions.contains(tp) {
                    // Already added and written: a pending write (more partitions being
                    // added, the producer adding while batches are in flight) does not
                    // change that.
                    ErrorCode::None.code()
                } else if m.pending {
                    // Possibly being added right now: ask again shortly.
                    ErrorCode::ConcurrentTransactions.code()
                } else {
                    ErrorCode::InvalidTxnState.code()
                };
                (tp.clone(), code)
            })
            .collect()
    }

    /// Whether a coordinator elsewhere already confirmed `tp` for this producer and epoch.
    pub fn is_verified(&self, tp: &(String, i32), pid: i64, epoch: i16) -> bool {
        guard(&self.verified).get(tp).and_then(|m| m.get(&pid)).is_some_and(|&e| e == epoch)
    }

    /// Taken before asking the coordinator, and handed to [`Self::mark_verified`].
    pub fn verification_round(&self, tp: &(String, i32)) -> u64 {
        guard(&self.forgotten).get(tp).copied().unwrap_or(0)
    }

    /// Keeps a confirmation asked for in `round`; false if the partition's confirmations were
    /// forgotten since (the answer may predate a marker).
    pub fn mark_verified(&self, tp: &(String, i32), pid: i64, epoch: i16, round: u64) -> bool {
        let forgotten = guard(&self.forgotten);
        if forgotten.get(tp).copied().unwrap_or(0) != round {
            return false;
        }
        guard(&self.verified).entry(tp.clone()).or_default().insert(pid, epoch);
        true
    }

    fn next_round(forgotten: &mut HashMap<(String, i32), u64>, tp: &(String, i32)) {
        let n = forgotten.entry(tp.clone()).or_default();
        *n = n.wrapping_add(1);
    }

    /// The transaction ended on `tp` (its marker is written): the next one verifies again.
    pub fn forget_verified(&self, tp: &(String, i32), pid: i64) {
        let mut forgotten = guard(&self.forgotten);
        Self::next_round(&mut forgotten, tp);
        let mut v = guard(&self.verified);
        if let Some(m) = v.get_mut(tp) {
            m.remove(&pid);
            if m.is_empty() {
                v.remove(tp);
            }
        }
    }

    /// This broker became `tp`'s leader: what it confirmed in an earlier term may predate a
    /// marker written by another leader meanwhile.
    pub fn forget_partition(&self, tp: &(String, i32)) {
        let mut forgotten = guard(&self.forgotten);
        Self::next_round(&mut forgotten, tp);
        guard(&self.verified).remove(tp);
    }

    /// Every transaction known here, for ListTransactions.
    pub fn all(&self) -> Vec<(String, TxnMetadata)> {
        guard(&self.txns).iter().map(|(k, v)| (k.clone(), v.clone())).collect()
    }

    /// InitProducerId. `expected` is the producer id and epoch the client holds, when it asks
    /// for a bump of its own epoch (KIP-360) rather than to fence whoever holds the id.
    pub fn prepare_init(
        &self,
        id: &str,
        timeout_ms: i32,
        expected: Option<(i64, i16)>,
        new_pid: Option<i64>,
        now: i64,
    ) -> Result<InitStep, i16> {
        if timeout_ms <= 0 || timeout_ms > self.config.max_timeout_ms {
            return Err(ErrorCode::InvalidTransactionTimeout.code());
        }
        let mut txns = guard(&self.txns);
        let fresh = |pid: i64| TxnMetadata {
            producer_id: pid,
            epoch: 0,
            timeout_ms,
            state: TxnState::Empty,
            partitions: Default::default(),
            last_update_ms: now,
            start_ms: -1,
            pending: false,
            last_producer_id: -1,
            last_epoch: -1,
        };
        let Some(m) = txns.get_mut(id) else {
            // Whatever the client held is gone (expired, or never written): like a first
            // init, which is how a producer recovers from UNKNOWN_PRODUCER_ID.
            let Some(pid) = new_pid else { return Ok(InitStep::NeedProducerId) };
            // A placeholder that holds the id while its first state is written; epoch -1 says
            // it has never been written, so a failed write removes it.
            txns.insert(id.to_string(), TxnMetadata { epoch: -1, pending: true, ..fresh(pid) });
            return Ok(InitStep::Write(fresh(pid)));
        };
        if m.pending {
            return Err(ErrorCode::ConcurrentTransactions.code());
        }
        // A client naming another producer id is fenced, unless it is the id this one replaced
        // with its epochs spent: a retry of the bump that rotated the id.
        if let Some((pid, epoch)) = expected {
            if m.epoch >= 0 && pid != m.producer_id && !(pid == m.last_producer_id && next_epoch(epoch).is_none()) {
                return Err(ErrorCode::ProducerFenced.code());
            }
        }
        if m.state.is_preparing() {
            return Err(ErrorCode::ConcurrentTransactions.code());
        }
        if m.state == TxnState::Ongoing {
            // Whoever asks, the open transaction is aborted under a new epoch first; the
            // client's retry then bumps again from there.
            let mut target = m.clone();
            target.epoch = next_epoch(m.epoch).unwrap_or(m.epoch);
            target.last_epoch = -1;
            target.state = TxnState::PrepareAbort;
            target.last_update_ms = now;
            m.pending = true;
            return Ok(InitStep::AbortFirst(target));
        }
        let expected_epoch = expected.map(|(_, e)| e);
        let (producer_id, epoch, last_epoch) = match next_epoch(m.epoch) {
            // Epochs spent, and the client (if it named one) holds the last of them: a new id.
            None if expected_epoch.is_none_or(|e| e == m.epoch) => match new_pid {
                Some(pid) => (pid, 0, if expected.is_some() { m.epoch } else { -1 }),
                None => return Ok(InitStep::NeedProducerId),
            },
            bumped => match expected_epoch {
                None => (m.producer_id, bumped.unwrap_or(m.epoch), -1),
                Some(e) if e == m.epoch => (m.producer_id, bumped.unwrap_or(m.epoch), m.epoch),
                // The client's previous bump succeeded but it never heard: the same answer.
                Some(e) if e == m.last_epoch => (m.producer_id, m.epoch, m.last_epoch),
                Some(_) => return Err(ErrorCode::ProducerFenced.code()),
            },
        };
        let target = TxnMetadata { epoch, last_epoch, ..fresh(producer_id) };
        m.pending = true;
        Ok(InitStep::Write(target))
    }

    fn check_producer<'a>(
        txns: &'a mut HashMap<String, TxnMetadata>,
        id: &str,
        pid: i64,
        epoch: i16,
    ) -> Result<&'a mut TxnMetadata, i16> {
        let m = txns.get_mut(id).ok_or(ErrorCode::InvalidProducerIdMapping.code())?;
        if m.producer_id != pid || m.epoch < 0 {
            return Err(ErrorCode::InvalidProducerIdMapping.code());
        }
        if m.epoch != epoch {
            return Err(ErrorCode::ProducerFenced.code());
        }
        if m.pending {
            return Err(ErrorCode::ConcurrentTransactions.code());
        }
        Ok(m)
    }

    /// AddPartitionsToTxn / AddOffsetsToTxn. Ok(None): nothing new to write.
    pub fn prepare_add_partitions(
        &self,
        id: &str,
        pid: i64,
        epoch: i16,
        partitions: &[(String, i32)],
        now: i64,
    ) -> Result<Option<TxnMetadata>, i16> {
        let mut txns = guard(&self.txns);
        let m = Self::check_producer(&mut txns, id, pid, epoch)?;
        match m.state {
            s if s.is_preparing() => return Err(ErrorCode::ConcurrentTransactions.code()),
            TxnState::Dead => return Err(ErrorCode::InvalidTxnState.code()),
            TxnState::Ongoing if partitions.iter().all(|p| m.partitions.contains(p)) => return Ok(None),
            _ => {}
        }
        let mut target = m.clone();
        if m.state != TxnState::Ongoing {
            target.start_ms = now;
            target.partitions.clear();
        }
        target.state = TxnState::Ongoing;
        target.partitions.extend(partitions.iter().cloned());
        target.last_update_ms = now;
        m.pending = true;
        Ok(Some(target))
    }

    /// EndTxn. Ok(None): already ended that way (a retry), nothing to write.
    pub fn prepare_end(
        &self,
        id: &str,
        pid: i64,
        epoch: i16,
        commit: bool,
        now: i64,
    ) -> Result<Option<TxnMetadata>, i16> {
        let mut txns = guard(&self.txns);
        let m = Self::check_producer(&mut txns, id, pid, epoch)?;
        match (m.state, commit) {
            (TxnState::Ongoing, _) => {
                let mut target = m.clone();
                target.state = if commit { TxnState::PrepareCommit } else { TxnState::PrepareAbort };
                target.last_update_ms = now;
                m.pending = true;
                Ok(Some(target))
            }
            (TxnState::CompleteCommit, true) | (TxnState::CompleteAbort, false) => Ok(None),
            (TxnState::PrepareCommit, true) | (TxnState::PrepareAbort, false) => {
                Err(ErrorCode::ConcurrentTransactions.code())
            }
            _ => Err(ErrorCode::InvalidTxnState.code()),
        }
    }

    /// After the markers of a prepared transaction are written: its Complete state, if it is
    /// still the transaction `prepared` describes.
    pub fn prepare_complete(&self, id: &str, prepared: &TxnMetadata, now: i64) -> Option<TxnMetadata> {
        let mut txns = guard(&self.txns);
        let m = txns.get_mut(id)?;
        if m.pending || m.producer_id != prepared.producer_id || m.epoch != prepared.epoch || m.state != prepared.state
        {
            return None;
        }
        let mut target = m.clone();
        target.state = match m.state {
            TxnState::PrepareCommit => TxnState::CompleteCommit,
            TxnState::PrepareAbort => TxnState::CompleteAbort,
            _ => return None,
        };
        target.partitions.clear();
        target.last_update_ms = now;
        m.pending = true;
        Some(target)
    }

    /// Applies a state once it is in the log (Some), or gives up a transition whose write
    /// failed (None).
    pub fn complete_write(&self, id: &str, written: Option<TxnMetadata>) {
        let mut txns = guard(&self.txns);
        match written {
            Some(t) => {
                // Unloaded meanwhile (leadership moved): the new coordinator reads the log.
                if let Some(m) = txns.get_mut(id) {
                    *m = TxnMetadata { pending: false, last_producer_id: m.producer_id, ..t };
                }
            }
            None => {
                if txns.get(id).is_some_and(|m| m.epoch < 0) {
                    txns.remove(id);
                } else if let Some(m) = txns.get_mut(id) {
                    m.pending = false;
                }
            }
        }
    }

    /// Open transactions past their timeout, each marked pending with its abort (epoch bumped,
    /// so the producer that left it open is fenced).
    pub fn timed_out(&self, now: i64) -> Vec<(String, TxnMetadata)> {
        let mut txns = guard(&self.txns);
        let mut out = Vec::new();
        for (id, m) in txns.iter_mut() {
            if m.pending || m.state != TxnState::Ongoing || m.start_ms.saturating_add(m.timeout_ms as i64) > now {
                continue;
            }
            let mut target = m.clone();
            target.epoch = next_epoch(m.epoch).unwrap_or(m.epoch);
            target.last_epoch = -1;
            target.state = TxnState::PrepareAbort;
            target.last_update_ms = now;
            m.pending = true;
            out.push((id.clone(), target));
        }
        out
    }

    /// Replaces what is known of `partition`'s transactional ids with what its log holds;
    /// returns those whose markers were still being written, for the caller to finish.
    pub fn load(
        &self,
        partition: i32,
        coordinator_epoch: i32,
        loaded: HashMap<String, TxnMetadata>,
        owned: impl Fn(&str) -> bool,
    ) -> Vec<(String, TxnMetadata)> {
        let mut txns = guard(&self.txns);
        txns.retain(|id, _| !owned(id));
        let resume: Vec<(String, TxnMetadata)> =
            loaded.iter().filter(|(_, m)| m.state.is_preparing()).map(|(k, v)| (k.clone(), v.clone())).collect();
        txns.extend(loaded);
        drop(txns);
        guard(&self.epochs).insert(partition, coordinator_epoch);
        resume
    }

    /// Forgets `partition`'s transactional ids after leadership moved away.
    pub fn unload(&self, partition: i32, owned: impl Fn(&str) -> bool) -> usize {
        guard(&self.epochs).remove(&partition);
        let mut txns = guard(&self.txns);
        let before = txns.len();
        txns.retain(|id, _| !owned(id));
        before - txns.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn coordinator() -> TransactionCoordinator {
        TransactionCoordinator::new(TxnConfig {
            max_timeout_ms: 900_000,
            abort_check_interval_ms: 10_000,
            verify_partitions: true,
        })
    }

    fn written(c: &TransactionCoordinator, id: &str, step: Result<InitStep, i16>) -> TxnMetadata {
        let Ok(InitStep::Write(t)) = step else { panic!("expected a write, got {step:?}") };
        c.complete_write(id, Some(t.clone()));
        t
    }

    #[test]
    fn init_allocates_then_bumps_the_epoch() {
        let c = coordinator();
        assert_eq!(c.prepare_init("t", 1000, None, None, 0), Ok(InitStep::NeedProducerId));
        assert_eq!(c.prepare_init("t", 900_001, None, None, 0), Err(ErrorCode::InvalidTransactionTimeout.code()));
        let first = written(&c, "t", c.prepare_init("t", 1000, None, Some(5), 0));
        assert_eq!((first.producer_id, first.epoch, first.state), (5, 0, TxnState::Empty));
        let second = written(&c, "t", c.prepare_init("t", 1000, None, None, 1));
        assert_eq!((second.producer_id, second.epoch), (5, 1));
        // The first incarnation is fenced.
        assert_eq!(c.prepare_add_partitions("t", 5, 0, &[("a".into(), 0)], 2), Err(ErrorCode::ProducerFenced.code()));
        assert_eq!(
            c.prepare_add_partitions("t", 6, 1, &[("a".into(), 0)], 2),
            Err(ErrorCode::InvalidProducerIdMapping.code())
        );
    }

    #[test]
    fn a_failed_first_write_leaves_nothing_behind() {
        let c = coordinator();
        let Ok(InitStep::Write(_)) = c.prepare_init("t", 1000, None, Some(5), 0) else { panic!() };
        assert_eq!(c.prepare_init("t", 1000, None, Some(6), 0), Err(ErrorCode::ConcurrentTransactions.code()));
        c.complete_write("t", None);
        assert_eq!(c.get("t"), None);
    }

    #[test]
    fn a_transaction_runs_through_its_states() {
        let c = coordinator();
        let m = written(&c, "t", c.prepare_init("t", 1000, None, Some(5), 0));
        let add = c.prepare_add_partitions("t", 5, m.epoch, &[("a".into(), 0)], 10).unwrap().unwrap();
        assert_eq!(c.prepare_end("t", 5, 0, true, 11), Err(ErrorCode::ConcurrentTransactions.code()), "pending write");
        c.complete_write("t", Some(add));
        assert_eq!(c.prepare_add_partitions("t", 5, 0, &[("a".into(), 0)], 11), Ok(None));
        let prep = c.prepare_end("t", 5, 0, true, 12).unwrap().unwrap();
        assert_eq!(prep.state, TxnState::PrepareCommit);
        c.complete_write("t", Some(prep.clone()));
        assert_eq!(c.prepare_end("t", 5, 0, true, 12), Err(ErrorCode::ConcurrentTransactions.code()));
        assert_eq!(
            c.prepare_add_partitions("t", 5, 0, &[("b".into(), 0)], 12),
            Err(ErrorCode::ConcurrentTransactions.code())
        );
        let done = c.prepare_complete("t", &prep, 13).unwrap();
        assert!(done.partitions.is_empty());
        c.complete_write("t", Some(done));
        assert_eq!(c.prepare_end("t", 5, 0, true, 14), Ok(None), "a retried commit succeeds");
        assert_eq!(c.prepare_end("t", 5, 0, false, 14), Err(ErrorCode::InvalidTxnState.code()));
        // The next transaction starts afresh.
        let next = c.prepare_add_partitions("t", 5, 0, &[("b".into(), 1)], 20).unwrap().unwrap();
        assert_eq!(next.partitions.len(), 1);
        assert_eq!(next.start_ms, 20);
    }

    /// A coordinator that holds `state` for "t" (producer 5, epoch 3), as loaded from the log.
    fn loaded_with(state: TxnState) -> TransactionCoordinator {
        let c = coordinator();
        let m = TxnMetadata {
            producer_id: 5,
            epoch: 3,
            timeout_ms: 1000,
            state,
            partitions: [("a".to_string(), 0)].into_iter().collect(),
            last_update_ms: 0,
            start_ms: 0,
            pending: false,
            last_producer_id: -1,
            last_epoch: -1,
        };
        c.load(7, 2, HashMap::from([("t".to_string(), m)]), |_| true);
        c
    }

    #[test]
    fn end_txn_answers_each_state_as_kafka_does() {
        use TxnState::*;
        // (state, commit?) -> the answer to a client's EndTxn with the current producer id and
        // epoch: Kafka's TransactionCoordinator rules (a retry of the result already reached is
        // NONE, of one being reached CONCURRENT_TRANSACTIONS, the opposite result
        // INVALID_TXN_STATE).
        let cases = [
            (Empty, true, Err(ErrorCode::InvalidTxnState.code())),
            (Empty, false, Err(ErrorCode::InvalidTxnState.code())),
            (PrepareCommit, true, Err(ErrorCode::ConcurrentTransactions.code())),
            (PrepareCommit, false, Err(ErrorCode::InvalidTxnState.code())),
            (PrepareAbort, false, Err(ErrorCode::ConcurrentTransactions.code())),
            (PrepareAbort, true, Err(ErrorCode::InvalidTxnState.code())),
            (CompleteCommit, true, Ok(None)),
            (CompleteCommit, false, Err(ErrorCode::InvalidTxnState.code())),
            (CompleteAbort, false, Ok(None)),
            (CompleteAbort, true, Err(ErrorCode::InvalidTxnState.code())),
            (Dead, true, Err(ErrorCode::InvalidTxnState.code())),
            (Dead, false, Err(ErrorCode::InvalidTxnState.code())),
        ];
        for (state, commit, want) in cases {
            let c = loaded_with(state);
            assert_eq!(c.prepare_end("t", 5, 3, commit, 1), want, "{state:?}, commit={commit}");
            assert_eq!(c.get("t").map(|m| (m.state, m.pending)), Some((state, false)), "{state:?} unchanged");
        }
        for commit in [true, false] {
            let c = loaded_with(Ongoing);
            let t = c.prepare_end("t", 5, 3, commit, 1).unwrap().unwrap();
            assert_eq!(t.state, if commit { PrepareCommit } else { PrepareAbort });
            assert_eq!((t.producer_id, t.epoch, t.partitions.len()), (5, 3, 1));
            // While it is being written, a retry of either kind waits.
            assert_eq!(c.prepare_end("t", 5, 3, commit, 2), Err(ErrorCode::ConcurrentTransactions.code()));
            assert_eq!(c.prepare_end("t", 5, 3, !commit, 2), Err(ErrorCode::ConcurrentTransactions.code()));
        }
        // The producer is checked before the state, in every state.
        for state in [Ongoing, PrepareCommit, CompleteCommit] {
            let c = loaded_with(state);
            assert_eq!(
                c.prepare_end("t", 5, 2, true, 1),
                Err(ErrorCode::ProducerFenced.code()),
                "older epoch, {state:?}"
            );
            assert_eq!(
                c.prepare_end("t", 5, 4, true, 1),
                Err(ErrorCode::ProducerFenced.code()),
                "newer epoch, {state:?}"
            );
            assert_eq!(c.prepare_end("t", 6, 3, true, 1), Err(ErrorCode::InvalidProducerIdMapping.code()), "{state:?}");
            assert_eq!(
                c.prepare_end("u", 5, 3, true, 1),
                Err(ErrorCode::InvalidProducerIdMapping.code()),
                "unknown id"
            );
        }
    }

    #[test]
    fn a_coordinator_that_loads_a_prepared_commit_finishes_it_before_answering_retries() {
        // The previous coordinator wrote PrepareCommit and went away before the markers: this
        // one resumes it, and the client's retried EndTxn waits for the markers, then succeeds.
        let c = loaded_with(TxnState::PrepareCommit);
        let resume = c.load(7, 3, HashMap::from([("t".to_string(), c.get("t").unwrap())]), |_| true);
        assert_eq!(resume.len(), 1, "the prepared transaction is handed back to be finished");
        let prepared = resume[0].1.clone();
        assert_eq!(c.coordinator_epoch(7), Some(3));
        assert_eq!(c.prepare_end("t", 5, 3, true, 1), Err(ErrorCode::ConcurrentTransactions.code()));
        assert_eq!(
            c.prepare_add_partitions("t", 5, 3, &[("b".into(), 0)], 1),
            Err(ErrorCode::ConcurrentTransactions.code())
        );
        assert_eq!(c.prepare_init("t", 1000, None, None, 1), Err(ErrorCode::ConcurrentTransactions.code()));
        let done = c.prepare_complete("t", &prepared, 2).unwrap();
        assert_eq!(done.state, TxnState::CompleteCommit);
        assert_eq!(
            c.prepare_end("t", 5, 3, true, 2),
            Err(ErrorCode::ConcurrentTransactions.code()),
            "completion being written"
        );
        c.complete_write("t", Some(done));
        assert_eq!(c.prepare_end("t", 5, 3, true, 3), Ok(None));
        assert_eq!(c.prepare_end("t", 5, 3, false, 3), Err(ErrorCode::InvalidTxnState.code()));
        // A completion whose write failed leaves the prepared state to finish again.
        let c = loaded_with(TxnState::PrepareAbort);
        let prepared = c.get("t").unwrap();
        assert!(c.prepare_complete("t", &prepared, 1).is_some());
        c.complete_write("t", None);
        assert_eq!(c.get("t").map(|m| (m.state, m.pending)), Some((TxnState::PrepareAbort, false)));
        assert_eq!(c.prepare_end("t", 5, 3, false, 2), Err(ErrorCode::ConcurrentTransactions.code()));
    }

    #[test]
    fn verify_only_answers_per_partition_as_the_coordinator_knows_it() {
        let c = coordinator();
        let (a0, a1) = (("a".to_string(), 0), ("a".to_string(), 1));
        assert_eq!(
            c.verify_only("t", 5, 0, std::slice::from_ref(&a0)),
            vec![(a0.clone(), ErrorCode::InvalidProducerIdMapping.code())]
        );
        let m = written(&c, "t", c.prepare_init("t", 1000, None, Some(5), 0));
        assert_eq!(
            c.verify_only("t", 5, 0, std::slice::from_ref(&a0)),
            vec![(a0.clone(), ErrorCode::InvalidTxnState.code())],
            "not added yet"
        );
        let add = c.prepare_add_partitions("t", 5, m.epoch, std::slice::from_ref(&a0), 10).unwrap().unwrap();
        assert_eq!(
            c.verify_only("t", 5, 0, std::slice::from_ref(&a0)),
            vec![(a0.clone(), ErrorCode::ConcurrentTransactions.code())]
        );
        c.complete_write("t", Some(add));
        assert_eq!(
            c.verify_only("t", 5, 0, &[a0.clone(), a1.clone()]),
            vec![(a0.clone(), ErrorCode::None.code()), (a1.clone(), ErrorCode::InvalidTxnState.code())]
        );
        // Adding a1 does not hold up writes to a0, already in the transaction.
        let add = c.prepare_add_partitions("t", 5, m.epoch, std::slice::from_ref(&a1), 11).unwrap().unwrap();
        assert_eq!(
            c.verify_only("t", 5, 0, &[a0.clone(), a1.clone()]),
            vec![(a0.clone(), ErrorCode::None.code()), (a1.clone(), ErrorCode::ConcurrentTransactions.code())]
        );
        c.complete_write("t", Some(add));
        assert_eq!(
            c.verify_only("t", 5, 1, std::slice::from_ref(&a0)),
            vec![(a0.clone(), ErrorCode::ProducerFenced.code())]
        );
        assert_eq!(
            c.verify_only("t", 6, 0, std::slice::from_ref(&a0)),
            vec![(a0.clone(), ErrorCode::InvalidProducerIdMapping.code())]
        );
    }

    #[test]
    fn a_verified_partition_is_forgotten_at_its_marker_or_a_new_leadership() {
        let c = coordinator();
        let tp = ("a".to_string(), 0);
        assert!(c.mark_verified(&tp, 5, 0, c.verification_round(&tp)));
        assert!(c.is_verified(&tp, 5, 0));
        assert!(!c.is_verified(&tp, 5, 1), "another epoch is another producer");
        c.forget_verified(&tp, 5);
        assert!(!c.is_verified(&tp, 5, 0));
        assert!(c.mark_verified(&tp, 5, 0, c.verification_round(&tp)));
        c.forget_partition(&tp);
        assert!(!c.is_verified(&tp, 5, 0));
        // An answer to a question asked before a marker is not kept after it.
        let asked = c.verification_round(&tp);
        c.forget_verified(&tp, 5);
        assert!(!c.mark_verified(&tp, 5, 0, asked));
        assert!(!c.is_verified(&tp, 5, 0));
    }

    #[test]
    fn reinit_aborts_an_open_transaction_and_timeouts_fence() {
        let c = coordinator();
        written(&c, "t", c.prepare_init("t", 1000, None, Some(5), 0));
        let add = c.prepare_add_partitions("t", 5, 0, &[("a".into(), 0)], 10).unwrap().unwrap();
        c.complete_write("t", Some(add));
        assert!(c.timed_out(1009).is_empty());
        let Ok(InitStep::AbortFirst(abort)) = c.prepare_init("t", 1000, None, None, 11) else { panic!() };
        assert_eq!((abort.state, abort.epoch), (TxnState::PrepareAbort, 1));
        c.complete_write("t", None);
        let timed = c.timed_out(1010);
        assert_eq!(timed.len(), 1);
        assert_eq!((timed[0].1.state, timed[0].1.epoch), (TxnState::PrepareAbort, 1));
        assert!(c.timed_out(5000).is_empty(), "already being aborted");
    }

    /// "t" initialized twice (producer 5, epoch 1), with the Complete/Empty `state` written.
    fn bumped_once() -> TransactionCoordinator {
        let c = coordinator();
        written(&c, "t", c.prepare_init("t", 1000, None, Some(5), 0));
        written(&c, "t", c.prepare_init("t", 1000, None, None, 1));
        c
    }

    #[test]
    fn a_bump_of_the_clients_own_epoch_remembers_it_and_a_retry_gets_the_same_answer() {
        let c = bumped_once();
        let t = written(&c, "t", c.prepare_init("t", 1000, Some((5, 1)), None, 2));
        assert_eq!((t.producer_id, t.epoch, t.last_epoch), (5, 2, 1));
        // The answer was lost and the client asks again with what it held: no second bump.
        let t = written(&c, "t", c.prepare_init("t", 1000, Some((5, 1)), None, 3));
        assert_eq!((t.producer_id, t.epoch, t.last_epoch), (5, 2, 1));
        // Having heard, it bumps from its new epoch.
        let t = written(&c, "t", c.prepare_init("t", 1000, Some((5, 2)), None, 4));
        assert_eq!((t.producer_id, t.epoch, t.last_epoch), (5, 3, 2));
    }

    #[test]
    fn a_stale_or_foreign_expected_producer_is_fenced() {
        let c = bumped_once();
        // Epoch 0 was fenced by the second init (no expected epoch: last epoch forgotten).
        assert_eq!(c.prepare_init("t", 1000, Some((5, 0)), None, 2), Err(ErrorCode::ProducerFenced.code()));
        assert_eq!(
            c.prepare_init("t", 1000, Some((5, 7)), None, 2),
            Err(ErrorCode::ProducerFenced.code()),
            "an epoch never given"
        );
        assert_eq!(
            c.prepare_init("t", 1000, Some((6, 1)), None, 2),
            Err(ErrorCode::ProducerFenced.code()),
            "another producer id"
        );
        assert_eq!(c.get("t").map(|m| (m.epoch, m.pending)), Some((1, false)), "nothing written");
        // A plain init (a new incarnation) fences the bumping client's retry too.
        written(&c, "t", c.prepare_init("t", 1000, Some((5, 1)), None, 3));
        written(&c, "t", c.prepare_init("t", 1000, None, None, 4));
        assert_eq!(c.prepare_init("t", 1000, Some((5, 1)), None, 5), Err(ErrorCode::ProducerFenced.code()));
        // The fencing answer comes before the wait for a transaction being completed.
        let c = loaded_with(TxnState::PrepareCommit);
        assert_eq!(c.prepare_init("t", 1000, Some((6, 3)), None, 1), Err(ErrorCode::ProducerFenced.code()));
        assert_eq!(c.prepare_init("t", 1000, Some((5, 3)), None, 1), Err(ErrorCode::ConcurrentTransactions.code()));
    }

    #[test]
    fn an_expected_producer_with_an_open_transaction_aborts_it_first() {
        let c = bumped_once();
        let add = c.prepare_add_partitions("t", 5, 1, &[("a".into(), 0)], 10).unwrap().unwrap();
        c.complete_write("t", Some(add));
        let Ok(InitStep::AbortFirst(abort)) = c.prepare_init("t", 1000, Some((5, 1)), None, 11) else { panic!() };
        assert_eq!((abort.state, abort.epoch, abort.last_epoch), (TxnState::PrepareAbort, 2, -1));
        c.complete_write("t", Some(abort.clone()));
        assert_eq!(c.prepare_init("t", 1000, Some((5, 1)), None, 12), Err(ErrorCode::ConcurrentTransactions.code()));
        let done = c.prepare_complete("t", &abort, 13).unwrap();
        c.complete_write("t", Some(done));
        // The abort's epoch was never given to the client: its retry is fenced, as in Kafka.
        assert_eq!(c.prepare_init("t", 1000, Some((5, 1)), None, 14), Err(ErrorCode::ProducerFenced.code()));
    }

    #[test]
    fn spent_epochs_rotate_the_producer_id_and_a_retry_of_the_rotation_gets_the_new_one() {
        let c = coordinator();
        let m = TxnMetadata { epoch: i16::MAX - 1, ..loaded_with(TxnState::CompleteCommit).get("t").unwrap() };
        c.load(7, 2, HashMap::from([("t".to_string(), m)]), |_| true);
        assert_eq!(c.prepare_init("t", 1000, Some((5, i16::MAX - 1)), None, 1), Ok(InitStep::NeedProducerId));
        let t = written(&c, "t", c.prepare_init("t", 1000, Some((5, i16::MAX - 1)), Some(9), 1));
        assert_eq!((t.producer_id, t.epoch, t.last_epoch), (9, 0, i16::MAX - 1));
        assert_eq!(c.get("t").map(|m| m.last_producer_id), Some(5));
        // The client never heard and asks again with the spent id and epoch.
        let t = written(&c, "t", c.prepare_init("t", 1000, Some((5, i16::MAX - 1)), None, 2));
        assert_eq!((t.producer_id, t.epoch), (9, 0));
        // The old id with an epoch not spent is someone else's stale view.
        assert_eq!(c.prepare_init("t", 1000, Some((5, 3)), None, 3), Err(ErrorCode::ProducerFenced.code()));
    }

    #[test]
    fn an_unknown_transactional_id_gets_a_new_producer_whatever_the_client_held() {
        let c = coordinator();
        assert_eq!(c.prepare_init("t", 1000, Some((5, 3)), None, 0), Ok(InitStep::NeedProducerId));
        let t = written(&c, "t", c.prepare_init("t", 1000, Some((5, 3)), Some(8), 0));
        assert_eq!((t.producer_id, t.epoch), (8, 0));
    }
}
