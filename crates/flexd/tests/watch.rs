//! `flexd watch` through the real binary, with drivers installed, updated and removed by
//! `flexd install` / `flexd uninstall`: the seed's testing plan (initial install, update,
//! another driver, removal) as the operator sees it.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::Duration;

use serde_json::Value;

fn flexd(plugin_dir: &Path, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_flexd"))
        .arg("--plugin-dir")
        .arg(plugin_dir)
        .args(args)
        .output()
        .unwrap()
}

struct Watch {
    child: Child,
    lines: Receiver<Value>,
}

impl Watch {
    fn start(plugin_dir: &Path) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_flexd"))
            .arg("--plugin-dir")
            .arg(plugin_dir)
            .args(["--probe-interval", "300ms", "watch", "--output", "json"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let value: Value = serde_json::from_str(&line)
                    .unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
                if tx.send(value).is_err() {
                    return;
                }
            }
        });
        Self { child, lines }
    }

    fn next(&self) -> Value {
        self.lines
            .recv_timeout(Duration::from_secs(15))
            .expect("an event line within 15 s")
    }

    fn terminate(mut self) -> Option<i32> {
        let pid = rustix::process::Pid::from_raw(self.child.id() as i32).unwrap();
        rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
        let status = self.child.wait().unwrap();
        status.code()
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn driver_source(dir: &Path, name: &str, attach: bool) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(
        &path,
        format!(
            "#!/bin/sh\ncase \"$1\" in init) echo '{{\"status\":\"Success\",\"capabilities\":{{\"attach\":{attach}}}}}';; *) echo '{{\"status\":\"Not supported\"}}'; exit 1;; esac\n"
        ),
    )
    .unwrap();
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    path
}

#[test]
fn install_update_add_another_and_remove_are_each_one_line() {
    let root = tempfile::tempdir().unwrap();
    let plugin = root.path().join("exec");
    let src = tempfile::tempdir().unwrap();
    let v1 = driver_source(src.path(), "v1", false);
    let v2 = driver_source(src.path(), "v2", true);
    std::fs::create_dir(&plugin).unwrap();
    std::fs::create_dir(plugin.join("pre~existing")).unwrap();
    std::fs::copy(&v1, plugin.join("pre~existing/existing")).unwrap();

    let watch = Watch::start(&plugin);
    // Drivers present at start come first.
    let e = watch.next();
    assert_eq!(
        (e["event"].as_str(), e["driver"].as_str()),
        (Some("add"), Some("pre/existing"))
    );
    assert!(
        e["time"].as_str().unwrap().ends_with('Z') && e["time"].as_str().unwrap().contains('.')
    );
    assert_eq!(e["error"], Value::Null);

    // 1. initial installation
    assert!(flexd(
        &plugin,
        &["install", "--driver", "acme/drv", v1.to_str().unwrap()]
    )
    .status
    .success());
    let e = watch.next();
    assert_eq!(
        (e["event"].as_str(), e["driver"].as_str()),
        (Some("add"), Some("acme/drv"))
    );
    assert_eq!(e["capabilities"]["attach"], false);
    assert!(e["path"].as_str().unwrap().ends_with("acme~drv/drv"));
    // 2. update of the same driver
    assert!(flexd(
        &plugin,
        &["install", "--driver", "acme/drv", v2.to_str().unwrap()]
    )
    .status
    .success());
    let e = watch.next();
    assert_eq!(
        (e["event"].as_str(), e["capabilities"]["attach"].as_bool()),
        (Some("update"), Some(true))
    );
    // 3. another driver
    assert!(flexd(
        &plugin,
        &["install", "--driver", "other/drv", v1.to_str().unwrap()]
    )
    .status
    .success());
    let e = watch.next();
    assert_eq!(
        (e["event"].as_str(), e["driver"].as_str()),
        (Some("add"), Some("other/drv"))
    );
    // 4. removal
    assert!(flexd(&plugin, &["uninstall", "--driver", "acme/drv"])
        .status
        .success());
    let e = watch.next();
    assert_eq!(
        (e["event"].as_str(), e["driver"].as_str()),
        (Some("remove"), Some("acme/drv"))
    );
    assert_eq!(e["capabilities"], Value::Null);
    // Nothing else happened.
    assert!(watch.lines.recv_timeout(Duration::from_secs(1)).is_err());
    assert_eq!(
        watch.terminate(),
        Some(0),
        "SIGTERM ends watch with exit status 0"
    );
}

#[test]
fn watch_creates_a_missing_plugin_dir_and_reports_failures() {
    let root = tempfile::tempdir().unwrap();
    let plugin = root.path().join("not-yet");
    let watch = Watch::start(&plugin);
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while !plugin.is_dir() {
        assert!(
            std::time::Instant::now() < deadline,
            "plugin dir not created"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    std::fs::create_dir(plugin.join("acme~bad")).unwrap();
    std::fs::write(plugin.join("acme~bad/readme.txt"), "no executable here").unwrap();
    let e = watch.next();
    assert_eq!(
        (e["event"].as_str(), e["driver"].as_str()),
        (Some("failed"), Some("acme/bad"))
    );
    assert!(e["error"].as_str().unwrap().contains("missing"), "{e}");
}
