//! The admin listener: Prometheus metrics (`/metrics`, OpenMetrics text),
//! status (`/status` JSON), the live dashboard (`/dashboard`, polling
//! `/dashboard.json`) and the XDP deny list, for operators only.
//!
//! Safe by default, as nginx's `stub_status` behind `allow 127.0.0.1` and
//! HAProxy's stats socket are: the listener is loopback unless
//! `node.admin_token_file` is set (the config is refused otherwise, by
//! `--check` too). Changing the deny list always needs the token
//! (`Authorization: Bearer …`, compared in constant time), and without a
//! token file it is refused outright: anyone on the machine can reach
//! loopback. Off loopback every request but `/healthz` needs the token.
//! Requests are bounded by the shared listener loop (a connection cap and a
//! deadline per connection, `waitroom_runtime::admin`).
//!
//! A node without an aggregator also serves the control API under `/api/`
//! ([`waitroom_runtime::control`]), with the tokens of
//! `node.admin_token_file` (`NAME TOKEN` lines, or one bare token named
//! `admin`); with an aggregator its room settings are the aggregator's, and
//! `/api/` says to go there.
use std::{net::SocketAddr, path::PathBuf, sync::Arc, sync::atomic::Ordering::Relaxed};

use http::{HeaderValue, Request, Response, StatusCode, header};
use hyper::body::Incoming;
use tokio::net::TcpListener;
use waitroom_runtime::{
    admin::{serve_with, text},
    body::Body,
    metrics::Registry,
    shutdown::Shutdown,
};

use waitroom_common::phase::{RoomPhase, arrival_estimate, event_phase};

use crate::{config::NodeSection, node::Node, xdp};

use waitroom_runtime::control::{MIN_TOKEN_BYTES, TokenError, Tokens};

/// Why the admin token could not be used.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error("node.admin_token_file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "node.admin_token_file {path}: mode {mode:04o} lets every user read the token (chmod 0600 or 0640 it)"
    )]
    Readable { path: PathBuf, mode: u32 },
    #[error(
        "node.admin_token_file {path}: the token is {len} bytes; use at least {MIN_TOKEN_BYTES} (`openssl rand -hex 32`)"
    )]
    Short { path: PathBuf, len: usize },
    /// A line that is neither `TOKEN` nor `NAME TOKEN`, or no token at all.
    #[error("node.admin_token_file {0}")]
    Format(TokenError),
}

impl From<TokenError> for AdminError {
    fn from(err: TokenError) -> Self {
        match err {
            TokenError::Read { path, source } => Self::Read { path, source },
            TokenError::Readable { path, mode } => Self::Readable { path, mode },
            TokenError::Short { path, len, .. } => Self::Short { path, len },
            other @ (TokenError::Format { .. } | TokenError::Empty { .. }) => Self::Format(other),
        }
    }
}

/// The configuration rule, checked when the file is parsed (so `--check`
/// refuses it too): an admin listener off loopback needs a token file.
pub fn check_listen(node: &NodeSection) -> Result<(), String> {
    match node.admin_listen {
        Some(addr) if !addr.ip().is_loopback() && node.admin_token_file.is_none() => Err(format!(
            "{addr} is not a loopback address; the admin listener changes the XDP deny list, so off loopback it needs node.admin_token_file (or bind it to 127.0.0.1)"
        )),
        _ => Ok(()),
    }
}

/// Who may do what on the admin listener.
#[derive(Clone, Debug)]
pub struct AdminAuth {
    /// The tokens of `node.admin_token_file` (one bare token, or `NAME
    /// TOKEN` lines as the control API's audit log wants them), kept as
    /// digests and compared in constant time (see [`Tokens`]).
    tokens: Option<Tokens>,
    /// Whether the listener is on loopback: there, reading needs no token.
    loopback: bool,
}

impl AdminAuth {
    /// Reads `node.admin_token_file` if set (start and `--check`).
    pub fn load(node: &NodeSection) -> Result<Self, AdminError> {
        let loopback = node
            .admin_listen
            .is_none_or(|a: SocketAddr| a.ip().is_loopback());
        let tokens = match &node.admin_token_file {
            Some(path) => Some(Tokens::load(path)?),
            None => None,
        };
        Ok(Self { tokens, loopback })
    }

    /// Whether `req` carries one of the tokens.
    fn authorized<B>(&self, req: &Request<B>) -> bool {
        self.tokens.as_ref().is_some_and(|t| t.who(req).is_some())
    }

    /// The tokens, for the control API of a node without an aggregator.
    #[must_use]
    pub fn tokens(&self) -> Option<&Tokens> {
        self.tokens.as_ref()
    }
}

/// Serves the node's admin endpoints until shutdown; `control` is the
/// control API of a node without an aggregator.
pub async fn serve(
    listener: TcpListener,
    node: Arc<Node>,
    auth: AdminAuth,
    control: Option<Arc<waitroom_runtime::control::Control>>,
    shutdown: Shutdown,
) {
    let auth = Arc::new(auth);
    let metrics = crate::exposition::registry(Arc::clone(&node));
    serve_with(listener, node, shutdown, move |node, req| {
        let auth = Arc::clone(&auth);
        let metrics = Arc::clone(&metrics);
        let control = control.clone();
        async move {
            if req.uri().path().starts_with("/api/") {
                return match control {
                    Some(control) => waitroom_runtime::control::serve(control, req).await,
                    None => text(
                        StatusCode::CONFLICT,
                        "application/json",
                        "{\"error\": \"this node runs the room settings of its aggregator: change them with the aggregator's control API (waitroom-aggregator ctl)\"}\n".into(),
                    ),
                };
            }
            route(&node, &auth, &metrics, req).await
        }
    })
    .await;
}

/// The control API of a node without an aggregator, over its settings store,
/// with the admin listener's tokens.
#[must_use]
pub fn control_api(
    node: &Arc<Node>,
    auth: &AdminAuth,
) -> Option<Arc<waitroom_runtime::control::Control>> {
    let store = node.reloads.store.as_ref()?;
    let tokens = auth.tokens().cloned();
    let applier = Arc::clone(node);
    Some(Arc::new(waitroom_runtime::control::Control {
        tokens,
        disabled_hint: "set node.admin_token_file in the node's config (mode 0600) and restart",
        store: Arc::clone(store),
        apply: Box::new(move |settings| {
            applier
                .apply_settings(settings)
                .map(|_| ())
                .map_err(|e| e.to_string())
        }),
        clock: node.clock.clone(),
    }))
}

async fn route(
    node: &Node,
    auth: &AdminAuth,
    metrics: &Registry,
    req: Request<Incoming>,
) -> Response<Body> {
    let path = req.uri().path();
    if path != "/healthz" && !auth.loopback && !auth.authorized(&req) {
        return unauthorized();
    }
    match path {
        "/metrics" => waitroom_runtime::metrics::response(metrics),
        "/healthz" => text(StatusCode::OK, "text/plain", "ok\n".into()),
        "/status" => text(
            StatusCode::OK,
            "application/json",
            serde_json::to_string_pretty(&status(node)).unwrap_or_default(),
        ),
        "/deny" => deny(node, auth, &req),
        "/dashboard" => waitroom_runtime::dashboard::page(),
        "/dashboard.json" => crate::dashboard::json(node),
        _ => text(StatusCode::NOT_FOUND, "text/plain", "not found\n".into()),
    }
}

fn unauthorized() -> Response<Body> {
    let mut resp = text(
        StatusCode::UNAUTHORIZED,
        "text/plain",
        "this needs the admin token: Authorization: Bearer <node.admin_token_file>\n".into(),
    );
    resp.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer realm=\"waitroom-admin\""),
    );
    resp
}

/// What a deny-list change asks for: `prefix=P` and optionally `force=true`.
#[derive(Debug, PartialEq, Eq)]
struct DenyRequest {
    prefix: xdp::IpPrefix,
    force: bool,
}

impl DenyRequest {
    /// Parses the query; the error is the response text.
    fn parse(query: &str) -> Result<Self, String> {
        let mut prefix = None;
        let mut force = false;
        for kv in query.split('&').filter(|kv| !kv.is_empty()) {
            match kv.split_once('=').unwrap_or((kv, "")) {
                ("prefix", p) => prefix = Some(p),
                ("force", "true" | "1") => force = true,
                ("force", "false" | "0") => force = false,
                (k, v) => {
                    return Err(format!(
                        "unknown parameter {k}={v} (use prefix= and force=true)"
                    ));
                }
            }
        }
        let prefix: xdp::IpPrefix = prefix
            .ok_or("missing prefix= (for example prefix=192.0.2.0/24)")?
            .parse()
            .map_err(|e| format!("prefix: {e}"))?;
        Ok(Self { prefix, force })
    }
}

/// The XDP deny list: `GET /deny` lists prefixes with their drop counts,
/// `POST /deny?prefix=P` adds one, `DELETE /deny?prefix=P` removes one. A
/// prefix shorter than /8 (IPv4) or /32 (IPv6) needs `&force=true`.
/// Changes need the token and are written to the state directory.
fn deny(node: &Node, auth: &AdminAuth, req: &Request<Incoming>) -> Response<Body> {
    let changing = matches!(
        *req.method(),
        http::Method::POST | http::Method::PUT | http::Method::DELETE
    );
    if changing && auth.tokens.is_none() {
        return text(
            StatusCode::FORBIDDEN,
            "text/plain",
            "changing the deny list needs node.admin_token_file to be set\n".into(),
        );
    }
    if changing && !auth.authorized(req) {
        return unauthorized();
    }
    let Some(x) = node.xdp.as_ref() else {
        return text(
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            "the XDP program is not attached on this node (see the warning at start)\n".into(),
        );
    };
    let guard = &x.guard;
    if req.method() == http::Method::GET {
        return match guard.deny_list() {
            Ok(list) => {
                let rows: Vec<serde_json::Value> = list
                    .iter()
                    .map(|(p, drops)| serde_json::json!({"prefix": p.to_string(), "dropped_packets": drops}))
                    .collect();
                text(
                    StatusCode::OK,
                    "application/json",
                    serde_json::to_string_pretty(&rows).unwrap_or_default(),
                )
            }
            Err(err) => text(
                StatusCode::INTERNAL_SERVER_ERROR,
                "text/plain",
                format!("{err}\n"),
            ),
        };
    }
    if !changing {
        return text(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "use GET, POST or DELETE\n".into(),
        );
    }
    let DenyRequest { prefix, force } =
        match DenyRequest::parse(req.uri().query().unwrap_or_default()) {
            Ok(r) => r,
            Err(msg) => return text(StatusCode::BAD_REQUEST, "text/plain", format!("{msg}\n")),
        };
    let result = if req.method() == http::Method::DELETE {
        guard.allow(prefix).map(|was| {
            if was {
                format!("allowed {prefix}\n")
            } else {
                format!("{prefix} was not denied\n")
            }
        })
    } else {
        if prefix.is_broad() && !force {
            return text(
                StatusCode::BAD_REQUEST,
                "text/plain",
                format!(
                    "{prefix} is shorter than /{} and would drop a large part of the Internet (your own SSH session too, perhaps); add &force=true if you mean it\n",
                    if prefix.addr().is_ipv4() {
                        xdp::IpPrefix::BROAD_V4
                    } else {
                        xdp::IpPrefix::BROAD_V6
                    }
                ),
            );
        }
        guard.deny(prefix).map(|()| format!("denied {prefix}\n"))
    };
    let msg = match result {
        Ok(msg) => msg,
        Err(err) => {
            return text(
                StatusCode::INTERNAL_SERVER_ERROR,
                "text/plain",
                format!("{err}\n"),
            );
        }
    };
    tracing::info!(%prefix, force, method = %req.method(), "deny list changed");
    let saved = guard
        .deny_list()
        .map_err(|e| e.to_string())
        .and_then(|list| {
            let prefixes: Vec<xdp::IpPrefix> = list.into_iter().map(|(p, _)| p).collect();
            xdp::deny_file::save(&x.deny_file, &prefixes).map_err(|e| e.to_string())
        });
    match saved {
        Ok(()) => text(StatusCode::OK, "text/plain", msg),
        Err(err) => {
            tracing::error!(%err, "deny list changed but not saved; it is lost at restart");
            text(
                StatusCode::INTERNAL_SERVER_ERROR,
                "text/plain",
                format!("{msg}but not saved (lost at restart): {err}\n"),
            )
        }
    }
}

/// Per-room status for operators, tests and the dashboard.
pub(crate) fn status(node: &Node) -> serde_json::Value {
    let now = node.clock.now();
    let minute = now.minute();
    let rooms: Vec<serde_json::Value> = node
        .rooms
        .iter()
        .enumerate()
        .map(|(i, room)| {
            let c = node.room_counters(i);
            let state = room.state.load();
            let live = room.live.load();
            // As the engine decides now: a scheduled event's overrides.
            let engine = live.engine.at(now);
            let cfg = engine.config();
            serde_json::json!({
                "id": room.spec.id,
                "suspended": live.suspended,
                "host": room.spec.host,
                "path": room.spec.path,
                "upstream": crate::upstream::status::json(&room.upstream),
                "queueing_method": cfg.queueing_method,
                "total_active_users": cfg.total_active_users,
                "new_users_per_minute": cfg.new_users_per_minute,
                "node_active_users": c.active_users(now.expiry_slot()),
                "node_admitted_this_minute": c.admits(minute).total(),
                "node_waiting": c.total_waiting(minute),
                "global_active_users": state.active_users,
                "global_waiting": state.total_waiting,
                "global_admitted_this_minute": state.admitted_this_minute,
                "admits_per_minute": state.admits_per_minute,
                "state_age_ms": now.0.saturating_sub(state.as_of.0),
                "buckets": state.buckets,
                "phase": RoomPhase::of(&engine, &state),
                "event_phase": event_phase(&live.engine, &engine),
                "wait_estimate": arrival_estimate(&engine, &state, minute),
            })
        })
        .collect();
    let gossip = node.gossip.as_ref().map(|g| {
        let now = node.clock.elapsed();
        let freshness = g.world.freshness(now);
        let world = g.world.load();
        // Rooms sharded between aggregator groups: each group's own news.
        let groups: Vec<_> = (g.status.groups.len() > 1)
            .then(|| {
                g.status.groups.iter().enumerate().map(|(i, group)| {
                    let freshness = g.world.group_freshness(&world, i, now);
                    serde_json::json!({
                        "name": group.name,
                        "connected": group.connected.load(Relaxed),
                        "fresh": freshness.is_fresh(),
                        "state_age_ms": freshness.age_ms(),
                    })
                })
            })
            .into_iter()
            .flatten()
            .collect();
        serde_json::json!({
            "connected": g.status.connected(),
            "fresh": freshness.is_fresh(),
            "state_age_ms": freshness.age_ms(),
            "reports_total": g.status.reports_total.load(Relaxed),
            "errors_total": g.status.errors_total.load(Relaxed),
            "groups": groups,
        })
    });
    serde_json::json!({
        "node": node.id,
        "colo": node.colo,
        "settings_version": node.settings_version(),
        "rooms": rooms,
        "gossip": gossip,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(text: &str) -> NodeSection {
        toml::from_str(&format!("id = \"t\"\nlisten = \"127.0.0.1:0\"\n{text}")).unwrap()
    }

    #[test]
    fn off_loopback_needs_a_token_file() {
        assert!(check_listen(&node("")).is_ok());
        assert!(check_listen(&node("admin_listen = \"127.0.0.1:9090\"")).is_ok());
        assert!(check_listen(&node("admin_listen = \"[::1]:9090\"")).is_ok());
        let err = check_listen(&node("admin_listen = \"0.0.0.0:9090\"")).unwrap_err();
        assert!(err.contains("admin_token_file"), "{err}");
        assert!(check_listen(&node("admin_listen = \"192.0.2.1:9090\"")).is_err());
        assert!(
            check_listen(&node(
                "admin_listen = \"0.0.0.0:9090\"\nadmin_token_file = \"/etc/waitroom/admin.token\""
            ))
            .is_ok()
        );
    }

    #[test]
    fn the_token_is_checked_whole() {
        let dir = std::env::temp_dir().join(format!("wr-admin-token-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("token");
        std::fs::write(&path, "0123456789abcdef0123\n").unwrap();
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let auth =
            AdminAuth::load(&node(&format!("admin_token_file = \"{}\"", path.display()))).unwrap();
        let with = |v: &str| {
            Request::builder()
                .header(header::AUTHORIZATION, v)
                .body(())
                .unwrap()
        };
        assert!(auth.authorized(&with("Bearer 0123456789abcdef0123")));
        assert!(!auth.authorized(&with("Bearer 0123456789abcdef012")));
        assert!(!auth.authorized(&with("Bearer 0123456789abcdef01234")));
        assert!(!auth.authorized(&with("Basic 0123456789abcdef0123")));
        assert!(!auth.authorized(&Request::new(())));

        // Named tokens, one per line (the control API logs the name): each
        // opens the admin listener.
        std::fs::write(
            &path,
            "ops 0123456789abcdef0123\nci  fedcba9876543210fedc\n",
        )
        .unwrap();
        let named =
            AdminAuth::load(&node(&format!("admin_token_file = \"{}\"", path.display()))).unwrap();
        assert!(named.authorized(&with("Bearer fedcba9876543210fedc")));
        assert!(named.authorized(&with("Bearer 0123456789abcdef0123")));
        assert!(!named.authorized(&with("Bearer ops 0123456789abcdef0123")));

        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = AdminAuth::load(&node(&format!("admin_token_file = \"{}\"", path.display())))
            .unwrap_err();
        assert!(matches!(err, AdminError::Readable { .. }), "{err}");
        std::fs::write(&path, "short").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let err = AdminAuth::load(&node(&format!("admin_token_file = \"{}\"", path.display())))
            .unwrap_err();
        assert!(matches!(err, AdminError::Short { len: 5, .. }), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn deny_requests() {
        let r = DenyRequest::parse("prefix=192.0.2.0/24").unwrap();
        assert_eq!(r.prefix.to_string(), "192.0.2.0/24");
        assert!(!r.force);
        assert!(
            DenyRequest::parse("prefix=0.0.0.0/0&force=true")
                .unwrap()
                .force
        );
        assert!(DenyRequest::parse("").is_err());
        assert!(
            DenyRequest::parse("prefix=10.1.2.3/8")
                .unwrap_err()
                .contains("host bits")
        );
        assert!(DenyRequest::parse("prefix=10.0.0.0/8&forse=true").is_err());
    }
}
