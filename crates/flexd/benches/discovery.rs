//! Discovery benchmarks against the real `flexd watch`, each with its baseline measured in the
//! same run (run with `bench/discovery.sh`):
//!
//! 1. latency: 200 atomic installs of new drivers (mkdir, write `.dN`, rename); time from the
//!    rename to the printed line, against the time to run the driver's `init` alone;
//! 2. storm: 10 s of the fastest writes one process can make into one driver's directory; how
//!    often that driver's `init` ran, flexd's CPU time against the writer's, and how long a
//!    second driver installed during the storm takes to be reported;
//! 3. scale: 5,000 drivers present at start; time until all are reported, against a serial loop
//!    running every `init` once; flexd's peak RSS.

use std::collections::HashMap;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use test_support::Watch;

/// The instant `watch` printed an event of `driver`.
fn wait_for(watch: &Watch, driver: &str) -> Instant {
    loop {
        let (at, event) = watch
            .lines
            .recv_timeout(Duration::from_secs(60))
            .expect("event within 60 s");
        if event["driver"] == driver {
            return at;
        }
    }
}

/// (user + system) CPU seconds of a process, and its peak RSS in KiB.
fn proc_cpu_and_rss(pid: u32) -> (f64, u64) {
    let fields = test_support::proc_stat(pid as i32)
        .map(|(_, f)| f)
        .unwrap_or_default();
    let ticks = rustix::param::clock_ticks_per_second() as f64;
    let utime: f64 = fields.get(11).and_then(|v| v.parse().ok()).unwrap_or(0.0);
    let stime: f64 = fields.get(12).and_then(|v| v.parse().ok()).unwrap_or(0.0);
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let hwm = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    ((utime + stime) / ticks, hwm)
}

fn install_atomic(plugin: &Path, name: &str, exe: &Path) -> Instant {
    let dir = plugin.join(format!("bench~{name}"));
    std::fs::create_dir(&dir).expect("mkdir");
    let staged = dir.join(format!(".{name}"));
    std::fs::copy(exe, &staged).expect("copy");
    std::fs::rename(&staged, dir.join(name)).expect("rename");
    Instant::now()
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn latency(exe: &Path) {
    let root = tempfile::tempdir().expect("tmp");
    let plugin = root.path().join("exec");
    std::fs::create_dir(&plugin).expect("mkdir");
    let watch = Watch::start(&plugin, "1s");
    std::thread::sleep(Duration::from_millis(300));
    let mut latencies = Vec::new();
    for i in 0..200 {
        let name = format!("d{i}");
        let renamed = install_atomic(&plugin, &name, exe);
        let printed = wait_for(&watch, &format!("bench/{name}"));
        latencies.push(ms(printed.saturating_duration_since(renamed)));
    }
    let mut inits = Vec::new();
    for _ in 0..200 {
        let start = Instant::now();
        let out = Command::new(exe)
            .arg("init")
            .stdin(Stdio::null())
            .output()
            .expect("init");
        assert!(out.status.success());
        inits.push(ms(start.elapsed()));
    }
    latencies.sort_by(f64::total_cmp);
    inits.sort_by(f64::total_cmp);
    let (p50, p99) = (percentile(&latencies, 0.5), percentile(&latencies, 0.99));
    let init50 = percentile(&inits, 0.5);
    println!("1. discovery latency, 200 atomic installs (probe interval 1 s):");
    println!("   init alone: p50 {init50:.2} ms; rename -> printed line: p50 {p50:.2} ms, p99 {p99:.2} ms");
    println!(
        "   p50 - init = {:.2} ms (target <= 5), p99 - init = {:.2} ms (target <= 25)",
        p50 - init50,
        p99 - init50
    );
}

fn storm(exe: &Path) {
    let root = tempfile::tempdir().expect("tmp");
    let plugin = root.path().join("exec");
    std::fs::create_dir(&plugin).expect("mkdir");
    let counter = root.path().join("init-count");
    // The storm driver counts its inits outside the plugin dir.
    let dir = plugin.join("bench~storm");
    std::fs::create_dir(&dir).expect("mkdir");
    let script = format!(
        "#!/bin/sh\nif [ \"$1\" = init ]; then echo x >> '{}'; echo '{{\"status\":\"Success\"}}'; else echo '{{\"status\":\"Not supported\"}}'; exit 1; fi\n",
        counter.display()
    );
    std::fs::write(dir.join("storm"), script).expect("write");
    std::fs::set_permissions(dir.join("storm"), std::fs::Permissions::from_mode(0o755))
        .expect("chmod");
    let watch = Watch::start(&plugin, "1s");
    wait_for(&watch, "bench/storm");
    let (cpu_before, _) = proc_cpu_and_rss(watch.pid());
    let inits_before = std::fs::read_to_string(&counter)
        .map(|s| s.lines().count())
        .unwrap_or(0);

    // The writer: a separate process rewriting a file in the driver's dir as fast as it can.
    let target = dir.join("data");
    let mut writer = Command::new("python3")
        .arg("-c")
        .arg(format!(
            "import time,os\nend=time.time()+10\nn=0\nwhile time.time()<end:\n  f=open({:?},'wb'); f.write(b'x'*64); f.close(); n+=1\nprint(n)",
            target.display().to_string()
        ))
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3");
    std::thread::sleep(Duration::from_secs(5));
    let installed = install_atomic(&plugin, "second", exe);
    let reported = wait_for(&watch, "bench/second");
    let mut out = String::new();
    std::io::Read::read_to_string(writer.stdout.as_mut().expect("stdout"), &mut out).expect("read");
    let writer_cpu = {
        // The writer has exited but is not reaped yet: its /proc entry still has its CPU times.
        let (cpu, _) = proc_cpu_and_rss(writer.id());
        let _ = writer.wait();
        cpu
    };
    std::thread::sleep(Duration::from_millis(1500)); // the last trailing edge
    let (cpu_after, _) = proc_cpu_and_rss(watch.pid());
    let inits = std::fs::read_to_string(&counter)
        .map(|s| s.lines().count())
        .unwrap_or(0)
        - inits_before;
    let writes: u64 = out.trim().parse().unwrap_or(0);
    let flexd_cpu = cpu_after - cpu_before;
    println!("2. storm: {writes} file writes in 10 s into one driver's dir (probe interval 1 s):");
    println!("   that driver's init ran {inits} times (target <= 11)");
    println!(
        "   flexd CPU {flexd_cpu:.3} s vs writer CPU {writer_cpu:.3} s: ratio {:.3} (target <= 0.10)",
        flexd_cpu / writer_cpu.max(1e-9)
    );
    println!(
        "   a second driver installed during the storm was reported after {:.1} ms (target <= 1200)",
        ms(reported.saturating_duration_since(installed))
    );
}

fn scale(exe: &Path, count: usize) {
    let root = tempfile::tempdir().expect("tmp");
    let plugin = root.path().join("exec");
    std::fs::create_dir(&plugin).expect("mkdir");
    for i in 0..count {
        let dir = plugin.join(format!("bench~s{i}"));
        std::fs::create_dir(&dir).expect("mkdir");
        std::fs::hard_link(exe, dir.join(format!("s{i}"))).expect("link");
    }
    let start = Instant::now();
    let watch = Watch::start(&plugin, "1s");
    let mut seen = HashMap::new();
    while seen.len() < count {
        let (at, line) = watch
            .lines
            .recv_timeout(Duration::from_secs(120))
            .expect("event");
        let event = line["event"].as_str().unwrap_or("").to_owned();
        let driver = line["driver"].as_str().unwrap_or("").to_owned();
        assert_eq!(event, "add", "{driver}");
        seen.insert(driver, at);
    }
    let startup = seen
        .values()
        .max()
        .expect("events")
        .saturating_duration_since(start);
    let (_, rss) = proc_cpu_and_rss(watch.pid());
    drop(watch);
    let serial_start = Instant::now();
    for i in 0..count {
        let out = Command::new(plugin.join(format!("bench~s{i}/s{i}")))
            .arg("init")
            .stdin(Stdio::null())
            .output()
            .expect("init");
        assert!(out.status.success());
    }
    let serial = serial_start.elapsed();
    println!("3. scale: {count} drivers present at start, all reported:");
    println!(
        "   start-up {:.0} ms vs serial init loop {:.0} ms: ratio {:.3} (target <= 0.6); flexd peak RSS {} KiB",
        ms(startup),
        ms(serial),
        startup.as_secs_f64() / serial.as_secs_f64(),
        rss
    );
}

fn main() {
    let only: Option<String> = std::env::args().skip(1).find(|a| !a.starts_with("--"));
    let dir = tempfile::tempdir().expect("tmp");
    let exe = test_support::compile_tiny_driver(dir.path(), true);
    let run = |name: &str| only.as_deref().is_none_or(|o| o == name);
    if run("latency") {
        latency(&exe);
    }
    if run("storm") {
        storm(&exe);
    }
    if run("scale") {
        scale(&exe, 5000);
    }
    let _ = std::io::stdout().flush();
}
