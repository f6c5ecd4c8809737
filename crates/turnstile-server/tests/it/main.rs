//! The HTTP server's tests: a real server on 127.0.0.1, a real HTTP client,
//! a SQLite file behind it.

mod endpoints;
mod load;
mod page;
mod resume;
mod serve;
mod slow_clients;
mod support;
mod tenants;
