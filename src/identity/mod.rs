//! Who a request is: tokens ([`auth`]) and team sign-in through an OpenID provider ([`oidc`]).

pub mod auth;
pub mod devices;
pub mod oidc;
mod store;

pub use devices::{Decision, DeviceCode, Devices, Poll};
pub use store::{WEB_SESSIONS_KEPT_SECS, WebSession, WebSessions};
