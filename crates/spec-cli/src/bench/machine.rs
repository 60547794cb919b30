//! Where a run happens: the machine's description from `/proc`, the CPU kernels' tile choices,
//! the process's resident memory, and where two of its threads sit.

use std::collections::BTreeMap;
use std::time::Instant;

use serde::Serialize;

use crate::BackendName;

/// Where the run happened.
#[derive(Debug, Clone, Serialize)]
pub(super) struct Machine {
    pub(super) cpu: String,
    /// The instruction set of the CPU products (`spec_kernels::instruction_set`).
    pub(super) kernels: String,
    pub(super) cores: usize,
    pub(super) memory_bytes: Option<u64>,
    pub(super) os: String,
    pub(super) backend: String,
    pub(super) gpu: Option<String>,
}

pub(super) fn machine_info(backend: BackendName) -> Machine {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let field = |name: &str| {
        cpuinfo.lines().find_map(|l| {
            l.split_once(':')
                .filter(|(key, _)| key.trim() == name)
                .map(|(_, v)| v.trim().to_owned())
        })
    };
    let cpu = field("model name").unwrap_or_else(|| std::env::consts::ARCH.to_owned());
    // A virtual machine may name only the vendor's line ("AMD EPYC"); family and model tell
    // its generations apart.
    let cpu = match (field("cpu family"), field("model")) {
        (Some(family), Some(model)) => format!("{cpu} (family {family}, model {model})"),
        _ => cpu,
    };
    let memory_bytes = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|r| r.split_whitespace().next())
                .and_then(|n| n.parse::<u64>().ok())
        })
        .map(|k| k * 1024);
    let os = format!(
        "{} {}",
        std::env::consts::OS,
        std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
    );
    let gpu = std::process::Command::new("nvidia-smi")
        .args(["--query-gpu=name,memory.total", "--format=csv,noheader"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .trim()
                .replace('\n', "; ")
        })
        .filter(|s| !s.is_empty());
    Machine {
        cpu,
        kernels: spec_kernels::instruction_set().to_owned(),
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        memory_bytes,
        os,
        backend: format!("{backend:?}").to_lowercase(),
        gpu,
    }
}

/// How often each tile ran the CPU's timed products of f32 rows stored in spans at one row
/// count of `x`, over the whole process (warm-up included), all shapes together
/// (`spec_kernels::span_tile_uses`); the report's list is empty where none ran (another
/// backend, a CPU without AVX-512, no verification of 4 to 14 tokens).
#[derive(Debug, Clone, Serialize)]
pub(super) struct SpanTileRuns {
    pub(super) rows_of_x: usize,
    /// Products run by each tile (`spec_kernels::SpanTile::name`).
    pub(super) tiles: BTreeMap<String, u64>,
}

/// The process's [`SpanTileRuns`], by rows of `x`.
pub(super) fn span_tile_runs() -> Vec<SpanTileRuns> {
    let mut by_rows: BTreeMap<usize, BTreeMap<String, u64>> = BTreeMap::new();
    for shape in spec_kernels::span_tile_uses() {
        let tiles = by_rows.entry(shape.m).or_default();
        for (tile, runs, _) in shape.runs {
            *tiles.entry(tile.name().to_owned()).or_default() += runs;
        }
    }
    by_rows
        .into_iter()
        .map(|(rows_of_x, tiles)| SpanTileRuns { rows_of_x, tiles })
        .collect()
}

/// Resets the process's peak resident size (`VmHWM`) to the current one; false where the
/// kernel refuses.
pub(super) fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// A `kB` field of `/proc/self/status`, in KiB.
pub(super) fn read_status_kib(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
}

/// The mean time, in ns, for a cache line to go from this thread to a second one and back:
/// where the operating system (and a hypervisor under it) has put two threads of this
/// process. On a 2-vCPU Zen 5 VM it is 48-71 ns in one placement of the vCPUs and 350-391 ns in
/// the other, the one in which two threads stream memory about half again as fast
/// (`docs/notes/vcpu-placement.md`), so each run records it. Spins for
/// at most [`ROUND_TRIP_PROBE`]; `None` when fewer than 100 round trips were made in that time
/// (the two threads did not run at once) or no thread could be started.
pub(super) fn core_round_trip_ns() -> Option<f64> {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    const TRIPS: u64 = 20_000;
    // Let the kernels' helper threads, which spin 2 ms after a job, go idle first.
    std::thread::sleep(std::time::Duration::from_millis(3));
    let flag = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let echo = std::thread::Builder::new().spawn_scoped(scope, || {
            for i in 0..TRIPS {
                while flag.load(Ordering::Acquire) != 2 * i + 1 {
                    if stop.load(Ordering::Relaxed) {
                        return;
                    }
                }
                flag.store(2 * i + 2, Ordering::Release);
            }
        });
        if echo.is_err() {
            return None;
        }
        let start = Instant::now();
        let mut trips = 0;
        'trips: while trips < TRIPS {
            flag.store(2 * trips + 1, Ordering::Release);
            while flag.load(Ordering::Acquire) != 2 * trips + 2 {
                if start.elapsed() > ROUND_TRIP_PROBE {
                    break 'trips;
                }
            }
            trips += 1;
        }
        let seconds = start.elapsed().as_secs_f64();
        stop.store(true, Ordering::Relaxed);
        (trips >= 100).then(|| seconds * 1e9 / trips as f64)
    })
}

/// The longest [`core_round_trip_ns`] spins: 20,000 round trips took 1-8 ms on that VM.
pub(super) const ROUND_TRIP_PROBE: std::time::Duration = std::time::Duration::from_millis(50);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_round_trip_probe_measures_where_two_threads_can_run() {
        if std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
            return;
        }
        // Other tests' threads may hold the cores for one probe: one in five must get through.
        let probes: Vec<Option<f64>> = (0..5).map(|_| core_round_trip_ns()).collect();
        assert!(
            probes.iter().flatten().any(|&ns| ns > 1.0 && ns < 1e6),
            "{probes:?}"
        );
    }

    #[test]
    fn proc_status_fields_are_read() {
        if cfg!(target_os = "linux") {
            let rss = read_status_kib("VmRSS:").unwrap();
            assert!(rss > 0);
            let hwm = read_status_kib("VmHWM:").unwrap();
            assert!(hwm >= rss);
        }
    }
}
