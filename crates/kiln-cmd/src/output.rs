//! Standard output of the commands. A reader that goes away early (`kiln
//! logs RUN | head -1`) closes the pipe: the command then stops quietly with
//! exit code 0, as `rg` and friends do, instead of panicking (`println!`
//! panics on a broken pipe, because Rust ignores SIGPIPE).

use std::io::Write;

/// Write `bytes` to standard output and flush. A closed pipe ends the
/// process quietly (exit 0); any other write error ends it with exit 5.
pub fn write_stdout(bytes: &[u8]) {
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_all(bytes).and_then(|()| out.flush()) {
        stdout_failed(&e);
    }
}

/// What to do when standard output cannot be written.
fn stdout_failed(e: &std::io::Error) -> ! {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        std::process::exit(kiln_api::exit::OK);
    }
    let _ = writeln!(std::io::stderr(), "error: cannot write to standard output: {e}");
    std::process::exit(kiln_api::exit::UNAVAILABLE);
}

/// `println!` that survives a closed standard output (see [`write_stdout`]).
#[macro_export]
macro_rules! outln {
    () => {
        $crate::write_stdout(b"\n")
    };
    ($($arg:tt)*) => {
        $crate::write_stdout(format!("{}\n", format_args!($($arg)*)).as_bytes())
    };
}
