//! The codecs of Kafka's message formats, for the places the broker must open records:
//! converting between message sets v0/v1 and record batches v2 (`legacy`), the keys a
//! compacted topic requires, and the log cleaner, which rewrites batches with the codec they
//! came in. Nothing else decompresses a v2 batch.
//!
//! Wire details Kafka's clients rely on: gzip may be several concatenated members; snappy comes
//! raw (librdkafka) or in snappy-java's "xerial" framing (Java clients, and what the broker
//! writes, since every client reads it); lz4 is the LZ4 frame format, whose header checksum
//! Kafka computed wrongly in message format v0 (KAFKA-3160) — it is recomputed before decoding.
//! zstd exists only in format v2 (refused for v0/v1, as Kafka does).
//!
//! Decompression is bounded: output beyond `limit` bytes is an error, not an allocation.

use std::io::{Read, Write};

use super::LogError;

pub const NONE: u8 = 0;
pub const GZIP: u8 = 1;
pub const SNAPPY: u8 = 2;
pub const LZ4: u8 = 3;
pub const ZSTD: u8 = 4;

const XERIAL_MAGIC: &[u8] = b"\x82SNAPPY\0";
/// snappy-java's default block size.
const XERIAL_BLOCK: usize = 32 * 1024;
const LZ4_FRAME_MAGIC: [u8; 4] = [0x04, 0x22, 0x4d, 0x18];

fn corrupt(codec: &str, e: impl std::fmt::Display) -> LogError {
    LogError::CorruptMessage(format!("{codec} data cannot be decompressed: {e}"))
}

const TOO_LARGE: &str = "decompressed data exceeds";

fn too_large(limit: usize) -> LogError {
    LogError::CorruptMessage(format!("{TOO_LARGE} {limit} bytes"))
}

/// Whether `decompress` failed on its limit rather than on the data.
pub fn is_too_large(e: &LogError) -> bool {
    matches!(e, LogError::CorruptMessage(m) if m.starts_with(TOO_LARGE))
}

/// Reads `r` to its end, failing past `limit` bytes.
fn read_bounded(r: impl Read, limit: usize, codec: &str) -> Result<Vec<u8>, LogError> {
    let mut out = Vec::new();
    r.take(limit as u64 + 1).read_to_end(&mut out).map_err(|e| corrupt(codec, e))?;
    if out.len() > limit {
        return Err(too_large(limit));
    }
    Ok(out)
}

/// `magic` is the message format the data came in (it decides lz4's header checksum).
pub fn decompress(codec: u8, magic: i8, data: &[u8], limit: usize) -> Result<Vec<u8>, LogError> {
    match codec {
        GZIP => read_bounded(flate2::read::MultiGzDecoder::new(data), limit, "gzip"),
        SNAPPY => snappy_decompress(data, limit),
        LZ4 => {
            let fixed;
            let input = if magic == 0 {
                fixed = with_proper_lz4_header_checksum(data)?;
                &fixed[..]
            } else {
                data
            };
            read_bounded(lz4_flex::frame::FrameDecoder::new(input), limit, "lz4")
        }
        ZSTD if magic < 2 => {
            Err(LogError::UnsupportedCompression("zstd is not allowed in message formats v0 and v1".into()))
        }
        ZSTD => {
            let dec = zstd::stream::read::Decoder::new(data).map_err(|e| corrupt("zstd", e))?;
            read_bounded(dec, limit, "zstd")
        }
        other => Err(LogError::CorruptMessage(format!("unknown compression codec {other}"))),
    }
}

pub fn compress(codec: u8, data: &[u8]) -> Result<Vec<u8>, LogError> {
    let io = |e: std::io::Error| LogError::CorruptMessage(format!("compression failed: {e}"));
    match codec {
        GZIP => {
            let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
            enc.write_all(data).map_err(io)?;
            enc.finish().map_err(io)
        }
        SNAPPY => {
            let mut out = Vec::with_capacity(data.len() / 2 + 32);
            out.extend_from_slice(XERIAL_MAGIC);
            out.extend_from_slice(&1i32.to_be_bytes()); // version
            out.extend_from_slice(&1i32.to_be_bytes()); // minimum compatible version
            let mut enc = snap::raw::Encoder::new();
            for chunk in data.chunks(XERIAL_BLOCK) {
                let block = enc.compress_vec(chunk).map_err(|e| LogError::CorruptMessage(e.to_string()))?;
                out.extend_from_slice(&(block.len() as i32).to_be_bytes());
                out.extend_from_slice(&block);
            }
            Ok(out)
        }
        LZ4 => {
            use lz4_flex::frame::{BlockMode, BlockSize, FrameEncoder, FrameInfo};
            // Independent 64 KiB blocks: what Kafka's own LZ4 streams write and accept.
            let info = FrameInfo::new().block_size(BlockSize::Max64KB).block_mode(BlockMode::Independent);
            let mut enc = FrameEncoder::with_frame_info(info, Vec::new());
            enc.write_all(data).map_err(io)?;
            enc.finish().map_err(|e| LogError::CorruptMessage(format!("lz4 compression failed: {e}")))
        }
        // Level 3: Kafka's default compression.zstd.level.
        ZSTD => zstd::stream::encode_all(data, 3).map_err(io),
        other => Err(LogError::UnsupportedCompression(format!("codec {other} cannot be written here"))),
    }
}

fn snappy_decompress(data: &[u8], limit: usize) -> Result<Vec<u8>, LogError> {
    let mut dec = snap::raw::Decoder::new();
    let mut block = |b: &[u8], out: &mut Vec<u8>| -> Result<(), LogError> {
        let n = snap::raw::decompress_len(b).map_err(|e| corrupt("snappy", e))?;
        if out.len() + n > limit {
            return Err(too_large(limit));
        }
        let start = out.len();
        out.resize(start + n, 0);
        let written = dec.decompress(b, &mut out[start..]).map_err(|e| corrupt("snappy", e))?;
        out.truncate(start + written);
        Ok(())
    };
    let mut out = Vec::new();
    if !data.starts_with(XERIAL_MAGIC) {
        block(data, &mut out)?;
        return Ok(out);
    }
    let mut rest = data.get(16..).ok_or_else(|| corrupt("snappy", "short xerial header"))?;
    while !rest.is_empty() {
        let len = rest.get(..4).ok_or_else(|| corrupt("snappy", "short xerial block length"))?;
        let len = i32::from_be_bytes([len[0], len[1], len[2], len[3]]);
        let len = usize::try_from(len).map_err(|_| corrupt("snappy", "negative xerial block length"))?;
        let b = rest.get(4..4 + len).ok_or_else(|| corrupt("snappy", "xerial block beyond the data"))?;
        block(b, &mut out)?;
        rest = &rest[4 + len..];
    }
    Ok(out)
}

/// The LZ4 frame with its header checksum recomputed over the frame descriptor, as the format
/// defines it (Kafka's message format v0 writers hashed the magic number too).
fn with_proper_lz4_header_checksum(data: &[u8]) -> Result<Vec<u8>, LogError> {
    if data.len() < 7 || data[..4] != LZ4_FRAME_MAGIC {
        return Err(corrupt("lz4", "not an LZ4 frame"));
    }
    let flg = data[4];
    let mut hc_at = 6;
    if flg & 0x08 != 0 {
        hc_at += 8; // content size
    }
    if flg & 0x01 != 0 {
        hc_at += 4; // dictionary id
    }
    if data.len() <= hc_at {
        return Err(corrupt("lz4", "short frame descriptor"));
    }
    let mut fixed = data.to_vec();
    fixed[hc_at] = ((twox_hash::XxHash32::oneshot(0, &data[4..hc_at]) >> 8) & 0xff) as u8;
    Ok(fixed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<u8> {
        (0..200_000u32).flat_map(|i| (i % 251).to_be_bytes()).collect()
    }

    #[test]
    fn each_codec_round_trips() {
        let data = sample();
        for codec in [GZIP, SNAPPY, LZ4] {
            let c = compress(codec, &data).unwrap();
            assert!(c.len() < data.len(), "codec {codec}");
            for magic in [0, 1] {
                assert_eq!(decompress(codec, magic, &c, data.len()).unwrap(), data, "codec {codec} magic {magic}");
            }
        }
    }

    #[test]
    fn raw_snappy_as_librdkafka_writes_it_is_read() {
        let data = sample();
        let raw = snap::raw::Encoder::new().compress_vec(&data).unwrap();
        assert_eq!(decompress(SNAPPY, 1, &raw, data.len()).unwrap(), data);
    }

    #[test]
    fn lz4_with_kafkas_broken_v0_header_checksum_is_read() {
        let data = sample();
        let mut c = compress(LZ4, &data).unwrap();
        // KAFKA-3160: the checksum over magic number and descriptor.
        c[6] = ((twox_hash::XxHash32::oneshot(0, &c[..6]) >> 8) & 0xff) as u8;
        assert_eq!(decompress(LZ4, 0, &c, data.len()).unwrap(), data);
    }

    #[test]
    fn decompression_is_bounded_and_garbage_is_an_error() {
        let data = sample();
        for codec in [GZIP, SNAPPY, LZ4] {
            let c = compress(codec, &data).unwrap();
            assert!(decompress(codec, 1, &c, data.len() - 1).is_err(), "codec {codec}");
            assert!(decompress(codec, 1, &c[..c.len() / 2], data.len()).is_err(), "codec {codec} truncated");
            assert!(decompress(codec, 1, b"\x82SNAPPY\0garbage-garbage", 1000).is_err());
        }
        assert!(matches!(decompress(ZSTD, 1, b"x", 10), Err(LogError::UnsupportedCompression(_))));
        assert!(decompress(7, 1, b"x", 10).is_err());
    }

    #[test]
    fn zstd_round_trips_in_v2_only_and_is_bounded() {
        let data = sample();
        let c = compress(ZSTD, &data).unwrap();
        assert!(c.len() < data.len());
        assert_eq!(decompress(ZSTD, 2, &c, data.len()).unwrap(), data);
        assert!(decompress(ZSTD, 2, &c, data.len() - 1).is_err());
        assert!(decompress(ZSTD, 2, &c[..c.len() / 2], data.len()).is_err());
        for codec in [GZIP, SNAPPY, LZ4] {
            let c = compress(codec, &data).unwrap();
            assert_eq!(decompress(codec, 2, &c, data.len()).unwrap(), data, "codec {codec}");
        }
    }
}
