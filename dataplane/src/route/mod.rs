//! What a table compiles to for the request path, rebuilt with every table: the router and the
//! route policies (redirects, CORS, authentication, canaries, client addresses, retries,
//! mirrors, response rewrites).

pub mod auth;
pub mod auth_tls;
pub mod canary;
pub mod conditions;
pub mod cors;
pub mod filters;
pub mod mirror;
pub mod policy;
pub mod realip;
pub mod retry;
pub mod rewrite_response;
pub mod router;
pub mod split;
