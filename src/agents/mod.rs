//! Agent processes: the pool that spawns, routes and reaps them ([`pool`]), and the built-in
//! offline agent ([`demo`]).

pub mod demo;
pub mod pool;
