//! The smallest useful FlexVolume driver, with no dependency at all: non-attachable, its volumes
//! are tmpfs mounts (`mount <dir> <json>`, `unmount <dir>`, both idempotent), and it answers
//! `Not supported` to everything else. Compiled, so the call-out benchmark measures flexd's
//! overhead rather than a shell's start-up. (A real Rust driver uses the `flexvolume-driver`
//! SDK; this one shows what the protocol asks for, byte by byte.)

use std::process::{exit, Command, Stdio};

fn reply(status: &str, message: &str) -> ! {
    // The message is ours (no driver input in it), so it needs no JSON escaping.
    println!(r#"{{"status":"{status}","message":"{message}"}}"#);
    exit(if status == "Success" { 0 } else { 1 })
}

/// Whether `dir` is a mount point now (the fifth field of /proc/self/mountinfo).
fn is_mounted(dir: &str) -> bool {
    std::fs::read_to_string("/proc/self/mountinfo")
        .map(|table| table.lines().any(|l| l.split(' ').nth(4) == Some(dir)))
        .unwrap_or(false)
}

/// Runs a helper silently: the reply must be the only output (kubelet reads stdout and stderr).
fn run(program: &str, args: &[&str]) -> bool {
    Command::new(program)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |i: usize| args.get(i).map(String::as_str).unwrap_or("");
    match arg(1) {
        "init" => println!(r#"{{"status":"Success","capabilities":{{"attach":false}}}}"#),
        "mount" if args.len() == 4 => {
            let dir = arg(2);
            if is_mounted(dir) {
                reply("Success", "already mounted");
            }
            if std::fs::create_dir_all(dir).is_err() {
                reply("Failure", "cannot create the mount dir");
            }
            if !run("mount", &["-t", "tmpfs", "-o", "size=64m", "tmpfs", dir]) {
                reply("Failure", "mount -t tmpfs failed");
            }
            reply("Success", "mounted")
        }
        "unmount" if args.len() == 3 => {
            let dir = arg(2);
            if is_mounted(dir) && !run("umount", &[dir]) {
                reply("Failure", "umount failed");
            }
            reply("Success", "unmounted")
        }
        _ => reply("Not supported", "tiny driver: not implemented"),
    }
}
