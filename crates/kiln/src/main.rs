//! The `kiln` binary: parses flags and calls the crates (see `lib.rs`).

fn main() {
    std::process::exit(kiln::main_entry());
}
