//! Loss scaling for mixed precision (PyTorch's GradScaler semantics).

use crate::spec::LossScaling;

#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LossScaler {
    pub scale: f64,
    dynamic: bool,
    growth_interval: usize,
    floor: f64,
    clean_steps: usize,
    /// Steps skipped because the gradients overflowed.
    pub skipped: usize,
}

/// What to do with a step whose gradients were checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScaleVerdict {
    /// Gradients finite: unscale and apply.
    Apply,
    /// Overflow absorbed: skip the update, the scale was halved.
    Skip,
    /// Overflow that scaling cannot absorb: a finding.
    Fail,
}

impl LossScaler {
    pub fn new(spec: Option<&LossScaling>) -> Self {
        let (scale, dynamic, growth_interval, floor) = match spec {
            None | Some(LossScaling::None) => (1.0, false, 0, 0.0),
            Some(LossScaling::Static { scale }) => (*scale, false, 0, 0.0),
            Some(LossScaling::Dynamic {
                init,
                growth_interval,
                floor,
            }) => (*init, true, *growth_interval, *floor),
        };
        LossScaler {
            scale,
            dynamic,
            growth_interval,
            floor,
            clean_steps: 0,
            skipped: 0,
        }
    }

    pub fn is_dynamic(&self) -> bool {
        self.dynamic
    }

    /// The smallest scale dynamic scaling may reach before it gives up.
    pub fn floor(&self) -> f64 {
        self.floor
    }

    /// Updates the scale after a backward pass whose gradients were (not) finite.
    pub fn update(&mut self, grads_finite: bool) -> ScaleVerdict {
        if !self.dynamic {
            return if grads_finite {
                ScaleVerdict::Apply
            } else {
                ScaleVerdict::Fail
            };
        }
        if grads_finite {
            self.clean_steps += 1;
            if self.clean_steps >= self.growth_interval {
                self.scale *= 2.0;
                self.clean_steps = 0;
            }
            ScaleVerdict::Apply
        } else {
            self.scale *= 0.5;
            self.clean_steps = 0;
            self.skipped += 1;
            if self.scale < self.floor {
                ScaleVerdict::Fail
            } else {
                ScaleVerdict::Skip
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dynamic_scaler_skips_then_collapses_below_floor() {
        let mut s = LossScaler::new(Some(&LossScaling::Dynamic {
            init: 4.0,
            growth_interval: 2,
            floor: 1.0,
        }));
        assert_eq!(s.update(false), ScaleVerdict::Skip); // 2
        assert_eq!(s.update(false), ScaleVerdict::Skip); // 1
        assert_eq!(s.update(false), ScaleVerdict::Fail); // 0.5 < floor
        assert_eq!(s.skipped, 3);
    }

    #[test]
    fn dynamic_scaler_grows_after_clean_interval() {
        let mut s = LossScaler::new(Some(&LossScaling::Dynamic {
            init: 4.0,
            growth_interval: 2,
            floor: 1.0,
        }));
        s.update(true);
        assert_eq!(s.scale, 4.0);
        s.update(true);
        assert_eq!(s.scale, 8.0);
    }

    #[test]
    fn static_overflow_is_a_failure() {
        let mut s = LossScaler::new(Some(&LossScaling::Static { scale: 128.0 }));
        assert_eq!(s.update(true), ScaleVerdict::Apply);
        assert_eq!(s.update(false), ScaleVerdict::Fail);
    }
}
