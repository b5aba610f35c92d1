//! Development certificates for gossip: a throwaway cluster CA, the
//! aggregator's server certificate and one client certificate per node.
//!
//! `cargo xtask certs` and the integration tests both go through
//! `waitroom-aggregator gen-certs`, which calls [`write()`], so there is one
//! place that knows what a valid cluster certificate looks like. Production
//! clusters bring their own CA; nothing here is meant for them (keys are
//! written unencrypted and the certificates never expire).
use std::{
    io::Write as _,
    path::{Path, PathBuf},
};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

use crate::tls::TlsFiles;

pub use crate::tls::DEV_AGGREGATOR_NAME as AGGREGATOR_NAME;

/// Why certificates could not be made or written.
#[derive(Debug, thiserror::Error)]
pub enum DevCertsError {
    #[error("generating {what}: {source}")]
    Generate { what: String, source: rcgen::Error },
    #[error("{path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("node name {name:?} is not usable in a certificate (letters, digits, '-', '.')")]
    BadNodeName { name: String },
}

/// What [`write()`] produced.
#[derive(Debug, Clone)]
pub struct Written {
    /// The CA certificate every peer trusts.
    pub ca: PathBuf,
    /// The aggregator's files (CA, server certificate, key).
    pub aggregator: TlsFiles,
    /// Each node's name and files (CA, client certificate, key).
    pub nodes: Vec<(String, TlsFiles)>,
}

fn generate(what: &str) -> impl Fn(rcgen::Error) -> DevCertsError + '_ {
    move |source| DevCertsError::Generate {
        what: what.to_owned(),
        source,
    }
}

fn name(common_name: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, "waitroom development");
    dn.push(DnType::CommonName, common_name);
    dn
}

fn write_file(path: &Path, text: &str, secret: bool) -> Result<(), DevCertsError> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let err = |source| DevCertsError::Write {
        path: path.to_owned(),
        source,
    };
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(if secret { 0o600 } else { 0o644 })
        .open(path)
        .map_err(err)?;
    file.write_all(text.as_bytes()).map_err(err)
}

/// Writes a new CA, an aggregator certificate and one client certificate per
/// name in `nodes` into `dir` (created if missing): `ca.pem`, `ca.key`,
/// `aggregator.pem`, `aggregator.key`, `NODE.pem`, `NODE.key`.
///
/// Each call makes a new CA: certificates from two calls do not trust each
/// other, which is how the tests make a node from "another cluster".
pub fn write(dir: &Path, nodes: &[String]) -> Result<Written, DevCertsError> {
    for node in nodes {
        let ok = !node.is_empty()
            && node
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.');
        if !ok || node == "ca" || node == "aggregator" {
            return Err(DevCertsError::BadNodeName { name: node.clone() });
        }
    }
    std::fs::create_dir_all(dir).map_err(|source| DevCertsError::Write {
        path: dir.to_owned(),
        source,
    })?;

    let ca_key = KeyPair::generate().map_err(generate("the CA key"))?;
    let mut ca_params = CertificateParams::default();
    ca_params.distinguished_name = name("waitroom development CA");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca = ca_params
        .self_signed(&ca_key)
        .map_err(generate("the CA certificate"))?;
    let ca_path = dir.join("ca.pem");
    write_file(&ca_path, &ca.pem(), false)?;
    write_file(&dir.join("ca.key"), &ca_key.serialize_pem(), true)?;

    let leaf = |file: &str,
                sans: Vec<String>,
                usage: ExtendedKeyUsagePurpose|
     -> Result<TlsFiles, DevCertsError> {
        let key = KeyPair::generate().map_err(generate(file))?;
        let mut params = CertificateParams::new(sans).map_err(generate(file))?;
        params.distinguished_name = name(file);
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![usage];
        params.use_authority_key_identifier_extension = true;
        let cert = params
            .signed_by(&key, &ca, &ca_key)
            .map_err(generate(file))?;
        let files = TlsFiles {
            ca: ca_path.clone(),
            cert: dir.join(format!("{file}.pem")),
            key: dir.join(format!("{file}.key")),
        };
        write_file(&files.cert, &cert.pem(), false)?;
        write_file(&files.key, &key.serialize_pem(), true)?;
        Ok(files)
    };

    let aggregator = leaf(
        "aggregator",
        vec![
            "localhost".to_owned(),
            "127.0.0.1".to_owned(),
            "::1".to_owned(),
            AGGREGATOR_NAME.to_owned(),
        ],
        ExtendedKeyUsagePurpose::ServerAuth,
    )?;
    let nodes = nodes
        .iter()
        .map(|node| {
            leaf(
                node,
                vec![node.clone()],
                ExtendedKeyUsagePurpose::ClientAuth,
            )
            .map(|files| (node.clone(), files))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Written {
        ca: ca_path,
        aggregator,
        nodes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_would_clash_with_the_ca_files_are_refused() {
        let dir = std::env::temp_dir().join(format!("wr-devcerts-{}", std::process::id()));
        for bad in ["ca", "aggregator", "", "a/b", "x y"] {
            let err = write(&dir, &[bad.to_owned()]).unwrap_err();
            assert!(
                matches!(err, DevCertsError::BadNodeName { .. }),
                "{bad}: {err}"
            );
        }
        let written = write(&dir, &["n-1".to_owned(), "n-2".to_owned()]).unwrap();
        assert_eq!(written.nodes.len(), 2);
        assert!(written.nodes[1].1.key.ends_with("n-2.key"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
