//! A command's failure: the message printed as `error: …` and the process
//! exit code (the documented constants of `kiln_api::exit`).

use kiln_api::{ApiError, exit};

/// A command failure: message for the user and the exit code.
pub struct Failure {
    pub message: String,
    pub code: i32,
}

impl From<ApiError> for Failure {
    fn from(e: ApiError) -> Self {
        let hint = match e.status() {
            Some(401) => {
                "\nhint: the server does not know this token: `kiln login URL` again, or set KILN_TOKEN (or --token-file) to the server's DATA_DIR/admin.token"
            }
            None => "\nhint: is the server running? set KILN_SERVER (or --server)",
            _ => "",
        };
        Failure { message: format!("{e}{hint}"), code: e.exit_code() }
    }
}

impl From<anyhow::Error> for Failure {
    fn from(e: anyhow::Error) -> Self {
        Failure { message: format!("{e:#}"), code: exit::UNAVAILABLE }
    }
}

/// A usage error (exit code 2): a flag or input the command cannot use.
pub fn usage(message: impl Into<String>) -> Failure {
    Failure { message: message.into(), code: exit::USAGE }
}

/// A command's result: its exit code, or a failure to print.
pub type CmdResult = Result<i32, Failure>;
