//! The lean `kiln-agent` binary: `kiln agent` alone, without the server,
//! store, UI and client (see `lean_agent.rs`).

fn main() {
    std::process::exit(kiln::agent_entry());
}
