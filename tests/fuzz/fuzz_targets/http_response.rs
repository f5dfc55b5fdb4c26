//! A debuginfod server's answer on arbitrary bytes: the head read to its
//! blank line (bounded), parsed, and the body read by its length, its
//! chunks or to the end, into a sink with a limit; and URLs. What a server
//! sends is untrusted: any panic, or memory taken from a number the server
//! chose, is a bug.
#![no_main]

use std::io::BufReader;
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use tp::debuginfod::client::{self, Limits, Url};

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(url) = Url::parse(text) {
            let _ = url.join("buildid/00/debuginfo").text();
        }
    }
    let mut reader = BufReader::new(data);
    let Ok(head) = client::read_head(&mut reader) else { return };
    let Ok(head) = client::parse_head(&head) else { return };
    let (mut size, mut bytes) = (|_: u64| {}, |_: u64| {});
    let mut limits = Limits {
        timeout: Duration::from_secs(1),
        deadline: None,
        max_body: 1 << 20,
        on_size: &mut size,
        on_bytes: &mut bytes,
    };
    let _ = client::body(&mut reader, &head, &mut std::io::sink(), &mut limits);
});
