//! Decoding a gossip frame from a peer: any bytes give a message or an error,
//! never a panic or an allocation the frame did not pay for; a decoded
//! message encodes back to a frame that decodes and encodes to the same bytes
//! (bytes, not messages: a float field may hold NaN, which is never equal).
#![no_main]

use libfuzzer_sys::fuzz_target;
use waitroom_common::wire;

fuzz_target!(|data: &[u8]| {
    if let Ok(message) = wire::decode(data) {
        let again = wire::encode(&message).expect("a decoded message encodes");
        let message = wire::decode(&again).expect("re-decodes");
        assert_eq!(wire::encode(&message).expect("encodes"), again);
    }
    let _ = wire::decode_header(data);
    let _ = wire::decode_payload(data);
});
