//! A seeded campaign around a user's own model, returning a report ready
//! for `insta::assert_snapshot!` in the user's test suite.

use crate::error::Result;
use crate::journal::Entry;
use crate::models::ModelFactory;
use crate::record::RunResult;
use crate::report::StabilityReport;
use crate::rng::Rng;
use crate::runner::RunOptions;
use crate::spec::{Case, Limits};
use crate::strategy::mutate;
use crate::training::run_model;

/// How many runs and from which seed.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct UserCampaign {
    /// Runs.
    pub runs: u64,
    /// The campaign seed.
    pub seed: u64,
}

impl Default for UserCampaign {
    fn default() -> Self {
        UserCampaign { runs: 24, seed: 0 }
    }
}

impl UserCampaign {
    /// `runs` runs from campaign seed `seed`.
    pub fn new(runs: u64, seed: u64) -> Self {
        UserCampaign { runs, seed }
    }
}

/// Runs the user's case and `runs - 1` seeded mutations of it (learning
/// rate, data seed, precision, steps, input scale, clipping, batch size,
/// and any knob the model declares, within its range)
/// with the user's model, and reports on them. Deterministic for a given
/// seed on a given machine.
pub fn user_report(
    base: &Case,
    factory: &dyn ModelFactory,
    campaign: &UserCampaign,
) -> Result<StabilityReport> {
    let mut entries = vec![Entry::Start {
        nanhunt_version: env!("CARGO_PKG_VERSION").to_string(),
        seed: campaign.seed,
        families: vec![base.family().to_string()],
        clean_data: base.data.pathologies.is_empty(),
        shard: (0, 1),
        device: base.device.to_string(),
        budget: format!("{} runs", campaign.runs),
        data: None,
        // Every run after the first mutates the user's case.
        mutation_rate: 1.0,
        size: crate::strategy::ModelScale::Small,
    }];
    for index in 0..campaign.runs {
        let case = if index == 0 {
            base.clone()
        } else {
            let mut rng = Rng::keyed(campaign.seed, "report.user", index);
            let c = mutate(base, &mut rng);
            if c.validate(&Limits::default()).is_ok() {
                c
            } else {
                base.clone()
            }
        };
        let outcome = run_model(&case, factory, &RunOptions::default())?;
        let record = RunResult::of(&outcome);
        entries.push(Entry::run(index, &case, record, 0));
    }
    Ok(StabilityReport::from_entries(&entries))
}
