//! The origin side of a room: pools, steering and health checks, as the node
//! runs them.
//!
//! The keys (`origin` or `[[rooms.pools]]`, `steering`, `[rooms.health]`) and
//! the checks that need no network library are in
//! [`waitroom_common::room_table`], which the aggregator parses too. Here the
//! node turns an already validated table into its runtime specs, checking what
//! needs `http` and `rustls`: `host:port`, DNS names, request paths.
use std::{path::PathBuf, time::Duration};

use http::uri::Authority;
use waitroom_common::room_table::{HealthTable, PoolTable, RoomTable};

pub use waitroom_common::room_table::Steering;

/// A field of the room table that is wrong, and why.
#[derive(Debug, PartialEq, Eq)]
pub struct FieldError {
    pub field: String,
    pub problem: String,
}

fn bad(field: impl Into<String>, problem: impl Into<String>) -> FieldError {
    FieldError {
        field: field.into(),
        problem: problem.into(),
    }
}

/// How to reach the origins of a pool over TLS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsSpec {
    /// Server name sent and verified; `None` = the origin's host.
    pub sni: Option<String>,
    /// PEM file of CA certificates to trust; `None` = the webpki roots.
    pub ca_file: Option<PathBuf>,
}

/// One pool as configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolSpec {
    pub name: String,
    /// Share of traffic under `random` steering.
    pub weight: u32,
    pub origins: Vec<Authority>,
    pub tls: Option<TlsSpec>,
}

/// Active health checks of every origin, from this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthSpec {
    /// Path (and query) probed with GET.
    pub path: String,
    pub interval: Duration,
    pub timeout: Duration,
    pub expected_status: u16,
    /// Consecutive failures that mark an up origin down.
    pub fall: u32,
    /// Consecutive successes that mark a down origin up.
    pub rise: u32,
    /// τ of the time-based EWMA: a sample Δt after the last weighs 1 − e^(−Δt/τ).
    pub ewma_time_bias: Duration,
}

/// The origin side of one room.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamSpec {
    pub steering: Steering,
    pub pools: Vec<PoolSpec>,
    /// `None`: no probes; origins are always taken as up.
    pub health: Option<HealthSpec>,
}

impl UpstreamSpec {
    /// The upstream of a room table that passed [`RoomTable::validate`];
    /// a field error is relative to the table (`pools[1].origins`).
    pub fn from_table(table: &RoomTable) -> Result<Self, FieldError> {
        let pools = table.origin_pools();
        if pools.is_empty() {
            return Err(bad("origin", "missing (or give `[[rooms.pools]]`)"));
        }
        let pools = pools
            .iter()
            .enumerate()
            .map(|(i, pool)| {
                // The shorthand has no pools to name: its problem is `origin`.
                let field = |key: &str| match table.origin {
                    Some(_) => "origin".to_owned(),
                    None => format!("pools[{i}].{key}"),
                };
                pool_spec(pool, field)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let health = table.health.as_ref().map(health_spec).transpose()?;
        Ok(Self {
            steering: table.steering,
            pools,
            health,
        })
    }
}

fn parse_origin(field: String, text: &str) -> Result<Authority, FieldError> {
    let origin: Authority = match text.parse() {
        Ok(origin) => origin,
        Err(e) => return Err(bad(field, format!("{text:?} is not host:port ({e})"))),
    };
    if origin.port_u16().is_none() {
        return Err(bad(
            field,
            format!("{text:?} needs a port, e.g. 127.0.0.1:8081"),
        ));
    }
    Ok(origin)
}

fn pool_spec(pool: &PoolTable, field: impl Fn(&str) -> String) -> Result<PoolSpec, FieldError> {
    let origins = pool
        .origins
        .iter()
        .map(|text| parse_origin(field("origins"), text))
        .collect::<Result<Vec<_>, _>>()?;
    if let Some(sni) = &pool.sni
        && rustls_pki_types::ServerName::try_from(sni.as_str()).is_err()
    {
        return Err(bad(field("sni"), format!("{sni:?} is not a DNS name")));
    }
    Ok(PoolSpec {
        name: pool.name.clone(),
        weight: pool.weight,
        origins,
        tls: pool.tls.then(|| TlsSpec {
            sni: pool.sni.clone(),
            ca_file: pool.ca_file.clone(),
        }),
    })
}

fn health_spec(t: &HealthTable) -> Result<HealthSpec, FieldError> {
    if t.path.parse::<http::uri::PathAndQuery>().is_err() {
        return Err(bad(
            "health.path",
            format!("{:?} is not a request path", t.path),
        ));
    }
    Ok(HealthSpec {
        path: t.path.clone(),
        interval: Duration::from_millis(t.interval_ms.get()),
        timeout: Duration::from_millis(t.timeout_ms.get()),
        expected_status: t.expected_status,
        fall: t.fall.get(),
        rise: t.rise.get(),
        ewma_time_bias: Duration::from_millis(t.ewma_time_bias_ms.get()),
    })
}

/// The upstream of a room table written as `text` (without `id` or limits),
/// for tests elsewhere in the crate.
#[cfg(test)]
pub(crate) fn spec_from_text(text: &str) -> Result<UpstreamSpec, FieldError> {
    let text = format!("id = \"t\"\ntotal_active_users = 1\nnew_users_per_minute = 1\n{text}");
    let table: RoomTable = toml::from_str(&text).expect("a room table");
    table.validate().expect("a valid room table");
    UpstreamSpec::from_table(&table)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_single_origin_is_one_pool_without_checks() {
        let spec = spec_from_text("origin = \"127.0.0.1:8081\"").unwrap();
        assert_eq!(spec.steering, Steering::Ordered);
        assert_eq!(spec.pools.len(), 1);
        assert_eq!(spec.pools[0].name, "default");
        assert_eq!(spec.pools[0].origins[0].as_str(), "127.0.0.1:8081");
        assert_eq!(spec.health, None);
    }

    #[test]
    fn pools_steering_and_health_are_read() {
        let spec = spec_from_text(
            r#"
steering = "dynamic"
[[pools]]
name = "eu"
weight = 3
origins = ["127.0.0.1:1", "127.0.0.1:2"]
[[pools]]
name = "us"
origins = ["us.example:443"]
tls = true
sni = "shop.example"
[health]
path = "/healthz"
interval_ms = 500
timeout_ms = 200
fall = 2
rise = 1
"#,
        )
        .unwrap();
        assert_eq!(spec.steering, Steering::Dynamic);
        assert_eq!(spec.pools[0].weight, 3);
        assert_eq!(spec.pools[0].origins.len(), 2);
        assert_eq!(spec.pools[1].weight, 1);
        assert_eq!(
            spec.pools[1].tls,
            Some(TlsSpec {
                sni: Some("shop.example".into()),
                ca_file: None
            })
        );
        let health = spec.health.unwrap();
        assert_eq!(health.path, "/healthz");
        assert_eq!(health.interval, Duration::from_millis(500));
        assert_eq!(health.timeout, Duration::from_millis(200));
        assert_eq!((health.fall, health.rise), (2, 1));
        assert_eq!(health.expected_status, 200);
        assert_eq!(health.ewma_time_bias, Duration::from_secs(60));
    }

    /// What the node checks beyond the shared table (those checks are tested
    /// in `waitroom_common::room_table` and, with file positions, in `config`).
    #[test]
    fn bad_fields_are_named() {
        let field = |text: &str| spec_from_text(text).unwrap_err().field;
        assert_eq!(field(""), "origin");
        assert_eq!(field("origin = \"no-port\""), "origin");
        assert_eq!(field("origin = \"a b:1\""), "origin");
        assert_eq!(
            field(
                "[[pools]]\nname = \"p\"\norigins = [\"a:1\"]\n[[pools]]\nname = \"q\"\norigins = [\"no-port\"]"
            ),
            "pools[1].origins"
        );
        assert_eq!(
            field("[[pools]]\nname = \"p\"\norigins = [\"a:1\"]\ntls = true\nsni = \"not a name\""),
            "pools[0].sni"
        );
        assert_eq!(
            field("origin = \"a:1\"\n[health]\npath = \"/a b\""),
            "health.path"
        );
    }
}
