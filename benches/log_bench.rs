//! Segment store throughput: append 1 KiB and 64 KiB batches to a `Log`,
//! read everything back through `read()` + `FileRange::read_into`, and
//! compare with plain `write_all` of the same bytes. Files live under
//! `./target/log_bench_tmp` (real disk, not tmpfs) and are removed after.
//! `GREGOR_BENCH_MB` overrides the 1024 MiB written per batch size.
//! Reads run right after the writes, so they mostly hit the page cache.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::Path;
use std::time::Instant;

use gregor::log::batch::{simple_batch, BatchHeader};
use gregor::log::{Log, LogConfig};

fn batch_of_size(target: usize) -> Vec<u8> {
    let mut v = target.saturating_sub(80);
    loop {
        let b = simple_batch(1, v, 1_700_000_000_000);
        if b.len() == target || v == 0 {
            return b;
        }
        if b.len() > target {
            v -= (b.len() - target).min(v);
        } else {
            v += target - b.len();
        }
    }
}

fn mbps(bytes: u64, secs: f64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0) / secs
}

fn run(base: &Path, batch_size: usize, total: u64) -> Result<(), Box<dyn std::error::Error>> {
    let template = batch_of_size(batch_size);
    let n = total / template.len() as u64;
    let bytes = n * template.len() as u64;
    let dir = base.join(format!("bench-{batch_size}"));
    let _ = fs::remove_dir_all(&dir);
    let config = LogConfig { retention_ms: -1, ..LogConfig::default() };

    // raw baseline: the same bytes with write_all, then fdatasync
    let raw_path = base.join(format!("raw-{batch_size}"));
    let t = Instant::now();
    let mut f: File = OpenOptions::new().write(true).create(true).truncate(true).open(&raw_path)?;
    for _ in 0..n {
        f.write_all(&template)?;
    }
    let raw_s = t.elapsed().as_secs_f64();
    f.sync_data()?;
    let raw_sync_s = t.elapsed().as_secs_f64();
    drop(f);
    fs::remove_file(&raw_path)?;

    // append
    let mut log = Log::open(dir.clone(), config.clone(), 0, 0, true)?;
    let mut buf = template.clone();
    let t = Instant::now();
    for _ in 0..n {
        buf.copy_from_slice(&template);
        log.append(&mut buf, 0)?;
    }
    let append_s = t.elapsed().as_secs_f64();
    log.flush()?;
    let append_sync_s = t.elapsed().as_secs_f64();

    // read everything back, 1 MiB per call like a Fetch
    let t = Instant::now();
    let mut offset = 0i64;
    let mut out = Vec::with_capacity(2 << 20);
    let mut read_bytes = 0u64;
    while offset < log.log_end_offset() {
        out.clear();
        for r in log.read(offset, 1 << 20, None)? {
            r.read_into(&mut out)?;
        }
        read_bytes += out.len() as u64;
        // next offset: walk the batch headers of what came back
        let mut pos = 0;
        while pos < out.len() {
            let h = BatchHeader::parse(&out[pos..]).ok_or("short batch")?;
            offset = h.next_offset();
            pos += h.total_size();
        }
    }
    let read_s = t.elapsed().as_secs_f64();
    assert_eq!(read_bytes, bytes);

    log.close()?;
    drop(log);
    let t = Instant::now();
    let log = Log::open(dir.clone(), config.clone(), i64::MAX, 0, true)?;
    let clean_open_ms = t.elapsed().as_secs_f64() * 1000.0;
    assert_eq!(log.log_end_offset() as u64, n);
    drop(log);
    let t = Instant::now();
    let log = Log::open(dir.clone(), config, 0, 0, false)?;
    let recover_s = t.elapsed().as_secs_f64();
    assert_eq!(log.log_end_offset() as u64, n);
    drop(log);
    fs::remove_dir_all(&dir)?;

    println!(
        "batch {:>6} B x {:>8}: append {:>7.0} MB/s ({:>6.0} MB/s incl. fsync) | read {:>7.0} MB/s | \
         raw write_all {:>7.0} MB/s ({:>6.0} MB/s incl. fdatasync) | clean reopen {:.1} ms | unclean recovery {:.2} s ({:.0} MB/s)",
        template.len(),
        n,
        mbps(bytes, append_s),
        mbps(bytes, append_sync_s),
        mbps(read_bytes, read_s),
        mbps(bytes, raw_s),
        mbps(bytes, raw_sync_s),
        clean_open_ms,
        recover_s,
        mbps(bytes, recover_s),
    );
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mb: u64 = std::env::var("GREGOR_BENCH_MB").ok().and_then(|s| s.parse().ok()).unwrap_or(1024);
    let base = std::env::current_dir()?.join("target").join("log_bench_tmp");
    fs::create_dir_all(&base)?;
    for size in [1024usize, 64 * 1024] {
        run(&base, size, mb << 20)?;
    }
    let _ = fs::remove_dir_all(&base);
    Ok(())
}
