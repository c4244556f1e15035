mod acceptance;
mod artifacts;
mod assignment;
mod claim;
mod env;
mod limits;
mod log_feed;
mod run_feed;
