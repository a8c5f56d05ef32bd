//! Log cleaner throughput next to the disk's sequential write speed, in one run.
//!
//!     cargo bench --bench cleaner_bench            # 1 GiB dirty log of 1 KiB records
//!     GREGOR_BENCH_MB=256 cargo bench --bench cleaner_bench
//!
//! The log: keyed 1 KiB records, 10% of them live (each key written 10 times), 100 records a
//! batch, 128 MiB segments. Reported: the cleaner's pass over the whole dirty log (MB of log
//! read per second, MB written), and a plain sequential write of the same size with one fsync
//! (what `dd conv=fsync` measures) in the same directory.

use std::fs;
use std::io::Write;
use std::sync::Arc;
use std::time::Instant;

use gregor::log::batch::{encode_batch, BatchOptions, SimpleRecord};
use gregor::log::cleaner::{CleanerConfig, LogCleaner};
use gregor::log::{LogConfig, LogManager};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mb: u64 = std::env::var("GREGOR_BENCH_MB").ok().and_then(|s| s.parse().ok()).unwrap_or(1024);
    let base = std::env::current_dir()?.join("target").join("cleaner_bench_tmp");
    let _ = fs::remove_dir_all(&base);
    fs::create_dir_all(&base)?;
    let config = LogConfig {
        segment_bytes: 128 << 20,
        compact: true,
        delete: false,
        min_cleanable_dirty_ratio: 0.01,
        ..LogConfig::default()
    };
    let m = Arc::new(LogManager::open(vec![base.join("logs")], config.clone())?);
    let log = m.get_or_create("bench", 0, config)?;
    let record_bytes = 1024usize;
    let total = (mb << 20) as usize / (record_bytes + 40);
    let live = (total / 10).max(1);
    let value = vec![b'v'; record_bytes];
    let ts = gregor::log::now_ms();
    let t = Instant::now();
    {
        let mut g = log.lock().map_err(|_| "poisoned")?;
        let mut i = 0usize;
        while i < total {
            let keys: Vec<String> = (i..(i + 100).min(total)).map(|n| format!("key-{:08}", n % live)).collect();
            let recs: Vec<SimpleRecord<'_>> = keys
                .iter()
                .map(|k| SimpleRecord { timestamp: ts, key: Some(k.as_bytes()), value: Some(&value), headers: vec![] })
                .collect();
            g.append(&mut encode_batch(&BatchOptions::default(), &recs), 0)?;
            i += keys.len();
        }
        let leo = g.log_end_offset();
        g.roll(leo)?;
        g.flush()?;
        // What the replica layer publishes once the records are replicated: the cleaner stops
        // at the high watermark.
        g.high_watermark_cell().store(leo, std::sync::atomic::Ordering::Release);
    }
    let size = log.lock().map_err(|_| "poisoned")?.size_bytes();
    println!(
        "dirty log: {:.0} MB, {total} records, {live} live keys (written in {:.1}s)",
        size as f64 / 1e6,
        t.elapsed().as_secs_f64()
    );

    let cleaner = LogCleaner::start(m.clone(), CleanerConfig { enable: false, ..CleanerConfig::default() });
    let t = Instant::now();
    let mut passes = 0;
    while cleaner.clean_filthiest(gregor::log::now_ms()) && passes < 100 {
        passes += 1;
    }
    let secs = t.elapsed().as_secs_f64();
    let after = log.lock().map_err(|_| "poisoned")?.size_bytes();
    let read = cleaner.stats.bytes_read.load(std::sync::atomic::Ordering::Relaxed);
    let written = cleaner.stats.bytes_written.load(std::sync::atomic::Ordering::Relaxed);
    println!(
        "cleaner: {passes} pass(es) in {secs:.2}s: {:.0} MB/s of log read, {:.0} MB written ({:.0} MB/s), log {:.0} MB -> {:.0} MB",
        read as f64 / 1e6 / secs,
        written as f64 / 1e6,
        written as f64 / 1e6 / secs,
        size as f64 / 1e6,
        after as f64 / 1e6
    );

    let path = base.join("seq-write");
    let block = vec![0x5au8; 1 << 20];
    let t = Instant::now();
    {
        let mut f = fs::File::create(&path)?;
        for _ in 0..(size >> 20).max(1) {
            f.write_all(&block)?;
        }
        f.sync_all()?;
    }
    let secs = t.elapsed().as_secs_f64();
    println!(
        "sequential write of {:.0} MB + fsync (dd conv=fsync): {:.0} MB/s",
        size as f64 / 1e6,
        size as f64 / 1e6 / secs
    );
    drop(cleaner);
    let _ = fs::remove_dir_all(&base);
    Ok(())
}
