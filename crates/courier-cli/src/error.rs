//! The command's error type: a message and an exit code.

use std::fmt;

/// A failure of the command: what to print and the exit code.
#[derive(Debug)]
pub struct CliError {
    /// Exit code: 2 for usage and configuration errors, 1 for run-time failures.
    pub code: i32,
    /// The sentence printed after `courier: error:`.
    pub msg: String,
}

impl CliError {
    /// A usage or configuration error (exit code 2).
    pub fn usage(msg: impl Into<String>) -> CliError {
        CliError {
            code: 2,
            msg: msg.into(),
        }
    }
    /// A run-time failure (exit code 1).
    pub fn run(msg: impl Into<String>) -> CliError {
        CliError {
            code: 1,
            msg: msg.into(),
        }
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.msg)
    }
}

impl From<courier::Error> for CliError {
    fn from(e: courier::Error) -> CliError {
        if e.status() == courier::Status::BadConfig {
            CliError::usage(e.detail().to_string())
        } else {
            CliError::run(e.to_string())
        }
    }
}

/// Result with the command's error.
pub type CliResult<T> = Result<T, CliError>;
