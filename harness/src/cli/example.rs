//! `nanhunt example --family F`: print a valid default case (in a binary
//! built with `main_with`, without `--family`: its model's own case).

use super::Exit;
use crate::spec::FAMILIES;
use crate::Case;

#[derive(clap::Args)]
pub struct Args {
    /// Model family [default: cnn, or the binary's own model].
    #[arg(long, value_parser = FAMILIES)]
    family: Option<String>,
}

pub fn main(args: Args) -> anyhow::Result<Exit> {
    let case = match (&args.family, crate::models::registered()) {
        (None, Some(model)) => model.case.clone(),
        (family, _) => {
            Case::example(family.as_deref().unwrap_or("cnn")).expect("clap restricts the family")
        }
    };
    println!("{}", case.to_json());
    Ok(Exit::Clean)
}
