//! The `nanhunt` command line. All logic lives in the library and its `cli`
//! module, which a user's own binary also runs over its model
//! (`nanhunt::cli::main_with`).

fn main() -> std::process::ExitCode {
    nanhunt::cli::main()
}
