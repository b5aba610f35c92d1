//! The XDP program's packet parser (`waitroom_common::xdp_parse`, the same
//! code the kernel runs, reading a byte slice instead of bounds-checked
//! pointers): any frame parses, is refused or is "not IP", never panics, and
//! a frame that parses still parses, to the same packet, with bytes appended
//! after it (trailing payload never changes what the headers say).
#![no_main]

use libfuzzer_sys::fuzz_target;
use waitroom_common::xdp_parse::{SliceFrame, parse};

fuzz_target!(|data: &[u8]| {
    let parsed = parse(&SliceFrame(data));
    if let Ok(Some(packet)) = parsed {
        let mut longer = data.to_vec();
        longer.extend_from_slice(&[0xAB; 64]);
        assert_eq!(parse(&SliceFrame(&longer)), Ok(Some(packet)));
    }
});
