//! Set-up shared by flexd's integration tests: everything of flexvolume's test support (the
//! sandbox, driver writers, root checks, waiting; included by path, one copy for both crates)
//! plus running the real `flexd` binary in a sandbox. A test file uses it with `mod common;`;
//! those that talk gRPC to `flexd serve` add `common/serve.rs` too.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

use serde_json::Value;

#[path = "../../../flexvolume/tests/common/mod.rs"]
mod base;
pub use base::*;

/// The flexd binary under test.
pub const FLEXD: &str = env!("CARGO_BIN_EXE_flexd");

/// `flexd --plugin-dir <plugin_dir>`, to add arguments to.
pub fn flexd_command(plugin_dir: &Path) -> Command {
    let mut command = Command::new(FLEXD);
    command.arg("--plugin-dir").arg(plugin_dir);
    command
}

/// Runs `flexd --plugin-dir <plugin_dir> <args>`.
pub fn flexd(plugin_dir: &Path, args: &[&str]) -> Output {
    flexd_command(plugin_dir)
        .args(args)
        .output()
        .expect("flexd runs")
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
                let value: Value = serde_json::from_str(&line)
                    .unwrap_or_else(|e| panic!("watch printed a line that is not JSON ({e}): {line}"));
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
