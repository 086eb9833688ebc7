//! Learning rate at a step under a schedule.

use crate::spec::ScheduleSpec;

/// The learning rate for `step` (0-based) of `total` steps.
pub fn lr_at(schedule: &ScheduleSpec, base: f64, step: usize, total: usize) -> f64 {
    let warm = |w: usize| -> f64 {
        if w > 0 && step < w {
            (step + 1) as f64 / w as f64
        } else {
            1.0
        }
    };
    match *schedule {
        ScheduleSpec::Constant => base,
        ScheduleSpec::Warmup { warmup_steps } => base * warm(warmup_steps),
        ScheduleSpec::Cosine {
            warmup_steps,
            min_factor,
        } => {
            if step < warmup_steps {
                return base * warm(warmup_steps);
            }
            let span = total.saturating_sub(warmup_steps).saturating_sub(1).max(1);
            let progress = ((step - warmup_steps) as f64 / span as f64).min(1.0);
            let cos = 0.5 * (1.0 + (std::f64::consts::PI * progress).cos());
            base * (min_factor + (1.0 - min_factor) * cos)
        }
        ScheduleSpec::Step { step_size, gamma } => base * gamma.powi((step / step_size) as i32),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedules_match_hand_values() {
        let c = ScheduleSpec::Cosine {
            warmup_steps: 0,
            min_factor: 0.0,
        };
        assert_eq!(lr_at(&c, 1.0, 0, 11), 1.0);
        // Halfway (step 5 of 0..=10): cos(pi/2) = 0 → 0.5.
        assert!((lr_at(&c, 1.0, 5, 11) - 0.5).abs() < 1e-12);
        assert!(lr_at(&c, 1.0, 10, 11).abs() < 1e-12);
        let w = ScheduleSpec::Warmup { warmup_steps: 4 };
        assert_eq!(lr_at(&w, 1.0, 0, 10), 0.25);
        assert_eq!(lr_at(&w, 1.0, 3, 10), 1.0);
        assert_eq!(lr_at(&w, 1.0, 9, 10), 1.0);
        let s = ScheduleSpec::Step {
            step_size: 3,
            gamma: 0.1,
        };
        assert_eq!(lr_at(&s, 1.0, 2, 10), 1.0);
        assert!((lr_at(&s, 1.0, 3, 10) - 0.1).abs() < 1e-15);
        assert!((lr_at(&s, 1.0, 6, 10) - 0.01).abs() < 1e-15);
    }
}
