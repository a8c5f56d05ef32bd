use super::*;

fn recompute_crc(b: &mut [u8]) {
    let crc = crc32c::crc32c(&b[CRC_START..]);
    b[OFF_CRC..OFF_CRC + 4].copy_from_slice(&crc.to_be_bytes());
}

#[test]
fn varint_roundtrip() {
    for v in [0, 1, -1, 63, -64, 64, 300, -300, i32::MAX, i32::MIN] {
        let mut b = Vec::new();
        write_varint(&mut b, v);
        assert_eq!(read_varint(&b), Some((v, b.len())));
    }
    for v in [0i64, -1, 1 << 40, i64::MIN, i64::MAX] {
        let mut b = Vec::new();
        write_varlong(&mut b, v);
        assert_eq!(read_varlong(&b), Some((v, b.len())));
    }
    // Known encodings from the protobuf spec.
    let mut b = Vec::new();
    write_varint(&mut b, -1);
    write_varint(&mut b, 1);
    write_varint(&mut b, 150);
    assert_eq!(b, vec![0x01, 0x02, 0xac, 0x02]);
    assert_eq!(read_varint(&[0x80, 0x80]), None);
}

#[test]
fn encoded_batch_layout() {
    let b = encode_batch(
        &BatchOptions::default(),
        &[SimpleRecord { timestamp: 1000, key: Some(b"k"), value: Some(b"val"), headers: vec![("h", None)] }],
    );
    // record: attrs 0, tsDelta 0, offDelta 0, keyLen 1 'k', valLen 3 'val', 1 header: "h", null
    let rec = [0u8, 0, 0, 2, b'k', 6, b'v', b'a', b'l', 2, 2, b'h', 1];
    let mut expect = Vec::new();
    expect.extend_from_slice(&0i64.to_be_bytes());
    expect.extend_from_slice(&((49 + 1 + rec.len()) as i32).to_be_bytes());
    expect.extend_from_slice(&(-1i32).to_be_bytes());
    expect.push(2);
    expect.extend_from_slice(&[0; 4]);
    expect.extend_from_slice(&0i16.to_be_bytes());
    expect.extend_from_slice(&0i32.to_be_bytes());
    expect.extend_from_slice(&1000i64.to_be_bytes());
    expect.extend_from_slice(&1000i64.to_be_bytes());
    expect.extend_from_slice(&(-1i64).to_be_bytes());
    expect.extend_from_slice(&(-1i16).to_be_bytes());
    expect.extend_from_slice(&(-1i32).to_be_bytes());
    expect.extend_from_slice(&1i32.to_be_bytes());
    expect.push((rec.len() * 2) as u8);
    expect.extend_from_slice(&rec);
    recompute_crc(&mut expect);
    assert_eq!(b, expect);
    let h = validate_batches(&b, 1 << 20).unwrap();
    assert_eq!(h.len(), 1);
    assert_eq!(h[0].records_count, 1);
    assert_eq!(h[0].max_timestamp, 1000);
    assert_eq!(h[0].total_size(), b.len());
}

#[test]
fn good_batches_validate() {
    let mut buf = simple_batch(3, 10, 5);
    buf.extend(simple_batch(1, 0, 6));
    let hs = validate_batches(&buf, 1 << 20).unwrap();
    assert_eq!(hs.len(), 2);
    assert_eq!(hs[0].last_offset_delta(), 2);
    assert_eq!(hs[1].base_timestamp, 6);
    assert!(!hs[0].is_control() && !hs[0].is_transactional());
    assert_eq!(hs[0].compression(), 0);
    assert!(validate_batches(&[], 100).unwrap().is_empty());
}

#[test]
fn bad_crc() {
    let mut b = simple_batch(2, 10, 5);
    let n = b.len();
    b[n - 1] ^= 0x40;
    assert!(matches!(validate_batches(&b, 1 << 20), Err(LogError::CorruptMessage(_))));
    // Header fields outside the CRC may change freely.
    let mut b = simple_batch(2, 10, 5);
    b[0..8].copy_from_slice(&77i64.to_be_bytes());
    b[12..16].copy_from_slice(&9i32.to_be_bytes());
    assert!(validate_batches(&b, 1 << 20).is_ok());
    // But the CRC field itself is checked.
    let mut b = simple_batch(2, 10, 5);
    b[OFF_CRC] ^= 1;
    assert_eq!(
        validate_batches(&b, 1 << 20).unwrap_err().kafka_code(),
        crate::protocol::ErrorCode::CorruptMessage.code()
    );
}

#[test]
fn bad_magic() {
    let mut b = simple_batch(1, 10, 5);
    b[OFF_MAGIC] = 1;
    let e = validate_batches(&b, 1 << 20).unwrap_err();
    assert!(matches!(e, LogError::UnsupportedVersion(_)));
    assert_eq!(e.kafka_code(), crate::protocol::ErrorCode::UnsupportedVersion.code());
}

#[test]
fn bad_lengths() {
    let b = simple_batch(1, 10, 5);
    // too long: claims one more byte than present
    let mut long = b.clone();
    let l = (b.len() - LOG_OVERHEAD + 1) as i32;
    long[8..12].copy_from_slice(&l.to_be_bytes());
    assert!(matches!(validate_batches(&long, 1 << 20), Err(LogError::CorruptMessage(_))));
    // too short for a header
    let mut short = b.clone();
    short[8..12].copy_from_slice(&10i32.to_be_bytes());
    assert!(matches!(validate_batches(&short, 1 << 20), Err(LogError::CorruptMessage(_))));
    // shorter than the records it holds (CRC recomputed so only length is wrong)
    let mut cut = b[..b.len() - 1].to_vec();
    let l = (cut.len() - LOG_OVERHEAD) as i32;
    cut[8..12].copy_from_slice(&l.to_be_bytes());
    recompute_crc(&mut cut);
    assert!(matches!(validate_batches(&cut, 1 << 20), Err(LogError::CorruptMessage(_))));
    // trailing garbage after a good batch
    let mut trail = b.clone();
    trail.extend_from_slice(&[0, 0, 0]);
    assert!(matches!(validate_batches(&trail, 1 << 20), Err(LogError::CorruptMessage(_))));
    // truncated buffer
    assert!(validate_batches(&b[..b.len() - 3], 1 << 20).is_err());
    assert!(validate_batches(&b[..30], 1 << 20).is_err());
    // negative length
    let mut neg = b.clone();
    neg[8..12].copy_from_slice(&(-5i32).to_be_bytes());
    assert!(validate_batches(&neg, 1 << 20).is_err());
}

#[test]
fn count_mismatch() {
    let mut b = simple_batch(3, 10, 5);
    b[OFF_RECORDS_COUNT..OFF_RECORDS_COUNT + 4].copy_from_slice(&4i32.to_be_bytes());
    recompute_crc(&mut b);
    assert_eq!(
        validate_batches(&b, 1 << 20).unwrap_err().kafka_code(),
        crate::protocol::ErrorCode::InvalidRecord.code()
    );
    let mut b = simple_batch(3, 10, 5);
    b[OFF_LAST_OFFSET_DELTA..OFF_LAST_OFFSET_DELTA + 4].copy_from_slice(&5i32.to_be_bytes());
    recompute_crc(&mut b);
    assert_eq!(
        validate_batches(&b, 1 << 20).unwrap_err().kafka_code(),
        crate::protocol::ErrorCode::InvalidRecord.code()
    );
    // count and delta agree but records say otherwise
    let mut b = simple_batch(3, 10, 5);
    b[OFF_RECORDS_COUNT..OFF_RECORDS_COUNT + 4].copy_from_slice(&2i32.to_be_bytes());
    b[OFF_LAST_OFFSET_DELTA..OFF_LAST_OFFSET_DELTA + 4].copy_from_slice(&1i32.to_be_bytes());
    recompute_crc(&mut b);
    assert!(validate_batches(&b, 1 << 20).is_err());
    // zero records
    let mut b = simple_batch(1, 0, 5);
    b[OFF_RECORDS_COUNT..OFF_RECORDS_COUNT + 4].copy_from_slice(&0i32.to_be_bytes());
    recompute_crc(&mut b);
    assert_eq!(
        validate_batches(&b, 1 << 20).unwrap_err().kafka_code(),
        crate::protocol::ErrorCode::InvalidRecord.code()
    );
}

#[test]
fn too_large() {
    let b = simple_batch(1, 100, 5);
    assert!(validate_batches(&b, b.len() as u32).is_ok());
    let e = validate_batches(&b, b.len() as u32 - 1).unwrap_err();
    assert!(matches!(e, LogError::MessageTooLarge));
    assert_eq!(e.kafka_code(), crate::protocol::ErrorCode::MessageTooLarge.code());
}

#[test]
fn compressed_batch_skips_record_walk() {
    let mut b = simple_batch(2, 10, 5);
    b[OFF_ATTRIBUTES + 1] |= 1; // gzip
    recompute_crc(&mut b);
    assert!(validate_batches(&b, 1 << 20).is_ok());
    b[OFF_ATTRIBUTES + 1] |= 7;
    recompute_crc(&mut b);
    assert!(validate_batches(&b, 1 << 20).is_err());
}

#[test]
fn stored_batch_check() {
    let b = simple_batch(2, 10, 5);
    assert!(check_stored_batch(&b).is_ok());
    assert!(check_stored_batch(&b[..b.len() - 1]).is_err());
    let mut c = b.clone();
    c[70] ^= 1;
    assert!(check_stored_batch(&c).is_err());
}
