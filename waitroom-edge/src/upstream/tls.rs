//! The connector that reaches origins: plain TCP for `http` pools, rustls for
//! `tls = true` pools (ring provider; the webpki roots plus any configured CA
//! file; the pool's `sni` instead of the origin's host when set).
//!
//! One rustls config serves every room of the node: trust is the union of the
//! configured CA files and the webpki roots, and the server name is looked up
//! per origin.
use std::{collections::HashMap, path::PathBuf, sync::Arc, time::Duration};

use http::Uri;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use rustls::RootCertStore;
use rustls_pki_types::{CertificateDer, ServerName, pem::PemObject as _};

use super::UpstreamSpec;

/// Why the origin TLS setup failed.
#[derive(Debug, thiserror::Error)]
pub enum OriginTlsError {
    #[error("room {room}: ca_file {path}: {source}")]
    CaFile {
        room: String,
        path: PathBuf,
        source: rustls_pki_types::pem::Error,
    },
    #[error("room {room}: ca_file {path}: no usable certificate")]
    NoCertificate { room: String, path: PathBuf },
    #[error("room {room}: sni {sni:?} is not a server name")]
    Sni { room: String, sni: String },
}

/// What the node's origin connections need for TLS, built once at start.
#[derive(Clone)]
pub struct OriginTls {
    config: Arc<rustls::ClientConfig>,
    /// `host:port` of an origin → the name to send and verify.
    names: Arc<HashMap<String, ServerName<'static>>>,
}

impl std::fmt::Debug for OriginTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OriginTls")
            .field("sni_overrides", &self.names.len())
            .finish_non_exhaustive()
    }
}

/// The connector type of every origin client.
pub type OriginConnector = HttpsConnector<HttpConnector>;

impl OriginTls {
    /// Reads the CA files and SNI names of every room's TLS pools.
    pub fn new<'a>(
        rooms: impl IntoIterator<Item = (&'a str, &'a UpstreamSpec)>,
    ) -> Result<Self, OriginTlsError> {
        let mut roots = RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
        };
        let mut names = HashMap::new();
        for (room, spec) in rooms {
            for pool in &spec.pools {
                let Some(tls) = &pool.tls else { continue };
                if let Some(path) = &tls.ca_file {
                    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
                        .and_then(Iterator::collect)
                        .map_err(|source| OriginTlsError::CaFile {
                            room: room.to_owned(),
                            path: path.clone(),
                            source,
                        })?;
                    let (added, _) = roots.add_parsable_certificates(certs);
                    if added == 0 {
                        return Err(OriginTlsError::NoCertificate {
                            room: room.to_owned(),
                            path: path.clone(),
                        });
                    }
                }
                if let Some(sni) = &tls.sni {
                    let name =
                        ServerName::try_from(sni.clone()).map_err(|_| OriginTlsError::Sni {
                            room: room.to_owned(),
                            sni: sni.clone(),
                        })?;
                    for origin in &pool.origins {
                        names.insert(origin.as_str().to_owned(), name.clone());
                    }
                }
            }
        }
        let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("ring supports the default TLS versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
        // The origin speaks HTTP/1.1 (the proxy rewrites requests to it).
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Self {
            config: Arc::new(config),
            names: Arc::new(names),
        })
    }

    /// A connector for `http://` and `https://` origin URIs.
    pub fn connector(&self, connect_timeout: Duration) -> OriginConnector {
        let mut http = HttpConnector::new();
        http.set_connect_timeout(Some(connect_timeout));
        http.set_nodelay(true);
        http.enforce_http(false);
        let names = Arc::clone(&self.names);
        let resolve = move |uri: &Uri| -> Result<ServerName<'static>, OriginTlsNameError> {
            if let Some(name) = uri.authority().and_then(|a| names.get(a.as_str())) {
                return Ok(name.clone());
            }
            let host = uri.host().unwrap_or_default();
            let host = host
                .strip_prefix('[')
                .and_then(|h| h.strip_suffix(']'))
                .unwrap_or(host);
            ServerName::try_from(host.to_owned()).map_err(|_| OriginTlsNameError)
        };
        HttpsConnector::new(http, Arc::clone(&self.config), false, Arc::new(resolve))
    }
}

/// An origin host that is not a valid TLS server name.
#[derive(Debug, thiserror::Error)]
#[error("origin host is not a valid TLS server name")]
pub struct OriginTlsNameError;
