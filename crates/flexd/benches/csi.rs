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

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
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

fn direct_cycles(exe: &Path, work: &Path, cycles: usize) -> Duration {
    let start = Instant::now();
    for i in 0..cycles {
        let target = work.join(format!("direct-{i}"));
        run_driver(
            exe,
            &["mount".as_ref(), target.as_os_str(), OPTIONS.as_ref()],
        );
        run_driver(exe, &["unmount".as_ref(), target.as_os_str()]);
        let _ = std::fs::remove_dir(&target);
    }
    start.elapsed()
}

async fn csi_cycles(sock: &Path, work: &Path, round: usize, cycles: usize) -> Duration {
    let mut node = node_client(sock).await;
    let start = Instant::now();
    for i in 0..cycles {
        let id = format!("r{round}-v{i}");
        let target = work.join(format!("csi-{id}"));
        node.node_publish_volume(publish_request(&id, &target, None))
            .await
            .expect("publish");
        node.node_unpublish_volume(unpublish_request(&id, &target))
            .await
            .expect("unpublish");
    }
    start.elapsed()
}

fn cycle_bench(rt: &tokio::runtime::Runtime, cycles: usize, rounds: usize) {
    let server = Server::start_with("node", PRODUCTION_LOGGING, |p| {
        test_support::install_example(p, "tmpfs/tmpfs", "bench~tmpfs")
    });
    let sock = server.socket("flexvolume-bench--tmpfs");
    let exe = test_support::executable_of(&server.plugin_dir, "bench~tmpfs");
    let work = server.path("work");
    // Warm-up: the page cache, the connection, flexd's first pin.
    direct_cycles(&exe, &work, 3);
    rt.block_on(csi_cycles(&sock, &work, 999, 3));
    let mut ratios = Vec::new();
    let (mut direct_ms, mut csi_ms) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        let (direct, csi) = if round % 2 == 0 {
            let d = direct_cycles(&exe, &work, cycles);
            (d, rt.block_on(csi_cycles(&sock, &work, round, cycles)))
        } else {
            let c = rt.block_on(csi_cycles(&sock, &work, round, cycles));
            (direct_cycles(&exe, &work, cycles), c)
        };
        let per = |d: Duration| d.as_secs_f64() * 1000.0 / cycles as f64;
        println!(
            "cycle round {round}: driver directly {:.2} ms, flexd via CSI {:.2} ms, ratio {:.2}",
            per(direct),
            per(csi),
            per(csi) / per(direct)
        );
        direct_ms.push(per(direct));
        csi_ms.push(per(csi));
        ratios.push(per(csi) / per(direct));
    }
    println!(
        "cycle median: driver directly {:.2} ms, flexd via CSI {:.2} ms, ratio {:.2} (target <= 1.3 with the state dir on tmpfs)",
        median(direct_ms),
        median(csi_ms),
        median(ratios)
    );
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
    let (mut ratios, mut cpu_ms) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        let (direct, (csi, cpu)) = if round % 2 == 0 {
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
            "concurrent round {round}: {n} driver runs at once {:.2} s, {n} NodePublishVolume at once {:.2} s (flexd CPU {cpu_per_call:.2} ms per call), ratio {:.2}",
            direct.as_secs_f64(),
            csi.as_secs_f64(),
            csi.as_secs_f64() / direct.as_secs_f64()
        );
        ratios.push(csi.as_secs_f64() / direct.as_secs_f64());
    }
    println!(
        "concurrent median ratio {:.2} ({n} calls, mount {delay} s; target <= 1.3), flexd CPU {:.2} ms per call",
        median(ratios),
        median(cpu_ms)
    );
}

fn main() {
    if !test_support::is_root() {
        eprintln!("csi bench needs root (the tmpfs driver mounts): skipped");
        return;
    }
    let cycles = arg(0, 100.0) as usize;
    let rounds = arg(1, 5.0) as usize;
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
