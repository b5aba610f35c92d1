//! The origin side of a `[[rooms]]` table: pools, steering and health checks.
//!
//! ```toml
//! [[rooms]]
//! id = "shop"
//! steering = "dynamic"            # "ordered" (default) | "random" | "dynamic"
//!
//! [[rooms.pools]]
//! name = "eu"
//! weight = 1                      # for "random"
//! origins = ["10.0.0.1:8080", "10.0.0.2:8080"]
//!
//! [[rooms.pools]]
//! name = "us"
//! origins = ["origin.us.example:443"]
//! tls = true
//! sni = "shop.example"            # default: the origin's host
//! ca_file = "/etc/waitroom/origin-ca.pem"   # default: the webpki roots
//!
//! [rooms.health]
//! path = "/healthz"
//! interval_ms = 5000
//! timeout_ms = 2000
//! expected_status = 200
//! fall = 3                        # consecutive failures to mark an origin down
//! rise = 2                        # consecutive successes to mark it up again
//! ewma_time_bias_ms = 60000       # the last time bias weighs ~63 % (seed 004)
//! ```
//!
//! A room may instead keep the single `origin = "host:port"` of earlier
//! versions: one pool named `default` with that one origin.
use std::{path::PathBuf, time::Duration};

use http::uri::Authority;

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

/// How a request picks a pool among the healthy ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Steering {
    /// The first healthy pool in listed order (failover).
    Ordered,
    /// A healthy pool at random, in proportion to `weight`.
    Random,
    /// The healthy pool with the lowest EWMA of health-check round-trip time.
    Dynamic,
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

impl Default for HealthSpec {
    fn default() -> Self {
        Self {
            path: "/".into(),
            interval: Duration::from_secs(5),
            timeout: Duration::from_secs(2),
            expected_status: 200,
            fall: 3,
            rise: 2,
            ewma_time_bias: Duration::from_secs(60),
        }
    }
}

/// The origin side of one room.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamSpec {
    pub steering: Steering,
    pub pools: Vec<PoolSpec>,
    /// `None`: no probes; origins are always taken as up.
    pub health: Option<HealthSpec>,
}

/// Keys of the room table this module reads.
pub const KEYS: [&str; 4] = ["origin", "pools", "steering", "health"];

impl UpstreamSpec {
    /// Reads `origin` or `pools`, `steering` and `health` from a room table.
    pub fn from_room_table(table: &toml::Table) -> Result<Self, FieldError> {
        let pools = match (table.get("origin"), table.get("pools")) {
            (Some(_), Some(_)) => {
                return Err(bad(
                    "pools",
                    "give either `origin` or `[[rooms.pools]]`, not both",
                ));
            }
            (None, None) => return Err(bad("origin", "missing (or give `[[rooms.pools]]`)")),
            (Some(origin), None) => {
                let origin = match origin {
                    toml::Value::String(s) => parse_origin("origin", s)?,
                    _ => return Err(bad("origin", "must be a string")),
                };
                vec![PoolSpec {
                    name: "default".into(),
                    weight: 1,
                    origins: vec![origin],
                    tls: None,
                }]
            }
            (None, Some(pools)) => parse_pools(pools)?,
        };
        let steering = match table.get("steering") {
            None => Steering::Ordered,
            Some(toml::Value::String(s)) => match s.as_str() {
                "ordered" => Steering::Ordered,
                "random" => Steering::Random,
                "dynamic" => Steering::Dynamic,
                other => {
                    return Err(bad(
                        "steering",
                        format!("{other:?} is not \"ordered\", \"random\" or \"dynamic\""),
                    ));
                }
            },
            Some(_) => return Err(bad("steering", "must be a string")),
        };
        let health = match table.get("health") {
            None => None,
            Some(toml::Value::Table(t)) => Some(parse_health(t)?),
            Some(_) => return Err(bad("health", "must be a table ([rooms.health])")),
        };
        if steering == Steering::Dynamic && health.is_none() {
            return Err(bad(
                "steering",
                "\"dynamic\" steers by health-check round-trip times: add [rooms.health]",
            ));
        }
        Ok(Self {
            steering,
            pools,
            health,
        })
    }
}

fn parse_origin(field: &str, text: &str) -> Result<Authority, FieldError> {
    let origin: Authority = text
        .parse()
        .map_err(|e| bad(field, format!("{text:?} is not host:port ({e})")))?;
    if origin.port_u16().is_none() {
        return Err(bad(
            field,
            format!("{text:?} needs a port, e.g. 127.0.0.1:8081"),
        ));
    }
    Ok(origin)
}

fn parse_pools(value: &toml::Value) -> Result<Vec<PoolSpec>, FieldError> {
    let toml::Value::Array(tables) = value else {
        return Err(bad("pools", "must be an array of tables ([[rooms.pools]])"));
    };
    if tables.is_empty() {
        return Err(bad("pools", "at least one pool is required"));
    }
    let mut pools: Vec<PoolSpec> = Vec::with_capacity(tables.len());
    for (i, value) in tables.iter().enumerate() {
        let toml::Value::Table(t) = value else {
            return Err(bad(format!("pools[{i}]"), "must be a table"));
        };
        let field = |key: &str| format!("pools[{i}].{key}");
        for key in t.keys() {
            if !["name", "weight", "origins", "tls", "sni", "ca_file"].contains(&key.as_str()) {
                return Err(bad(field(key), "unknown key"));
            }
        }
        let name = match t.get("name") {
            Some(toml::Value::String(s)) if !s.is_empty() => s.clone(),
            Some(_) => return Err(bad(field("name"), "must be a non-empty string")),
            None => return Err(bad(field("name"), "missing")),
        };
        if pools.iter().any(|p| p.name == name) {
            return Err(bad(field("name"), format!("duplicate pool name {name:?}")));
        }
        let weight = match t.get("weight") {
            None => 1,
            Some(toml::Value::Integer(n)) if (0..=i64::from(u32::MAX)).contains(n) => *n as u32,
            Some(_) => return Err(bad(field("weight"), "must be a non-negative integer")),
        };
        let origins = match t.get("origins") {
            Some(toml::Value::Array(list)) if !list.is_empty() => list
                .iter()
                .map(|v| match v {
                    toml::Value::String(s) => parse_origin(&field("origins"), s),
                    _ => Err(bad(field("origins"), "must be strings \"host:port\"")),
                })
                .collect::<Result<Vec<_>, _>>()?,
            Some(_) => {
                return Err(bad(
                    field("origins"),
                    "must be a non-empty array of \"host:port\"",
                ));
            }
            None => return Err(bad(field("origins"), "missing")),
        };
        let tls = match t.get("tls") {
            None | Some(toml::Value::Boolean(false)) => false,
            Some(toml::Value::Boolean(true)) => true,
            Some(_) => return Err(bad(field("tls"), "must be true or false")),
        };
        let text = |key: &str| -> Result<Option<String>, FieldError> {
            match t.get(key) {
                None => Ok(None),
                Some(toml::Value::String(s)) if !s.is_empty() => Ok(Some(s.clone())),
                Some(_) => Err(bad(field(key), "must be a non-empty string")),
            }
        };
        let sni = text("sni")?;
        let ca_file = text("ca_file")?.map(PathBuf::from);
        if !tls && (sni.is_some() || ca_file.is_some()) {
            return Err(bad(field("tls"), "`sni` and `ca_file` need `tls = true`"));
        }
        if let Some(sni) = &sni
            && rustls_pki_types::ServerName::try_from(sni.as_str()).is_err()
        {
            return Err(bad(field("sni"), format!("{sni:?} is not a DNS name")));
        }
        pools.push(PoolSpec {
            name,
            weight,
            origins,
            tls: tls.then_some(TlsSpec { sni, ca_file }),
        });
    }
    Ok(pools)
}

fn parse_health(t: &toml::Table) -> Result<HealthSpec, FieldError> {
    let mut spec = HealthSpec::default();
    let field = |key: &str| format!("health.{key}");
    let positive = |key: &str| -> Result<Option<u64>, FieldError> {
        match t.get(key) {
            None => Ok(None),
            Some(toml::Value::Integer(n)) if *n > 0 => Ok(Some(*n as u64)),
            Some(_) => Err(bad(field(key), "must be a positive integer")),
        }
    };
    for key in t.keys() {
        if ![
            "path",
            "interval_ms",
            "timeout_ms",
            "expected_status",
            "fall",
            "rise",
            "ewma_time_bias_ms",
        ]
        .contains(&key.as_str())
        {
            return Err(bad(field(key), "unknown key"));
        }
    }
    match t.get("path") {
        None => {}
        Some(toml::Value::String(s))
            if s.starts_with('/') && s.parse::<http::uri::PathAndQuery>().is_ok() =>
        {
            spec.path = s.clone();
        }
        Some(_) => return Err(bad(field("path"), "must be a path starting with '/'")),
    }
    if let Some(ms) = positive("interval_ms")? {
        spec.interval = Duration::from_millis(ms);
    }
    if let Some(ms) = positive("timeout_ms")? {
        spec.timeout = Duration::from_millis(ms);
    }
    if spec.timeout > spec.interval {
        return Err(bad(
            field("timeout_ms"),
            format!(
                "{} ms is longer than interval_ms ({} ms)",
                spec.timeout.as_millis(),
                spec.interval.as_millis()
            ),
        ));
    }
    match t.get("expected_status") {
        None => {}
        Some(toml::Value::Integer(n)) if (100..=599).contains(n) => {
            spec.expected_status = *n as u16;
        }
        Some(_) => {
            return Err(bad(
                field("expected_status"),
                "must be an HTTP status (100-599)",
            ));
        }
    }
    for (key, slot) in [("fall", &mut spec.fall), ("rise", &mut spec.rise)] {
        if let Some(n) = positive(key)? {
            *slot = u32::try_from(n).map_err(|_| bad(field(key), "too large"))?;
        }
    }
    if let Some(ms) = positive("ewma_time_bias_ms")? {
        spec.ewma_time_bias = Duration::from_millis(ms);
    }
    Ok(spec)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<UpstreamSpec, FieldError> {
        UpstreamSpec::from_room_table(&toml::from_str(text).unwrap())
    }

    #[test]
    fn a_single_origin_is_one_pool_without_checks() {
        let spec = parse("origin = \"127.0.0.1:8081\"").unwrap();
        assert_eq!(spec.steering, Steering::Ordered);
        assert_eq!(spec.pools.len(), 1);
        assert_eq!(spec.pools[0].origins[0].as_str(), "127.0.0.1:8081");
        assert_eq!(spec.health, None);
    }

    #[test]
    fn pools_steering_and_health_are_read() {
        let spec = parse(
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

    #[test]
    fn bad_fields_are_named() {
        let field = |text: &str| parse(text).unwrap_err().field;
        assert_eq!(field(""), "origin");
        assert_eq!(
            field("origin = \"a:1\"\n[[pools]]\nname = \"p\"\norigins = [\"a:1\"]"),
            "pools"
        );
        assert_eq!(field("[[pools]]\norigins = [\"a:1\"]"), "pools[0].name");
        assert_eq!(
            field("[[pools]]\nname = \"p\"\norigins = []"),
            "pools[0].origins"
        );
        assert_eq!(
            field("[[pools]]\nname = \"p\"\norigins = [\"no-port\"]"),
            "pools[0].origins"
        );
        assert_eq!(
            field(
                "[[pools]]\nname = \"p\"\norigins = [\"a:1\"]\n[[pools]]\nname = \"p\"\norigins = [\"a:2\"]"
            ),
            "pools[1].name"
        );
        assert_eq!(
            field("[[pools]]\nname = \"p\"\norigins = [\"a:1\"]\nsni = \"x\""),
            "pools[0].tls"
        );
        assert_eq!(
            field("origin = \"a:1\"\nsteering = \"fastest\""),
            "steering"
        );
        assert_eq!(
            field("origin = \"a:1\"\nsteering = \"dynamic\""),
            "steering"
        );
        assert_eq!(field("origin = \"a:1\"\n[health]\nfall = 0"), "health.fall");
        assert_eq!(
            field("origin = \"a:1\"\n[health]\ninterval_ms = 100\ntimeout_ms = 200"),
            "health.timeout_ms"
        );
        assert_eq!(
            field("origin = \"a:1\"\n[health]\nexpected_status = 9"),
            "health.expected_status"
        );
        assert_eq!(
            field("origin = \"a:1\"\n[health]\npath = \"x\""),
            "health.path"
        );
        assert_eq!(
            field("origin = \"a:1\"\n[health]\nintervall_ms = 5"),
            "health.intervall_ms"
        );
    }
}
