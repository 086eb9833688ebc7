//! Where a `--device cuda` campaign trains each case. A GPU pays off only
//! for a model large enough to keep it busy: a default case's step there
//! is kernel launches, many times slower than the runner's CPU
//! (docs/PERFORMANCE-LOG.md). No fixed size says where the line is on
//! every runner, so cases are placed by the speed their class measured.
//!
//! - A class is the family and the power of two nearest the multiply-adds
//!   of a batch's forward pass.
//! - A class goes to the side whose median ms per step over its latest
//!   [`KEPT`] runs is lower (the lower middle of an even count, so a
//!   worker's first case, which starts a CUDA context, does not decide).
//! - A class without both timings takes its family's measured line: the
//!   CPU where a class as large or larger ran faster there, the device
//!   where a class as small or smaller ran faster there (a GPU's lead
//!   grows with the work). Else it is measured: [`TRIALS`] cases on each
//!   side, the CPU while a timing is still out.
//! - The slower side gets a case again only while it has taken less than
//!   1/[`EXPLORE_SHARE`] of the class's time, so that keeping its timing
//!   current costs at most that share, however much slower it is.
//!
//! A user's model, whose size the case does not describe, a CPU campaign
//! and [`Placement::Device`] stay where they were asked.

use super::Placement;
use crate::spec::{Case, DeviceSpec};
use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

/// Cases of a class each side runs before the faster one is chosen.
pub(crate) const TRIALS: u64 = 2;
/// Timings kept per side and class (the latest).
pub(crate) const KEPT: usize = 8;
/// The slower side takes at most 1/`EXPLORE_SHARE` of a class's time.
pub(crate) const EXPLORE_SHARE: f64 = 50.0;

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

impl Side {
    fn other(self) -> Side {
        match self {
            Side::Cpu => Side::Device,
            Side::Device => Side::Cpu,
        }
    }
}

/// What one side measured for a class: ms per step (the latest, first
/// out), the cases placed there and the time they took.
#[derive(Default)]
struct Measured {
    kept: VecDeque<f64>,
    placed: u64,
    spent: f64,
}

/// What one class measured on each side.
#[derive(Default)]
struct Timings {
    cpu: Measured,
    device: Measured,
}

impl Timings {
    fn on(&mut self, side: Side) -> &mut Measured {
        match side {
            Side::Cpu => &mut self.cpu,
            Side::Device => &mut self.device,
        }
    }

    /// The faster side, once both sides have [`TRIALS`] timings.
    fn faster(&self) -> Option<Side> {
        let trials = TRIALS as usize;
        if self.cpu.kept.len() < trials || self.device.kept.len() < trials {
            return None;
        }
        let (cpu, device) = (median(&self.cpu.kept)?, median(&self.device.kept)?);
        Some(if device < cpu {
            Side::Device
        } else {
            Side::Cpu
        })
    }

    /// Where the next case goes: the faster side, or the slower one while
    /// it has spent less than its share; without a verdict, `inferred`,
    /// or else the trials (the side with fewer cases until each has had
    /// [`TRIALS`], then the CPU while a timing is still out).
    fn choose(&mut self, inferred: Option<Side>) -> Side {
        if let Some(faster) = self.faster() {
            let total = self.cpu.spent + self.device.spent;
            let slower = faster.other();
            return if self.on(slower).spent * EXPLORE_SHARE < total {
                slower
            } else {
                faster
            };
        }
        if let Some(side) = inferred {
            return side;
        }
        if self.device.placed < self.cpu.placed && self.device.placed < TRIALS {
            Side::Device
        } else {
            Side::Cpu
        }
    }

    fn observe(&mut self, side: Side, millis: f64, ms_per_step: f64) {
        let m = self.on(side);
        if m.kept.len() == KEPT {
            m.kept.pop_front();
        }
        m.kept.push_back(ms_per_step);
        m.spent += millis;
    }
}

/// The side a class takes from its family's measured classes: the CPU
/// where one as large or larger ran faster there, the device where one as
/// small or smaller ran faster there.
fn inferred(classes: &HashMap<Class, Timings>, class: &Class) -> Option<Side> {
    let family = classes.iter().filter(|(c, _)| c.family == class.family);
    let mut side = None;
    for (c, t) in family {
        match t.faster() {
            Some(Side::Cpu) if c.scale >= class.scale => return Some(Side::Cpu),
            Some(Side::Device) if c.scale <= class.scale => side = Some(Side::Device),
            _ => {}
        }
    }
    side
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
        let guess = inferred(&classes, &class);
        let timings = classes.entry(class).or_default();
        let side = timings.choose(guess);
        timings.on(side).placed += 1;
        match side {
            Side::Cpu => DeviceSpec::Cpu,
            Side::Device => self.asked,
        }
    }

    /// What a run of `case` (as placed) took: `millis` over `steps` steps.
    /// Only runs that trained are timed: a side whose runs all fail (a
    /// GPU out of memory) never gets a timing, and its class stays on the
    /// CPU once its trials are out.
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
        classes
            .entry(class)
            .or_default()
            .observe(side, millis as f64, ms_per_step);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::Size;

    const GPU: DeviceSpec = DeviceSpec::Cuda(0);

    fn cnn(size: Size, batch_times: usize) -> Case {
        let mut c = Case::example_sized("cnn", size).unwrap();
        c.batch_size *= batch_times;
        c
    }

    /// Places `case` and reports its run as taking `ms` on the CPU or
    /// `gpu_ms` on the GPU (10 steps); returns where it ran.
    fn run(p: &Placer, case: &Case, ms: u64, gpu_ms: u64) -> DeviceSpec {
        let mut c = case.clone();
        c.device = p.place(case);
        p.observe(&c, if c.device == GPU { gpu_ms } else { ms }, 10);
        c.device
    }

    /// A class alternates for its trials, then follows the faster side;
    /// a class of the same family takes the measured line without trials.
    #[test]
    fn cases_go_where_their_class_ran_faster() {
        let p = Placer::new(GPU, Placement::Speed);
        let (tiny, mid, big, huge) = (
            cnn(Size::Small, 1),
            cnn(Size::Default, 1),
            cnn(Size::Large, 1),
            cnn(Size::Large, 4),
        );
        let trials: Vec<DeviceSpec> = (0..4).map(|_| p.place(&mid)).collect();
        assert_eq!(trials, [DeviceSpec::Cpu, GPU, DeviceSpec::Cpu, GPU]);
        // No timing yet: the CPU, never slower than a CPU-only campaign.
        assert_eq!(p.place(&mid), DeviceSpec::Cpu);
        let p = Placer::new(GPU, Placement::Speed);
        for _ in 0..4 {
            run(&p, &mid, 10, 200);
        }
        assert_eq!(run(&p, &mid, 10, 200), DeviceSpec::Cpu);
        // A smaller class takes the CPU without trials.
        assert!((0..4).all(|_| run(&p, &tiny, 5, 200) == DeviceSpec::Cpu));
        // The large class is measured; the GPU's first case started its
        // context (2 s), its second is its speed, and it wins the class.
        let sides: Vec<DeviceSpec> = [(90, 2000), (95, 2000), (90, 30), (95, 30)]
            .iter()
            .map(|&(ms, gpu_ms)| run(&p, &big, ms, gpu_ms))
            .collect();
        assert_eq!(sides, [DeviceSpec::Cpu, GPU, DeviceSpec::Cpu, GPU]);
        assert_eq!(run(&p, &big, 90, 30), GPU);
        // A larger class takes the GPU without trials.
        assert!((0..4).all(|_| run(&p, &huge, 360, 60) == GPU));
        // Times change: the GPU slows past the CPU and loses the class.
        for _ in 0..KEPT {
            let mut c = big.clone();
            c.device = GPU;
            p.observe(&c, 3000, 10);
        }
        assert_eq!(p.place(&big), DeviceSpec::Cpu);
    }

    /// However much slower the other side is, keeping its timing current
    /// takes at most its share of the class's time.
    #[test]
    fn the_slower_side_takes_at_most_its_share_of_the_time() {
        for gpu_ms in [11, 200, 5000] {
            let p = Placer::new(GPU, Placement::Speed);
            let case = cnn(Size::Default, 1);
            let (mut cpu_time, mut gpu_time, mut explored) = (0, 0, 0);
            // Long enough for the trials' GPU time to be its share twice.
            let runs = 4 * EXPLORE_SHARE as u64 * gpu_ms / 10 + 1000;
            for i in 0..runs {
                match run(&p, &case, 10, gpu_ms) {
                    DeviceSpec::Cpu => cpu_time += 10,
                    _ => {
                        gpu_time += gpu_ms;
                        explored += u64::from(i >= 4);
                    }
                }
            }
            let share = gpu_time as f64 / (cpu_time + gpu_time) as f64;
            let bound = 1.0 / EXPLORE_SHARE + gpu_ms as f64 / (cpu_time + gpu_time) as f64;
            assert!(share <= bound, "{gpu_ms} ms: {share} > {bound}");
            assert!(explored >= 1, "{gpu_ms} ms: the GPU was never timed again");
        }
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
