//! The visitor's cookie: the engine's ticket, sealed with an AEAD.
//!
//! Format (then base64url without padding):
//! `version (1) | key id (1) | nonce (12) | ChaCha20-Poly1305(ticket bytes)`.
//! The room id and the format version are the associated data, so a cookie from
//! another room or format does not open. The key id lets keys rotate: the first
//! configured key seals, every configured key opens. Whatever fails to open makes
//! a new visitor (the caller counts why); it is never an error page.
use std::{
    cell::RefCell,
    sync::atomic::{AtomicU64, Ordering::Relaxed},
};

use base64::{Engine as _, engine::general_purpose::URL_SAFE_NO_PAD};
use ring::aead::{Aad, CHACHA20_POLY1305, LessSafeKey, Nonce, UnboundKey};
use waitroom_common::ticket::Ticket;

use crate::metrics::CookieFailure;

/// Cookie format version; bump when the layout changes.
const FORMAT: u8 = 1;
/// Largest cookie value we try to open; longer ones are refused unread.
pub const MAX_COOKIE_LEN: usize = 512;
const HEADER: usize = 2 + 12;
/// Poly1305 tag length.
const TAG: usize = 16;

/// Keys that seal and open cookies (ChaCha20-Poly1305 from `ring`: its
/// assembly is about ten times faster on a 60-byte ticket than a portable
/// implementation, and the cookie is on every request's path).
pub struct CookieKeys {
    /// `(id, key)`; the first seals.
    keys: Vec<(u8, LessSafeKey)>,
    /// Unique to this set of keys in the process: what [`OPENED`] remembers
    /// instead of a pointer, which the next set could be given again.
    generation: u64,
}

/// The next [`CookieKeys::generation`].
static GENERATION: AtomicU64 = AtomicU64::new(1);

impl std::fmt::Debug for CookieKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CookieKeys")
            .field(
                "ids",
                &self.keys.iter().map(|(id, _)| *id).collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// A configured key that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("cookie key {id}: secret_hex must be 64 hex digits (32 bytes)")]
    BadSecret { id: u8 },
    #[error("cookie key id {id} appears twice")]
    DuplicateId { id: u8 },
    #[error("no cookie keys")]
    Empty,
}

impl CookieKeys {
    /// Builds from `(id, 32-byte secret)`; the first one seals.
    pub fn new(keys: &[(u8, [u8; 32])]) -> Result<Self, KeyError> {
        if keys.is_empty() {
            return Err(KeyError::Empty);
        }
        let mut out: Vec<(u8, LessSafeKey)> = Vec::with_capacity(keys.len());
        for (id, secret) in keys {
            if out.iter().any(|(i, _)| i == id) {
                return Err(KeyError::DuplicateId { id: *id });
            }
            let key = UnboundKey::new(&CHACHA20_POLY1305, secret)
                .map_err(|_| KeyError::BadSecret { id: *id })?;
            out.push((*id, LessSafeKey::new(key)));
        }
        Ok(Self {
            keys: out,
            generation: GENERATION.fetch_add(1, Relaxed),
        })
    }

    /// Parses `(id, hex)` pairs as found in the config.
    pub fn from_hex(keys: &[(u8, &str)]) -> Result<Self, KeyError> {
        let mut parsed = Vec::with_capacity(keys.len());
        for (id, text) in keys {
            let bytes = hex::decode(text.trim()).map_err(|_| KeyError::BadSecret { id: *id })?;
            let secret: [u8; 32] = bytes
                .try_into()
                .map_err(|_| KeyError::BadSecret { id: *id })?;
            parsed.push((*id, secret));
        }
        Self::new(&parsed)
    }

    /// Seals `plain` for `room`; returns the cookie value.
    pub fn seal(&self, room: &str, plain: &[u8]) -> String {
        // base64's alphabet is ASCII: the lossy conversion never replaces.
        self.seal_with(room, plain, |v| String::from_utf8_lossy(v).into_owned())
            .unwrap_or_default()
    }

    /// Seals `plain` for `room` and hands the cookie value to `f`, where it
    /// lies on the stack for a ticket (the `Set-Cookie` line is written
    /// around it without another copy or allocation). `None` only where
    /// sealing fails, for messages of gigabytes.
    pub fn seal_with<R>(&self, room: &str, plain: &[u8], f: impl FnOnce(&[u8]) -> R) -> Option<R> {
        let (id, key) = &self.keys[0];
        // `fill`, not `random::<[u8; 12]>()`, which draws the array an
        // element at a time (100 instructions more a cookie).
        let mut nonce_bytes = [0u8; 12];
        rand::fill(&mut nonce_bytes[..]);
        // On the stack for a ticket (`set_cookie_header` serializes it into
        // 128 bytes at most); a longer text in a vector.
        let mut stack = [0u8; HEADER + 128 + TAG];
        let mut heap = Vec::new();
        let len = HEADER + plain.len() + TAG;
        let raw: &mut [u8] = if len <= stack.len() {
            &mut stack[..len]
        } else {
            heap.resize(len, 0);
            &mut heap
        };
        raw[0] = FORMAT;
        raw[1] = *id;
        raw[2..HEADER].copy_from_slice(&nonce_bytes);
        let (body, tag_at) = raw[HEADER..].split_at_mut(plain.len());
        body.copy_from_slice(plain);
        let tag = with_aad(room, |aad| {
            key.seal_in_place_separate_tag(
                Nonce::assume_unique_for_key(nonce_bytes),
                Aad::from(aad),
                body,
            )
        })
        .ok()?;
        tag_at.copy_from_slice(tag.as_ref());
        let raw = &*raw;
        // Encoded on the stack: `encode_string`'s chunked writer cost twice
        // as much for a cookie's hundred bytes.
        let mut encoded = [0u8; 512];
        match URL_SAFE_NO_PAD.encode_slice(raw, &mut encoded) {
            // Bytes, not `str`: the `Set-Cookie` line is bytes, and a
            // UTF-8 check of base64's ASCII cost ~140 instructions a cookie.
            Ok(n) => Some(f(&encoded[..n])),
            Err(_) => Some(f(URL_SAFE_NO_PAD.encode(raw).as_bytes())),
        }
    }

    /// Length of the cookie value [`CookieKeys::seal`] makes of `plain_len` bytes.
    pub fn sealed_len(plain_len: usize) -> usize {
        (HEADER + plain_len + TAG).div_ceil(3) * 4
    }

    /// Opens a cookie value sealed for `room`.
    pub fn open<V: AsRef<[u8]> + ?Sized>(
        &self,
        room: &str,
        value: &V,
    ) -> Result<Vec<u8>, CookieFailure> {
        let value = value.as_ref();
        if value.len() > MAX_COOKIE_LEN {
            return Err(CookieFailure::TooLarge);
        }
        let mut raw = URL_SAFE_NO_PAD
            .decode(value.trim_ascii())
            .map_err(|_| CookieFailure::Malformed)?;
        if raw.len() < HEADER + TAG || raw[0] != FORMAT {
            return Err(CookieFailure::Malformed);
        }
        let id = raw[1];
        let Some((_, key)) = self.keys.iter().find(|(i, _)| *i == id) else {
            return Err(CookieFailure::UnknownKey);
        };
        let nonce: [u8; 12] = raw[2..HEADER]
            .try_into()
            .map_err(|_| CookieFailure::Malformed)?;
        // A cookie that opens under another room's AAD is a stray, not an attack;
        // we cannot tell which room without trying them all, so call it tampered.
        let plain_len = with_aad(room, |aad| {
            key.open_in_place(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(aad),
                &mut raw[HEADER..],
            )
            .map(|plain| plain.len())
        })
        .map_err(|_| CookieFailure::Tampered)?;
        raw.truncate(HEADER + plain_len);
        raw.drain(..HEADER);
        Ok(raw)
    }

    /// The ticket in a cookie value sealed for `room`: [`CookieKeys::open`]
    /// and decoded, a ticket that does not decode being `Malformed`.
    ///
    /// A browser sends the same cookie on every request of a connection
    /// until the node sets a new one, and opening it (base64, the AEAD, the
    /// decoding) was the largest piece of the admitted path after hyper's
    /// own (issue 17). So the worker thread remembers, for each of
    /// `OPENED_SLOTS` slots chosen by the connection id `conn`, the last
    /// value that opened, with the room and the key set it opened under.
    /// The very same bytes under the same keys for the same room open to the
    /// same ticket, so a hit returns that ticket unopened; anything else (a
    /// new value, another room, rotated keys) is opened in full. Failures
    /// are never remembered: each is opened again and counted by the caller.
    pub fn open_ticket<V: AsRef<[u8]> + ?Sized>(
        &self,
        room: &str,
        value: &V,
        conn: u64,
    ) -> Result<Ticket, CookieFailure> {
        let value = value.as_ref();
        let slot = (conn % OPENED_SLOTS as u64) as usize;
        let hit = OPENED.with_borrow(|opened| {
            opened.get(slot).and_then(Option::as_ref).and_then(|o| {
                (o.generation == self.generation && same_bytes(&o.value, value) && o.room == room)
                    .then_some(o.ticket)
            })
        });
        if let Some(ticket) = hit {
            return Ok(ticket);
        }
        let bytes = self.open(room, value)?;
        let ticket: Ticket = postcard::from_bytes(&bytes).map_err(|_| CookieFailure::Malformed)?;
        OPENED.with_borrow_mut(|opened| {
            if opened.len() < OPENED_SLOTS {
                opened.resize_with(OPENED_SLOTS, || None);
            }
            match &mut opened[slot] {
                // The strings' buffers are reused: no allocation once warm.
                Some(o) => {
                    o.generation = self.generation;
                    o.ticket = ticket;
                    o.room.clear();
                    o.room.push_str(room);
                    o.value.clear();
                    o.value.extend_from_slice(value);
                }
                empty @ None => {
                    *empty = Some(Opened {
                        generation: self.generation,
                        room: room.to_owned(),
                        value: value.to_vec(),
                        ticket,
                    });
                }
            }
        });
        Ok(ticket)
    }
}

/// `a == b` in time that does not depend on where they differ: a visitor
/// whose cookie does not open leaves the slot's remembered value (another
/// visitor's cookie) in place, and an early-exit comparison against it would
/// tell, by timing, how much of a guess was right.
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Slots of a worker thread's [`OPENED`] cache.
const OPENED_SLOTS: usize = 64;

/// A cookie value that opened, what it opened to and under what.
struct Opened {
    generation: u64,
    room: String,
    value: Vec<u8>,
    ticket: Ticket,
}

thread_local! {
    /// Each worker thread's last opened cookie per slot ([`CookieKeys::open_ticket`]).
    static OPENED: RefCell<Vec<Option<Opened>>> = const { RefCell::new(Vec::new()) };
}

/// The associated data: `waitroom`, the format version, the room id.
fn aad(room: &str) -> Vec<u8> {
    let mut aad = Vec::with_capacity(room.len() + 10);
    aad.extend_from_slice(b"waitroom");
    aad.push(FORMAT);
    aad.extend_from_slice(room.as_bytes());
    aad
}

/// Calls `f` with [`aad`]`(room)`, built on the stack for a room id of
/// ordinary length (no allocation on the request path).
fn with_aad<R>(room: &str, f: impl FnOnce(&[u8]) -> R) -> R {
    const PREFIX: usize = b"waitroom".len() + 1;
    let mut buf = [0u8; 128];
    if room.len() > buf.len() - PREFIX {
        return f(&aad(room));
    }
    buf[..PREFIX - 1].copy_from_slice(b"waitroom");
    buf[PREFIX - 1] = FORMAT;
    buf[PREFIX..PREFIX + room.len()].copy_from_slice(room.as_bytes());
    f(&buf[..PREFIX + room.len()])
}

/// Name of the cookie for a room: one per room, so rooms never see each other's.
pub fn cookie_name(room: &str) -> String {
    let mut name = String::with_capacity(room.len() + 4);
    name.push_str("__wr_");
    for c in room.chars() {
        name.push(if c.is_ascii_alphanumeric() { c } else { '_' });
    }
    name
}

/// Finds `name` among the request's `Cookie` headers: the value of the
/// first `name=value` pair (pairs split at `;`, spaces and tabs about a pair
/// dropped) in the first header that has one. A header holding anything but
/// visible ASCII, space and tab is passed over whole (it is no text).
///
/// Plain byte comparisons and `memchr`: `str::split`'s searchers over
/// `to_str` and the flattened iterators it replaced cost ~900 instructions
/// for one cookie, 3 % of an admitted request (issue 17).
pub fn find<'a>(headers: &'a http::HeaderMap, name: &str) -> Option<&'a [u8]> {
    let name = name.as_bytes();
    for value in headers.get_all(http::header::COOKIE) {
        let bytes = value.as_bytes();
        if !is_text(bytes) {
            continue;
        }
        let mut rest = bytes;
        loop {
            let (pair, next) = match memchr::memchr(b';', rest) {
                Some(at) => (&rest[..at], Some(&rest[at + 1..])),
                None => (rest, None),
            };
            // Only spaces and tabs among what `trim_ascii` trims pass `is_text`.
            let pair = pair.trim_ascii();
            if pair.len() > name.len() && pair[name.len()] == b'=' && pair.starts_with(name) {
                // Visible ASCII, checked above (bytes: a UTF-8 check of it
                // cost ~140 instructions a request).
                return Some(&pair[name.len() + 1..]);
            }
            match next {
                Some(next) => rest = next,
                None => break,
            }
        }
    }
    None
}

/// `HeaderValue::to_str`'s test (visible ASCII, space, tab), without an
/// early exit, so that it runs over the value in wide steps.
fn is_text(bytes: &[u8]) -> bool {
    bytes.iter().fold(true, |ok, &b| {
        ok & ((b.wrapping_sub(0x20) < 0x5f) | (b == b'\t'))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(ids: &[u8]) -> CookieKeys {
        let pairs: Vec<(u8, [u8; 32])> = ids.iter().map(|i| (*i, [*i; 32])).collect();
        CookieKeys::new(&pairs).unwrap()
    }

    #[test]
    fn sealed_cookie_opens_for_its_room_only() {
        let k = keys(&[1]);
        let c = k.seal("shop", b"ticket");
        assert_eq!(k.open("shop", &c).unwrap(), b"ticket");
        assert_eq!(k.open("other", &c), Err(CookieFailure::Tampered));
    }

    /// Plain texts on either side of the stack buffer's 128 bytes seal to
    /// values of the announced length that open to the same bytes, and
    /// nowhere else.
    #[test]
    fn texts_short_and_long_seal_and_open() {
        let k = keys(&[1]);
        for len in (0..=140).chain([200, 300]) {
            let plain: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
            let c = k.seal("shop", &plain);
            assert!(c.len() <= CookieKeys::sealed_len(len), "{len}");
            // Unpadded base64 of the header, the text and the tag.
            assert_eq!(c.len(), (4 * (HEADER + len + TAG)).div_ceil(3), "{len}");
            if c.len() <= MAX_COOKIE_LEN {
                assert_eq!(k.open("shop", &c).unwrap(), plain, "{len}");
                assert_eq!(k.open("other", &c), Err(CookieFailure::Tampered), "{len}");
            }
        }
    }

    #[test]
    fn the_associated_data_is_the_same_on_the_stack_and_for_long_room_ids() {
        for room in [
            "",
            "shop",
            &"r".repeat(119),
            &"r".repeat(120),
            &"x".repeat(400),
        ] {
            assert_eq!(with_aad(room, <[u8]>::to_vec), aad(room), "{}", room.len());
            let k = keys(&[1]);
            let c = k.seal(room, b"ticket");
            assert_eq!(c.len(), CookieKeys::sealed_len(6));
            assert_eq!(k.open(room, &c).unwrap(), b"ticket");
            assert_eq!(
                k.open(&format!("{room}!"), &c),
                Err(CookieFailure::Tampered)
            );
        }
    }

    #[test]
    fn rotation_previous_key_still_opens() {
        let old = keys(&[1]);
        let c = old.seal("shop", b"t");
        let rotated = keys(&[2, 1]);
        assert_eq!(rotated.open("shop", &c).unwrap(), b"t");
        // New cookies are sealed with the new key; the old-only jar cannot open them.
        let fresh = rotated.seal("shop", b"t");
        assert_eq!(old.open("shop", &fresh), Err(CookieFailure::UnknownKey));
    }

    #[test]
    fn every_flipped_bit_is_detected() {
        let k = keys(&[7]);
        let c = k.seal("shop", b"some ticket bytes");
        let raw = URL_SAFE_NO_PAD.decode(&c).unwrap();
        for i in 2..raw.len() {
            let mut bad = raw.clone();
            bad[i] ^= 0x01;
            let v = URL_SAFE_NO_PAD.encode(&bad);
            assert!(k.open("shop", &v).is_err(), "byte {i} flip accepted");
        }
    }

    #[test]
    fn garbage_truncated_and_huge_are_refused() {
        let k = keys(&[1]);
        let c = k.seal("shop", b"ticket");
        assert_eq!(k.open("shop", "%%%"), Err(CookieFailure::Malformed));
        assert_eq!(k.open("shop", &c[..10]), Err(CookieFailure::Malformed));
        assert!(k.open("shop", &c[..c.len() - 3]).is_err());
        assert_eq!(
            k.open("shop", &"A".repeat(MAX_COOKIE_LEN + 1)),
            Err(CookieFailure::TooLarge)
        );
    }

    #[test]
    fn a_remembered_cookie_opens_only_for_the_same_bytes_room_and_keys() {
        use waitroom_common::{room::RoomId, time::UnixMillis};
        let k = keys(&[1]);
        let ticket = Ticket::new_visitor(RoomId(3), UnixMillis(1_800_000_000_000), 20);
        let c = k.seal("shop", &postcard::to_allocvec(&ticket).unwrap());
        let conn = 7;
        assert_eq!(k.open_ticket("shop", &c, conn), Ok(ticket));
        assert_eq!(k.open_ticket("shop", &c, conn), Ok(ticket), "remembered");
        // Another room's AAD: not taken from the cache.
        assert_eq!(
            k.open_ticket("other", &c, conn),
            Err(CookieFailure::Tampered)
        );
        // One byte changed: opened, and refused.
        let mut bad = c.clone().into_bytes();
        let last = bad.len() - 1;
        bad[last] = if bad[last] == b'A' { b'B' } else { b'A' };
        let bad = String::from_utf8(bad).unwrap();
        assert_eq!(k.open_ticket("shop", &c, conn), Ok(ticket));
        assert!(k.open_ticket("shop", &bad, conn).is_err());
        // Keys rotated to a set without the sealing key: refused, though the
        // very same value opened under the previous set on this connection.
        assert_eq!(k.open_ticket("shop", &c, conn), Ok(ticket));
        let rotated = keys(&[2]);
        assert_eq!(
            rotated.open_ticket("shop", &c, conn),
            Err(CookieFailure::UnknownKey)
        );
        // Bytes that open but are no ticket.
        let junk = k.seal("shop", b"\xff\xff\xff");
        assert_eq!(
            k.open_ticket("shop", &junk, conn),
            Err(CookieFailure::Malformed)
        );
        // Another connection in another slot opens its own.
        assert_eq!(k.open_ticket("shop", &c, conn + 1), Ok(ticket));
    }

    #[test]
    fn same_bytes_is_equality() {
        assert!(same_bytes(b"", b""));
        assert!(same_bytes(b"abc", b"abc"));
        assert!(!same_bytes(b"abc", b"abd"));
        assert!(!same_bytes(b"abc", b"xbc"));
        assert!(!same_bytes(b"abc", b"abcd"));
    }

    #[test]
    fn finds_the_named_cookie_among_many() {
        let mut h = http::HeaderMap::new();
        h.append(http::header::COOKIE, "a=1; __wr_shop=xyz".parse().unwrap());
        h.append(http::header::COOKIE, "b=2".parse().unwrap());
        assert_eq!(find(&h, "__wr_shop"), Some(&b"xyz"[..]));
        assert_eq!(find(&h, "b"), Some(&b"2"[..]));
        assert_eq!(find(&h, "c"), None);
        assert_eq!(cookie_name("my room/1"), "__wr_my_room_1");
    }

    /// A nonce used twice under one key would give both messages away (and
    /// Poly1305's key): every seal draws a fresh one.
    #[test]
    fn every_seal_has_a_nonce_of_its_own() {
        let k = keys(&[1]);
        let mut seen = std::collections::HashSet::new();
        for _ in 0..10_000 {
            let raw = URL_SAFE_NO_PAD.decode(k.seal("shop", b"ticket")).unwrap();
            let nonce: [u8; 12] = raw[2..HEADER].try_into().unwrap();
            assert_ne!(nonce, [0; 12]);
            assert!(seen.insert(nonce), "nonce {nonce:?} drawn twice");
        }
    }

    /// What `find` was before issue 17 made it one pass: the reference.
    fn find_by_str<'a>(headers: &'a http::HeaderMap, name: &str) -> Option<&'a str> {
        headers
            .get_all(http::header::COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(';'))
            .filter_map(|pair| pair.trim().split_once('='))
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v)
    }

    #[test]
    fn finds_a_cookie_as_the_reading_by_str_does() {
        // Fragments an attacker or a broken client could send, glued in
        // every order up to three at a time, in one or two headers.
        const PARTS: [&[u8]; 16] = [
            b"a=1",
            b"__wr_shop=xyz",
            b"; ",
            b";",
            b" ",
            b"\t",
            b"=",
            b"__wr_shop",
            b"__wr_shop =v",
            b" __wr_shop= v ",
            b"__wr_shopx=1",
            b"x__wr_shop=2",
            b"\xc3\xa9",
            b"\x7f",
            b"a=b=c",
            b"__wr_shop=",
        ];
        let mut checked = 0;
        let mut values = vec![Vec::new()];
        for _ in 0..3 {
            let mut longer = Vec::new();
            for v in &values {
                for p in PARTS {
                    let mut w = v.clone();
                    w.extend_from_slice(p);
                    longer.push(w);
                }
            }
            values.extend(longer);
        }
        values.dedup();
        for (i, first) in values.iter().enumerate() {
            // The second header: none, or one of a few values.
            for second in [
                None,
                Some(&values[i % 17]),
                Some(&values[(i * 7) % values.len()]),
            ] {
                let mut h = http::HeaderMap::new();
                let Ok(v) = http::HeaderValue::from_bytes(first) else {
                    continue;
                };
                h.append(http::header::COOKIE, v);
                if let Some(Ok(v)) = second.map(|s| http::HeaderValue::from_bytes(s)) {
                    h.append(http::header::COOKIE, v);
                }
                for name in ["__wr_shop", "a", "x"] {
                    assert_eq!(
                        find(&h, name),
                        find_by_str(&h, name).map(str::as_bytes),
                        "{name} in {h:?}"
                    );
                    checked += 1;
                }
            }
        }
        assert!(checked > 30_000, "{checked}");
    }
}
