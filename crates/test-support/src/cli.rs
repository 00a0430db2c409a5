//! Running the real `flexd` binary: with no setting inherited from the environment, on a
//! sandbox's directories, as `flexd watch` whose event lines a test reads.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::sandbox::{terminate, Sandbox};

/// The flexd binary under test: `flexd` beside the running test's own directory
/// (`target/<profile>/deps/<test>` → `target/<profile>/flexd`), which cargo builds for every
/// integration test and bench of the flexd package.
pub fn flexd_exe() -> PathBuf {
    built_exe("flexd")
}

/// The builtin loop driver's own binary (`flexd-loop`), found as [`flexd_exe`] is.
pub fn flexd_loop_exe() -> PathBuf {
    built_exe("flexd-loop")
}

fn built_exe(name: &str) -> PathBuf {
    let test = std::env::current_exe().expect("the test's own path");
    let profile_dir = test
        .parent()
        .and_then(Path::parent)
        .expect("a test binary under target/<profile>/deps");
    let exe = profile_dir.join(name);
    assert!(
        exe.is_file(),
        "{} is not built: run the tests of the flexd package",
        exe.display()
    );
    exe
}

/// `flexd`, with no flexd setting inherited from the environment the tests run in (its
/// `FLEXD_*` variables, `NODE_NAME`, `RUST_LOG`): a test says what it wants.
pub fn clean_flexd() -> Command {
    let mut command = Command::new(flexd_exe());
    start_with_the_original_open_files(&mut command);
    for (var, _) in std::env::vars_os() {
        let name = var.to_string_lossy();
        if name.starts_with("FLEXD_") || name == "NODE_NAME" || name == "RUST_LOG" {
            command.env_remove(&var);
        }
    }
    command
}

/// The tests share one process, and one of them raises its open-file limit
/// ([`crate::raise_open_files`]) for the connections it holds: every flexd still starts with the
/// limit the tests were started with, whichever test runs beside it. Read now, not in the
/// child: a raise after this call is not seen, one before it left the original behind.
fn start_with_the_original_open_files(command: &mut Command) {
    use std::os::unix::process::CommandExt as _;
    let limit = match flexvolume_os::open_files::original() {
        Some((current, maximum)) => rustix::process::Rlimit { current, maximum },
        None => rustix::process::getrlimit(rustix::process::Resource::Nofile),
    };
    // SAFETY: setrlimit is a system call, async-signal-safe, on a value moved in.
    unsafe {
        command.pre_exec(move || {
            rustix::process::setrlimit(rustix::process::Resource::Nofile, limit)
                .map_err(std::io::Error::from)
        });
    }
}

/// `flexd --plugin-dir <plugin_dir>` (see `clean_flexd`), to add arguments to.
pub fn flexd_command(plugin_dir: &Path) -> Command {
    let mut command = clean_flexd();
    command.arg("--plugin-dir").arg(plugin_dir);
    command
}

/// `flexd serve --mode <mode>` on `plugin_dir`, with the rest under `root`: CSI sockets in
/// `csi`, registration sockets in `registry`, state in `state`, metrics on a port the system
/// picks; its output discarded unless the caller says otherwise.
pub fn serve_command(plugin_dir: &Path, root: &Path, mode: &str) -> Command {
    let mut command = flexd_command(plugin_dir);
    command
        .args(["serve", "--mode", mode, "--metrics-address", "127.0.0.1:0"])
        .arg("--csi-dir")
        .arg(root.join("csi"))
        .arg("--registration-dir")
        .arg(root.join("registry"))
        .arg("--state-dir")
        .arg(root.join("state"))
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    command
}

/// Runs `flexd --plugin-dir <plugin_dir> <args>`.
pub fn flexd(plugin_dir: &Path, args: &[&str]) -> Output {
    flexd_command(plugin_dir)
        .args(args)
        .output()
        .expect("flexd runs")
}

/// Runs `flexd <args>` (no plugin dir).
pub fn run_flexd(args: &[&str]) -> Output {
    clean_flexd().args(args).output().expect("flexd runs")
}

/// Asserts that flexd succeeded, showing what it said otherwise.
pub fn ok(out: &Output) {
    assert!(
        out.status.success(),
        "flexd failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
}

/// Asserts that a command exited with `code` and said each of `says` on stderr.
pub fn assert_fails_saying(out: &Output, code: i32, says: &[&str]) {
    let stderr = stderr_of(out);
    assert_eq!(out.status.code(), Some(code), "{stderr}");
    for text in says {
        assert!(stderr.contains(text), "no {text:?} in: {stderr}");
    }
}

/// Whether a JSON value is a string that contains `text` (a message, an error, a detail).
pub fn json_says(value: &Value, text: &str) -> bool {
    value.as_str().is_some_and(|s| s.contains(text))
}

/// The check of a `flexd check --output json` report whose name starts with `name`.
pub fn check_named<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["checks"]
        .as_array()
        .expect("a report's checks")
        .iter()
        .find(|c| c["name"].as_str().is_some_and(|n| n.starts_with(name)))
        .unwrap_or_else(|| panic!("no check {name:?} in {report:#}"))
}

/// flexd's stdout, after asserting that it succeeded.
pub fn stdout_ok(out: &Output) -> String {
    ok(out);
    String::from_utf8(out.stdout.clone()).expect("stdout is UTF-8")
}

/// What a command printed on stdout, as text (lossily).
pub fn stdout_of(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// What a command printed on stderr, as text (lossily).
pub fn stderr_of(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A multi-document YAML stream (`flexd manifests`, `deploy/*.yaml`) as JSON values; the empty
/// document of a stream that starts with `---` after comments is left out.
pub fn yaml_documents(text: &str) -> Vec<Value> {
    use serde::Deserialize as _;
    serde_yaml_ng::Deserializer::from_str(text)
        .map(|doc| Value::deserialize(doc).expect("a YAML document"))
        .filter(|doc| !doc.is_null())
        .collect()
}

/// Runs `command` and asserts that it succeeded, showing `what` and all it said otherwise.
pub fn output_ok(command: &mut Command, what: impl std::fmt::Display) -> Output {
    let out = command
        .output()
        .unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"));
    assert!(
        out.status.success(),
        "{what}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The secret and the pod kubelet gives a mount, as `flexd volume mount` arguments.
pub const POD_MOUNT_ARGS: [&str; 10] = [
    "--secret",
    "password=hunter2",
    "--pod-name",
    "web-0",
    "--pod-namespace",
    "prod",
    "--pod-uid",
    "uid-1",
    "--service-account",
    "sa",
];

/// flexd's stdout as JSON.
pub fn stdout_json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not JSON ({e}): {:?} / stderr {:?}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// A driver whose volumes are tmpfs mounts.
pub const TMPFS_DRIVER: &str = r#"init) echo '{"status":"Success","capabilities":{"attach":false}}';;
mount) mkdir -p "$2"; mount -t tmpfs tmpfs "$2" && echo '{"status":"Success"}' || { echo '{"status":"Failure","message":"mount failed"}'; exit 1; };;
unmount) umount "$2"; echo '{"status":"Success"}';;"#;

/// An attaching driver: device `/dev/fake-1` for volume `backend/vol-1`, a tmpfs as the
/// mounted device; mount and unmount are left to the defaults (bind, unmount).
pub const ATTACHING_DRIVER: &str = r#"init) echo '{"status":"Success","capabilities":{"attach":true}}';;
getvolumename) echo '{"status":"Success","volumeName":"backend/vol-1"}';;
attach) echo '{"status":"Success","device":"/dev/fake-1"}';;
waitforattach) echo "{\"status\":\"Success\",\"device\":\"$2\"}";;
mountdevice) mkdir -p "$2"; mount -t tmpfs tmpfs "$2"; echo '{"status":"Success"}';;
unmountdevice) umount "$2"; echo '{"status":"Success"}';;
detach) echo '{"status":"Success"}';;"#;

/// Runs `flexd install --driver <driver> <source>` into `plugin_dir`.
pub fn install_driver(plugin_dir: &Path, driver: &str, source: &Path) -> Output {
    flexd(
        plugin_dir,
        &["install", "--driver", driver, source.to_str().unwrap()],
    )
}

/// Whether xfs can be made here (`.ci/run` installs xfsprogs).
pub fn has_mkfs_xfs() -> bool {
    Command::new("mkfs.xfs").arg("-V").output().is_ok()
}

/// Growing a 320 MiB xfs volume to 640 MiB through `flexd volume expand`: flexd succeeded,
/// says the new size, and the filesystem (`before`, `after` bytes) grew. Returns flexd's JSON.
pub fn assert_xfs_doubled(out: &Output, before: u64, after: u64) -> Value {
    ok(out);
    let json: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["new_bytes"], 640u64 << 20);
    assert!(
        after > before + (250 << 20),
        "filesystem grew from {before} to {after}"
    );
    json
}

/// Growing a mounted ext4 through `flexd volume expand` (`before`, `after`: its bytes): it
/// grew by more than `min_growth`, or, where flexd lacks CAP_SYS_RESOURCE (sandboxes and
/// containers cannot resize ext4 online), flexd named the capability and nothing changed.
pub fn assert_ext4_grew_or_names_cap_sys_resource(
    out: &Output,
    before: u64,
    after: u64,
    min_growth: u64,
) {
    if flexvolume_os::mount::has_capability(flexvolume_os::mount::CAP_SYS_RESOURCE) {
        ok(out);
        assert!(
            after > before + min_growth,
            "filesystem grew from {before} to {after}"
        );
    } else {
        eprintln!("note: no CAP_SYS_RESOURCE here; checking the error instead of the growth");
        assert_eq!(out.status.code(), Some(1));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("needs CAP_SYS_RESOURCE"), "{err}");
        assert_eq!(after, before);
    }
}

/// flexd run on a sandbox's directories.
impl Sandbox {
    /// `flexd --plugin-dir <plugin>`, to add arguments to.
    pub fn command(&self) -> Command {
        flexd_command(&self.plugin())
    }

    /// Runs `flexd --plugin-dir <plugin> <args>`.
    pub fn flexd(&self, args: &[&str]) -> Output {
        flexd(&self.plugin(), args)
    }

    /// `flexd volume` on node `node-1` with the sandbox's state dir, then `args`.
    pub fn volume_command(&self, args: &[&str]) -> Command {
        let mut command = self.command();
        command
            .args(["volume", "--node", "node-1", "--state-dir"])
            .arg(self.state())
            .args(args);
        command
    }

    /// Runs `flexd volume` (see `volume_command`).
    pub fn volume(&self, args: &[&str]) -> Output {
        self.volume_command(args).output().expect("flexd runs")
    }

    /// Runs `flexd volume mount --driver <driver> --target <target> <more>`.
    pub fn volume_mount(&self, driver: &str, target: impl AsRef<Path>, more: &[&str]) -> Output {
        let target = target.as_ref().to_str().unwrap();
        self.volume(&[&["mount", "--driver", driver, "--target", target][..], more].concat())
    }

    /// Runs `flexd volume unmount --target <target>`.
    pub fn volume_unmount(&self, target: impl AsRef<Path>) -> Output {
        self.volume(&["unmount", "--target", target.as_ref().to_str().unwrap()])
    }
}

/// A running `flexd watch --output json` on a plugin dir: its event lines, each with the
/// instant it was read. Killed on drop.
pub struct Watch {
    child: Child,
    pub lines: Receiver<(Instant, Value)>,
}

impl Watch {
    /// Starts watching `plugin_dir`, probing every `interval` (e.g. `300ms`).
    pub fn start(plugin_dir: &Path, interval: &str) -> Self {
        let mut child = flexd_command(plugin_dir)
            .args(["--probe-interval", interval, "--log-level", "error"])
            .args(["watch", "--output", "json"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let at = Instant::now();
                let value: Value = serde_json::from_str(&line).unwrap_or_else(|e| {
                    panic!("watch printed a line that is not JSON ({e}): {line}")
                });
                if tx.send((at, value)).is_err() {
                    return;
                }
            }
        });
        Self { child, lines }
    }

    /// The next event line, waiting up to 15 s for it.
    pub fn next(&self) -> Value {
        self.lines
            .recv_timeout(Duration::from_secs(15))
            .expect("an event line within 15 s")
            .1
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGTERM; the exit code.
    pub fn terminate(mut self) -> Option<i32> {
        terminate(&mut self.child).code()
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
