//! The record-batch validator (v2 batches as produced and as replicated, stored batches on
//! recovery) and the legacy message-set converters (magic 0/1 in, for Produce v0-v2, and
//! out, for Fetch v0-v3).
#![no_main]
use gregor::log::{batch, legacy};
use libfuzzer_sys::fuzz_target;

const MAX_MESSAGE: u32 = 1 << 20;
const DECOMPRESS_LIMIT: usize = 1 << 22;

fuzz_target!(|data: &[u8]| {
    if let Some(h) = batch::BatchHeader::parse(data) {
        let _ = h.check_framing(data.len());
        let _ = (h.last_offset(), h.next_offset(), h.compression(), h.total_size());
    }
    let _ = batch::crc_matches(data);
    let _ = batch::check_stored_batch(data);
    if let Ok(headers) = batch::validate_batches(data, MAX_MESSAGE) {
        let total: usize = headers.iter().map(|h| h.total_size()).sum();
        assert!(total <= data.len(), "validated batches span {total} of {} bytes", data.len());
    }
    let _ = batch::validate_replicated_batches(data);
    if legacy::first_magic(data).is_some() {
        if let Ok(v2) = legacy::to_record_batch(data, DECOMPRESS_LIMIT) {
            // What a Produce v0-v2 is stored as must pass the checks a v2 produce passes.
            if !v2.is_empty() {
                batch::validate_batches(&v2, u32::MAX).expect("a converted message set is a valid v2 batch");
            }
        }
    }
    for magic in [0i8, 1] {
        let _ = legacy::to_message_set_counted(data, magic, 0, 1 << 16, DECOMPRESS_LIMIT);
    }
});
