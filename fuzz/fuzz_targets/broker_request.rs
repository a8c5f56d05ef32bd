//! The whole request path of an in-process standalone broker: frames are decoded, handled
//! and answered as a connection's would be (`network::RequestPath`), without a socket. The
//! input is a connection's byte stream, size-prefixed frames one after another; as on a real
//! connection, the first frame refused ends it.
//!
//! Time is paused (tokio's test clock, advanced whenever the broker is idle), so a long-poll
//! fetch or a join waiting out a rebalance costs no wall time, while a handler that never
//! yields still trips libFuzzer's -timeout: that is a stall. The broker keeps its state
//! across inputs (topics created by one input are there for the next, as in a real run) and
//! is replaced by a fresh one every RESTART_EVERY inputs, so state and disk use stay bounded.
#![no_main]
use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use gregor::broker::Broker;
use gregor::config::BrokerConfig;
use gregor::network::RequestPath;
use libfuzzer_sys::fuzz_target;

const RESTART_EVERY: u64 = 20_000;
const MAX_FRAME: usize = 1 << 20;
/// Virtual time a request may stay parked before the input moves on. A request may ask to
/// wait long (Fetch's max_wait_ms is an int32 of milliseconds, and Kafka honours it), which is
/// not a stall; one that spins without yielding still trips -timeout in real time.
const PARK_LIMIT: std::time::Duration = std::time::Duration::from_secs(600);

struct Harness {
    rt: tokio::runtime::Runtime,
    broker: Option<Arc<Broker>>,
    dir: PathBuf,
    runs: u64,
}

thread_local! {
    static HARNESS: RefCell<Option<Harness>> = const { RefCell::new(None) };
}

fn start_broker(rt: &tokio::runtime::Runtime, dir: &Path) -> Arc<Broker> {
    let _ = std::fs::remove_dir_all(dir);
    let overrides: Vec<String> = [
        format!("log.dirs={}", dir.display()),
        "broker.id=0".into(),
        "listeners=PLAINTEXT://127.0.0.1:9092".into(),
        "offsets.topic.num.partitions=2".into(),
        "offsets.topic.replication.factor=1".into(),
        "transaction.state.log.num.partitions=2".into(),
        "transaction.state.log.replication.factor=1".into(),
        "transaction.state.log.min.isr=1".into(),
        // Bounds, as an operator may set them, so that each created partition (a directory
        // and files on disk) stays cheap for a run of millions of inputs.
        "gregor.max.partitions.per.topic=8".into(),
        "gregor.max.partitions.per.request=16".into(),
        "log.segment.bytes=65536".into(),
    ]
    .into();
    let config = BrokerConfig::load(None, &overrides, std::iter::empty()).expect("fuzz broker config");
    rt.block_on(async {
        let broker = Broker::start(config).await.expect("start the fuzz broker");
        // The timers requests wait on: a join completes when the group timer sees the
        // rebalance through.
        broker.start_group_coordinator();
        broker.spawn_isr_expiry();
        broker
    })
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().start_paused(true).build().expect("runtime")
}

fn harness() -> Harness {
    let rt = runtime();
    let base = if Path::new("/dev/shm").is_dir() { PathBuf::from("/dev/shm") } else { std::env::temp_dir() };
    let dir = tempfile::Builder::new().prefix("gregor-fuzz-broker").tempdir_in(base).expect("temp dir").keep();
    let broker = Some(start_broker(&rt, &dir.join("data")));
    Harness { rt, broker, dir, runs: 0 }
}

fuzz_target!(|data: &[u8]| {
    HARNESS.with(|h| {
        let mut h = h.borrow_mut();
        let h = h.get_or_insert_with(harness);
        h.runs += 1;
        if h.runs % RESTART_EVERY == 0 {
            if let Some(old) = h.broker.take() {
                old.shutdown();
            }
            // A new runtime: dropping the old one ends the old broker's timers and parked requests.
            h.rt = runtime();
            h.broker = Some(start_broker(&h.rt, &h.dir.join("data")));
        }
        let Some(broker) = h.broker.clone() else { return };
        let path = RequestPath::new(broker.components(), Arc::from("PLAINTEXT"), "/127.0.0.1".into());
        h.rt.block_on(async {
            let mut rest = data;
            while rest.len() >= 4 {
                let size = i32::from_be_bytes([rest[0], rest[1], rest[2], rest[3]]);
                if size < 0 || size as usize > MAX_FRAME {
                    break;
                }
                let size = (size as usize).min(rest.len() - 4);
                let frame = Bytes::copy_from_slice(&rest[4..4 + size]);
                rest = &rest[4 + size..];
                let correlation_id = frame.get(4..8).map(|b| [b[0], b[1], b[2], b[3]]);
                let Ok(result) = tokio::time::timeout(PARK_LIMIT, path.process(frame)).await else {
                    // Parked as asked (a fetch may ask for days): the client would give up.
                    break;
                };
                match result {
                    Ok(Some(response)) => {
                        let len = i32::from_be_bytes([response[0], response[1], response[2], response[3]]);
                        assert_eq!(len as usize, response.len() - 4, "response length prefix");
                        let echoed = [response[4], response[5], response[6], response[7]];
                        assert_eq!(Some(echoed), correlation_id, "correlation id not echoed");
                    }
                    Ok(None) => {}
                    Err(_) => break,
                }
            }
        });
    });
});
