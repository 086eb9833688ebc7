//! Crash dumps under their earlier name: a run's dump is a scene of the
//! one format both drivers write ([`crate::scene`]), with its case.

pub use crate::scene::{
    ensure_free, save_tensors, write, BatchPart, Environment, OptimizerRecord, SavedScene as Dump,
    Scene, SceneParts, CASE_FILE, RECENT_LOSSES, SCENE_FILE, SCENE_TENSORS,
};
