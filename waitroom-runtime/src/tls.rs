//! Mutual TLS for gossip: PEM files in, quinn configs out.
//!
//! Every node and the aggregator hold the cluster CA, their own certificate
//! and key. The aggregator accepts only clients whose certificate chains to
//! that CA (`WebPkiClientVerifier`), so a machine that merely reaches the UDP
//! port cannot inject reports that would open the gates; nodes check the
//! aggregator's certificate against the same CA, so they never take slots
//! from an impostor. TLS 1.3 only: QUIC requires it.
//!
//! The `ring` provider is named explicitly rather than installed process-wide,
//! so this module works whatever other crates in the binary pick.
use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use arc_swap::ArcSwap;
use rustls::{
    RootCertStore,
    crypto::CryptoProvider,
    server::{ResolvesServerCert, VerifierBuilderError, WebPkiClientVerifier},
    sign::CertifiedKey,
};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject as _};

/// ALPN of the gossip protocol: a node and an aggregator that do not agree on
/// it fail the handshake instead of exchanging frames they cannot read.
pub const ALPN: &[u8] = b"waitroom-gossip/1";

/// DNS name in the development aggregator certificate besides `localhost`
/// and `127.0.0.1` (`cargo xtask certs`), and the node's default
/// `server_name`: nodes use it to reach an aggregator by address on a
/// private network.
pub const DEV_AGGREGATOR_NAME: &str = "aggregator.waitroom.internal";

/// Where a peer's PEM files are.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsFiles {
    /// The cluster CA certificate(s): the only issuers a peer is trusted from.
    pub ca: PathBuf,
    /// This peer's certificate chain (leaf first).
    pub cert: PathBuf,
    /// This peer's private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
}

/// Why TLS could not be set up. Each names the file to look at.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{path}: cannot read PEM: {source}")]
    Pem {
        path: PathBuf,
        source: rustls_pki_types::pem::Error,
    },
    #[error("{path}: no certificate in the file")]
    NoCertificate { path: PathBuf },
    #[error("{path}: CA certificate refused: {source}")]
    BadCa {
        path: PathBuf,
        source: rustls::Error,
    },
    #[error("{path}: no usable CA certificate")]
    NoCa { path: PathBuf },
    #[error("client certificate verifier: {source}")]
    Verifier { source: VerifierBuilderError },
    #[error("{cert} / {key}: certificate and key refused: {source}")]
    CertKey {
        cert: PathBuf,
        key: PathBuf,
        source: rustls::Error,
    },
    #[error("TLS configuration has no QUIC-capable cipher suite")]
    NoQuicSuite,
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Maps a rustls refusal of `cert`/`key` to the error naming both files.
fn cert_key_error(cert: &Path, key: &Path) -> impl Fn(rustls::Error) -> TlsError {
    let (cert, key) = (cert.to_owned(), key.to_owned());
    move |source| TlsError::CertKey {
        cert: cert.clone(),
        key: key.clone(),
        source,
    }
}

fn certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = |source| TlsError::Pem {
        path: path.to_owned(),
        source,
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(pem)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(pem)?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate {
            path: path.to_owned(),
        });
    }
    Ok(certs)
}

fn key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|source| TlsError::Pem {
        path: path.to_owned(),
        source,
    })
}

fn roots(path: &Path) -> Result<Arc<RootCertStore>, TlsError> {
    let mut store = RootCertStore::empty();
    for cert in certs(path)? {
        store.add(cert).map_err(|source| TlsError::BadCa {
            path: path.to_owned(),
            source,
        })?;
    }
    if store.is_empty() {
        return Err(TlsError::NoCa {
            path: path.to_owned(),
        });
    }
    Ok(Arc::new(store))
}

/// The visitors' TLS listener: certificate chain and key from PEM files,
/// ALPN `h2` then `http/1.1`. The certificate is served through the returned
/// [`CertSwap`], so a reload can replace it while connections are accepted.
pub fn https_server_config(
    cert: &Path,
    key_path: &Path,
) -> Result<(rustls::ServerConfig, Arc<CertSwap>), TlsError> {
    let swap = Arc::new(CertSwap {
        current: ArcSwap::new(CertSwap::load_key(cert, key_path)?),
    });
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(cert_key_error(cert, key_path))?
        .with_no_client_auth()
        .with_cert_resolver(Arc::clone(&swap) as Arc<dyn ResolvesServerCert>);
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok((config, swap))
}

/// The certificate and key a TLS listener presents, replaceable at run time
/// (SIGHUP re-reads the files): every handshake takes the current pair.
#[derive(Debug)]
pub struct CertSwap {
    current: ArcSwap<CertifiedKey>,
}

impl CertSwap {
    /// Loads a certificate chain and its key, checking that they belong
    /// together (a key for another certificate is refused here, not at the
    /// first handshake).
    pub fn load_key(cert: &Path, key_path: &Path) -> Result<Arc<CertifiedKey>, TlsError> {
        CertifiedKey::from_der(certs(cert)?, key(key_path)?, &provider())
            .map(Arc::new)
            .map_err(cert_key_error(cert, key_path))
    }

    /// Presents `pair` from the next handshake on.
    pub fn store(&self, pair: Arc<CertifiedKey>) {
        self.current.store(pair);
    }
}

impl ResolvesServerCert for CertSwap {
    fn resolve(&self, _hello: rustls::server::ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.load_full())
    }
}

/// Whether the peer of `connection` holds a certificate for `name`: the
/// aggregator takes a node's identity from its client certificate (already
/// verified against the cluster CA by the handshake), so a node can only
/// report as the name its certificate carries. Names are matched as the
/// certificate's DNS subject alternative names, as a server name would be.
#[must_use]
pub fn peer_is(connection: &quinn::Connection, name: &str) -> bool {
    let Some(identity) = connection.peer_identity() else {
        return false;
    };
    let Ok(chain) = identity.downcast::<Vec<CertificateDer<'static>>>() else {
        return false;
    };
    let Some(leaf) = chain.first() else {
        return false;
    };
    let Ok(server_name) = rustls_pki_types::ServerName::try_from(name) else {
        return false;
    };
    webpki::EndEntityCert::try_from(leaf)
        .is_ok_and(|cert| cert.verify_is_valid_for_subject_name(&server_name).is_ok())
}

/// Checks that the three files load (what `--check` runs).
pub fn check(files: &TlsFiles) -> Result<(), TlsError> {
    roots(&files.ca)?;
    certs(&files.cert)?;
    key(&files.key)?;
    Ok(())
}

/// Transport settings shared by both ends: keep-alives well inside the idle
/// timeout so a quiet but healthy connection is never dropped, and an idle
/// timeout short enough that a dead peer is noticed within a few intervals.
fn transport() -> Arc<quinn::TransportConfig> {
    let mut t = quinn::TransportConfig::default();
    t.keep_alive_interval(Some(Duration::from_secs(1)));
    t.max_idle_timeout(Some(
        quinn::IdleTimeout::try_from(Duration::from_secs(6)).expect("6 s fits a VarInt"),
    ));
    // One report in flight per node at a time; a few spare streams for overlap.
    t.max_concurrent_bidi_streams(8u32.into());
    t.max_concurrent_uni_streams(0u32.into());
    Arc::new(t)
}

/// The aggregator's QUIC config: requires a client certificate from the CA.
pub fn server_config(files: &TlsFiles) -> Result<quinn::ServerConfig, TlsError> {
    let provider = provider();
    let verifier = WebPkiClientVerifier::builder_with_provider(roots(&files.ca)?, provider.clone())
        .build()
        .map_err(|source| TlsError::Verifier { source })?;
    let mut crypto = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(cert_key_error(&files.cert, &files.key))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs(&files.cert)?, key(&files.key)?)
        .map_err(cert_key_error(&files.cert, &files.key))?;
    crypto.alpn_protocols = vec![ALPN.to_vec()];
    let quic = quinn::crypto::rustls::QuicServerConfig::try_from(crypto)
        .map_err(|_| TlsError::NoQuicSuite)?;
    let mut config = quinn::ServerConfig::with_crypto(Arc::new(quic));
    config.transport_config(transport());
    Ok(config)
}

/// The aggregator's QUIC endpoint on `addr`, whose stateless-reset key and
/// connection-ID key are derived from its private key (`files.key`), so
/// they stay the same across restarts.
///
/// Why: an aggregator killed without a goodbye leaves every node holding a
/// dead connection. When it comes back, the nodes' next packets on that
/// connection reach a process that does not know it, which answers with a
/// stateless reset (RFC 9000, 10.3). With quinn's defaults — random keys
/// per process — the new process takes the old connection IDs for forged
/// ones and drops the packets, and a reset's token would not be the one
/// the node was given anyway; so the node only gives up after its missed
/// answers (two answer timeouts, about 2 s). With the same keys the reset
/// is sent and valid: the node learns at its next report that the
/// connection is gone and reconnects at once.
pub fn server_endpoint(
    config: quinn::ServerConfig,
    addr: std::net::SocketAddr,
    files: &TlsFiles,
) -> std::io::Result<quinn::Endpoint> {
    let secret = std::fs::read(&files.key)?;
    let derive = |label: &[u8]| {
        let mut context = ring::digest::Context::new(&ring::digest::SHA256);
        context.update(label);
        context.update(&secret);
        context.finish()
    };
    let reset_key = ring::hmac::Key::new(
        ring::hmac::HMAC_SHA256,
        derive(b"waitroom aggregator stateless reset key\0").as_ref(),
    );
    let mut cid_key = [0_u8; 8];
    cid_key.copy_from_slice(&derive(b"waitroom aggregator connection id key\0").as_ref()[..8]);
    let cid_key = u64::from_le_bytes(cid_key);
    let mut endpoint = quinn::EndpointConfig::new(Arc::new(reset_key));
    endpoint.cid_generator(move || {
        Box::new(quinn_proto::HashedConnectionIdGenerator::from_key(cid_key))
    });
    let socket = std::net::UdpSocket::bind(addr)?;
    quinn::Endpoint::new(
        endpoint,
        Some(config),
        socket,
        Arc::new(quinn::TokioRuntime),
    )
}

/// A node's QUIC config: trusts only the CA, presents the node certificate.
pub fn client_config(files: &TlsFiles) -> Result<quinn::ClientConfig, TlsError> {
    let mut crypto = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(cert_key_error(&files.cert, &files.key))?
        .with_root_certificates(roots(&files.ca)?)
        .with_client_auth_cert(certs(&files.cert)?, key(&files.key)?)
        .map_err(cert_key_error(&files.cert, &files.key))?;
    crypto.alpn_protocols = vec![ALPN.to_vec()];
    let quic = quinn::crypto::rustls::QuicClientConfig::try_from(crypto)
        .map_err(|_| TlsError::NoQuicSuite)?;
    let mut config = quinn::ClientConfig::new(Arc::new(quic));
    config.transport_config(transport());
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devcerts;

    #[test]
    fn dev_certificates_load_on_both_ends() {
        let dir = std::env::temp_dir().join(format!("wr-tls-{}", std::process::id()));
        let written = devcerts::write(&dir, &["node-1".to_owned()]).unwrap();
        server_config(&written.aggregator).unwrap();
        client_config(&written.nodes[0].1).unwrap();
        check(&written.aggregator).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_missing_file_is_named() {
        let files = TlsFiles {
            ca: "/nonexistent/ca.pem".into(),
            cert: "/nonexistent/c.pem".into(),
            key: "/nonexistent/k.pem".into(),
        };
        let err = check(&files).unwrap_err();
        assert!(err.to_string().starts_with("/nonexistent/ca.pem:"), "{err}");
    }
}
