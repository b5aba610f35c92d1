//! The waitroom node.
pub mod xdp;
