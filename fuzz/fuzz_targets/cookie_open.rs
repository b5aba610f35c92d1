//! Opening a cookie value a visitor sent: any bytes must give an answer (most
//! often `Malformed` or `Tampered`), never a panic; and whatever opens must
//! have been sealed by us, which random input never is.
#![no_main]

use libfuzzer_sys::fuzz_target;
use waitroom_edge::{
    cookie::{CookieKeys, MAX_COOKIE_LEN},
    metrics::CookieFailure,
};

fuzz_target!(|data: &[u8]| {
    let keys = CookieKeys::new(&[(1, [7; 32]), (2, [9; 32])]).expect("two distinct keys");
    // The first byte picks the room, so the AAD varies too.
    let (room, rest) = match data.split_first() {
        Some((b, rest)) if b % 2 == 0 => ("shop", rest),
        Some((_, rest)) => ("tickets", rest),
        None => ("shop", data),
    };
    if let Ok(value) = std::str::from_utf8(rest) {
        assert!(
            keys.open(room, value).is_err(),
            "a value we never sealed opened"
        );
    }
    // Round trip: what we seal, we open, for any plain bytes short enough
    // to make a cookie the node accepts (longer ones are refused unopened).
    let sealed = keys.seal(room, rest);
    if sealed.len() <= MAX_COOKIE_LEN {
        assert_eq!(keys.open(room, &sealed).as_deref(), Ok(rest));
    } else {
        assert_eq!(keys.open(room, &sealed), Err(CookieFailure::TooLarge));
    }
});
