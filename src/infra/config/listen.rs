//! `listen`: an IP address and port (`127.0.0.1:8080`, `[::]:8080`), or a host name and port
//! (`localhost:8080`), resolved once at start.

use std::net::{SocketAddr, ToSocketAddrs};

use serde::{Deserialize, Deserializer};

/// Reads `listen` as [`parse`] does.
pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<SocketAddr, D::Error> {
    let text = String::deserialize(d)?;
    parse(&text).map_err(serde::de::Error::custom)
}

/// `text` as an address to bind: an IP address and port as written; a host name and port as it
/// resolves, its first IPv4 address if it has one (`localhost` is `127.0.0.1`, where clients
/// that also try `::1` find it too).
pub fn parse(text: &str) -> Result<SocketAddr, ListenError> {
    if let Ok(addr) = text.parse::<SocketAddr>() {
        return Ok(addr);
    }
    let addrs: Vec<SocketAddr> = text
        .to_socket_addrs()
        .map_err(|source| ListenError::NotAnAddress {
            text: text.to_string(),
            source,
        })?
        .collect();
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or_else(|| addrs.first())
        .copied()
        .ok_or_else(|| ListenError::Nowhere(text.to_string()))
}

/// Why `listen` cannot be bound.
#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    /// Neither an address nor a host name that resolves.
    #[error("{text:?} is not an address and port to listen on (like 127.0.0.1:8080 or localhost:8080): {source}")]
    NotAnAddress {
        /// As written.
        text: String,
        /// What resolving it said.
        source: std::io::Error,
    },
    /// A host name that resolves to nothing.
    #[error("{0:?} resolves to no address to listen on")]
    Nowhere(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_and_host_names() {
        assert_eq!(
            parse("127.0.0.1:9000").ok(),
            Some(SocketAddr::from(([127, 0, 0, 1], 9000)))
        );
        assert_eq!(parse("[::1]:9000").ok().map(|a| a.is_ipv6()), Some(true));
        assert_eq!(
            parse("localhost:9000").ok(),
            Some(SocketAddr::from(([127, 0, 0, 1], 9000)))
        );
        for bad in ["localhost", "127.0.0.1", ":9000", "127.0.0.1:http"] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}
