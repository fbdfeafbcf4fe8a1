//! A user's sealed settings: keys for their agents ([`secrets`]) and their own MCP servers
//! ([`user_mcp`]), sealed at rest ([`crate::infra::sealing`]).

pub mod secrets;
pub mod user_mcp;
