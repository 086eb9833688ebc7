//! Where a `--device cuda` campaign trains each case. A GPU pays off only
//! for a model large enough to keep it busy: a default case's step there
//! is kernel launches, many times slower than the runner's CPU
//! (docs/PERFORMANCE-LOG.md). No fixed size says where the line is on
//! every runner, so cases are placed by the speed their class measured: a
//! class (the family, and the power of two nearest the multiply-adds of a
//! batch's forward pass) first alternates between the CPU and the GPU,
//! [`TRIALS`] cases each, then goes where its steps were faster (the median
//! of each side's latest [`KEPT`], the lower middle of an even count),
//! with one case in [`EXPLORE`] sent to the other side to keep its timing
//! current. A user's model, whose size the case does not describe, a CPU
//! campaign and [`Placement::Device`] stay where they were asked.

use super::Placement;
use crate::spec::{Case, DeviceSpec};
use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

/// Cases of a class each side runs before the faster one is chosen.
pub(crate) const TRIALS: u64 = 2;
/// Timings kept per side and class (the latest).
pub(crate) const KEPT: usize = 8;
/// One placement in this many goes to the slower side.
pub(crate) const EXPLORE: u64 = 16;

/// Where cases run, from what their classes measured.
pub(crate) struct Placer {
    asked: DeviceSpec,
    policy: Placement,
    classes: Mutex<HashMap<Class, Timings>>,
}

/// Cases alike in where they run fastest.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Class {
    family: String,
    /// log2 of a batch's forward multiply-adds, rounded.
    scale: u32,
}

/// The runner's CPU or the device the campaign asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Side {
    Cpu,
    Device,
}

/// What one class measured: ms per step, the latest first out.
#[derive(Default)]
struct Timings {
    cpu: VecDeque<f64>,
    device: VecDeque<f64>,
    placed_cpu: u64,
    placed_device: u64,
}

impl Timings {
    /// Where the next case goes: the side with fewer cases until each has
    /// had [`TRIALS`]; then the faster, once both have timings (the CPU
    /// while one is still out), and the other side every [`EXPLORE`]th.
    fn choose(&self) -> Side {
        if self.placed_cpu < TRIALS || self.placed_device < TRIALS {
            return if self.placed_device < self.placed_cpu {
                Side::Device
            } else {
                Side::Cpu
            };
        }
        let (Some(cpu), Some(device)) = (median(&self.cpu), median(&self.device)) else {
            return Side::Cpu;
        };
        let faster = if device < cpu {
            Side::Device
        } else {
            Side::Cpu
        };
        let placed = self.placed_cpu + self.placed_device;
        match (placed % EXPLORE == EXPLORE - 1, faster) {
            (false, side) => side,
            (true, Side::Cpu) => Side::Device,
            (true, Side::Device) => Side::Cpu,
        }
    }

    fn place(&mut self) -> Side {
        let side = self.choose();
        match side {
            Side::Cpu => self.placed_cpu += 1,
            Side::Device => self.placed_device += 1,
        }
        side
    }

    fn observe(&mut self, side: Side, ms_per_step: f64) {
        let kept = match side {
            Side::Cpu => &mut self.cpu,
            Side::Device => &mut self.device,
        };
        if kept.len() == KEPT {
            kept.pop_front();
        }
        kept.push_back(ms_per_step);
    }
}

/// The median, the lower middle of an even count: a side's first case in
/// a worker pays for starting it (a CUDA context, a child process), and
/// of two timings the other one is the side's speed.
fn median(v: &VecDeque<f64>) -> Option<f64> {
    let mut s: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    if s.is_empty() {
        return None;
    }
    s.sort_by(f64::total_cmp);
    Some(s[(s.len() - 1) / 2])
}

impl Placer {
    /// Placement for a campaign on `asked`.
    pub(crate) fn new(asked: DeviceSpec, policy: Placement) -> Self {
        Placer {
            asked,
            policy,
            classes: Mutex::new(HashMap::new()),
        }
    }

    fn class(&self, case: &Case) -> Option<Class> {
        if self.asked == DeviceSpec::Cpu || self.policy == Placement::Device {
            return None;
        }
        let work = case.model.multiply_adds()? as f64 * case.batch_size as f64;
        Some(Class {
            family: case.family().to_string(),
            scale: work.max(1.0).log2().round() as u32,
        })
    }

    /// The device `case` trains on.
    pub(crate) fn place(&self, case: &Case) -> DeviceSpec {
        let Some(class) = self.class(case) else {
            return self.asked;
        };
        let mut classes = self.classes.lock().expect("placement poisoned");
        match classes.entry(class).or_default().place() {
            Side::Cpu => DeviceSpec::Cpu,
            Side::Device => self.asked,
        }
    }

    /// What a run of `case` (as placed) took: `millis` over `steps` steps.
    pub(crate) fn observe(&self, case: &Case, millis: u64, steps: usize) {
        let Some(class) = self.class(case) else {
            return;
        };
        let side = if case.device == DeviceSpec::Cpu {
            Side::Cpu
        } else {
            Side::Device
        };
        let ms_per_step = millis as f64 / steps.max(1) as f64;
        let mut classes = self.classes.lock().expect("placement poisoned");
        classes.entry(class).or_default().observe(side, ms_per_step);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::Size;

    fn placed(p: &Placer, case: &Case) -> DeviceSpec {
        p.place(case)
    }

    /// A class alternates for its trials, then follows the faster side,
    /// and goes on exploring the other one; classes are timed apart.
    #[test]
    fn cases_go_where_their_class_ran_faster() {
        let gpu = DeviceSpec::Cuda(0);
        let p = Placer::new(gpu, Placement::Speed);
        let small = Case::example("cnn").unwrap();
        let large = Case::example_sized("cnn", Size::Large).unwrap();
        let trials: Vec<DeviceSpec> = (0..4).map(|_| placed(&p, &small)).collect();
        assert_eq!(trials, [DeviceSpec::Cpu, gpu, DeviceSpec::Cpu, gpu]);
        // No timing yet: the CPU, never slower than a CPU-only campaign.
        assert_eq!(placed(&p, &small), DeviceSpec::Cpu);
        let run = |c: &Case, on: DeviceSpec, ms: u64| {
            let mut c = c.clone();
            c.device = on;
            p.observe(&c, ms, 10);
        };
        run(&small, DeviceSpec::Cpu, 10);
        run(&small, DeviceSpec::Cpu, 12);
        run(&small, gpu, 200);
        run(&small, gpu, 250);
        let next: Vec<DeviceSpec> = (0..EXPLORE).map(|_| placed(&p, &small)).collect();
        let on_gpu = next.iter().filter(|d| **d == gpu).count();
        assert_eq!(on_gpu, 1, "one exploration in {EXPLORE}: {next:?}");
        // The large class has its own trials, and a faster GPU wins it.
        for _ in 0..4 {
            placed(&p, &large);
        }
        run(&large, DeviceSpec::Cpu, 90);
        run(&large, DeviceSpec::Cpu, 95);
        // The GPU's first case started its context: its second is its speed.
        run(&large, gpu, 2000);
        run(&large, gpu, 30);
        let next: Vec<DeviceSpec> = (0..EXPLORE).map(|_| placed(&p, &large)).collect();
        assert_eq!(
            next.iter().filter(|d| **d == gpu).count(),
            EXPLORE as usize - 1
        );
        // Times change: the GPU slows past the CPU and loses the class.
        for _ in 0..KEPT {
            run(&large, gpu, 300);
        }
        assert_eq!(placed(&p, &large), DeviceSpec::Cpu);
    }

    #[test]
    fn a_cpu_campaign_a_users_model_and_placement_on_the_device_stay_where_asked() {
        let cpu = Placer::new(DeviceSpec::Cpu, Placement::Speed);
        let case = Case::example("rnn").unwrap();
        assert!((0..6).all(|_| cpu.place(&case) == DeviceSpec::Cpu));
        let gpu = Placer::new(DeviceSpec::Cuda(1), Placement::Speed);
        let mut own = case.clone();
        let custom = serde_json::json!({"name": "mine", "input": case.model.input(), "outputs": 4});
        own.model = crate::spec::ModelSpec::Custom(serde_json::from_value(custom).unwrap());
        assert!((0..6).all(|_| gpu.place(&own) == DeviceSpec::Cuda(1)));
        let asked = Placer::new(DeviceSpec::Cuda(0), Placement::Device);
        assert!((0..6).all(|_| asked.place(&case) == DeviceSpec::Cuda(0)));
    }
}
