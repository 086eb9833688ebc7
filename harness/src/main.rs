//! The `nanhunt` command line. All logic lives in the library and `cli/`;
//! `main` maps the result to an exit code and prints the error chain.

mod cli;

use std::process::ExitCode;

fn main() -> ExitCode {
    restore_sigpipe();
    nanhunt::device::retain_freed_memory();
    match cli::main() {
        Ok(code) => code.into(),
        Err(e) => {
            eprintln!("error: {e:#}");
            let exit = cli::Exit::of_error(&e);
            if exit == cli::Exit::Internal {
                eprintln!("(an internal error, not bad input: please report it with the case)");
            }
            exit.into()
        }
    }
}

/// Rust ignores SIGPIPE, so `nanhunt fuzz | head` would panic on the closed
/// pipe; with the default action the process ends quietly, like other tools.
fn restore_sigpipe() {
    #[cfg(unix)]
    // SAFETY: setting a signal's disposition to SIG_DFL at startup, before
    // any thread exists, has no preconditions.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}
