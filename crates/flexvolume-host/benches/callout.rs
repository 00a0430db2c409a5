//! Call-out overhead: N sequential `init` call-outs of a tiny compiled driver through the
//! library (spawn in a process group, pidfd wait, capped capture, reply parsing) against N plain
//! spawn-and-wait (`Command::output`) of the same binary, measured side by side in one run.
//!
//! Run: `bench/callout.sh` (or `cargo bench -p flexvolume-host --bench callout -- [N] [ROUNDS]`).
//! Prints each round's ratio and the median; the target is a median ratio ≤ 1.10.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use flexvolume_host::runner::{self, RunnerConfig};
use flexvolume_host::CallOut;

fn through_library(exe: &Path, n: usize, config: &RunnerConfig) -> Duration {
    let call = CallOut::init();
    let start = Instant::now();
    for _ in 0..n {
        let reply = runner::call(config, exe, &call).expect("init succeeds");
        assert!(reply.capabilities.is_some());
    }
    start.elapsed()
}

fn plain_spawn(exe: &Path, n: usize) -> Duration {
    let start = Instant::now();
    for _ in 0..n {
        let out = Command::new(exe)
            .arg("init")
            .stdin(Stdio::null())
            .output()
            .expect("spawn");
        assert!(out.status.success() && !out.stdout.is_empty());
    }
    start.elapsed()
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let n: usize = args.first().and_then(|s| s.parse().ok()).unwrap_or(1000);
    let rounds: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(5);
    let dir = tempfile::tempdir().expect("tempdir");
    let exe = test_support::compile_tiny_driver(dir.path(), true);
    let config = RunnerConfig::default();
    // Warm up the page cache and the allocator.
    through_library(&exe, 50, &config);
    plain_spawn(&exe, 50);

    println!("call-out overhead: {n} sequential init call-outs per side, {rounds} rounds (order alternates)");
    // With the per-call-out process cap (a cgroup) when this host has one, and without.
    let mut configs = Vec::new();
    match runner::process_cap() {
        Ok(dir) => configs.push((
            format!("process cap on, in {}", dir.display()),
            config.clone(),
        )),
        Err(why) => println!("process cap: unavailable ({why})"),
    }
    let uncapped = RunnerConfig {
        max_processes: None,
        ..config
    };
    configs.push(("process cap off".to_owned(), uncapped));
    for (label, config) in &configs {
        println!("== {label}");
        back_to_back(&exe, n, rounds, config);
        sporadic(&exe, config);
    }
}

fn back_to_back(exe: &Path, n: usize, rounds: usize, config: &RunnerConfig) {
    let mut ratios = Vec::new();
    for round in 0..rounds {
        let (lib, plain) = if round % 2 == 0 {
            let l = through_library(exe, n, config);
            (l, plain_spawn(exe, n))
        } else {
            let p = plain_spawn(exe, n);
            (through_library(exe, n, config), p)
        };
        let ratio = lib.as_secs_f64() / plain.as_secs_f64();
        ratios.push(ratio);
        println!(
            "round {}: library {:>7.1} µs/call, plain spawn {:>7.1} µs/call, ratio {:.3}",
            round + 1,
            lib.as_secs_f64() * 1e6 / n as f64,
            plain.as_secs_f64() * 1e6 / n as f64,
            ratio
        );
    }
    ratios.sort_by(f64::total_cmp);
    let median = ratios[ratios.len() / 2];
    println!(
        "back to back: median ratio library/plain = {median:.3} (target <= 1.10): {}",
        if median <= 1.10 { "MET" } else { "NOT MET" }
    );
}

/// Call-outs on a real node are sporadic, and some kernel costs only show then (moving a task
/// between cgroups waits for an RCU grace period unless another move just happened). So: one
/// call-out every 100 ms, each timed alone, library against plain spawn; medians compared.
fn sporadic(exe: &Path, config: &RunnerConfig) {
    const CALLS: usize = 30;
    let median_of = |f: &dyn Fn() -> Duration| {
        let mut times: Vec<Duration> = (0..CALLS)
            .map(|_| {
                std::thread::sleep(Duration::from_millis(100));
                f()
            })
            .collect();
        times.sort();
        times[CALLS / 2]
    };
    let lib = median_of(&|| through_library(exe, 1, config));
    let plain = median_of(&|| plain_spawn(exe, 1));
    let ratio = lib.as_secs_f64() / plain.as_secs_f64();
    println!(
        "sporadic (one call-out every 100 ms, {CALLS} each): library median {:.1} µs, plain {:.1} µs, ratio {ratio:.3} (target <= 1.10): {}",
        lib.as_secs_f64() * 1e6,
        plain.as_secs_f64() * 1e6,
        if ratio <= 1.10 { "MET" } else { "NOT MET" }
    );
}
