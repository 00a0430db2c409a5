//! One sandbox that never leaks a mount, one way to write a driver, one root check that says
//! visibly when a test did not run, one way to wait. Nothing here runs flexd: flexvolume-host's
//! tests use it without building the binary.

use std::io::Write as _;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

/// `relative` in the repository (examples, deploy, fuzz seeds): this crate lives at
/// `crates/test-support`.
pub fn repo_path(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(relative)
}

/// The example drivers (`examples/drivers`).
pub fn examples() -> PathBuf {
    repo_path("examples/drivers")
}

/// A sample or test driver by its path under `examples/drivers` (drivers to copy) or
/// `tests/drivers` (fixtures: the quirks, the shape driver).
pub fn driver_source(source: &str) -> PathBuf {
    let example = examples().join(source);
    if example.exists() {
        example
    } else {
        repo_path("tests/drivers").join(source)
    }
}

// ---- Tests that cannot run here say so ----

pub fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// Says that `test` did not run, and why, where a person running `cargo test` sees it.
///
/// libtest captures what a test prints with `print!`/`eprint!` and shows it only when the test
/// fails (or with `--nocapture`); a skipped test passes, so an `eprintln!` would never be seen.
/// A write to the stderr handle itself is not captured: this line lands between cargo's
/// `test … ok` lines, on the terminal or in the CI log, whatever the capture settings.
pub fn report_skip(test: &str, why: &str) {
    let line = format!("SKIPPED {test}: {why}\n");
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

/// The name of the test (function) this expands in, as libtest lists it.
#[macro_export]
macro_rules! test_name {
    () => {{
        fn here() {}
        let name = std::any::type_name_of_val(&here);
        let name = name.strip_suffix("::here").unwrap_or(name);
        let name = name.trim_end_matches("::{{closure}}");
        // Without the crate (the test target), as `cargo test` prints it.
        name.split_once("::").map_or(name, |(_, test)| test)
    }};
}

/// Returns from the test unless it runs as root, saying visibly that it skipped (see
/// `report_skip`). The reason defaults to mounting, what most root-only tests need root for.
#[macro_export]
macro_rules! require_root {
    () => {
        $crate::require_root!("needs root (mounts)")
    };
    ($why:expr) => {
        if !$crate::is_root() {
            $crate::report_skip($crate::test_name!(), $why);
            return;
        }
    };
}

/// Returns from the test, saying visibly why it did not run (see `report_skip`).
#[macro_export]
macro_rules! skip {
    ($why:expr) => {{
        $crate::report_skip($crate::test_name!(), &$why);
        return;
    }};
}

// ---- Waiting ----

/// Polls `condition` until it holds or `limit` passes; whether it held.
pub fn wait_until(limit: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if condition() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Polls until `condition` holds; fails the test after a deadline generous enough for a loaded
/// 2-core machine.
pub fn eventually(what: &str, condition: impl FnMut() -> bool) {
    assert!(
        wait_until(Duration::from_secs(60), condition),
        "timed out waiting for {what}"
    );
}

/// Waits until `path` exists.
pub fn wait_for_path(path: &Path) {
    assert!(
        wait_until(Duration::from_secs(30), || path.exists()),
        "{} never appeared",
        path.display()
    );
}

// ---- Processes ----

/// The command name of process `pid` and the fields of `/proc/<pid>/stat` after it (field 0
/// is the state, 1 the parent, 2 the process group, 11 and 12 user and system time).
pub fn proc_stat(pid: i32) -> Option<(String, Vec<String>)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (open, close) = (stat.find('(')?, stat.rfind(')')?);
    let fields = stat[close + 1..]
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    Some((stat[open + 1..close].to_owned(), fields))
}

/// True once the process is gone (or a zombie nobody has reaped yet).
pub fn is_dead(pid: i32) -> bool {
    proc_stat(pid)
        .is_none_or(|(_, fields)| matches!(fields.first().map(String::as_str), Some("Z" | "X")))
}

/// Polls until `pid` is dead, up to `limit`; whether it died.
pub fn wait_dead(pid: i32, limit: Duration) -> bool {
    wait_until(limit, || is_dead(pid))
}

/// SIGKILL to `pid`, whatever it is by now.
pub fn kill(pid: i32) {
    if let Some(pid) = rustix::process::Pid::from_raw(pid) {
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
    }
}

/// SIGKILL to a child, then reaps it.
pub fn sigkill(child: &mut Child) {
    kill(child.id() as i32);
    let _ = child.wait();
}

/// The pid a driver wrote to `path`, waiting for it to be written.
pub fn read_pid(path: &Path) -> i32 {
    let mut pid = None;
    let written = wait_until(Duration::from_secs(15), || {
        pid = std::fs::read_to_string(path)
            .ok()
            .and_then(|s| s.trim().parse().ok());
        pid.is_some()
    });
    assert!(written, "{} never written", path.display());
    pid.unwrap_or_default()
}

/// SIGTERM, then waits for the exit.
pub fn terminate(child: &mut Child) -> ExitStatus {
    let pid = rustix::process::Pid::from_raw(child.id() as i32).expect("a child has a pid");
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    let mut status = None;
    let stopped = wait_until(Duration::from_secs(20), || {
        status = child.try_wait().unwrap();
        status.is_some()
    });
    assert!(stopped, "{pid:?} did not stop on SIGTERM");
    status.expect("stopped")
}

// ---- Drivers ----

/// Writes an executable (mode 755).
pub fn write_exe(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// Writes an executable atomically: a staged dot-file renamed over `path`, as an installer
/// does (a watcher never sees it half written).
pub fn install_exe(path: &Path, text: &str) {
    let name = path.file_name().unwrap().to_string_lossy();
    let staged = path.with_file_name(format!(".{name}"));
    write_exe(&staged, text);
    std::fs::rename(&staged, path).unwrap();
}

/// A sh driver: `cases` is the body of its `case "$1"`; every other call-out is Not supported.
pub fn driver_script(cases: &str) -> String {
    format!(
        "#!/bin/sh\ncase \"$1\" in\n{cases}\n*) echo '{{\"status\":\"Not supported\"}}'; exit 1;;\nesac\n"
    )
}

/// The `case` line of an `init` answering Success with `capabilities` (a JSON object).
pub fn init_case(capabilities: &str) -> String {
    format!("init) echo '{{\"status\":\"Success\",\"capabilities\":{capabilities}}}';;")
}

/// A driver that only answers `init`, with `attach` as its capability.
pub fn init_only_script(attach: bool) -> String {
    driver_script(&init_case(&format!("{{\"attach\":{attach}}}")))
}

/// The executable of driver directory `dir_name` (`vendor~driver` holds `driver`).
pub fn executable_of(plugin_dir: &Path, dir_name: &str) -> PathBuf {
    let exe = dir_name.rsplit('~').next().unwrap();
    plugin_dir.join(dir_name).join(exe)
}

/// Installs [`driver_source`]`(source)` as driver directory `dir_name` (e.g. `acme~tmpfs`).
pub fn install_example(plugin_dir: &Path, source: &str, dir_name: &str) {
    std::fs::create_dir_all(plugin_dir.join(dir_name)).unwrap();
    std::fs::copy(driver_source(source), executable_of(plugin_dir, dir_name)).unwrap();
}

/// Runs `command`, whose program was just written: while another thread of the test binary
/// forks, the child briefly holds the file open for writing and exec fails with ETXTBSY, so
/// that is retried.
pub fn output_of_new_executable(command: &mut Command) -> std::process::Output {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match command.output() {
            Err(e)
                if e.raw_os_error() == Some(rustix::io::Errno::TXTBSY.raw_os_error())
                    && Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(20));
            }
            result => return result.unwrap(),
        }
    }
}

/// Compiles `examples/drivers/rust-tiny` (the benchmarks' driver) into `dir` with the same
/// toolchain, so nothing needs to be built beforehand.
pub fn compile_tiny_driver(dir: &Path, optimized: bool) -> PathBuf {
    let exe = dir.join("tiny");
    let source = examples().join("rust-tiny/src/main.rs");
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let mut command = Command::new(rustc);
    command.args(["--edition", "2021"]);
    if optimized {
        // Static too, for benches: exec then reads one file, not ld.so and libc as well (in
        // the VM those come over 9p, about 100 ms a call-out, which buries what is measured).
        command.args(["-C", "opt-level=3", "-C", "target-feature=+crt-static"]);
    }
    let status = command
        .arg("-o")
        .arg(&exe)
        .arg(&source)
        .status()
        .expect("rustc runs");
    assert!(status.success(), "rustc failed on {source:?}");
    exe
}

/// Makes a FIFO at `path` with permission bits `mode`.
pub fn make_fifo(path: &Path, mode: u32) {
    rustix::fs::mknodat(
        rustix::fs::CWD,
        path,
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(mode),
        0,
    )
    .unwrap();
}

// ---- Disks ----

/// Fills the filesystem holding `dir` with one file (`.filler`) until ENOSPC; returns it.
pub fn fill_disk(dir: &Path) -> PathBuf {
    let filler = dir.join(".filler");
    let mut f = std::fs::File::create(&filler).unwrap();
    let chunk = vec![0u8; 4096];
    loop {
        match f.write(&chunk) {
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(rustix::io::Errno::NOSPC.raw_os_error()) => break,
            Err(e) => panic!("filling {}: {e}", dir.display()),
        }
    }
    filler
}

/// Mounts a tmpfs (`options` such as `size=512k`) at `at`, creating it; a sandbox holding `at`
/// unmounts it.
pub fn mount_tmpfs(at: &Path, options: &std::ffi::CStr) {
    std::fs::create_dir_all(at).unwrap();
    rustix::mount::mount(
        "tmpfs",
        at,
        "tmpfs",
        rustix::mount::MountFlags::empty(),
        options,
    )
    .unwrap();
}

// ---- Mounts ----

/// Every mount point of this mount namespace, in mount order.
pub fn mount_points() -> Vec<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    flexvolume_os::mount::parse_mountinfo(&info)
        .into_iter()
        .map(|m| m.mount_point)
        .collect()
}

/// The mount points at or below `root`, deepest first (the order they can be unmounted in).
pub fn mounts_below(root: &Path) -> Vec<PathBuf> {
    let mut mounts: Vec<PathBuf> = mount_points()
        .into_iter()
        .filter(|m| m.starts_with(root))
        .collect();
    mounts.sort_by_key(|m| std::cmp::Reverse(m.components().count()));
    mounts
}

/// A mount repeated on its mounted target (CLI or CSI) left the first one as it was: the
/// driver's mount ran once, and `file`, written into the first mount, still reads `content`.
pub fn assert_repeat_kept_the_mount(mount_calls: usize, file: &Path, content: &str) {
    assert_eq!(mount_calls, 1, "the repeat does not call the driver");
    assert_eq!(std::fs::read_to_string(file).unwrap(), content);
}

/// The attaching driver was asked to wait for `device`, then to mount it on `dir`.
pub fn assert_device_mounted(s: &Sandbox, device: &str, dir: &Path) {
    let wait = &s.calls_of("waitforattach")[0];
    assert_eq!(wait[1], device);
    let mountdevice = &s.calls_of("mountdevice")[0];
    assert_eq!(
        (mountdevice[1].as_str(), mountdevice[2].as_str()),
        (dir.to_str().unwrap(), device)
    );
}

/// Whether something is mounted on `path`.
pub fn is_mounted(path: &Path) -> bool {
    let path = path.canonicalize().unwrap_or_else(|_| path.to_owned());
    mount_points().contains(&path)
}

/// Unmounts everything at or below `root`, deepest first; lazily where a mount is busy (a
/// driver process still in it), so a test never leaves a mount behind.
pub fn unmount_all_below(root: &Path) {
    for m in mounts_below(root) {
        if rustix::mount::unmount(&m, rustix::mount::UnmountFlags::empty()).is_err() {
            let _ = rustix::mount::unmount(&m, rustix::mount::UnmountFlags::DETACH);
        }
    }
}

/// Loop devices whose backing file is below `dir`: (device, backing file).
pub fn loop_devices_below(dir: &Path) -> Vec<(String, PathBuf)> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/sys/block")
        .into_iter()
        .flatten()
        .flatten()
    {
        let backing = entry.path().join("loop/backing_file");
        if let Ok(text) = std::fs::read_to_string(&backing) {
            let file = PathBuf::from(text.trim_end_matches('\n'));
            if file.starts_with(dir) {
                let dev = format!("/dev/{}", entry.file_name().to_string_lossy());
                found.push((dev, file));
            }
        }
    }
    found
}

// ---- The sandbox ----

/// A test's own directories: `exec` (the plugin dir), `state`, `work` (targets) below a
/// temporary root. Dropped, even by a panicking test, it unmounts everything mounted below its
/// root and releases the loop devices backed by files below it, then removes it all.
pub struct Sandbox {
    /// Held for its drop, which removes the directory (after `Sandbox`'s own drop unmounts).
    _dir: tempfile::TempDir,
    /// `dir`, canonical: what mount points and backing files below it are compared with.
    root: PathBuf,
    images: std::sync::atomic::AtomicUsize,
}

impl Sandbox {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        for d in ["exec", "state", "work"] {
            std::fs::create_dir(root.join(d)).unwrap();
        }
        Self {
            _dir: dir,
            root,
            images: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// A sandbox with one logging driver, `dir_name` running `cases` (see `driver`).
    pub fn with_driver(dir_name: &str, cases: &str) -> Self {
        let sandbox = Self::new();
        sandbox.driver(dir_name, cases);
        sandbox
    }

    /// A sandbox with examples installed: each (source in `examples/drivers`, driver dir).
    pub fn with_examples(examples: &[(&str, &str)]) -> Self {
        let sandbox = Self::new();
        sandbox.install_examples(examples);
        sandbox
    }

    /// Writes file `name` in the sandbox; its path.
    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.path(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    /// Makes directory `name` (and what it is in) in the sandbox; its path.
    pub fn dir(&self, name: &str) -> PathBuf {
        let path = self.path(name);
        std::fs::create_dir_all(&path).unwrap();
        path
    }

    pub fn root(&self) -> &Path {
        &self.root
    }
    pub fn path(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }
    pub fn plugin(&self) -> PathBuf {
        self.path("exec")
    }
    pub fn state(&self) -> PathBuf {
        self.path("state")
    }
    /// A target below `work` (not created).
    pub fn target(&self, name: &str) -> PathBuf {
        self.path("work").join(name)
    }
    /// The log every driver written by `driver` appends its calls to.
    pub fn log(&self) -> PathBuf {
        self.path("calls.log")
    }
    /// The file a blocking driver (`$RELEASE` in its script) waits for.
    pub fn release(&self) -> PathBuf {
        self.path("release")
    }

    /// Installs (atomically) a driver script that logs every call (argv, tab-separated) before
    /// running `cases` (a `case "$1"` body); `$RELEASE` names the file a blocking driver waits
    /// for.
    pub fn driver(&self, dir_name: &str, cases: &str) {
        std::fs::create_dir_all(self.plugin().join(dir_name)).unwrap();
        let script = driver_script(cases).replacen(
            "#!/bin/sh\n",
            &format!(
                // One write per line (O_APPEND keeps it whole): concurrent drivers share the log.
                "#!/bin/sh\nRELEASE='{}'\nline=; for a in \"$@\"; do line=\"$line$a\t\"; done; printf '%s\\n' \"$line\" >> '{}'\n",
                self.release().display(),
                self.log().display()
            ),
            1,
        );
        install_exe(&executable_of(&self.plugin(), dir_name), &script);
    }

    /// Installs a driver script that answers `init` (no attach) and runs `cases`, without
    /// logging its calls.
    pub fn plain_driver(&self, dir_name: &str, cases: &str) {
        std::fs::create_dir_all(self.plugin().join(dir_name)).unwrap();
        let script = driver_script(&format!("{}\n{cases}", init_case(r#"{"attach":false}"#)));
        write_exe(&executable_of(&self.plugin(), dir_name), &script);
    }

    /// Installs `examples/drivers/<source>` as driver directory `dir_name`.
    pub fn install_example(&self, source: &str, dir_name: &str) {
        install_example(&self.plugin(), source, dir_name);
    }

    /// Installs examples: each (source in `examples/drivers`, driver directory).
    pub fn install_examples(&self, examples: &[(&str, &str)]) {
        for (source, dir_name) in examples {
            self.install_example(source, dir_name);
        }
    }

    /// The logged calls, each as its argv.
    pub fn calls(&self) -> Vec<Vec<String>> {
        std::fs::read_to_string(self.log())
            .unwrap_or_default()
            .lines()
            .map(|l| {
                l.trim_end_matches('\t')
                    .split('\t')
                    .map(str::to_owned)
                    .collect()
            })
            .collect()
    }

    pub fn calls_of(&self, op: &str) -> Vec<Vec<String>> {
        self.calls().into_iter().filter(|c| c[0] == op).collect()
    }

    /// The call-outs made, in order, without init (the prober's business).
    pub fn ops(&self) -> Vec<String> {
        self.calls()
            .into_iter()
            .map(|c| c[0].clone())
            .filter(|op| op != "init")
            .collect()
    }

    /// A loop device on a new sparse image `disk<n>.img` of `size_mb` MiB in the sandbox.
    pub fn loop_device(&self, size_mb: u64) -> String {
        let n = self
            .images
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let image = self.path(&format!("disk{n}.img"));
        let f = std::fs::File::create(&image).unwrap();
        f.set_len(size_mb * 1024 * 1024).unwrap();
        let out = Command::new("losetup")
            .args(["-f", "--show"])
            .arg(&image)
            .output()
            .unwrap();
        assert!(out.status.success(), "losetup: {out:?}");
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    }

    /// Loop devices backed by files in the sandbox.
    pub fn loop_devices(&self) -> Vec<(String, PathBuf)> {
        loop_devices_below(&self.root)
    }
}

impl Default for Sandbox {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        let _ = std::fs::write(self.release(), "");
        unmount_all_below(&self.root);
        for (dev, _) in self.loop_devices() {
            let _ = Command::new("losetup").args(["-d", &dev]).output();
        }
    }
}
