//! Opening a partition directory: the segments found on disk, the swaps and temporary files a
//! crash left, and the recovery of what was not fsynced.

use super::*;

/// Kafka's temporary suffixes that a restart simply removes: leftovers of an interrupted
/// delete, of a cleaning that had not reached its swap, or of a checkpoint write. `.swap` is
/// different: see [`Log::open`].
const TEMP_SUFFIXES: [&str; 3] = [".deleted", ".cleaned", ".tmp"];

pub(super) fn parse_segment_name(name: &str, ext: &str) -> Option<i64> {
    let stem = name.strip_suffix(ext)?;
    if stem.len() != 20 || !stem.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    stem.parse().ok()
}

/// Finishes a cleaner swap that a crash interrupted (Kafka's rule): the `.swap` segment was
/// complete and fsynced before it got that name, so it replaces every segment whose base
/// offset falls in its offset range, and then takes its live name. `bases` (sorted) is
/// updated to match.
pub(super) fn complete_swap(dir: &Path, base: i64, bases: &mut Vec<i64>) -> Result<(), LogError> {
    let [log, _, _] = LogSegment::paths(dir, base, SWAP_SUFFIX);
    let file = std::sync::Arc::new(fs::File::open(&log)?);
    let len = file.metadata()?.len();
    let mut next = base;
    let mut sc = crate::log::segment::HeaderScanner::new(file, 0, len, 64 * 1024);
    while let Ok(Some((_, h))) = sc.next_header() {
        next = h.next_offset();
    }
    let replaced: Vec<i64> = bases.iter().copied().filter(|&b| b >= base && b < next.max(base + 1)).collect();
    for &b in &replaced {
        remove_segment_files(dir, b);
    }
    // Stale index files under the live name would describe the old segment.
    remove_segment_files(dir, base);
    fs::rename(&log, log_file_path(dir, base))?;
    sync_dir(dir)?;
    bases.retain(|b| !replaced.contains(b));
    bases.push(base);
    bases.sort_unstable();
    tracing::warn!(dir = %dir.display(), base, replaced = ?replaced, "completed an interrupted cleaner swap");
    Ok(())
}

pub(super) fn remove_segment_files(dir: &Path, base: i64) {
    for p in [
        log_file_path(dir, base),
        index_file_path(dir, base),
        time_index_file_path(dir, base),
        txn_index_file_path(dir, base),
    ] {
        if let Err(e) = fs::remove_file(&p) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(file = %p.display(), error = %e, "could not remove segment file");
            }
        }
    }
}

impl Log {
    /// Opens (creating if missing) the partition directory and loads its
    /// segments. With `had_clean_shutdown` everything is trusted after cheap
    /// index sanity checks; otherwise every segment from the one holding
    /// `recovery_point` onwards is re-validated batch by batch and cut at
    /// the first invalid byte (later segments are deleted).
    pub fn open(
        dir: PathBuf,
        config: LogConfig,
        recovery_point: i64,
        log_start_offset: i64,
        had_clean_shutdown: bool,
    ) -> Result<Log, LogError> {
        let (log, recovered) =
            Self::open_deferring_sync(dir, config, recovery_point, log_start_offset, had_clean_shutdown)?;
        if recovered {
            // Recovered data may only be in the page cache; make it durable
            // before claiming it as recovered.
            log.sync_all_segments()?;
        }
        Ok(log)
    }

    /// fsyncs every segment's files.
    pub fn sync_all_segments(&self) -> Result<(), LogError> {
        for seg in self.segments.values() {
            seg.flush()?;
        }
        Ok(())
    }

    /// [`Log::open`], leaving the recovered data's fsync to the caller: true when something
    /// was recovered, and the caller must make the log's files durable before it serves the
    /// log or writes a checkpoint (a broker loading thousands of logs after a crash syncs each
    /// log dir once instead of fsyncing every recovered segment).
    pub fn open_deferring_sync(
        dir: PathBuf,
        config: LogConfig,
        recovery_point: i64,
        log_start_offset: i64,
        had_clean_shutdown: bool,
    ) -> Result<(Log, bool), LogError> {
        fs::create_dir_all(&dir)?;
        let now = now_ms();
        let mut bases = Vec::new();
        let mut index_bases = Vec::new();
        let mut swaps = Vec::new();
        for entry in fs::read_dir(&dir)? {
            let entry = entry?;
            let name = match entry.file_name().into_string() {
                Ok(n) => n,
                Err(_) => continue,
            };
            if let Some(stem) = name.strip_suffix(SWAP_SUFFIX) {
                match parse_segment_name(stem, ".log") {
                    Some(b) => swaps.push(b),
                    // A swapped segment's indexes are rebuilt from its log, like Kafka does.
                    None => {
                        if let Err(e) = fs::remove_file(entry.path()) {
                            tracing::warn!(file = %entry.path().display(), error = %e, "could not remove swap index");
                        }
                    }
                }
                continue;
            }
            if TEMP_SUFFIXES.iter().any(|s| name.ends_with(s)) {
                if let Err(e) = fs::remove_file(entry.path()) {
                    tracing::warn!(file = %entry.path().display(), error = %e, "could not remove temporary file");
                }
                continue;
            }
            if let Some(b) = parse_segment_name(&name, ".log") {
                bases.push(b);
            } else if let Some(b) = parse_segment_name(&name, ".index")
                .or_else(|| parse_segment_name(&name, ".timeindex"))
                .or_else(|| parse_segment_name(&name, ".txnindex"))
            {
                index_bases.push(b);
            }
        }
        bases.sort_unstable();
        swaps.sort_unstable();
        for b in swaps {
            complete_swap(&dir, b, &mut bases)?;
        }
        for b in index_bases {
            if bases.binary_search(&b).is_err() {
                remove_segment_files(&dir, b);
            }
        }

        let recover_from = if had_clean_shutdown {
            None
        } else {
            Some(bases.iter().rev().find(|&&b| b <= recovery_point).or(bases.first()).copied().unwrap_or(0))
        };
        let mut segments = BTreeMap::new();
        let mut recovered_any = false;
        let mut stop_after: Option<usize> = None;
        for (i, &base) in bases.iter().enumerate() {
            let is_last = i + 1 == bases.len();
            let upper = bases.get(i + 1).copied().unwrap_or(i64::MAX);
            let mut seg = LogSegment::open(&dir, base, &config, is_last, now)?;
            let must_recover = recover_from.is_some_and(|rf| base >= rf);
            let mut cut = 0;
            if must_recover {
                cut = seg.recover()?;
                recovered_any = true;
            } else if !seg.load_trusted(upper)? {
                tracing::warn!(dir = %dir.display(), base, "segment failed sanity checks; rebuilding it from the log");
                cut = seg.recover()?;
                recovered_any = true;
            }
            let overlaps = seg.next_offset() > upper;
            segments.insert(base, seg);
            if cut > 0 || overlaps {
                tracing::warn!(
                    dir = %dir.display(),
                    base,
                    bytes_cut = cut,
                    later_segments_deleted = bases.len() - i - 1,
                    "log recovery truncated the log at the first invalid batch"
                );
                stop_after = Some(i);
                break;
            }
        }
        if let Some(i) = stop_after {
            for &b in &bases[i + 1..] {
                remove_segment_files(&dir, b);
            }
        }

        let mut log = Log {
            dir,
            config,
            segments,
            log_start_offset: 0,
            log_end_offset: 0,
            recovery_point: 0,
            unflushed_messages: 0,
            last_flush_ms: now,
            deleted: false,
            health: None,
            stats: Arc::default(),
            latest_delete_horizon: -1,
            high_watermark: Arc::new(AtomicI64::new(0)),
            first_unstable_offset: Arc::new(AtomicI64::new(i64::MAX)),
            truncated_to: None,
            rolled_at: None,
        };
        if log.segments.is_empty() {
            let base = log_start_offset.max(0);
            let seg = LogSegment::create(&log.dir, base, &log.config, now)?;
            log.segments.insert(base, seg);
        }
        log.refresh_end_offset();
        let first_base = log.first_segment_base();
        log.log_start_offset = log_start_offset.max(first_base);
        if log.log_start_offset > log.log_end_offset {
            // The checkpointed start is beyond the data (e.g. recovery cut
            // it): everything below the start offset is deleted by
            // definition, so start an empty log there.
            let start = log.log_start_offset;
            log.truncate_fully_and_start_at(start)?;
        }
        if let Some(active) = log.segments.values_mut().next_back() {
            active.ensure_active()?;
        }
        log.recovery_point = if had_clean_shutdown || recovered_any {
            log.log_end_offset
        } else {
            recovery_point.clamp(0, log.log_end_offset)
        };
        log.publish_stats();
        Ok((log, recovered_any))
    }
}
