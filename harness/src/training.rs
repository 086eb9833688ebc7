//! One whole training run of a case: the runner's session driven step by
//! step to the end, the end-of-run judgement of an explosion, the finding's
//! precision check and the crash dump. The session ([`crate::runner`])
//! knows one step; this module knows a run, and sits above the precision
//! check, which re-runs a step in a session of its own.

use crate::error::{Error, Result};
use crate::finding::{Finding, Outcome};
use crate::models::{BuiltinFactory, ModelFactory};
use crate::runner::{RunOptions, Session};
use crate::spec::Case;

/// Runs a case of a built-in family with the default options.
///
/// ```no_run
/// let case = nanhunt::Case::example("cnn").expect("a built-in family");
/// match nanhunt::run(&case)? {
///     nanhunt::Outcome::Unstable { finding } => println!("{}", finding.signature),
///     other => println!("{}", other.verdict()),
/// }
/// # Ok::<(), nanhunt::Error>(())
/// ```
pub fn run(case: &Case) -> Result<Outcome> {
    run_builtin(case, &RunOptions::default())
}

/// A case with `opts` and its own factory: a built-in family's, or the
/// process's registered model's ([`crate::models::register`]); another
/// `custom` model is rejected (it needs its factory).
pub(crate) fn run_builtin(case: &Case, opts: &RunOptions) -> Result<Outcome> {
    let builtin = BuiltinFactory::new(&case.model);
    match crate::models::factory_for(case, None, &builtin) {
        Ok(factory) => run_model(case, factory, opts),
        Err(_) => Ok(Outcome::Rejected {
            reason: "invalid case: field `model.family`: a `custom` model needs its factory (use `run_model`)".into(),
        }),
    }
}

/// Runs a case with its model's factory: a user's own model, or a
/// built-in family's (`BuiltinFactory::new(&case.model)`). The one entry
/// point of a whole run.
///
/// ```no_run
/// use nanhunt::models::BuiltinFactory;
/// let case = nanhunt::Case::example("transformer").expect("a built-in family");
/// let factory = BuiltinFactory::new(&case.model).expect("a built-in family");
/// let outcome = nanhunt::run_model(&case, &factory, &nanhunt::RunOptions::default())?;
/// # Ok::<(), nanhunt::Error>(())
/// ```
pub fn run_model(case: &Case, factory: &dyn ModelFactory, opts: &RunOptions) -> Result<Outcome> {
    let mut session = match Session::new(case, factory, opts) {
        Ok(s) => s,
        Err(e @ (Error::InvalidCase { .. } | Error::Data { .. })) => {
            return Ok(Outcome::Rejected {
                reason: e.to_string(),
            })
        }
        Err(e) => return Err(e),
    };
    check_dump_options(case, opts)?;
    let Some(mut finding) = train(&mut session, opts)? else {
        return Ok(Outcome::Stable {
            trace: session.into_trace(),
        });
    };
    if let (true, Some(before)) = (opts.fidelity, session.failed_before()) {
        let check = crate::fidelity::check(session.case(), factory, opts, &finding, before)?;
        finding.precision = Some(Box::new(check));
    }
    // A failure at or before the asked-for step is what gets dumped.
    let dumped = opts.dump_at.is_some_and(|at| at < finding.step);
    if let (Some(dir), false) = (&opts.dump, dumped) {
        session.write_dump(dir, &finding)?;
    }
    Ok(Outcome::Unstable {
        finding: Box::new(finding),
    })
}

/// A dump directory that is free, and a `dump_at` step inside the case.
fn check_dump_options(case: &Case, opts: &RunOptions) -> Result<()> {
    if let Some(dir) = &opts.dump {
        crate::scene::ensure_free(dir)?;
    }
    if let Some(at) = opts.dump_at {
        if opts.dump.is_none() {
            return Err(Error::invalid("dump_at", "needs a dump directory"));
        }
        if at >= case.steps {
            return Err(Error::invalid(
                "dump_at",
                format!("step {at} is outside the case's {} steps", case.steps),
            ));
        }
    }
    Ok(())
}

/// Every step of the case until the first finding; then the checks a run
/// makes at its end (the last deferred update, an unrecovered jump or
/// crossing of the divergence line).
fn train(session: &mut Session, opts: &RunOptions) -> Result<Option<Finding>> {
    for step in 0..session.case().steps {
        let before = match opts.dump_at {
            Some(at) if at == step => Some(session.snapshot()?),
            _ => None,
        };
        if let Some(finding) = session.step(step)? {
            // Without the probe only this snapshot holds the state before.
            session.keep_failed_before(before);
            return Ok(Some(finding));
        }
        if let (Some(before), Some(dir)) = (before, &opts.dump) {
            session.write_step_dump(dir, step, &before, None)?;
        }
    }
    if let Some(finding) = session.finish()? {
        return Ok(Some(finding));
    }
    Ok(session.unrecovered())
}
