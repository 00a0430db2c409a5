//! Soak: `flexd watch` runs while drivers are installed, upgraded (good and broken), removed,
//! and the plugin dir itself deleted and recreated, and volumes are mounted and unmounted
//! through `flexd volume` at the same time. At the end: the drivers watch reports equal the
//! directory contents, no mount is left, and the watcher's fds, inotify watches and RSS did
//! not grow past a bound.
//!
//! Bounded for the normal suite (20 s); `FLEXD_SOAK_SECS=600 cargo test -p flexd --test integration -- soak::`
//! runs longer. `FLEXD_SOAK_SEED` replays a run (the seed is printed).

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use test_support::{mounts_below, write_exe, Sandbox, Watch};

/// xorshift64*: the run is replayable from its seed.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn script(body_init: &str) -> String {
    test_support::driver_script(&format!(
        "init) {body_init};;\nmount) mkdir -p \"$2\"; mount -t tmpfs tmpfs \"$2\" && echo '{{\"status\":\"Success\"}}' || exit 1;;\nunmount) umount \"$2\"; echo '{{\"status\":\"Success\"}}';;"
    ))
}

/// A watcher whose reported state (driver → ready) is kept up to date from its JSON lines.
struct Watcher {
    watch: Watch,
    state: RefCell<BTreeMap<String, bool>>,
}

impl Watcher {
    fn start(plugin_dir: &Path) -> Self {
        Self {
            watch: Watch::start(plugin_dir, "200ms"),
            state: RefCell::default(),
        }
    }
    fn pid(&self) -> u32 {
        self.watch.pid()
    }
    /// What the lines printed so far say.
    fn state(&self) -> BTreeMap<String, bool> {
        let mut state = self.state.borrow_mut();
        for (_, v) in self.watch.lines.try_iter() {
            let driver = v["driver"].as_str().unwrap_or_default().to_owned();
            match v["event"].as_str() {
                Some("remove") => {
                    state.remove(&driver);
                }
                Some("failed") => {
                    state.insert(driver, false);
                }
                _ => {
                    state.insert(driver, true);
                }
            }
        }
        state.clone()
    }
}

/// (open fds, inotify watches, RSS in KiB) of a process.
/// The call-out cgroups of process `pid` (its process cap), and how many of them still hold a
/// process other than `pid` itself (a spawner thread of `pid` lives in each on cgroup v1).
fn callout_cgroups(pid: u32) -> (usize, usize) {
    let Ok(base) = flexvolume_host::runner::process_cap() else {
        return (0, 0);
    };
    let prefix = format!("call-{pid}-");
    let mut count = 0;
    let mut busy = 0;
    for entry in std::fs::read_dir(base).into_iter().flatten().flatten() {
        if !entry.file_name().to_string_lossy().starts_with(&prefix) {
            continue;
        }
        count += 1;
        let procs = std::fs::read_to_string(entry.path().join("cgroup.procs")).unwrap_or_default();
        if procs.lines().any(|p| p.trim() != pid.to_string()) {
            busy += 1;
        }
    }
    (count, busy)
}

fn resources(pid: u32) -> (usize, usize, u64) {
    let fd_dir = PathBuf::from(format!("/proc/{pid}/fd"));
    let mut fds = 0;
    let mut watches = 0;
    for entry in std::fs::read_dir(&fd_dir).unwrap().flatten() {
        fds += 1;
        let info = std::fs::read_to_string(format!(
            "/proc/{pid}/fdinfo/{}",
            entry.file_name().to_string_lossy()
        ))
        .unwrap_or_default();
        watches += info
            .lines()
            .filter(|l| l.starts_with("inotify wd:"))
            .count();
    }
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let rss = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0);
    (fds, watches, rss)
}

/// What the directory holds: driver → whether its current executable answers init.
fn expected(plugin_dir: &Path) -> BTreeMap<String, bool> {
    let mut out = BTreeMap::new();
    let Ok(entries) = std::fs::read_dir(plugin_dir) else {
        return out;
    };
    for entry in entries.flatten() {
        let dir_name = entry.file_name().to_string_lossy().into_owned();
        if dir_name.starts_with('.') {
            continue;
        }
        let exe_name = dir_name.rsplit('~').next().unwrap_or_default().to_owned();
        let Ok(text) = std::fs::read_to_string(entry.path().join(&exe_name)) else {
            continue;
        };
        out.insert(dir_name.replacen('~', "/", 1), !text.contains("broken"));
    }
    out
}

#[test]
fn soak_discovery_and_volumes_under_churn_leak_nothing() {
    test_support::require_root!();
    let secs: u64 = std::env::var("FLEXD_SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    let seed: u64 = std::env::var("FLEXD_SOAK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
                | 1
        });
    eprintln!("soak: {secs} s, seed {seed} (FLEXD_SOAK_SEED={seed} replays it)");
    let s = Sandbox::new();
    let plugin_dir = s.plugin();
    let volume_plugins = s.path("volume-exec");
    let state_dir = s.state();
    let sources = s.path("src");
    for d in [&volume_plugins, &sources] {
        std::fs::create_dir_all(d).unwrap();
    }
    // The volumes' driver lives apart, so plugin-dir deletion does not take it away mid-mount.
    std::fs::create_dir(volume_plugins.join("soak~tmpfs")).unwrap();
    write_exe(
        &volume_plugins.join("soak~tmpfs/tmpfs"),
        &script(r#"echo '{"status":"Success","capabilities":{"attach":false}}'"#),
    );

    let watcher = Watcher::start(&plugin_dir);
    let mut rng = Rng(seed);
    let flexd = |plugin: &Path, args: &[&str]| {
        test_support::flexd_command(plugin)
            .args(args)
            .stderr(Stdio::null())
            .stdout(Stdio::null())
            .status()
            .unwrap()
    };
    // `flexd volume <op> --target <target>` through the volumes' own plugin dir.
    let volume = |op: &str, target: &Path, more: &[&str]| {
        let state = state_dir.to_str().unwrap();
        let t = target.to_str().unwrap();
        let args = [
            &["volume", "--state-dir", state, op][..],
            more,
            &["--target", t],
        ]
        .concat();
        flexd(&volume_plugins, &args)
    };
    let mut ops: BTreeMap<&str, u64> = BTreeMap::new();
    let mut mounted: Vec<PathBuf> = Vec::new();
    let mut baseline = None;
    let started = Instant::now();
    let mut version = 0u64;
    while started.elapsed() < Duration::from_secs(secs) {
        if baseline.is_none() && started.elapsed() > Duration::from_secs(2) {
            baseline = Some(resources(watcher.pid()));
        }
        version += 1;
        let driver = format!("soak/d{}", rng.below(8));
        let op = match rng.below(100) {
            0..=34 => {
                let source = sources.join(format!("v{version}"));
                let body = if rng.below(5) == 0 {
                    "echo broken; exit 1".to_owned()
                } else {
                    format!(r#"echo '{{"status":"Success","version":"{version}"}}'"#)
                };
                write_exe(&source, &script(&body));
                flexd(
                    &plugin_dir,
                    &["install", "--driver", &driver, source.to_str().unwrap()],
                );
                "install or upgrade"
            }
            35..=54 => {
                flexd(
                    &plugin_dir,
                    &[
                        "uninstall",
                        "--driver",
                        &driver,
                        "--state-dir",
                        state_dir.to_str().unwrap(),
                    ],
                );
                "uninstall"
            }
            55..=57 => {
                let _ = std::fs::remove_dir_all(&plugin_dir);
                std::fs::create_dir_all(&plugin_dir).unwrap();
                "plugin dir deleted and recreated"
            }
            58..=79 => {
                let target = s.target(&format!("vol{}", rng.below(6)));
                let t = target.to_str().unwrap();
                let status = volume("mount", &target, &["--driver", "soak/tmpfs"]);
                assert!(status.success(), "mount of {t} failed (seed {seed})");
                mounted.push(target);
                "mount"
            }
            _ => {
                let Some(target) = mounted.pop() else {
                    continue;
                };
                let t = target.to_str().unwrap();
                let status = volume("unmount", &target, &[]);
                assert!(status.success(), "unmount of {t} failed (seed {seed})");
                "unmount"
            }
        };
        *ops.entry(op).or_default() += 1;
    }
    for target in mounted.drain(..) {
        let status = volume("unmount", &target, &[]);
        assert!(status.success());
    }

    // The watcher catches up: what it reports is what the directory holds.
    let want = expected(&plugin_dir);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let got = watcher.state();
        if got == want {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "seed {seed}: watch reports {got:?}, the plugin dir holds {want:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let leaked = mounts_below(s.root());
    assert!(leaked.is_empty(), "seed {seed}: leaked mounts {leaked:?}");

    let total: u64 = ops.values().sum();
    let (fds0, watches0, rss0) = baseline.unwrap_or_else(|| resources(watcher.pid()));
    let (fds, watches, rss) = resources(watcher.pid());
    // A probe may still be running; once it ends, no driver process may be left.
    let deadline = Instant::now() + Duration::from_secs(10);
    let (mut cgroups, mut busy) = callout_cgroups(watcher.pid());
    while busy > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        (cgroups, busy) = callout_cgroups(watcher.pid());
    }
    eprintln!("soak: the watcher keeps {cgroups} call-out cgroups; {busy} hold a driver process");
    assert_eq!(busy, 0, "seed {seed}: a driver process outlived its init");
    assert!(
        cgroups <= 32,
        "seed {seed}: {cgroups} call-out cgroups (pool bound 32)"
    );
    eprintln!(
        "soak: {total} operations {ops:?}; watcher fds {fds0}->{fds}, inotify watches {watches0}->{watches}, RSS {rss0}->{rss} KiB; 0 leaked mounts"
    );
    // One watch for the plugin dir, one per driver dir at most, and a few fds of its own.
    assert!(
        watches <= 1 + want.len() + 1,
        "seed {seed}: {watches} inotify watches for {} drivers",
        want.len()
    );
    assert!(fds <= fds0 + 4, "seed {seed}: fds grew {fds0} -> {fds}");
    assert!(
        rss <= rss0 + 32 * 1024,
        "seed {seed}: RSS grew {rss0} -> {rss} KiB"
    );
}
