//! The frame codec: any byte stream is cut into size-prefixed frames or refused, never more
//! than `socket.request.max.bytes` taken for one, and `holds_whole_frame` (which decides
//! what is still answered at shutdown) agrees with the reader.
#![no_main]
use libfuzzer_sys::fuzz_target;

const MAX: usize = 64 * 1024;

thread_local! {
    static RT: tokio::runtime::Runtime = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
}

fuzz_target!(|data: &[u8]| {
    RT.with(|rt| {
        rt.block_on(async {
            // Unbounded: a bounded pool is the unit tests' subject (a frame waiting for room
            // would wait here forever, as no other connection gives any back).
            let pool = gregor::network::RequestMemoryPool::new(None);
            let mut rest = data;
            loop {
                let before = rest;
                let whole = gregor::network::holds_whole_frame(before);
                match gregor::network::read_frame(&mut rest, MAX, &pool).await {
                    Ok((frame, _room)) => {
                        assert!(frame.len() <= MAX);
                        assert_eq!(before.len() - rest.len(), frame.len() + 4);
                        assert_eq!(&frame[..], &before[4..4 + frame.len()]);
                    }
                    Err(_) => {
                        if whole {
                            let n = i32::from_be_bytes([before[0], before[1], before[2], before[3]]);
                            assert!(n as usize > MAX, "a whole frame of {n} bytes was refused");
                        }
                        break;
                    }
                }
            }
        })
    });
});
