//! A user's sealed settings: keys for their agents ([`secrets`]), the sealed list they are kept
//! in ([`sealed_list`]), and their own MCP servers ([`user_mcp`]).

pub mod sealed_list;
pub mod secrets;
pub mod user_mcp;
