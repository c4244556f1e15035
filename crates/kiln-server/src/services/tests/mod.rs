mod acceptance;
mod artifacts;
mod assignment;
mod claim;
mod env;
mod log_feed;
