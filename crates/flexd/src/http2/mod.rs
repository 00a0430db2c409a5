//! The HTTP/2 pieces flexd needs under tonic, apart from what it serves: the client preface
//! (read within a deadline before tonic sees a connection) and the `:authority` rewriter with
//! its HPACK codec. Transport, not FlexVolume or CSI.

pub mod authority;
pub mod hpack;

/// The HTTP/2 client preface (RFC 9113 §3.4): the 24 bytes every gRPC client sends first.
pub const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

#[cfg(test)]
mod tests;
