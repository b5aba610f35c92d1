//! The PROXY protocol header (HAProxy's v1 text and v2 binary) that a TCP
//! load balancer in front of the node sends first on every connection, naming
//! the client it accepted. Parsed by the `ppp` crate; this module only reads
//! the bytes off the socket, under the connection's header deadline, without
//! taking any byte that belongs to what follows (TLS or HTTP).
use std::{net::SocketAddr, time::Instant};

use bytes::Bytes;
use ppp::{HeaderResult, PartialResult as _, v1, v2};
use tokio::io::{AsyncRead, AsyncReadExt as _};

/// Most bytes a PROXY header may take: v1 is at most 107; v2 is 16 plus its
/// addresses and TLVs, which load balancers keep to a few hundred.
pub const MAX_HEADER_BYTES: usize = 4096;

/// How a v1 header starts, and its longest form (CRLF included).
const V1_PREFIX: &[u8] = b"PROXY ";
const V1_MAX_BYTES: usize = 107;

/// Why a connection's PROXY header was not accepted; each closes it.
#[derive(Debug, thiserror::Error)]
pub enum ProxyHeaderError {
    #[error("no complete PROXY header before the header deadline")]
    Timeout,
    #[error("the connection ended before a complete PROXY header")]
    Closed,
    #[error("malformed PROXY header: {0}")]
    Malformed(String),
    #[error("PROXY header longer than {MAX_HEADER_BYTES} bytes")]
    TooLong,
    #[error("reading the PROXY header: {0}")]
    Io(#[from] std::io::Error),
}

/// A parsed PROXY header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyHeader {
    /// The client the load balancer accepted; `None` for a connection of the
    /// load balancer's own (v2 `LOCAL`, as health checks; v1 `UNKNOWN`; a
    /// UNIX socket), whose client is the peer.
    pub source: Option<SocketAddr>,
    /// Bytes read past the header: the start of the TLS or HTTP stream.
    pub rest: Bytes,
}

/// What the bytes so far are.
#[derive(Debug, PartialEq, Eq)]
pub enum Parsed {
    /// A complete header of `len` bytes naming `source`.
    Complete {
        len: usize,
        source: Option<SocketAddr>,
    },
    /// Could still become a header with more bytes.
    Incomplete,
    /// Cannot become a header, whatever follows.
    Invalid(String),
}

/// Parses the start of a connection.
#[must_use]
pub fn parse(buf: &[u8]) -> Parsed {
    // A v1 line is judged whole: `ppp` refuses some cuts of a good line
    // (one ending in the space before the last port) instead of waiting.
    let v1_start = &buf[..buf.len().min(V1_PREFIX.len())];
    if V1_PREFIX.starts_with(v1_start) && !buf.contains(&b'\n') && buf.len() < V1_MAX_BYTES {
        return Parsed::Incomplete;
    }
    let result = HeaderResult::parse(buf);
    if result.is_incomplete() {
        return Parsed::Incomplete;
    }
    match result {
        HeaderResult::V1(Ok(h)) => Parsed::Complete {
            len: h.header.len(),
            source: match h.addresses {
                v1::Addresses::Tcp4(a) => {
                    Some(SocketAddr::new(a.source_address.into(), a.source_port))
                }
                v1::Addresses::Tcp6(a) => {
                    Some(SocketAddr::new(a.source_address.into(), a.source_port))
                }
                v1::Addresses::Unknown => None,
            },
        },
        HeaderResult::V2(Ok(h)) => Parsed::Complete {
            len: h.len(),
            source: match (h.command, h.addresses) {
                (v2::Command::Local, _) => None,
                (v2::Command::Proxy, v2::Addresses::IPv4(a)) => {
                    Some(SocketAddr::new(a.source_address.into(), a.source_port))
                }
                (v2::Command::Proxy, v2::Addresses::IPv6(a)) => {
                    Some(SocketAddr::new(a.source_address.into(), a.source_port))
                }
                (v2::Command::Proxy, _) => None,
            },
        },
        HeaderResult::V1(Err(e)) => Parsed::Invalid(e.to_string()),
        HeaderResult::V2(Err(e)) => Parsed::Invalid(e.to_string()),
    }
}

/// Reads the PROXY header at the start of `io`, by `deadline`.
pub async fn read_header<R: AsyncRead + Unpin>(
    io: &mut R,
    deadline: Instant,
) -> Result<ProxyHeader, ProxyHeaderError> {
    tokio::time::timeout_at(deadline.into(), read(io))
        .await
        .map_err(|_| ProxyHeaderError::Timeout)?
}

/// Every turn either returns or grows the buffer, which is capped: at most
/// [`MAX_HEADER_BYTES`] turns.
async fn read<R: AsyncRead + Unpin>(io: &mut R) -> Result<ProxyHeader, ProxyHeaderError> {
    let mut buf = Vec::with_capacity(256);
    let mut chunk = [0u8; 512];
    loop {
        if !buf.is_empty() {
            match parse(&buf) {
                Parsed::Complete { len, source } => {
                    return Ok(ProxyHeader {
                        source,
                        rest: Bytes::copy_from_slice(&buf[len..]),
                    });
                }
                Parsed::Invalid(why) => return Err(ProxyHeaderError::Malformed(why)),
                Parsed::Incomplete => {}
            }
        }
        let room = MAX_HEADER_BYTES - buf.len();
        if room == 0 {
            return Err(ProxyHeaderError::TooLong);
        }
        let want = room.min(chunk.len());
        let n = io.read(&mut chunk[..want]).await?;
        if n == 0 {
            return Err(ProxyHeaderError::Closed);
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::io::AsyncWriteExt as _;

    use super::*;

    fn v2_header(command: v2::Command, from: &str, to: &str) -> Vec<u8> {
        let addresses = v2::Addresses::from((
            from.parse::<SocketAddr>().unwrap(),
            to.parse::<SocketAddr>().unwrap(),
        ));
        v2::Builder::with_addresses(v2::Version::Two | command, v2::Protocol::Stream, addresses)
            .write_tlv(v2::Type::NoOp, b"pad")
            .unwrap()
            .build()
            .unwrap()
    }

    #[test]
    fn each_version_names_its_source_and_its_length() {
        let v1 = b"PROXY TCP4 203.0.113.9 10.0.0.1 4711 80\r\nGET / HTTP/1.1\r\n";
        assert_eq!(
            parse(v1),
            Parsed::Complete {
                len: 41,
                source: Some("203.0.113.9:4711".parse().unwrap())
            }
        );
        let v1_6 = b"PROXY TCP6 2001:db8::9 2001:db8::1 4711 443\r\n";
        assert!(matches!(
            parse(v1_6),
            Parsed::Complete { source: Some(s), .. } if s == "[2001:db8::9]:4711".parse().unwrap()
        ));
        assert!(matches!(
            parse(b"PROXY UNKNOWN\r\n"),
            Parsed::Complete {
                len: 15,
                source: None
            }
        ));
        let v2 = v2_header(v2::Command::Proxy, "203.0.113.9:4711", "10.0.0.1:443");
        assert_eq!(
            parse(&v2),
            Parsed::Complete {
                len: v2.len(),
                source: Some("203.0.113.9:4711".parse().unwrap())
            }
        );
        let local = v2_header(v2::Command::Local, "203.0.113.9:4711", "10.0.0.1:443");
        assert!(matches!(
            parse(&local),
            Parsed::Complete { source: None, .. }
        ));
    }

    #[test]
    fn partial_headers_wait_and_garbage_is_refused_at_once() {
        let v2 = v2_header(v2::Command::Proxy, "203.0.113.9:4711", "10.0.0.1:443");
        for cut in 1..v2.len() {
            assert_eq!(parse(&v2[..cut]), Parsed::Incomplete, "v2 cut at {cut}");
        }
        let v1 = b"PROXY TCP4 203.0.113.9 10.0.0.1 4711 80\r\n";
        for cut in 1..v1.len() {
            assert_eq!(parse(&v1[..cut]), Parsed::Incomplete, "v1 cut at {cut}");
        }
        for garbage in [
            &b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"[..],
            b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",
            b"PROXY TCP4 999.0.0.1 10.0.0.1 1 2\r\n",
            b"PROXY TCP9 1.2.3.4 10.0.0.1 1 2\r\n",
            b"PROXY TCP4 1.2.3.4 10.0.0.1 1 2\n\n",
        ] {
            assert!(
                matches!(parse(garbage), Parsed::Invalid(_)),
                "{:?}",
                String::from_utf8_lossy(garbage)
            );
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn reading_keeps_what_follows_and_stops_at_the_deadline() {
        let (mut client, mut server) = tokio::io::duplex(8192);
        let v2 = v2_header(v2::Command::Proxy, "203.0.113.9:4711", "10.0.0.1:443");
        // In two writes: the reader waits for the rest.
        client.write_all(&v2[..10]).await.unwrap();
        let reader = tokio::spawn(async move {
            let h = read_header(&mut server, Instant::now() + Duration::from_secs(5)).await;
            (h, server)
        });
        tokio::task::yield_now().await;
        let mut rest = v2[10..].to_vec();
        rest.extend_from_slice(b"GET / HTTP/1.1\r\n");
        client.write_all(&rest).await.unwrap();
        let (h, _server) = reader.await.unwrap();
        let h = h.unwrap();
        assert_eq!(h.source, Some("203.0.113.9:4711".parse().unwrap()));
        assert_eq!(&h.rest[..], b"GET / HTTP/1.1\r\n");

        // Nothing sent: the deadline ends it.
        let (_quiet, mut server) = tokio::io::duplex(64);
        let err = read_header(&mut server, Instant::now() + Duration::from_millis(50))
            .await
            .unwrap_err();
        assert!(matches!(err, ProxyHeaderError::Timeout), "{err}");
        // Closed half-way.
        let (mut client, mut server) = tokio::io::duplex(64);
        client.write_all(b"PROXY TCP4 1.2").await.unwrap();
        drop(client);
        let err = read_header(&mut server, Instant::now() + Duration::from_secs(5))
            .await
            .unwrap_err();
        assert!(matches!(err, ProxyHeaderError::Closed), "{err}");
        // A v2 header that claims more than the cap.
        let (mut client, mut server) = tokio::io::duplex(16_384);
        let mut huge = v2[..14].to_vec();
        huge.extend_from_slice(&u16::MAX.to_be_bytes());
        huge.resize(8000, 0);
        client.write_all(&huge).await.unwrap();
        let err = read_header(&mut server, Instant::now() + Duration::from_secs(5))
            .await
            .unwrap_err();
        assert!(matches!(err, ProxyHeaderError::TooLong), "{err}");
    }
}
