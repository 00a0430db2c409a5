//! CSI node path benchmarks against a real `flexd serve`, each with its baseline measured in
//! the same run (run with `bench/csi.sh`, as root: the tmpfs example really mounts):
//!
//! 1. cycle: one NodePublishVolume + NodeUnpublishVolume of the tmpfs example through a gRPC
//!    client, against the driver's own `mount` + `unmount` run directly; alternating rounds,
//!    the median of the rounds' ratios;
//! 2. concurrency: CONCURRENT NodePublishVolume calls at once, for different volumes of a
//!    driver whose mount takes DELAY seconds, against the same number of driver runs started
//!    at once without flexd; every volume must be published exactly once.
//!
//! The state dir is in the sandbox, below `$TMPDIR`: `bench/csi.sh` runs it once on disk and
//! once on tmpfs.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use test_support::serve::{
    node_client, publish_all_at_once, publish_request, unpublish_request, Server,
};

/// flexd logs at its default level, as on a node (tests run it at debug).
const PRODUCTION_LOGGING: &[(&str, &str)] = &[("RUST_LOG", "info")];

/// What flexd gives the tmpfs driver's mount (for the direct baseline).
const OPTIONS: &str = r#"{"kubernetes.io/fsType":"ext4","kubernetes.io/readwrite":"rw"}"#;

/// #52's target for both parts: flexd at most this many times its baseline.
const TARGET: f64 = 1.2;
/// A run whose ratios, in either order, spread wider than this (max − min over their median)
/// says so and does not count: the machine was doing something else part of the time.
const TOO_NOISY: f64 = 0.15;

/// NaN for no values (a run of one round has none of one order).
fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Each round's ratio, by which side ran first, and the baseline's own figure per round.
#[derive(Default)]
struct Rounds {
    flexd_first: Vec<f64>,
    baseline_first: Vec<f64>,
    baseline: Vec<f64>,
}

impl Rounds {
    fn push(&mut self, flexd_first: bool, ratio: f64, baseline: f64) {
        if flexd_first {
            self.flexd_first.push(ratio);
        } else {
            self.baseline_first.push(ratio);
        }
        self.baseline.push(baseline);
    }

    /// Medians and spread per order, then whether the run counts and meets the target.
    fn report(&self, what: &str, baseline: &str) {
        let range = |values: &[f64]| {
            values
                .iter()
                .fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(*v), hi.max(*v)))
        };
        let spread = |values: &[f64]| {
            let (lo, hi) = range(values);
            (hi - lo) / median(values.to_vec())
        };
        let order = |ratios: &[f64]| {
            let (lo, hi) = range(ratios);
            format!(
                "{:.2} ({} rounds, {lo:.2}-{hi:.2})",
                median(ratios.to_vec()),
                ratios.len()
            )
        };
        let all: Vec<f64> = self
            .flexd_first
            .iter()
            .chain(&self.baseline_first)
            .copied()
            .collect();
        let noise = spread(&self.flexd_first)
            .max(spread(&self.baseline_first))
            .max(0.0);
        let verdict = if self.flexd_first.is_empty() || self.baseline_first.is_empty() {
            "NOT COUNTED: a figure needs rounds in both orders".to_owned()
        } else if noise > TOO_NOISY {
            format!(
                "TOO NOISY TO COUNT: the ratios of one order spread {:.0}% (over {:.0}%)",
                noise * 100.0,
                TOO_NOISY * 100.0
            )
        } else if median(self.flexd_first.clone()) <= TARGET
            && median(self.baseline_first.clone()) <= TARGET
        {
            "MET".to_owned()
        } else {
            "NOT MET".to_owned()
        };
        println!(
            "{what} ratio {:.2}: flexd first {}, {baseline} first {}; {baseline} alone varied {:.0}% between rounds; target <= {TARGET} in each order: {verdict}",
            median(all),
            order(&self.flexd_first),
            order(&self.baseline_first),
            spread(&self.baseline) * 100.0
        );
    }
}

fn arg(n: usize, default: f64) -> f64 {
    std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .nth(n)
        .and_then(|a| a.parse().ok())
        .unwrap_or(default)
}

fn run_driver(exe: &Path, args: &[&std::ffi::OsStr]) {
    let out = Command::new(exe)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("driver runs");
    assert!(out.status.success(), "driver {args:?}: {out:?}");
}

/// One mount + unmount of the driver run directly.
fn direct_cycle(exe: &Path, target: &Path) -> Duration {
    let start = Instant::now();
    run_driver(
        exe,
        &["mount".as_ref(), target.as_os_str(), OPTIONS.as_ref()],
    );
    run_driver(exe, &["unmount".as_ref(), target.as_os_str()]);
    let elapsed = start.elapsed();
    let _ = std::fs::remove_dir(target);
    elapsed
}

/// One NodePublishVolume + NodeUnpublishVolume through flexd.
async fn csi_cycle(
    node: &mut test_support::serve::NodeClient,
    id: &str,
    target: &Path,
) -> Duration {
    let start = Instant::now();
    node.node_publish_volume(publish_request(id, target, None))
        .await
        .expect("publish");
    node.node_unpublish_volume(unpublish_request(id, target))
        .await
        .expect("unpublish");
    start.elapsed()
}

/// `cycles` pairs, each a cycle through flexd and one of the driver directly, in the order
/// given: both sides of a pair meet the same machine, so a machine slower for a while slows both.
async fn paired_cycles(
    sock: &Path,
    exe: &Path,
    work: &Path,
    round: usize,
    cycles: usize,
    flexd_first: bool,
) -> (Duration, Duration) {
    let mut node = node_client(sock).await;
    let (mut direct, mut csi) = (Duration::ZERO, Duration::ZERO);
    for i in 0..cycles {
        let id = format!("r{round}-v{i}");
        let csi_target = work.join(format!("csi-{id}"));
        let direct_target = work.join(format!("direct-{id}"));
        if flexd_first {
            csi += csi_cycle(&mut node, &id, &csi_target).await;
            direct += direct_cycle(exe, &direct_target);
        } else {
            direct += direct_cycle(exe, &direct_target);
            csi += csi_cycle(&mut node, &id, &csi_target).await;
        }
    }
    (direct, csi)
}

fn cycle_bench(rt: &tokio::runtime::Runtime, cycles: usize, rounds: usize) {
    let server = Server::start_with("node", PRODUCTION_LOGGING, |p| {
        test_support::install_example(p, "tmpfs/tmpfs", "bench~tmpfs")
    });
    let sock = server.socket("flexvolume-bench--tmpfs");
    let exe = test_support::executable_of(&server.plugin_dir, "bench~tmpfs");
    let work = server.path("work");
    // Warm-up: the page cache, the connection, flexd's first pin.
    rt.block_on(paired_cycles(&sock, &exe, &work, 999, 3, false));
    let mut ratios = Rounds::default();
    let (mut direct_ms, mut csi_ms) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        let flexd_first = round % 2 == 1;
        let (direct, csi) = rt.block_on(paired_cycles(
            &sock,
            &exe,
            &work,
            round,
            cycles,
            flexd_first,
        ));
        let per = |d: Duration| d.as_secs_f64() * 1000.0 / cycles as f64;
        println!(
            "cycle round {round} ({} first in each pair): driver directly {:.2} ms, flexd via CSI {:.2} ms, ratio {:.2}",
            if flexd_first { "flexd" } else { "driver" },
            per(direct),
            per(csi),
            per(csi) / per(direct)
        );
        direct_ms.push(per(direct));
        csi_ms.push(per(csi));
        ratios.push(flexd_first, per(csi) / per(direct), per(direct));
    }
    println!(
        "cycle median: driver directly {:.2} ms, flexd via CSI {:.2} ms",
        median(direct_ms),
        median(csi_ms),
    );
    ratios.report("cycle", "driver");
}

/// A driver whose mount takes `delay` seconds and mounts nothing (publish needs only Success).
fn slow_driver(delay: f64) -> String {
    test_support::driver_script(&format!(
        "{}\nmount) sleep {delay}; echo '{{\"status\":\"Success\"}}';;\nunmount) echo '{{\"status\":\"Success\"}}';;",
        test_support::init_case(r#"{"attach":false}"#)
    ))
}

fn direct_concurrent(exe: &Path, work: &Path, n: usize) -> Duration {
    let start = Instant::now();
    let children: Vec<_> = (0..n)
        .map(|i| {
            Command::new(exe)
                .arg("mount")
                .arg(work.join(format!("direct-{i}")))
                .arg(OPTIONS)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .spawn()
                .expect("driver starts")
        })
        .collect();
    for child in children {
        let out = child.wait_with_output().expect("driver ends");
        assert!(out.status.success(), "{out:?}");
    }
    start.elapsed()
}

/// The wall time of `n` publishes at once, and flexd's CPU time over them.
async fn csi_concurrent(
    server: &Server,
    sock: &Path,
    work: &Path,
    n: usize,
) -> (Duration, Duration) {
    let node = node_client(sock).await;
    let targets: Vec<(String, PathBuf)> = (0..n)
        .map(|i| (format!("c{i}"), work.join(format!("csi-c{i}"))))
        .collect();
    let (start, cpu) = (Instant::now(), server.cpu_time());
    publish_all_at_once(&node, &targets).await;
    let (elapsed, cpu) = (start.elapsed(), server.cpu_time() - cpu);
    for (id, target) in &targets {
        node.clone()
            .node_unpublish_volume(unpublish_request(id, target))
            .await
            .expect("unpublish");
    }
    (elapsed, cpu)
}

fn concurrency_bench(rt: &tokio::runtime::Runtime, n: usize, delay: f64, rounds: usize) {
    let server = Server::start_with("node", PRODUCTION_LOGGING, |p| {
        std::fs::create_dir_all(p.join("bench~slow")).unwrap();
        test_support::write_exe(
            &test_support::executable_of(p, "bench~slow"),
            &slow_driver(delay),
        );
    });
    let sock = server.socket("flexvolume-bench--slow");
    let exe = test_support::executable_of(&server.plugin_dir, "bench~slow");
    let work = server.path("work");
    let (mut ratios, mut cpu_ms) = (Rounds::default(), Vec::new());
    for round in 0..rounds {
        let flexd_first = round % 2 == 1;
        let (direct, (csi, cpu)) = if !flexd_first {
            let d = direct_concurrent(&exe, &work, n);
            (d, rt.block_on(csi_concurrent(&server, &sock, &work, n)))
        } else {
            let c = rt.block_on(csi_concurrent(&server, &sock, &work, n));
            (direct_concurrent(&exe, &work, n), c)
        };
        let cpu_per_call = cpu.as_secs_f64() * 1000.0 / n as f64;
        cpu_ms.push(cpu_per_call);
        assert!(server.records().is_empty(), "every volume unpublished");
        println!(
            "concurrent round {round} ({} first): {n} driver runs at once {:.2} s, {n} NodePublishVolume at once {:.2} s (flexd CPU {cpu_per_call:.2} ms per call), ratio {:.2}",
            if flexd_first { "flexd" } else { "driver" },
            direct.as_secs_f64(),
            csi.as_secs_f64(),
            csi.as_secs_f64() / direct.as_secs_f64()
        );
        ratios.push(
            flexd_first,
            csi.as_secs_f64() / direct.as_secs_f64(),
            direct.as_secs_f64(),
        );
    }
    println!(
        "concurrent: {n} calls, mount {delay} s, flexd CPU {:.2} ms per call (median)",
        median(cpu_ms)
    );
    ratios.report("concurrent", "driver runs");
}

fn main() {
    if !test_support::is_root() {
        eprintln!("csi bench needs root (the tmpfs driver mounts): skipped");
        return;
    }
    let cycles = arg(0, 100.0) as usize;
    let rounds = arg(1, 6.0) as usize;
    let concurrent = arg(2, 256.0) as usize;
    let delay = arg(3, 0.2);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    println!("state dir below {}", std::env::temp_dir().display());
    if cycles > 0 {
        cycle_bench(&rt, cycles, rounds);
    }
    if concurrent > 0 {
        concurrency_bench(&rt, concurrent, delay, rounds);
    }
}
