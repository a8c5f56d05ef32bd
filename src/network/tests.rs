use super::quotas::TokenBucket;
use super::*;

async fn frame_of(bytes: &[u8], max: usize) -> Result<Bytes, FrameError> {
    let mut rd = bytes;
    read_frame(&mut rd, max, &RequestMemoryPool::new(None)).await.map(|(f, _)| f)
}

#[tokio::test]
async fn frames_are_read_whole_and_bounded() {
    let mut wire = 5i32.to_be_bytes().to_vec();
    wire.extend_from_slice(b"hello");
    assert_eq!(&frame_of(&wire, 5).await.unwrap()[..], b"hello");
    // One byte over the limit, or a negative size: refused before anything is allocated.
    assert!(matches!(frame_of(&wire, 4).await, Err(FrameError::TooLarge(5, 4))));
    assert!(matches!(frame_of(&(-1i32).to_be_bytes(), 100).await, Err(FrameError::TooLarge(-1, 100))));
    // A clean close between frames, and one in the middle of a frame, are told apart.
    assert!(matches!(frame_of(&[], 100).await, Err(FrameError::Closed)));
    assert!(matches!(frame_of(&wire[..7], 100).await, Err(FrameError::Io(_))));
}

fn wire(len: usize) -> Vec<u8> {
    let mut w = (len as i32).to_be_bytes().to_vec();
    w.resize(4 + len, 7);
    w
}

#[tokio::test]
async fn a_frame_waits_for_room_in_the_request_memory_pool() {
    let pool = RequestMemoryPool::new(Some(100));
    let (first, wire2) = (wire(80), wire(30));
    let (frame, room) = read_frame(&mut &first[..], 1000, &pool).await.unwrap();
    assert_eq!(frame.len(), 80);
    let mut rd = &wire2[..];
    let second = read_frame(&mut rd, 1000, &pool);
    tokio::pin!(second);
    // 30 more bytes do not fit beside the 80 held: the second frame is not read.
    tokio::select! {
        biased;
        _ = &mut second => panic!("a frame was read without room in the pool"),
        _ = std::future::ready(()) => {}
    }
    drop(room);
    assert_eq!(second.await.unwrap().0.len(), 30);
    // A frame larger than the whole pool waits for all of it, then is read.
    let big = wire(150);
    assert_eq!(read_frame(&mut &big[..], 1000, &pool).await.unwrap().0.len(), 150);
}

#[test]
fn connection_creation_is_held_to_its_rate() {
    let bucket = TokenBucket::new(10);
    let mut b = bucket.lock().unwrap();
    let t0 = b.at;
    // One second's worth at once, then one every 100 ms.
    for _ in 0..10 {
        assert_eq!(b.take(t0), None);
    }
    let wait = b.take(t0).expect("the eleventh connection waits");
    assert!(wait > std::time::Duration::from_millis(90) && wait <= std::time::Duration::from_millis(100));
    assert_eq!(b.take(t0 + std::time::Duration::from_millis(100)), None);
    // A rate of 0 accepts nothing.
    let zero = TokenBucket::new(0);
    let mut z = zero.lock().unwrap();
    assert!(z.take(t0 + std::time::Duration::from_secs(5)).is_some());
}

#[test]
fn whole_frames_are_recognised_in_a_buffer() {
    let mut wire = 3i32.to_be_bytes().to_vec();
    assert!(!holds_whole_frame(&wire[..2]));
    assert!(!holds_whole_frame(&wire));
    wire.extend_from_slice(b"abc");
    assert!(holds_whole_frame(&wire));
    assert!(!holds_whole_frame(&(-5i32).to_be_bytes()));
}

#[test]
fn responses_carry_their_length_and_correlation_id() {
    let body = ResponseKind::ApiVersions(Default::default());
    let bytes = encode_response(ApiKey::ApiVersions, 0, 42, &body).unwrap().into_bytes().unwrap();
    let len = i32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) as usize;
    assert_eq!(len, bytes.len() - 4);
    assert_eq!(i32::from_be_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]), 42);
}

#[test]
fn fetch_record_sets_are_sent_as_they_are_not_copied() {
    use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
    let big = Bytes::from(vec![7u8; 5000]);
    let small = Bytes::from(vec![9u8; 10]);
    for version in [4, 11, 12, 16] {
        let mut topic = FetchableTopicResponse::default();
        topic.topic = kafka_protocol::messages::TopicName(kafka_protocol::protocol::StrBytes::from_static_str("t"));
        for (i, records) in [big.clone(), small.clone(), big.clone()].into_iter().enumerate() {
            let mut p = PartitionData::default();
            p.partition_index = i as i32;
            p.records = Some(records);
            topic.partitions.push(p);
        }
        let mut fetch = kafka_protocol::messages::FetchResponse::default();
        fetch.responses = vec![topic];
        let body = ResponseKind::Fetch(fetch);
        let ResponseFrame::Pieces(pieces) = encode_response(ApiKey::Fetch, version, 7, &body).unwrap() else {
            panic!("a fetch with large record sets is sent in pieces");
        };
        let forwarded = pieces.iter().filter(|p| p.bytes().as_ptr() == big.as_ptr()).count();
        assert_eq!(forwarded, 2, "both large record sets forwarded, v{version}");
        // Byte for byte what encoding into one buffer gives.
        let mut whole = BytesMut::new();
        whole.put_i32(0);
        let mut header = ResponseHeader::default();
        header.correlation_id = 7;
        header.encode(&mut whole, ApiKey::Fetch.response_header_version(version)).unwrap();
        body.encode(&mut whole, version).unwrap();
        let len = (whole.len() - 4) as i32;
        whole[..4].copy_from_slice(&len.to_be_bytes());
        assert_eq!(ResponseFrame::Pieces(pieces).into_bytes().unwrap(), whole.freeze(), "v{version}");
    }
}

/// A plaintext socket pair: the broker's write half and the client's end.
async fn socket_pair() -> (tokio::net::tcp::OwnedWriteHalf, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let client = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
    let (server, _) = listener.accept().await.unwrap();
    (server.into_split().1, client)
}

fn segment_like(dir: &std::path::Path, len: usize) -> (std::path::PathBuf, FileRange, Vec<u8>) {
    let path = dir.join("00000000000000000000.log");
    let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
    std::fs::write(&path, &data).unwrap();
    let file = Arc::new(std::fs::File::open(&path).unwrap());
    (path, FileRange { file, position: 100, len: len - 100, end_offset: 0 }, data)
}

#[tokio::test]
async fn file_ranges_are_sent_around_bytes_even_after_their_segment_is_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let (path, range, data) = segment_like(dir.path(), 3 << 20);
    // Retention deletes the segment after the response was built: the open file still reads.
    std::fs::remove_file(&path).unwrap();
    let (mut wr, mut client) = socket_pair().await;
    let pieces = vec![Piece::Bytes(Bytes::from_static(b"head")), Piece::File(range), Piece::Bytes("tail".into())];
    let reader = tokio::spawn(async move {
        let mut got = Vec::new();
        client.read_to_end(&mut got).await.unwrap();
        got
    });
    write_pieces(&mut wr, &pieces).await.unwrap();
    drop(wr);
    let got = reader.await.unwrap();
    let mut want = b"head".to_vec();
    want.extend_from_slice(&data[100..]);
    want.extend_from_slice(b"tail");
    assert!(got == want, "{} bytes received, {} expected", got.len(), want.len());
}

#[tokio::test]
async fn a_file_range_cut_short_by_truncation_fails_the_write() {
    let dir = tempfile::tempdir().unwrap();
    let (path, range, _) = segment_like(dir.path(), 1 << 20);
    // A follower truncation after the response was built: the promised length cannot be sent.
    std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(4096).unwrap();
    let (mut wr, mut client) = socket_pair().await;
    let reader = tokio::spawn(async move {
        let mut got = Vec::new();
        let _ = client.read_to_end(&mut got).await;
        got.len()
    });
    let e = write_pieces(&mut wr, &[Piece::File(range)]).await.unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof);
    drop(wr);
    assert_eq!(reader.await.unwrap(), 4096 - 100, "only what the file still held");
}

#[tokio::test]
async fn pieces_are_written_whole_and_in_order() {
    let pieces: Vec<Piece> =
        (0..600u32).map(|i| Piece::Bytes(Bytes::from(vec![(i % 251) as u8; (i % 7) as usize]))).collect();
    let mut out: Vec<u8> = Vec::new();
    write_pieces(&mut out, &pieces).await.unwrap();
    let want: Vec<u8> = pieces.iter().flat_map(|p| p.bytes().iter().copied()).collect();
    assert_eq!(out, want);
}

#[test]
fn connection_limits_follow_a_reconfiguration() {
    let config = |pairs: &[(&str, &str)]| {
        crate::config::BrokerConfig::from_map(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect())
            .unwrap()
    };
    let q = ConnectionQuotas::new(&config(&[("max.connections.per.ip", "1")]));
    // Not the inter-broker listener, which max.connections and the creation rate exempt.
    let (ip, listener): (IpAddr, Arc<str>) = ("10.0.0.1".parse().unwrap(), Arc::from("CLIENT"));
    let first = q.admit(ip, &listener).unwrap();
    assert!(q.admit(ip, &listener).is_err());
    q.reconfigure(&config(&[("max.connections.per.ip", "1"), ("max.connections.per.ip.overrides", "10.0.0.1:2")]));
    let second = q.admit(ip, &listener).unwrap();
    q.reconfigure(&config(&[("max.connections", "2")]));
    assert!(q.full(&listener), "two open connections fill a broker limited to two");
    drop((first, second));
    assert!(!q.full(&listener));
    q.reconfigure(&config(&[("max.connection.creation.rate", "1")]));
    assert!(q.creation_delay(&listener).is_none());
    assert!(q.creation_delay(&listener).is_some(), "the second connection within a second waits");
}
