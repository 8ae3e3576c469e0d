//! The server's CPU use and the CPU it is allocated: their ratio over a window is Bigtable's
//! CPU load (`cluster/cpu_load`), what the autoscaler targets.
//!
//! * Use: the CPU time of every thread of the process ([`cpu_seconds`], the kernel's
//!   process CPU clock), exported as `process_cpu_seconds_total` and in the server's status
//!   report.
//! * Allocation ([`allocation`]): `--cpu-allocation-millicores` when given (on Kubernetes the
//!   operator sets it to the pod's CPU request through the downward API), else the CPU limit of
//!   the server's cgroup (`cpu.max`), else the machine's cores. Exported as
//!   `basalt_cpu_allocation_cores` with its source.

use std::time::Duration;

/// Where an allocation comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// `--cpu-allocation-millicores` (the pod's CPU request on Kubernetes).
    Flag,
    /// The cgroup's CPU limit.
    CgroupLimit,
    /// The machine's cores: nothing says less.
    Machine,
}

impl Source {
    pub fn name(self) -> &'static str {
        match self {
            Source::Flag => "flag",
            Source::CgroupLimit => "cgroup-limit",
            Source::Machine => "machine",
        }
    }
}

/// The CPU time the process has used, all threads: the kernel's process CPU clock.
pub fn cpu_seconds() -> f64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    Duration::new(
        t.tv_sec.max(0) as u64,
        t.tv_nsec.clamp(0, 999_999_999) as u32,
    )
    .as_secs_f64()
}

/// The cores of a cgroup v2 `cpu.max` (`"<quota> <period>"`, or `"max <period>"`: no limit).
/// Pure.
pub fn parse_cpu_max(text: &str) -> Option<f64> {
    let mut parts = text.split_whitespace();
    let quota: f64 = parts.next()?.parse().ok()?;
    let period: f64 = parts.next().map_or(Some(100_000.0), |p| p.parse().ok())?;
    (quota > 0.0 && period > 0.0).then(|| quota / period)
}

/// The allocation in cores and its source, from the flag (millicores; 0 is unset), the
/// cgroup's `cpu.max` text if any, and the machine's cores. Pure.
pub fn allocation(
    flag_millicores: Option<u64>,
    cpu_max: Option<&str>,
    machine: usize,
) -> (f64, Source) {
    if let Some(m) = flag_millicores.filter(|&m| m > 0) {
        return (m as f64 / 1000.0, Source::Flag);
    }
    if let Some(cores) = cpu_max.and_then(parse_cpu_max) {
        return (cores.min(machine.max(1) as f64), Source::CgroupLimit);
    }
    (machine.max(1) as f64, Source::Machine)
}

/// This server's allocation (see the module): reads the cgroup's `cpu.max` and the machine's
/// cores.
pub fn this_servers_allocation(flag_millicores: Option<u64>) -> (f64, Source) {
    let cpu_max = std::fs::read_to_string("/sys/fs/cgroup/cpu.max").ok();
    let machine = std::thread::available_parallelism().map_or(1, |n| n.get());
    allocation(flag_millicores, cpu_max.as_deref(), machine)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_allocation_comes_from_the_flag_then_the_cgroup_then_the_machine() {
        assert_eq!(
            allocation(Some(1500), Some("200000 100000"), 8),
            (1.5, Source::Flag)
        );
        assert_eq!(
            allocation(Some(0), Some("200000 100000"), 8),
            (2.0, Source::CgroupLimit)
        );
        assert_eq!(
            allocation(None, Some("max 100000"), 8),
            (8.0, Source::Machine)
        );
        assert_eq!(allocation(None, None, 4), (4.0, Source::Machine));
        // A limit above the machine is the machine.
        assert_eq!(
            allocation(None, Some("1600000 100000"), 4),
            (4.0, Source::CgroupLimit)
        );
        assert_eq!(parse_cpu_max("50000 100000\n"), Some(0.5));
        assert_eq!(parse_cpu_max("150000"), Some(1.5));
        assert_eq!(parse_cpu_max("max"), None);
        assert_eq!(parse_cpu_max(""), None);
    }

    #[test]
    fn cpu_time_grows_with_work() {
        let before = cpu_seconds();
        let mut x = 0u64;
        let started = std::time::Instant::now();
        while started.elapsed() < Duration::from_millis(50) {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        }
        std::hint::black_box(x);
        let used = cpu_seconds() - before;
        assert!(used > 0.02 && used < 5.0, "{used}");
    }
}
