//! The call-out protocol against real driver executables that reproduce what public drivers do
//! (tests/drivers/quirks/*): every quirk has an exact expected outcome.

use std::path::Path;
use std::time::Duration;

use flexvolume_host::layout::{self, LayoutPolicy};
use flexvolume_host::runner::{self, CallError, Cancel, RunnerConfig};
use flexvolume_host::{DriverName, InstalledDriver, Plugin, PodInfo, VolumeSpec};
use flexvolume_protocol::options::Options;
use flexvolume_protocol::{CallOut, CallOutKind, ExitStatus, ProtocolError, Status};

use test_support::{driver_source, is_dead, kill, read_pid, write_exe};

/// Patience for a killed driver to go.
const PATIENCE: Duration = Duration::from_secs(15);

fn wait_dead(pid: i32) -> bool {
    test_support::wait_dead(pid, PATIENCE)
}

/// A temp plugin dir holding one quirk driver, installed as `test/<quirk>`.
struct Fixture {
    dir: tempfile::TempDir,
    driver: InstalledDriver,
}

fn install(quirk: &str) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let driver_dir = dir.path().join(format!("test~{quirk}"));
    std::fs::create_dir(&driver_dir).unwrap();
    std::fs::copy(driver_source("quirks").join(quirk), driver_dir.join(quirk)).unwrap();
    let name = DriverName::parse(&format!("test/{quirk}")).unwrap();
    let driver = layout::locate(dir.path(), &name, LayoutPolicy::default()).unwrap();
    Fixture { dir, driver }
}

fn config() -> RunnerConfig {
    RunnerConfig::default()
}

/// A runner that times out after `timeout_ms` and kills `grace_ms` after SIGTERM.
fn quick_config(grace_ms: u64, timeout_ms: u64) -> RunnerConfig {
    RunnerConfig {
        kill_grace: Duration::from_millis(grace_ms),
        ..RunnerConfig::default()
    }
    .with_timeout_for_all(Duration::from_millis(timeout_ms))
}

fn mount_call(target: &str) -> CallOut {
    CallOut::from_raw(CallOutKind::Mount, vec![target.into(), "{}".into()]).unwrap()
}

fn init(quirk: &str) -> Result<flexvolume_host::Reply, CallError> {
    let f = install(quirk);
    runner::call(&config(), &f.driver.path, &CallOut::init())
}

/// `mount` of a quirk that writes the pid of the process the test is about (itself, a helper,
/// a daemon) to the file its call names: the call's result and that pid, read after the call.
fn mount_writing_pid(
    quirk: &str,
    config: &RunnerConfig,
) -> (Result<flexvolume_host::Reply, CallError>, i32) {
    let f = install(quirk);
    let pidfile = f.dir.path().join("pid");
    let result = runner::call(
        config,
        &f.driver.path,
        &mount_call(pidfile.to_str().unwrap()),
    );
    (result, read_pid(&pidfile))
}

/// The protocol error a call failed with; any other failure fails the test.
fn protocol_error(err: &CallError) -> &ProtocolError {
    match err {
        CallError::Protocol { source, .. } => source,
        other => panic!("expected a protocol error, got {other:?}"),
    }
}

/// Asserts that a call's error is a protocol error matching the pattern (and guard) given.
macro_rules! assert_protocol_error {
    ($err:expr, $($pattern:tt)+) => {
        assert!(matches!(protocol_error(&$err), $($pattern)+), "{:?}", $err)
    };
}

#[test]
fn capitalised_keys_are_understood() {
    let reply = init("capitalised").unwrap();
    assert_eq!(reply.status, Status::Success);
    let caps = reply.capabilities.unwrap();
    assert!(!caps.attach, "Attach:false must be read");
    assert!(caps.fs_group && caps.selinux_relabel, "defaults merged");
}

#[test]
fn failure_with_exit_zero_is_a_failure() {
    let f = install("failure-exit0");
    let err = runner::call(&config(), &f.driver.path, &mount_call("/t")).unwrap_err();
    match err {
        CallError::Failure { kind, message, .. } => {
            assert_eq!(kind, CallOutKind::Mount);
            assert_eq!(message, "backend unreachable");
        }
        other => panic!("expected Failure, got {other:?}"),
    }
}

#[test]
fn not_supported_with_exit_one_is_remembered_per_plugin() {
    let f = install("notsupported-exit1");
    let plugin = Plugin::init(f.driver.clone(), &config()).unwrap();
    let call = CallOut::from_raw(CallOutKind::Attach, vec!["{}".into(), "node".into()]).unwrap();
    let err = plugin.call(&config(), &call).unwrap_err();
    assert!(err.is_not_supported(), "{err:?}");
    assert!(plugin.is_unsupported(CallOutKind::Attach));
    // Prove the second call does not run the driver: remove the executable; the answer must
    // still be Not supported (a run would fail to spawn).
    std::fs::remove_file(&f.driver.path).unwrap();
    let again = plugin.call(&config(), &call).unwrap_err();
    assert!(again.is_not_supported(), "{again:?}");
    // A re-probe (new plugin instance) forgets it.
    assert!(!Plugin::from_init_reply(f.driver.clone(), &init_reply())
        .is_unsupported(CallOutKind::Attach));
}

fn init_reply() -> flexvolume_host::Reply {
    flexvolume_protocol::find_reply(br#"{"status":"Success"}"#).unwrap()
}

#[test]
fn usage_text_instead_of_json_is_an_error_quoting_it() {
    let f = install("usage-text");
    let err = runner::call(&config(), &f.driver.path, &mount_call("/t")).unwrap_err();
    match protocol_error(&err) {
        ProtocolError::NoReply { exit, output, kind } => {
            assert_eq!(*exit, ExitStatus::Code(1));
            assert_eq!(*kind, CallOutKind::Mount);
            assert!(output.starts_with("usage: "), "{output}");
        }
        other => panic!("expected NoReply, got {other:?}"),
    }
    let text = err.to_string();
    assert!(
        text.contains("usage: ") && text.contains("exit status 1"),
        "{text}"
    );
}

#[test]
fn log_lines_before_the_json_are_skipped() {
    let reply = init("log-lines").unwrap();
    assert_eq!(reply.message, "logged first");
    assert!(!reply.capabilities.unwrap().attach);
}

#[test]
fn of_two_objects_the_first_with_a_status_wins() {
    let f = install("two-objects");
    let err = runner::call(&config(), &f.driver.path, &mount_call("/t")).unwrap_err();
    assert!(
        matches!(&err, CallError::Failure { message, .. } if message == "first object"),
        "{err:?}"
    );
}

#[test]
fn dash_echo_prefix_is_tolerated() {
    let reply = init("echo-ne").unwrap();
    assert_eq!(reply.message, "dash echo");
}

#[test]
fn empty_output_is_an_error_naming_the_exit_status() {
    let err = init("empty-output").unwrap_err();
    assert_protocol_error!(
        err,
        ProtocolError::NoReply { exit: ExitStatus::Code(0), output, .. } if output.is_empty()
    );
}

#[test]
fn reply_on_stderr_is_used_when_stdout_is_empty() {
    assert_eq!(init("stderr-only").unwrap().message, "from stderr");
}

#[test]
fn success_with_nonzero_exit_is_a_driver_bug() {
    let err = init("success-exit2").unwrap_err();
    assert_protocol_error!(
        err,
        ProtocolError::SuccessWithBadExit {
            exit: ExitStatus::Code(2),
            ..
        }
    );
    assert!(err.to_string().contains("driver bug"));
}

#[test]
fn crash_by_signal_is_reported_with_the_signal() {
    let err = init("crash").unwrap_err();
    assert_protocol_error!(
        err,
        ProtocolError::NoReply {
            exit: ExitStatus::Signal(11),
            ..
        }
    );
    assert!(err.to_string().contains("killed by signal 11"), "{err}");
}

#[test]
fn a_hung_driver_times_out_and_its_whole_group_is_killed() {
    let (result, helper) = mount_writing_pid("hang", &quick_config(500, 300));
    let err = result.unwrap_err();
    assert!(
        matches!(&err, CallError::Timeout { kind: CallOutKind::Mount, after, .. } if *after == Duration::from_millis(300)),
        "{err:?}"
    );
    assert!(err.to_string().contains("mount timed out"), "{err}");
    // The background helper the driver started is in its process group: killed too.
    assert!(wait_dead(helper), "helper {helper} survived the timeout");
}

#[test]
fn a_driver_ignoring_sigterm_is_killed_after_the_grace() {
    let (result, pid) = mount_writing_pid("ignore-term", &quick_config(300, 500));
    let err = result.unwrap_err();
    assert!(matches!(err, CallError::Timeout { .. }), "{err:?}");
    assert!(wait_dead(pid), "driver {pid} survived SIGKILL");
}

#[test]
fn a_daemonized_child_holding_stdout_does_not_hang_the_call() {
    // The daemon lives 60 s; the call-out's timeout is 30 s. Returning Success at all proves we
    // did not wait for the pipe to close.
    let config = RunnerConfig::default().with_timeout_for_all(Duration::from_secs(30));
    let (result, daemon) = mount_writing_pid("daemon-child", &config);
    assert_eq!(result.unwrap().message, "daemon left running");
    let alive = !is_dead(daemon);
    // Clean up the daemon before asserting, so a failure leaves nothing behind.
    kill(daemon);
    assert!(
        alive,
        "the daemon must still be running when the call returned"
    );
}

#[test]
fn ten_mebibytes_of_output_are_capped_and_the_reply_still_read() {
    let f = install("big-output");
    let call = mount_call("first");
    let raw = runner::run(&config(), &f.driver.path, &call).unwrap();
    assert_eq!(
        raw.stdout.len(),
        flexvolume_host::runner::DEFAULT_OUTPUT_CAP
    );
    let reply_line = r#"{"status":"Success","message":"reply before the flood","capabilities":{"attach":false}}"#;
    assert_eq!(
        raw.stdout.len() as u64 + raw.dropped.0,
        10 * 1024 * 1024 + reply_line.len() as u64 + 1
    );
    let reply = runner::call(&config(), &f.driver.path, &call).unwrap();
    assert_eq!(reply.message, "reply before the flood");
}

#[test]
fn a_reply_past_the_cap_is_lost_but_the_call_completes() {
    let f = install("big-output");
    let err = runner::call(&config(), &f.driver.path, &mount_call("last")).unwrap_err();
    match protocol_error(&err) {
        ProtocolError::NoReply { output, .. } => assert!(
            output.len() < 1024,
            "the quote is truncated: {} bytes",
            output.len()
        ),
        other => panic!("expected NoReply, got {other:?}"),
    }
}

#[test]
fn missing_and_non_executable_drivers_fail_to_spawn() {
    let f = install("capitalised");
    let missing = f.driver.dir.join("nope");
    let err = runner::call(&config(), &missing, &CallOut::init()).unwrap_err();
    assert!(
        matches!(&err, CallError::Spawn { source, .. } if source.kind() == std::io::ErrorKind::NotFound),
        "{err:?}"
    );
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&f.driver.path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let err = runner::call(&config(), &f.driver.path, &CallOut::init()).unwrap_err();
    assert!(matches!(&err, CallError::Spawn { .. }), "{err:?}");
    assert!(err.to_string().contains("cannot execute driver"), "{err}");
    // The layout refuses it before any run, with the reason.
    let layout_err =
        layout::locate(f.dir.path(), &f.driver.name, LayoutPolicy::default()).unwrap_err();
    assert!(
        layout_err.to_string().contains("not executable (mode 644)"),
        "{layout_err}"
    );
}

#[test]
fn argv_is_exact_stdin_is_null_and_the_driver_leads_its_group() {
    let f = install("introspect");
    let mut spec = VolumeSpec::new("pv-1".into(), f.driver.name.clone());
    spec.fs_type = "ext4".into();
    spec.options
        .insert("with space".into(), "a \"quoted\" value".into());
    let options = Options::for_mount(&spec, &PodInfo::default(), Some(1000));
    let target = Path::new("/var/lib/kubelet/pods/x/volumes/test~introspect/v");
    let reply = runner::call(&config(), &f.driver.path, &CallOut::mount(target, &options)).unwrap();
    assert_eq!(reply.message, "argc=3 leader=true stdin=[]");
    let argv: Vec<String> = serde_json::from_str(reply.volume_name.as_deref().unwrap()).unwrap();
    assert_eq!(
        argv,
        vec![
            "mount".to_owned(),
            target.display().to_string(),
            options.to_json()
        ]
    );
}

#[test]
fn every_call_out_has_the_documented_argv() {
    let f = install("introspect");
    let spec = VolumeSpec::new("pv".into(), f.driver.name.clone());
    let o = Options::for_volume(&spec);
    let json = o.to_json();
    let dir = Path::new("/dev-mount");
    let cases: Vec<(CallOut, Vec<&str>)> = vec![
        (CallOut::init(), vec!["init"]),
        (CallOut::get_volume_name(&o), vec!["getvolumename", &json]),
        (
            CallOut::attach(&o, "node-1"),
            vec!["attach", &json, "node-1"],
        ),
        (
            CallOut::wait_for_attach("/dev/sdb", &o),
            vec!["waitforattach", "/dev/sdb", &json],
        ),
        (
            CallOut::is_attached(&o, "node-1"),
            vec!["isattached", &json, "node-1"],
        ),
        (
            CallOut::mount_device(dir, "/dev/sdb", &o),
            vec!["mountdevice", "/dev-mount", "/dev/sdb", &json],
        ),
        (
            CallOut::detach("vol~name", "node-1"),
            vec!["detach", "vol~name", "node-1"],
        ),
        (
            CallOut::unmount_device(dir),
            vec!["unmountdevice", "/dev-mount"],
        ),
        (CallOut::mount(dir, &o), vec!["mount", "/dev-mount", &json]),
        (CallOut::unmount(dir), vec!["unmount", "/dev-mount"]),
        (
            CallOut::expand_volume(&o, dir, 20, 10),
            vec!["expandvolume", &json, "/dev-mount", "20", "10"],
        ),
        (
            CallOut::expand_fs(&o, "/dev/sdb", dir, 20, 10),
            vec!["expandfs", &json, "/dev/sdb", "/dev-mount", "20", "10"],
        ),
    ];
    for (call, want) in cases {
        let reply = runner::call(&config(), &f.driver.path, &call).unwrap();
        let argv: Vec<String> =
            serde_json::from_str(reply.volume_name.as_deref().unwrap()).unwrap();
        assert_eq!(argv, want, "{}", call.kind);
        assert_eq!(argv.len(), call.kind.arity() + 1);
    }
}

#[test]
fn secrets_echoed_by_a_driver_are_redacted_from_messages_and_errors() {
    let f = install("echo-secret");
    let mut spec = VolumeSpec::new("pv".into(), f.driver.name.clone());
    spec.secrets
        .insert("password".into(), b"s3cr3t-Value".to_vec());
    let options = Options::for_mount(&spec, &PodInfo::default(), None);
    let call = CallOut::mount(Path::new("/t"), &options);
    let err = runner::call(&config(), &f.driver.path, &call).unwrap_err();
    let shown = format!("{err} {err:?} {call:?}");
    assert!(!shown.contains("s3cr3t-Value"), "{shown}");
    assert!(
        !shown.contains("czNjcjN0LVZhbHVl"),
        "base64 leaked: {shown}"
    );
    assert!(shown.contains("<redacted>"), "{shown}");
}

#[test]
fn the_compiled_tiny_driver_answers_init() {
    // The benchmark's driver, compiled here with the same toolchain so the test needs nothing
    // built beforehand.
    let dir = tempfile::tempdir().unwrap();
    let exe = test_support::compile_tiny_driver(dir.path(), false);
    let reply = runner::call(&config(), &exe, &CallOut::init()).unwrap();
    assert!(!reply.capabilities.unwrap().attach);
    let err = runner::call(
        &config(),
        &exe,
        &CallOut::get_volume_name(&Default::default()),
    )
    .unwrap_err();
    assert!(err.is_not_supported());
}

/// A driver written to a temp dir as `driver`; its `mount` is called with that dir as target
/// (`$2`), where it leaves its marker files.
fn scratch_driver(script: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("driver");
    write_exe(&path, script);
    (dir, path)
}

#[test]
fn a_cancelled_driver_and_its_helper_are_killed() {
    // The helper's pid, then the driver's: once `driver` is there, both are.
    let (dir, path) = scratch_driver(
        "#!/bin/sh\nsleep 60 &\necho $! > \"$2/helper\"\necho $$ > \"$2/driver\"\nwait\n",
    );
    let cancel = Cancel::new();
    let config = RunnerConfig {
        kill_grace: Duration::from_millis(200),
        ..RunnerConfig::default()
    }
    .cancelled_by(&cancel);
    let call = mount_call(dir.path().to_str().unwrap());
    let running = std::thread::spawn(move || runner::call(&config, &path, &call));
    let driver = read_pid(&dir.path().join("driver"));
    let helper = read_pid(&dir.path().join("helper"));
    std::thread::sleep(Duration::from_millis(200));
    cancel.cancel("fence of vol-1 lost");
    cancel.cancel("a second reason is dropped");
    let result = running.join().unwrap();
    let gone = wait_dead(driver) && wait_dead(helper);
    if !gone {
        kill(helper);
        kill(driver);
    }
    let err = result.unwrap_err();
    assert!(
        matches!(&err, CallError::Cancelled { kind: CallOutKind::Mount, why, .. } if why == "fence of vol-1 lost"),
        "{err:?}"
    );
    assert!(
        err.to_string()
            .contains("mount was stopped: fence of vol-1 lost"),
        "{err}"
    );
    assert!(
        gone,
        "driver {driver} or helper {helper} survived the cancel"
    );
}

#[test]
fn a_call_after_the_cancel_does_not_run_the_driver() {
    let (dir, path) =
        scratch_driver("#!/bin/sh\ntouch \"$2/ran\"\necho '{\"status\":\"Success\"}'\n");
    let cancel = Cancel::new();
    cancel.cancel("fence lost");
    let config = config().cancelled_by(&cancel);
    let err = runner::call(&config, &path, &mount_call(dir.path().to_str().unwrap())).unwrap_err();
    assert!(
        matches!(&err, CallError::Cancelled { why, .. } if why == "fence lost"),
        "{err:?}"
    );
    assert!(!dir.path().join("ran").exists(), "the driver ran");
}

#[test]
fn a_cancel_never_fired_changes_nothing() {
    let (dir, path) = scratch_driver(
        "#!/bin/sh\ntouch \"$2/ran\"\necho '{\"status\":\"Success\",\"message\":\"mounted\"}'\n",
    );
    let cancel = Cancel::new();
    let config = config().cancelled_by(&cancel);
    let reply = runner::call(&config, &path, &mount_call(dir.path().to_str().unwrap())).unwrap();
    assert_eq!(reply.message, "mounted");
    assert!(dir.path().join("ran").exists());
    assert_eq!(cancel.reason(), None);
}
