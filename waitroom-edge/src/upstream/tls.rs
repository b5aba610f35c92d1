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

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use http_body_util::Empty;
    use hyper_util::{client::legacy::Client, rt::TokioExecutor};
    use rustls_pki_types::PrivateKeyDer;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    use super::*;
    use waitroom_runtime::devcerts;

    /// A TLS origin on loopback with the dev certificate (names: localhost,
    /// 127.0.0.1, ::1, `devcerts::AGGREGATOR_NAME`), answering 204 to anything.
    async fn tls_origin(files: &waitroom_runtime::tls::TlsFiles) -> std::net::SocketAddr {
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&files.cert)
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        let key = PrivateKeyDer::from_pem_file(&files.key).unwrap();
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let mut buf = [0u8; 2048];
                    let _ = tls.read(&mut buf).await;
                    let _ = tls
                        .write_all(b"HTTP/1.1 204 No Content\r\ncontent-length: 0\r\n\r\n")
                        .await;
                    let _ = tls.shutdown().await;
                });
            }
        });
        addr
    }

    fn tls_good(spec: &UpstreamSpec) -> OriginTls {
        OriginTls::new([("r", spec)]).unwrap()
    }

    fn spec(addr: std::net::SocketAddr, extra: &str) -> UpstreamSpec {
        let text = format!("[[pools]]\nname = \"p\"\norigins = [\"{addr}\"]\ntls = true\n{extra}");
        crate::upstream::config::spec_from_text(&text).unwrap()
    }

    async fn get(tls: &OriginTls, addr: std::net::SocketAddr) -> Result<u16, String> {
        let client: Client<OriginConnector, Empty<Bytes>> =
            Client::builder(TokioExecutor::new()).build(tls.connector(Duration::from_secs(2)));
        let uri: Uri = format!("https://{addr}/").parse().unwrap();
        client
            .get(uri)
            .await
            .map(|r| r.status().as_u16())
            .map_err(|e| format!("{e:?}"))
    }

    #[tokio::test]
    async fn tls_origins_are_verified_by_the_ca_file_under_the_configured_sni() {
        let dir = std::env::temp_dir().join(format!(
            "waitroom-origin-tls-{}-{}",
            std::process::id(),
            rand::random::<u32>()
        ));
        let written = devcerts::write(&dir, &[]).unwrap();
        let addr = tls_origin(&written.aggregator).await;
        let ca = format!("ca_file = \"{}\"", written.ca.display());
        let sni = format!("sni = \"{}\"", devcerts::AGGREGATOR_NAME);

        let good = spec(addr, &format!("{ca}\n{sni}"));
        let tls = OriginTls::new([("r", &good)]).unwrap();
        assert_eq!(get(&tls, addr).await, Ok(204));

        // The configured name is the one verified: another name fails.
        let other = spec(addr, &format!("{ca}\nsni = \"other.example\""));
        let tls = OriginTls::new([("r", &other)]).unwrap();
        let err = get(&tls, addr).await.unwrap_err();
        assert!(err.contains("NotValidForName"), "{err}");

        // Without the CA file the issuer is unknown (webpki roots only).
        let no_ca = spec(addr, &sni);
        let tls = OriginTls::new([("r", &no_ca)]).unwrap();
        assert!(get(&tls, addr).await.is_err());

        // The workers' own origin pool speaks the same TLS.
        let pool = crate::origin_pool::OriginPool::new(Duration::from_secs(2), &tls_good(&good));
        let authority: http::uri::Authority = addr.to_string().parse().unwrap();
        let mut conn = pool
            .checkout(&http::uri::Scheme::HTTPS, &authority)
            .await
            .unwrap();
        let req = http::Request::builder()
            .uri("/")
            .header(http::header::HOST, "origin.example")
            .body(waitroom_runtime::body::full(Bytes::new()))
            .unwrap();
        let resp = conn.send(req).await.map_err(|e| e.into_error()).unwrap();
        assert_eq!(resp.status(), 204);

        // A CA file that does not exist is named at start.
        let missing = spec(addr, "ca_file = \"/nonexistent/ca.pem\"");
        let err = OriginTls::new([("r", &missing)]).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/ca.pem"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
