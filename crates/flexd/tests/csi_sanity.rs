//! The official CSI conformance suite, csi-sanity (kubernetes-csi/csi-test v5.3.1), against a
//! real `flexd serve --mode both`: the builtin loop driver (attach, stage, provisioning,
//! expansion, metrics) and the node-only tmpfs example. Both must have zero failures; specs of
//! capabilities flexd does not offer (snapshots, listing, cloning, …) are skipped by the suite
//! itself (the README lists them).
//!
//! The suite is a Go binary built from `../shared/tools/csi-sanity` (relative to the repository
//! root), or named by `CSI_SANITY`. Without it, or without root (the suite mounts), these tests
//! say loudly that they skipped.

mod common;

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::serve_command;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

/// The csi-sanity binary: `$CSI_SANITY`, else what `../shared/tools/csi-sanity` prints (it
/// builds the suite once per machine), else the cache that script fills.
fn csi_sanity() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("CSI_SANITY") {
        return Some(PathBuf::from(path));
    }
    let script = repo_root().join("../shared/tools/csi-sanity");
    if script.is_file() {
        if let Ok(out) = Command::new(&script).stderr(Stdio::inherit()).output() {
            let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
            if out.status.success() && path.is_file() {
                return Some(path);
            }
        }
    }
    let home = std::env::var_os("HOME")?;
    let cached = Path::new(&home).join(".cache/flexd-tools/csi-sanity-5.3.1/csi-sanity");
    cached.is_file().then_some(cached)
}

/// Says on the real stderr (libtest does not capture it) that the suite did not run.
fn skip(why: &str) {
    common::report_skip("csi-sanity conformance", why);
}

fn flexd() -> Command {
    Command::new(env!("CARGO_BIN_EXE_flexd"))
}

struct Serve {
    child: Child,
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Unmounts whatever is still mounted under `root` (deepest first), so a failing run leaks
/// no mount.
fn unmount_all_under(root: &Path) {
    let Ok(table) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    let root = root.display().to_string();
    let mut points: Vec<&str> = table
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|p| p.starts_with(&root))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.len()));
    for point in points {
        let _ = Command::new("umount").arg("-l").arg(point).status();
    }
}

struct Counts {
    passed: u32,
    failed: u32,
    skipped: u32,
}

/// `… 48 Passed | 0 Failed | 1 Pending | 42 Skipped` from ginkgo's summary.
fn counts(output: &str) -> Option<Counts> {
    let line = output.lines().rev().find(|l| l.contains(" Passed | "))?;
    let number = |label: &str| -> Option<u32> {
        let before = &line[..line.find(label)?];
        before.split_whitespace().last()?.parse().ok()
    };
    Some(Counts {
        passed: number(" Passed")?,
        failed: number(" Failed")?,
        skipped: number(" Skipped")?,
    })
}

/// Installs one driver, serves it in both modes, runs the suite against its socket.
fn conformance(install: &[&str], csi_name: &str, parameters: Option<&str>) {
    if !rustix::process::geteuid().is_root() {
        return skip("needs root (the suite stages and publishes real volumes)");
    }
    let Some(sanity) = csi_sanity() else {
        return skip(
            "no csi-sanity: run ../shared/tools/csi-sanity once (it builds it) or set CSI_SANITY",
        );
    };
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let plugins = root.join("plugins");
    let status = flexd()
        .arg("--plugin-dir")
        .arg(&plugins)
        .arg("install")
        .args(install)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success(), "install {install:?}");
    let log = std::fs::File::create(root.join("flexd.log")).unwrap();
    let serve = Serve {
        child: serve_command(&plugins, root, "both")
            .stderr(log)
            .spawn()
            .unwrap(),
    };
    let socket = root.join("csi").join(csi_name).join("csi.sock");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !socket.exists() {
        assert!(Instant::now() < deadline, "flexd never served {csi_name}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut args = vec![
        format!("--csi.endpoint=unix://{}", socket.display()),
        // The suite creates these itself and wants them absent.
        format!("--csi.mountdir={}", root.join("mnt").display()),
        format!("--csi.stagingdir={}", root.join("staging").display()),
        "--ginkgo.no-color".to_owned(),
    ];
    if let Some(yaml) = parameters {
        let file = root.join("parameters.yaml");
        std::fs::write(&file, yaml.replace("$ROOT", &root.display().to_string())).unwrap();
        args.push(format!("--csi.testvolumeparameters={}", file.display()));
    }
    let mut child = Command::new(&sanity)
        .args(&args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut output = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut output)
        .unwrap();
    let mut errors = String::new();
    let _ = child.stderr.take().unwrap().read_to_string(&mut errors);
    let exit = child.wait().unwrap();
    drop(serve);
    unmount_all_under(root);
    let log = std::fs::read_to_string(root.join("flexd.log")).unwrap_or_default();
    let Some(counts) = counts(&output) else {
        panic!("no csi-sanity summary ({exit}):\n{output}\n{errors}\nflexd log:\n{log}");
    };
    eprintln!(
        "csi-sanity against {csi_name}: {} passed, {} failed, {} skipped",
        counts.passed, counts.failed, counts.skipped
    );
    let failures: Vec<&str> = output.lines().filter(|l| l.contains("[FAIL]")).collect();
    assert!(
        counts.failed == 0 && exit.success(),
        "csi-sanity against {csi_name}: {} failed:\n{}\n\n{output}\nflexd log:\n{log}",
        counts.failed,
        failures.join("\n")
    );
    assert!(counts.passed > 0);
}

#[test]
fn csi_sanity_passes_against_the_builtin_loop_driver() {
    conformance(
        &["--builtin", "loop"],
        "flexvolume-flexd--loop",
        // Images in the test's own directory, not /var/lib/flexd-loop.
        Some("imageDir: $ROOT/images\n"),
    );
}

#[test]
fn csi_sanity_passes_against_a_node_only_driver() {
    let tmpfs = repo_root().join("examples/drivers/tmpfs/tmpfs");
    conformance(
        &["--driver", "acme/tmpfs", tmpfs.to_str().unwrap()],
        "flexvolume-acme--tmpfs",
        None,
    );
}

#[test]
fn the_summary_line_is_read() {
    let c = counts("Ran 49 of 92 Specs\nFAIL! -- 48 Passed | 1 Failed | 1 Pending | 42 Skipped\n")
        .unwrap();
    assert_eq!((c.passed, c.failed, c.skipped), (48, 1, 42));
}
