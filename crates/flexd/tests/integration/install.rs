//! `flexd install` / `flexd uninstall` through the real binary: atomic file and directory
//! installs, with readers running concurrently.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use flexvolume_host::runner::{self, RunnerConfig};
use flexvolume_host::CallOut;

use test_support::{driver_script, fill_disk as fill, flexd, install_driver, mount_tmpfs, Sandbox};

/// A driver script whose init reports `version`.
fn write_driver(path: &Path, version: &str) {
    let init = format!(
        "init) echo '{{\"status\":\"Success\",\"message\":\"{version}\",\"capabilities\":{{\"attach\":false}}}}';;"
    );
    test_support::write_exe(path, &driver_script(&init));
}

/// Runs `flexd --output json install --driver acme/drv <source>`.
fn install_json(plugin_dir: &Path, source: &Path) -> std::process::Output {
    flexd(
        plugin_dir,
        &[
            "--output",
            "json",
            "install",
            "--driver",
            "acme/drv",
            source.to_str().unwrap(),
        ],
    )
}

/// A sandbox with sources of versions v1 and v2 in its own dir (see `versions`).
fn sandbox_with_versions(write: fn(&Path, &str)) -> (Sandbox, Vec<PathBuf>) {
    let s = Sandbox::new();
    let src = s.dir("src");
    let sources = versions(&src, write);
    (s, sources)
}

/// Sources of versions v1 and v2 in `dir`, each written by `write` (a file or a directory).
fn versions(dir: &Path, write: fn(&Path, &str)) -> Vec<PathBuf> {
    ["v1", "v2"]
        .iter()
        .map(|v| {
            let p = dir.join(v);
            write(&p, v);
            p
        })
        .collect()
}

fn dot_files(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.'))
        .collect()
}

#[test]
fn install_creates_then_atomically_replaces_a_driver() {
    let plugin = tempfile::tempdir().unwrap();
    let src = tempfile::tempdir().unwrap();
    let v1 = src.path().join("v1");
    write_driver(&v1, "v1");
    std::fs::set_permissions(&v1, std::fs::Permissions::from_mode(0o750)).unwrap();
    // The plugin dir does not exist yet: install creates it.
    let plugin_dir = plugin.path().join("exec");

    let out = install_json(&plugin_dir, &v1);
    assert!(out.status.success(), "{out:?}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (report["replaced"].as_bool(), report["method"].as_str()),
        (Some(false), Some("rename"))
    );
    let installed = plugin_dir.join("acme~drv/drv");
    let meta = std::fs::metadata(&installed).unwrap();
    assert_eq!(meta.permissions().mode() & 0o7777, 0o750, "mode is kept");
    assert_eq!(
        std::fs::read(&installed).unwrap(),
        std::fs::read(&v1).unwrap()
    );
    let first_inode = meta.ino();

    let v2 = src.path().join("v2");
    write_driver(&v2, "v2");
    let out = flexd(
        &plugin_dir,
        &["install", "--driver", "acme/drv", v2.to_str().unwrap()],
    );
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("updated driver acme/drv"));
    let meta = std::fs::metadata(&installed).unwrap();
    assert_ne!(
        meta.ino(),
        first_inode,
        "replaced by rename, not rewritten in place"
    );
    let reply = runner::call(&RunnerConfig::default(), &installed, &CallOut::init()).unwrap();
    assert_eq!(reply.message, "v2");
    assert!(
        dot_files(&plugin_dir.join("acme~drv")).is_empty(),
        "no staging file left"
    );
}

#[test]
fn a_reader_calling_the_driver_during_200_reinstalls_never_fails() {
    let (s, sources) = sandbox_with_versions(write_driver);
    let p = s.plugin();
    assert!(install_driver(&p, "acme/drv", &sources[0]).status.success());
    let exe = p.join("acme~drv/drv");

    let stop = Arc::new(AtomicBool::new(false));
    let calls = Arc::new(AtomicUsize::new(0));
    let reader = {
        let (stop, calls, exe) = (stop.clone(), calls.clone(), exe.clone());
        std::thread::spawn(move || -> Result<(), String> {
            let config = RunnerConfig::default();
            while !stop.load(Ordering::Relaxed) {
                let reply =
                    runner::call(&config, &exe, &CallOut::init()).map_err(|e| e.to_string())?;
                if reply.message != "v1" && reply.message != "v2" {
                    return Err(format!("unexpected reply {reply:?}"));
                }
                calls.fetch_add(1, Ordering::Relaxed);
            }
            Ok(())
        })
    };
    for i in 0..200 {
        let source = &sources[i % 2];
        let out = flexd(
            &p,
            &["install", "--driver", "acme/drv", source.to_str().unwrap()],
        );
        assert!(out.status.success(), "install {i}: {out:?}");
    }
    stop.store(true, Ordering::Relaxed);
    reader.join().unwrap().unwrap();
    assert!(calls.load(Ordering::Relaxed) > 0, "the reader ran");
}

/// A driver directory whose executable and helper file both carry `version`.
fn write_driver_dir(dir: &Path, version: &str) {
    std::fs::create_dir_all(dir.join("lib")).unwrap();
    write_driver(&dir.join("drv"), version);
    std::fs::write(dir.join("lib/helper.txt"), version).unwrap();
    std::fs::write(dir.join("VERSION"), version).unwrap();
}

/// Reads the driver's and the helper's versions through one directory fd, i.e. one snapshot of
/// whichever directory was in place when it was opened. None if that snapshot was deleted
/// under us (the old set being cleaned up after an exchange).
fn snapshot(driver_dir: &Path) -> Option<(String, String)> {
    use rustix::fs::{openat, Mode, OFlags, CWD};
    let dir = openat(
        CWD,
        driver_dir,
        OFlags::RDONLY | OFlags::DIRECTORY,
        Mode::empty(),
    )
    .ok()?;
    let read = |name: &str| -> Option<String> {
        let fd = openat(&dir, name, OFlags::RDONLY, Mode::empty()).ok()?;
        let mut text = String::new();
        std::io::Read::read_to_string(&mut std::fs::File::from(fd), &mut text).ok()?;
        Some(text)
    };
    let driver = read("drv")?;
    let helper = read("lib/helper.txt")?;
    let driver_version = if driver.contains("\"v1\"") {
        "v1"
    } else if driver.contains("\"v2\"") {
        "v2"
    } else {
        "?"
    };
    Some((driver_version.to_owned(), helper))
}

#[test]
fn a_directory_install_never_exposes_a_mix_of_old_and_new_files() {
    let (s, sources) = sandbox_with_versions(write_driver_dir);
    let p = s.plugin();
    let out = install_json(&p, &sources[0]);
    assert!(out.status.success(), "{out:?}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["method"], "rename-directory");
    let driver_dir = p.join("acme~drv");

    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let (stop, driver_dir) = (stop.clone(), driver_dir.clone());
        std::thread::spawn(move || -> Result<usize, String> {
            let mut consistent = 0;
            while !stop.load(Ordering::Relaxed) {
                if let Some((driver, helper)) = snapshot(&driver_dir) {
                    if driver != helper {
                        return Err(format!("mixed set: driver {driver}, helper {helper}"));
                    }
                    consistent += 1;
                }
            }
            Ok(consistent)
        })
    };
    for i in 0..100 {
        let out = install_json(&p, &sources[i % 2]);
        assert!(out.status.success(), "install {i}: {out:?}");
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(
            report["method"], "exchange",
            "this filesystem supports RENAME_EXCHANGE"
        );
    }
    stop.store(true, Ordering::Relaxed);
    let consistent = reader.join().unwrap().unwrap();
    assert!(consistent > 0, "the reader saw snapshots");
    // The last install (i = 99) was v2; nothing staged is left behind.
    assert_eq!(
        std::fs::read_to_string(driver_dir.join("VERSION")).unwrap(),
        "v2"
    );
    assert!(dot_files(&p).is_empty(), "{:?}", dot_files(&p));
    let reply = runner::call(
        &RunnerConfig::default(),
        &driver_dir.join("drv"),
        &CallOut::init(),
    )
    .unwrap();
    assert_eq!(reply.message, "v2");
}

/// A sandbox with driver acme/drv installed from `good` in a source dir of its own: (sandbox,
/// source dir, good).
fn good_driver_installed() -> (Sandbox, PathBuf, PathBuf) {
    let s = Sandbox::new();
    let (src, good) = good_source(&s);
    assert!(install_driver(&s.plugin(), "acme/drv", &good)
        .status
        .success());
    (s, src, good)
}

/// A source dir of its own in the sandbox, holding driver `good`: (source dir, good).
fn good_source(s: &Sandbox) -> (PathBuf, PathBuf) {
    let src = s.dir("src");
    let good = src.join("good");
    write_driver(&good, "good");
    (src, good)
}

#[test]
fn bad_sources_and_names_are_refused_and_the_live_driver_is_untouched() {
    let (s, src, good) = good_driver_installed();
    let p = &s.plugin();
    let live = p.join("acme~drv/drv");
    let before = std::fs::read(&live).unwrap();

    let plain = src.as_path().join("plain");
    std::fs::write(&plain, "not executable").unwrap();
    std::fs::set_permissions(&plain, std::fs::Permissions::from_mode(0o644)).unwrap();
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec!["acme/drv".into(), plain.display().to_string()],
            "is not executable (mode 644)",
        ),
        (
            vec!["acme/drv".into(), "/nonexistent/driver".into()],
            "source /nonexistent/driver",
        ),
        (
            vec!["acme/drv".into(), src.as_path().display().to_string()],
            "has no executable named \"drv\"",
        ),
        (
            vec!["../etc".into(), good.display().to_string()],
            "starting with '.'",
        ),
        (
            vec!["a//b".into(), good.display().to_string()],
            "empty segment",
        ),
    ];
    for (args, want) in cases {
        let out = flexd(p, &["install", "--driver", &args[0], &args[1]]);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "{args:?}: {err}");
        assert_eq!(
            std::fs::read(&live).unwrap(),
            before,
            "live driver changed by {args:?}"
        );
    }
    assert!(dot_files(&p.join("acme~drv")).is_empty());

    // A driver directory that is a symlink is never written through.
    let elsewhere = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(elsewhere.path(), p.join("acme~sneaky")).unwrap();
    let out = flexd(
        p,
        &["install", "--driver", "acme/sneaky", good.to_str().unwrap()],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not a directory (or is a symlink)"));
    assert_eq!(std::fs::read_dir(elsewhere.path()).unwrap().count(), 0);
}

/// A driver from a sloppy image (everything 0777) is installed writable by its owner only, so
/// discovery trusts it (docs/discovery.md#trust), whatever the installer's umask; the plugin
/// dir install creates is not writable by others either.
#[test]
fn a_driver_anyone_could_write_is_installed_writable_by_root_only_and_is_ready() {
    use std::os::unix::process::CommandExt;
    let s = Sandbox::new();
    let mode = |path: &Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o7777;
    let chmod = |path: &Path, mode: u32| {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap()
    };
    let src = s.dir("src");
    let file = src.join("file");
    write_driver(&file, "file");
    chmod(&file, 0o777);
    let dir = src.join("dir");
    write_driver_dir(&dir, "dir");
    for (path, m) in [
        (dir.as_path(), 0o777),
        (&dir.join("drv"), 0o777),
        (&dir.join("lib"), 0o777),
        (&dir.join("lib/helper.txt"), 0o666),
    ] {
        chmod(path, m);
    }
    let plugin = s.path("new/exec");
    let install = |driver: &str, source: &Path| {
        let mut command = test_support::flexd_command(&plugin);
        command.args(["install", "--driver", driver, source.to_str().unwrap()]);
        // SAFETY: umask is async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            command.pre_exec(|| {
                rustix::process::umask(rustix::fs::Mode::empty());
                Ok(())
            });
        }
        let out = command.output().unwrap();
        assert!(out.status.success(), "{driver}: {out:?}");
    };
    install("acme/file", &file);
    install("acme/drv", &dir);

    for (path, want) in [
        (s.path("new"), 0o755),
        (plugin.clone(), 0o755),
        (plugin.join("acme~file"), 0o755),
        (plugin.join("acme~file/file"), 0o755),
        (plugin.join("acme~drv"), 0o755),
        (plugin.join("acme~drv/drv"), 0o755),
        (plugin.join("acme~drv/lib"), 0o755),
        (plugin.join("acme~drv/lib/helper.txt"), 0o644),
    ] {
        assert_eq!(mode(&path), want, "{}", path.display());
    }
    let out = flexd(&plugin, &["drivers", "-o", "json"]);
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let statuses: Vec<(&str, &str)> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|d| (d["name"].as_str().unwrap(), d["status"].as_str().unwrap()))
        .collect();
    assert_eq!(
        statuses,
        [("acme/drv", "ready"), ("acme/file", "ready")],
        "{list}"
    );
}

/// Installing into a plugin dir others may write fails with discovery's reason, before the
/// driver is put in place: discovery would refuse it.
#[test]
fn install_into_a_plugin_dir_anyone_could_write_is_refused() {
    let s = Sandbox::new();
    let (_, good) = good_source(&s);
    let dir = s.dir("src/dir");
    write_driver_dir(&dir, "dir");
    let p = s.plugin();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o777)).unwrap();
    for (driver, source) in [("acme/file", &good), ("acme/drv", &dir)] {
        let out = flexd(
            &p,
            &["install", "--driver", driver, source.to_str().unwrap()],
        );
        assert_eq!(out.status.code(), Some(1), "{driver}: {out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(&format!(
                "{}: writable by group and others (mode 777)",
                p.display()
            )) && err.contains("discovery would refuse it"),
            "{driver}: {err}"
        );
        let exe = p
            .join(driver.replace('/', "~"))
            .join(driver.rsplit('/').next().unwrap());
        assert!(!exe.exists(), "{driver} was installed");
    }
}

#[test]
fn uninstall_removes_the_driver_and_refuses_an_absent_one() {
    let (s, src, _) = good_driver_installed();
    let p = &s.plugin();
    // An empty state dir of its own: no volume uses the driver.
    let state = src.as_path().join("state");
    let uninstall = [
        "uninstall",
        "--driver",
        "acme/drv",
        "--state-dir",
        state.to_str().unwrap(),
    ];
    let out = flexd(p, &uninstall);
    assert!(out.status.success(), "{out:?}");
    assert!(!p.join("acme~drv").exists());
    assert!(dot_files(p).is_empty());
    let out = flexd(p, &uninstall);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("driver acme/drv is not installed"));
}

#[test]
fn then_sleep_stays_up_until_sigterm_and_exits_zero() {
    let s = Sandbox::new();
    let (_, good) = good_source(&s);
    let mut child = s
        .command()
        .args(["install", "--then-sleep", "--driver", "acme/drv"])
        .arg(&good)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let installed = s.plugin().join("acme~drv/drv");
    test_support::wait_for_path(&installed);
    assert!(
        child.try_wait().unwrap().is_none(),
        "exited instead of sleeping"
    );
    let status = test_support::terminate(&mut child);
    assert_eq!(status.code(), Some(0));
}

/// A driver script padded to `kib` KiB, so that copying it needs room.
fn write_big_driver(path: &Path, version: &str, kib: usize) {
    write_driver(path, version);
    let mut script = std::fs::read_to_string(path).unwrap();
    script.push_str(&format!("# {}\n", "x".repeat(kib * 1024)));
    std::fs::write(path, script).unwrap();
}

/// A full plugin-dir disk: installing a new version (a file, or a directory) fails with a clear
/// error, the old version keeps running, and no staging file or directory is left to fill the
/// disk further. With room again, the same install succeeds.
#[test]
fn installing_onto_a_full_disk_fails_clearly_and_keeps_the_old_version() {
    test_support::require_root!("needs root to mount a small tmpfs as the plugin dir");
    let s = Sandbox::new();
    let plugin_dir = s.plugin();
    mount_tmpfs(&plugin_dir, c"size=512k");
    let src = s.dir("src");
    let (v1, v2, v2_dir) = (src.join("v1"), src.join("v2"), src.join("v2-dir"));
    write_driver(&v1, "v1");
    write_big_driver(&v2, "v2", 64);
    write_driver_dir(&v2_dir, "v2");
    write_big_driver(&v2_dir.join("drv"), "v2", 64);
    let install = |what: &Path| {
        flexd(
            &plugin_dir,
            &["install", "--driver", "acme/drv", what.to_str().unwrap()],
        )
    };
    let out = install(&v1);
    assert!(out.status.success(), "{out:?}");
    let installed = plugin_dir.join("acme~drv/drv");
    let filler = fill(&plugin_dir);

    for new in [&v2, &v2_dir] {
        let out = install(new);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "{} installed on a full disk",
            new.display()
        );
        assert!(err.contains("No space left on device"), "{err}");
        let reply = runner::call(&RunnerConfig::default(), &installed, &CallOut::init()).unwrap();
        assert_eq!(reply.message, "v1", "the old version stays in place");
        assert!(
            dot_files(&plugin_dir.join("acme~drv")).is_empty(),
            "staging files left: {:?}",
            dot_files(&plugin_dir.join("acme~drv"))
        );
        let leftovers: Vec<String> = dot_files(&plugin_dir)
            .into_iter()
            .filter(|n| n != ".filler")
            .collect();
        assert!(leftovers.is_empty(), "staging dirs left: {leftovers:?}");
    }

    std::fs::remove_file(filler).unwrap();
    let out = install(&v2);
    assert!(out.status.success(), "{out:?}");
    let reply = runner::call(&RunnerConfig::default(), &installed, &CallOut::init()).unwrap();
    assert_eq!(reply.message, "v2");
}

/// Finding 6: the installer DaemonSet added CHOWN, DAC_OVERRIDE and FOWNER. Root's uid with no
/// capability at all (bounding set emptied, as `drop: [ALL]` leaves it) installs into a
/// root-owned plugin dir, upgrades and uninstalls: root owns everything it writes there.
#[test]
fn root_installs_upgrades_and_uninstalls_with_no_capability() {
    test_support::require_root!("needs root (root's uid without capabilities)");
    let (s, sources) = sandbox_with_versions(write_driver_dir);
    let plugin = s.plugin();
    let without_capabilities = |args: &[&str]| {
        let out = std::process::Command::new("setpriv")
            .args([
                "--bounding-set=-all",
                "--inh-caps=-all",
                "--ambient-caps=-all",
            ])
            .arg(test_support::flexd_exe())
            .arg("--plugin-dir")
            .arg(&plugin)
            .arg("--state-dir")
            .arg(s.state())
            .args(args)
            .output()
            .unwrap();
        test_support::ok(&out);
        out
    };
    // It really has none: a capability-needing chown of a file it does not own fails.
    let probe = s.path("not-owned");
    std::fs::write(&probe, "").unwrap();
    std::os::unix::fs::chown(&probe, Some(12345), None).unwrap();
    let chown = std::process::Command::new("setpriv")
        .args([
            "--bounding-set=-all",
            "--inh-caps=-all",
            "--ambient-caps=-all",
        ])
        .args(["chown", "0"])
        .arg(&probe)
        .status()
        .unwrap();
    assert!(!chown.success(), "setpriv left a capability");
    for source in &sources {
        without_capabilities(&["install", "--driver", "acme/drv", source.to_str().unwrap()]);
    }
    let installed = plugin.join("acme~drv");
    assert_eq!(snapshot(&installed).unwrap().0, "v2");
    without_capabilities(&["uninstall", "--driver", "acme/drv"]);
    assert!(!installed.exists());
}
