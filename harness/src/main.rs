//! The `nanhunt` command line. All logic lives in the library and `cli/`;
//! `main` maps the result to an exit code and prints the error chain.

mod cli;

use std::process::ExitCode;

fn main() -> ExitCode {
    match cli::main() {
        Ok(code) => code.into(),
        Err(e) => {
            eprintln!("error: {e:#}");
            cli::Exit::Error.into()
        }
    }
}
