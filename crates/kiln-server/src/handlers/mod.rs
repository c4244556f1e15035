//! HTTP handlers, one file per route family. A handler parses the request
//! (path, query, headers, body), calls one service and maps its result to
//! the response; authorization is the router's middleware (`auth`). No
//! handler holds SQL, a retry or a long-poll loop: those are the services'.

pub(crate) mod access;
pub(crate) mod agents;
pub(crate) mod answers;
pub(crate) mod artifacts;
pub(crate) mod attempts;
pub(crate) mod blob;
pub(crate) mod body;
pub(crate) mod env_secrets;
pub(crate) mod environments;
pub(crate) mod health;
pub(crate) mod logs;
pub(crate) mod notify;
pub(crate) mod oidc;
pub(crate) mod repos;
pub(crate) mod runs;
pub(crate) mod secrets;
pub(crate) mod teams;
pub(crate) mod tests_api;
pub(crate) mod ui;
