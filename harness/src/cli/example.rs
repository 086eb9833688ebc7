//! `nanhunt example --family F`: print a valid default case.

use super::Exit;
use nanhunt::spec::FAMILIES;
use nanhunt::Case;

#[derive(clap::Args)]
pub struct Args {
    /// Model family.
    #[arg(long, default_value = "cnn", value_parser = FAMILIES)]
    family: String,
}

pub fn main(args: Args) -> anyhow::Result<Exit> {
    let case = Case::example(&args.family).expect("clap restricts the family");
    println!("{}", case.to_json());
    Ok(Exit::Clean)
}
