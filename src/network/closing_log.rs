//! Log lines about refused and closed connections, at most one per client address and kind of
//! problem per `gregor.connection.log.interval.ms`.
//!
//! A client whose request is refused with a closed connection (a version it should not have
//! sent, a failed handshake) usually reconnects at once and sends the same thing again; one
//! line per attempt measured 342,321 lines (56 MB) per broker in two minutes. The first line
//! of an interval is written, the others are counted and that count is written with the next
//! line the address earns for the same kind. Kinds apart (a malformed frame, a failed
//! authentication, an expired session), so one problem's lines never hide another's.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::sync::MutexExt;

/// Addresses remembered at once. Past it, addresses whose interval has ended are forgotten
/// first; if every one is still in its interval, lines are written untracked rather than
/// letting many addresses grow the map without bound.
const MAX_TRACKED: usize = 10_000;

pub struct ClosingLog {
    interval: Duration,
    seen: Mutex<HashMap<(IpAddr, &'static str), Window>>,
}

struct Window {
    started: Instant,
    suppressed: u64,
}

impl ClosingLog {
    pub fn new(interval: Duration) -> ClosingLog {
        ClosingLog { interval, seen: Mutex::new(HashMap::new()) }
    }

    /// Whether a line of `kind` about `client` may be written now: `Some(n)` with the number
    /// of such lines suppressed since the last one, or `None` when this one is suppressed.
    pub fn admit(&self, client: IpAddr, kind: &'static str, now: Instant) -> Option<u64> {
        let key = (client, kind);
        let mut seen = self.seen.lock_unpoisoned();
        if let Some(w) = seen.get_mut(&key) {
            if now.duration_since(w.started) < self.interval {
                w.suppressed += 1;
                return None;
            }
            let suppressed = std::mem::take(&mut w.suppressed);
            w.started = now;
            return Some(suppressed);
        }
        if seen.len() >= MAX_TRACKED {
            let interval = self.interval;
            // An address whose window ended with suppressed lines loses that count here: the
            // price of the bound, and only when many addresses are misbehaving at once.
            seen.retain(|_, w| now.duration_since(w.started) < interval);
            if seen.len() >= MAX_TRACKED {
                return Some(0);
            }
        }
        seen.insert(key, Window { started: now, suppressed: 0 });
        Some(0)
    }
}

/// Writes one line of `$kind` (a `&'static str`) about a connection of `$client` (an
/// `IpAddr`) through `$log` (a [`ClosingLog`]) at `$level` (a `tracing` macro), unless the
/// address already had such a line in this interval; the count of lines left out since its
/// last one is a field of the line.
macro_rules! closing_line {
    ($log:expr, $client:expr, $kind:expr, $level:ident, $($arg:tt)+) => {
        if let Some(suppressed) = $log.admit($client, $kind, std::time::Instant::now()) {
            tracing::$level!(suppressed, $($arg)+);
        }
    };
}
pub(crate) use closing_line;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_interval_with_the_count_of_the_rest() {
        let log = ClosingLog::new(Duration::from_secs(60));
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let t0 = Instant::now();
        assert_eq!(log.admit(a, "frame", t0), Some(0));
        for i in 1..=1000 {
            assert_eq!(log.admit(a, "frame", t0 + Duration::from_millis(i)), None);
        }
        // Another address has its own interval.
        assert_eq!(log.admit(b, "frame", t0 + Duration::from_secs(1)), Some(0));
        assert_eq!(log.admit(a, "frame", t0 + Duration::from_secs(60)), Some(1000));
        assert_eq!(log.admit(a, "frame", t0 + Duration::from_secs(61)), None);
        assert_eq!(log.admit(a, "frame", t0 + Duration::from_secs(120)), Some(1));
        // Another kind of problem from the same address has its own interval.
        assert_eq!(log.admit(a, "authentication", t0 + Duration::from_secs(121)), Some(0));
    }

    #[test]
    fn the_map_stays_bounded() {
        let log = ClosingLog::new(Duration::from_secs(60));
        let t0 = Instant::now();
        for i in 0..(MAX_TRACKED as u32 + 50) {
            let ip = IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000 + i));
            assert_eq!(log.admit(ip, "frame", t0), Some(0));
        }
        assert!(log.seen.lock().unwrap().len() <= MAX_TRACKED);
        // Once their intervals end, old addresses make room for new ones.
        let late = IpAddr::from(std::net::Ipv4Addr::new(192, 168, 0, 1));
        assert_eq!(log.admit(late, "frame", t0 + Duration::from_secs(61)), Some(0));
        assert_eq!(log.seen.lock().unwrap().len(), 1);
    }
}
