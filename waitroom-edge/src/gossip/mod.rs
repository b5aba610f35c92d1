//! The node's gossip client: reports to the aggregator over QUIC, keeps the
//! last known global state. (Being built: see issue 5.)

/// The `[aggregator]` table of the node's config.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GossipConfig {
    /// `host:port` of the aggregator (UDP, QUIC).
    pub address: std::net::SocketAddr,
}
