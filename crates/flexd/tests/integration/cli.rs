//! `flexd drivers` and `flexd call` through the real binary, against real driver executables.

use std::path::Path;

use serde_json::Value;

use test_support::{
    examples, flexd, flexd_command, install_example as install, is_mounted, json_says, stdout_json,
    Sandbox,
};

#[test]
fn drivers_lists_ready_and_failed_drivers_as_json() {
    let s = Sandbox::with_examples(&[
        ("tmpfs/tmpfs", "acme~tmpfs"),
        ("attachable/attachable", "attachable"),
        ("quirks/usage-text", "acme~broken-init"),
    ]);
    let p = &s.plugin();
    // Its executable is named after the source, not the driver: missing.
    std::fs::create_dir(p.join("acme~empty")).unwrap();
    std::fs::write(p.join("stray-file"), "x").unwrap();
    // Invisible: dot-names are never probed.
    std::fs::create_dir(p.join(".staging")).unwrap();
    // usage-text answers init correctly; make a driver whose init really fails.
    install(p, "quirks/empty-output", "acme~bad");

    let out = flexd(p, &["drivers", "--output", "json"]);
    assert!(out.status.success(), "{out:?}");
    let list = stdout_json(&out);
    let list = list.as_array().unwrap();
    let names: Vec<&str> = list.iter().map(|d| d["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "acme/bad",
            "acme/broken-init",
            "acme/empty",
            "acme/tmpfs",
            "attachable",
            "stray-file"
        ]
    );
    let by_name = |n: &str| list.iter().find(|d| d["name"] == n).unwrap();

    let tmpfs = by_name("acme/tmpfs");
    assert_eq!(tmpfs["status"], "ready");
    assert_eq!(tmpfs["error"], Value::Null);
    assert_eq!(tmpfs["capabilities"]["attach"], false);
    assert_eq!(tmpfs["capabilities"]["fsGroup"], true);
    assert!(tmpfs["path"]
        .as_str()
        .unwrap()
        .ends_with("acme~tmpfs/tmpfs"));
    assert!(tmpfs["dir"].as_str().unwrap().ends_with("acme~tmpfs"));
    assert_eq!(by_name("attachable")["capabilities"]["attach"], true);
    assert_eq!(by_name("acme/broken-init")["status"], "ready");

    let bad = by_name("acme/bad");
    assert_eq!(bad["status"], "failed");
    assert_eq!(bad["capabilities"], Value::Null);
    assert!(json_says(&bad["error"], "init failed"), "{bad}");
    let empty = by_name("acme/empty");
    assert!(json_says(&empty["error"], "missing"), "{empty}");
    let stray = by_name("stray-file");
    assert!(json_says(&stray["error"], "plain file"), "{stray}");
}

#[test]
fn drivers_prints_a_table_for_humans() {
    let s = Sandbox::new();
    s.install_example("tmpfs/tmpfs", "acme~tmpfs");
    let out = s.flexd(&["drivers"]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let mut lines = text.lines();
    assert!(lines.next().unwrap().starts_with("NAME"));
    let row: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(&row[..3], ["acme/tmpfs", "ready", "no"]);
}

/// A driver someone other than root could write is listed as failed, saying why, and never
/// run; the others are still ready (docs/discovery.md#trust).
#[test]
fn drivers_lists_drivers_anyone_could_write_as_failed_with_the_reason() {
    use std::os::unix::fs::PermissionsExt;
    let s = Sandbox::with_examples(&[
        ("tmpfs/tmpfs", "acme~tmpfs"),
        ("tmpfs/tmpfs", "acme~open"),
        ("tmpfs/tmpfs", "acme~opendir"),
    ]);
    let p = &s.plugin();
    let chmod = |path: &Path, mode: u32| {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap()
    };
    chmod(&p.join("acme~open/open"), 0o777);
    chmod(&p.join("acme~opendir"), 0o777);
    let mut refused = vec![
        (
            "acme/open",
            "acme~open/open: writable by group and others (mode 777)",
        ),
        (
            "acme/opendir",
            "acme~opendir: writable by group and others (mode 777)",
        ),
    ];
    if test_support::is_root() {
        std::fs::create_dir(p.join("acme~theirs")).unwrap();
        std::fs::copy(
            test_support::driver_source("tmpfs/tmpfs"),
            p.join("acme~theirs/theirs"),
        )
        .unwrap();
        std::os::unix::fs::chown(p.join("acme~theirs/theirs"), Some(12345), None).unwrap();
        refused.push((
            "acme/theirs",
            "acme~theirs/theirs: owned by uid 12345, not root",
        ));
    }

    let out = flexd(p, &["drivers", "-o", "json"]);
    assert!(out.status.success(), "{out:?}");
    let list = stdout_json(&out);
    let list = list.as_array().unwrap();
    let by_name = |n: &str| list.iter().find(|d| d["name"] == n).unwrap();
    assert_eq!(list.len(), 1 + refused.len(), "{list:?}");
    assert_eq!(by_name("acme/tmpfs")["status"], "ready");
    for (name, why) in &refused {
        let d = by_name(name);
        assert_eq!(d["status"], "failed", "{d}");
        assert_eq!(d["capabilities"], Value::Null);
        assert!(json_says(&d["error"], why), "{d}");
        assert!(json_says(&d["error"], "chown root and chmod go-w"), "{d}");
    }

    // The table says the same.
    let out = flexd(p, &["drivers"]);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    let row = |name: &str| {
        let line = text.lines().find(|l| l.starts_with(name)).unwrap();
        line.split_whitespace().nth(1).unwrap().to_owned()
    };
    assert_eq!(row("acme/tmpfs"), "ready", "{text}");
    for (name, why) in &refused {
        assert_eq!(row(name), "failed", "{text}");
        assert!(text.contains(why), "{text}");
    }
}

#[test]
fn drivers_fails_clearly_on_a_missing_plugin_dir() {
    let out = flexd(Path::new("/nonexistent/flexd-plugins"), &["drivers"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cannot read plugin dir /nonexistent/flexd-plugins"),
        "{err}"
    );
}

#[test]
fn call_exit_status_follows_the_reply() {
    let s = Sandbox::with_examples(&[
        ("quirks/capitalised", "t~capitalised"),
        ("quirks/failure-exit0", "t~failure-exit0"),
    ]);
    let p = &s.plugin();

    let ok = flexd(p, &["--output", "json", "call", "t/capitalised", "init"]);
    assert_eq!(ok.status.code(), Some(0), "{ok:?}");
    let reply = stdout_json(&ok);
    assert_eq!(reply["status"], "Success");
    assert_eq!(reply["capabilities"]["attach"], false);

    let ns = flexd(
        p,
        &[
            "--output",
            "json",
            "call",
            "t/capitalised",
            "attach",
            "{}",
            "node-1",
        ],
    );
    assert_eq!(ns.status.code(), Some(3), "{ns:?}");
    assert_eq!(stdout_json(&ns)["status"], "Not supported");

    let fail = flexd(
        p,
        &[
            "--output",
            "json",
            "call",
            "t/failure-exit0",
            "unmount",
            "/x",
        ],
    );
    assert_eq!(fail.status.code(), Some(1), "{fail:?}");
    let reply = stdout_json(&fail);
    assert_eq!(
        (reply["status"].as_str(), reply["message"].as_str()),
        (Some("Failure"), Some("backend unreachable"))
    );
}

#[test]
fn call_times_out_with_a_clear_error() {
    let s = Sandbox::new();
    s.install_example("quirks/hang", "t~hang");
    let out = s.flexd(&[
        "call",
        "--timeout",
        "300ms",
        "t/hang",
        "unmount",
        "/dev/null",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unmount timed out after 300ms"), "{err}");
}

#[test]
fn call_refuses_hostile_names_and_bad_arguments_before_running_anything() {
    let s = Sandbox::new();
    let p = &s.plugin();
    for (name, why) in [
        ("../x", "starting with '.'"),
        ("a//b", "empty segment"),
        ("-rf", "starting with '-'"),
        ("a b", "contains ' '"),
        (&"x".repeat(300), "300 bytes long"),
    ] {
        let out = flexd(p, &["call", "--", name, "init"]);
        assert_eq!(out.status.code(), Some(1), "{name}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(why), "{name}: {err}");
    }
    let out = flexd(p, &["call", "t/x", "frobnicate"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown call-out \"frobnicate\""));
    let out = flexd(p, &["call", "t/x", "mount", "/only-one-arg"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("mount <target-dir> <json>"));
    let out = flexd(p, &["call", "--timeout", "soon", "t/x", "init"]);
    test_support::assert_fails_saying(&out, 2, &["500ms, 2s, 10m"]);
    let out = flexd(p, &["call", "t/absent", "init"]);
    test_support::assert_fails_saying(&out, 1, &["driver t/absent is not usable"]);
}

#[test]
fn call_refuses_a_symlink_escaping_the_plugin_dir_unless_allowed() {
    let s = Sandbox::new();
    let outside = tempfile::tempdir().unwrap();
    let target = outside.path().join("evil");
    std::fs::copy(test_support::driver_source("quirks/capitalised"), &target).unwrap();
    let dir = s.plugin().join("t~evil");
    std::fs::create_dir(&dir).unwrap();
    std::os::unix::fs::symlink(&target, dir.join("evil")).unwrap();

    let out = s.flexd(&["call", "t/evil", "init"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("outside the plugin dir") && err.contains("--allow-symlinks"),
        "{err}"
    );
    let out = s.flexd(&["--allow-symlinks", "call", "t/evil", "init"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
}

#[test]
fn the_example_tmpfs_driver_really_mounts_through_flexd_call() {
    test_support::require_root!();
    let s = Sandbox::new();
    s.install_example("tmpfs/tmpfs", "acme~tmpfs");
    let target = s.target("vol");
    let t = target.to_str().unwrap();

    let out = s.flexd(&["call", "acme/tmpfs", "mount", t, r#"{"size":"8m"}"#]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(is_mounted(&target));
    std::fs::write(target.join("data"), "hello").unwrap();
    // Idempotent: a second mount succeeds and keeps the data.
    let again = s.flexd(&["call", "acme/tmpfs", "mount", t, "{}"]);
    assert_eq!(again.status.code(), Some(0));
    assert_eq!(
        std::fs::read_to_string(target.join("data")).unwrap(),
        "hello"
    );
    let out = s.flexd(&["call", "acme/tmpfs", "unmount", t]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(!is_mounted(&target));
}

#[test]
fn check_passes_a_conforming_driver_and_explains_failures() {
    // The mount flow is among the required checks; as non-root flexd skips it, so fails.
    test_support::require_root!("needs root (flexd check runs the mount flow)");
    let s = Sandbox::with_examples(&[
        ("tmpfs/tmpfs", "acme~tmpfs"),
        ("quirks/usage-text", "q~usage-text"),
        ("quirks/log-lines", "q~log-lines"),
        ("quirks/empty-output", "q~empty-output"),
    ]);
    let p = &s.plugin();

    let out = flexd(p, &["--output", "json", "check", "acme/tmpfs"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let report = stdout_json(&out);
    assert_eq!(report["passed"], true);
    let checks = report["checks"].as_array().unwrap();
    assert!(checks.len() >= 4);
    // Every required check passes; the only other is isattached, skipped: tmpfs does not attach.
    assert!(
        checks
            .iter()
            .all(|c| c["verdict"] == "pass" || (c["verdict"] == "skip" && c["required"] == false)),
        "{report}"
    );
    assert_eq!(checks.iter().filter(|c| c["verdict"] == "skip").count(), 1);
    assert!(checks.iter().all(|c| c["ms"].as_f64().unwrap() >= 0.0));

    let verdict = |report: &Value, name: &str| -> String {
        test_support::check_named(report, name)["verdict"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let out = flexd(p, &["--output", "json", "check", "q/usage-text"]);
    assert_eq!(out.status.code(), Some(1));
    let report = stdout_json(&out);
    assert_eq!(verdict(&report, "unknown call-out"), "fail");
    assert_eq!(verdict(&report, "init answers"), "pass");

    let out = flexd(p, &["--output", "json", "check", "q/log-lines"]);
    let report = stdout_json(&out);
    assert_eq!(verdict(&report, "init output is strict JSON"), "warn");

    let out = flexd(p, &["check", "q/empty-output"]);
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("FAIL  init answers Success"), "{text}");
    assert!(text.contains("SKIP  unknown call-out"), "{text}");
    assert!(text.trim_end().ends_with("some required checks FAILED"));
}

/// What a driver author runs first must pass on every driver we ship, with no options: each
/// required check passes (a provisioning driver's scratch volume is one it provisioned).
#[test]
fn check_passes_with_no_options_on_every_example_driver() {
    test_support::require_root!("needs root (flexd check runs the mount flow)");
    let s = Sandbox::new();
    let p = &s.plugin();
    let mut drivers = Vec::new();
    for entry in std::fs::read_dir(examples()).unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let dir = p.join(format!("acme~{name}"));
        std::fs::create_dir_all(&dir).unwrap();
        if entry.path().join("Cargo.toml").exists() {
            let exe = test_support::compile_tiny_driver(&dir, false);
            std::fs::rename(exe, dir.join(&name)).unwrap();
        } else {
            std::fs::copy(entry.path().join(&name), dir.join(&name)).unwrap();
        }
        drivers.push(name);
    }
    drivers.sort();
    assert_eq!(drivers, ["attachable", "rust-tiny", "tmpfs"]);
    // A check's scratch dir is named after its pid: what these checks leave is told by name
    // from other tests' checks running at the same time.
    let mut scratch_names = Vec::new();
    for name in &drivers {
        let check = test_support::flexd_command(p)
            .args(["--output", "json", "check", "--driver"])
            .arg(format!("acme/{name}"))
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        scratch_names.push(format!("flexd-check-{}-", check.id()));
        let out = check.wait_with_output().unwrap();
        let report = stdout_json(&out);
        let required: Vec<&Value> = report["checks"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["required"] == true)
            .collect();
        assert!(
            required.iter().all(|c| c["verdict"] == "pass"),
            "{name}: {report:#}"
        );
        assert_eq!(report["passed"], true, "{name}");
        assert_eq!(out.status.code(), Some(0), "{name}");
    }
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    for scratch in &scratch_names {
        assert!(
            !mountinfo.contains(scratch.as_str()),
            "a check left a mount behind: {scratch}"
        );
    }
}

/// A driver that cannot mount without options (an NFS driver without its server) is not failed
/// for it when none were given: the report quotes the driver, says it needs options, and exits
/// 3; given the options, it passes.
#[test]
fn check_says_which_options_a_driver_needs_rather_than_failing_it() {
    test_support::require_root!("needs root (flexd check runs the mount flow)");
    let s = Sandbox::new();
    let p = &s.plugin();
    std::fs::create_dir_all(p.join("acme~nfsish")).unwrap();
    test_support::write_exe(
        &p.join("acme~nfsish/nfsish"),
        r#"#!/bin/sh
case "$1" in
  init) echo '{"status":"Success","capabilities":{"attach":false}}' ;;
  mount)
    case "$3" in *'"server":'*) ;; *) echo '{"status":"Failure","message":"option server is required"}'; exit 1 ;; esac
    mkdir -p "$2"; grep -q " $2 " /proc/self/mountinfo || mount -t tmpfs tmpfs "$2"
    echo '{"status":"Success"}' ;;
  unmount) grep -q " $2 " /proc/self/mountinfo && umount "$2"; echo '{"status":"Success"}' ;;
  *) echo '{"status":"Not supported"}'; exit 1 ;;
esac
"#,
    );
    let out = flexd(p, &["--output", "json", "check", "--driver", "acme/nfsish"]);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let report = stdout_json(&out);
    assert_eq!(report["passed"], false);
    assert_eq!(report["needs_options"], true);
    let mount = test_support::check_named(&report, "mount through");
    assert_eq!(mount["verdict"], "needs-options", "{report:#}");
    assert!(
        json_says(&mount["detail"], "option server is required"),
        "{mount}"
    );
    assert!(report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .all(|c| c["verdict"] != "fail"));
    let text = flexd(p, &["check", "--driver", "acme/nfsish"]);
    let text = String::from_utf8(text.stdout).unwrap();
    assert!(text.contains("NEED OPTIONS"), "{text}");

    let out = flexd(
        p,
        &[
            "check",
            "--driver",
            "acme/nfsish",
            "--options",
            r#"{"server":"nfs.example"}"#,
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{out:?}");
}

#[test]
fn check_runs_the_mount_flow_and_catches_drivers_that_are_not_idempotent() {
    test_support::require_root!();
    let s = Sandbox::new();
    let p = &s.plugin();
    install(p, "attachable/attachable", "chk~attachable");
    s.plain_driver(
        "chk~strict",
        r#"mount) grep -q " $2 " /proc/self/mountinfo && { echo '{"status":"Failure","message":"already mounted"}'; exit 1; }
  mkdir -p "$2"; mount -t tmpfs tmpfs "$2"; echo '{"status":"Success"}';;
unmount) umount "$2" || { echo '{"status":"Failure","message":"not mounted"}'; exit 1; }; echo '{"status":"Success"}';;"#,
    );
    s.plain_driver(
        "chk~stacking",
        r#"mount) mkdir -p "$2"; mount -t tmpfs tmpfs "$2"; echo '{"status":"Success"}';;
unmount) umount "$2" 2>/dev/null; echo '{"status":"Success"}';;"#,
    );
    s.plain_driver(
        "chk~liar",
        r#"mount) mkdir -p "$2"; echo '{"status":"Success"}';;
unmount) echo '{"status":"Success"}';;"#,
    );
    let check = |driver: &str| {
        let out = flexd(p, &["--output", "json", "check", driver]);
        let report = stdout_json(&out);
        let verdicts: Vec<(String, String)> = report["checks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| {
                (
                    c["name"].as_str().unwrap().to_owned(),
                    c["verdict"].as_str().unwrap().to_owned(),
                )
            })
            .collect();
        let of = |prefix: &str| {
            verdicts
                .iter()
                .find(|(n, _)| n.starts_with(prefix))
                .map(|(_, v)| v.clone())
                .unwrap_or_else(|| panic!("no check {prefix:?} in {report}"))
        };
        let got = [
            of("mount through the whole flow"),
            of("isattached answers"),
            of("mount of a mounted target"),
            of("unmount (unmountdevice, detach)"),
            of("unmount of an unmounted target"),
        ];
        (out.status.code(), got, report)
    };

    let (code, got, report) = check("chk/attachable");
    assert_eq!(
        (code, got.clone()),
        (
            Some(0),
            ["pass", "pass", "pass", "pass", "pass"].map(String::from)
        ),
        "{report}"
    );
    let detail = test_support::check_named(&report, "mount through")["detail"].clone();
    assert_eq!(detail, "mounted; device /dev/flex-attachable");

    let (code, got, report) = check("chk/strict");
    assert_eq!(code, Some(1), "{report}");
    assert_eq!(
        got,
        ["pass", "skip", "fail", "pass", "fail"].map(String::from),
        "{report}"
    );

    let (code, got, report) = check("chk/stacking");
    assert_eq!(
        code,
        Some(1),
        "stacking a mount on each repeat is not idempotent: {report}"
    );
    assert_eq!(
        got,
        ["pass", "skip", "fail", "pass", "pass"].map(String::from),
        "{report}"
    );

    let (code, got, report) = check("chk/liar");
    assert_eq!(code, Some(1), "{report}");
    assert_eq!(got[0], "fail", "{report}");
    assert_eq!(
        got[1..],
        ["skip", "skip", "skip", "skip"].map(String::from),
        "{report}"
    );

    // Nothing is left mounted by any of these checks (scratch dirs `flexd-check-<pid>-chk~…`;
    // other tests' checks may be running at this moment).
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !table
            .lines()
            .any(|l| l.contains("flexd-check-") && l.contains("-chk~")),
        "{table}"
    );
}

/// An attachable sh driver whose isattached is `isattached` (a `case` branch body).
fn install_attachable(plugin_dir: &Path, dir_name: &str, isattached: &str) {
    std::fs::create_dir_all(plugin_dir.join(dir_name)).unwrap();
    let init = test_support::init_case(r#"{"attach":true}"#);
    let script = test_support::driver_script(&format!("{init}\nisattached) {isattached};;"));
    test_support::write_exe(&test_support::executable_of(plugin_dir, dir_name), &script);
}

#[test]
fn state_dir_and_node_name_come_from_the_environment_unless_given() {
    let root = tempfile::tempdir().unwrap();
    let plugin = root.path().join("plugins");
    install(&plugin, "attachable/attachable", "acme~att");
    let env_state = root.path().join("env-state");
    let flag_state = root.path().join("flag-state");
    let target = root.path().join("not-mounted");

    // FLEXD_STATE_DIR: where unmount takes its lock.
    let out = flexd_command(&plugin)
        .env("FLEXD_STATE_DIR", &env_state)
        .args(["volume", "unmount", "--target"])
        .arg(&target)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(env_state.join("locks").is_dir(), "FLEXD_STATE_DIR not used");
    // The flag beats the environment.
    let out = flexd_command(&plugin)
        .env("FLEXD_STATE_DIR", root.path().join("unused"))
        .args(["volume", "unmount", "--state-dir"])
        .arg(&flag_state)
        .arg("--target")
        .arg(&target)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(flag_state.join("locks").is_dir());
    assert!(!root.path().join("unused").exists());

    // NODE_NAME: the node attach and isattached act for.
    let isattached = |extra: &[&str]| {
        let out = flexd_command(&plugin)
            .arg("--state-dir")
            .arg(&flag_state)
            .env("NODE_NAME", "node-from-env")
            .args(["-o", "json", "volume", "isattached"])
            .args(["--driver", "acme/att", "--volume-name", "v1"])
            .args(extra)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        stdout_json(&out)["node"].as_str().unwrap().to_owned()
    };
    assert_eq!(isattached(&[]), "node-from-env");
    assert_eq!(isattached(&["--node-name", "node-flag"]), "node-flag");
    // The first spelling, `volume --node`, still works.
    assert_eq!(isattached(&["--node", "node-old"]), "node-old");
}

#[test]
fn short_o_is_output() {
    let plugin = tempfile::tempdir().unwrap();
    install(plugin.path(), "tmpfs/tmpfs", "acme~tmpfs");
    for args in [&["-o", "json", "drivers"][..], &["drivers", "-o", "json"]] {
        let out = flexd(plugin.path(), args);
        assert!(out.status.success(), "{out:?}");
        assert_eq!(stdout_json(&out)[0]["name"], "acme/tmpfs", "{args:?}");
    }
}

#[test]
fn an_explicit_log_level_beats_rust_log() {
    let root = tempfile::tempdir().unwrap();
    let source = examples().join("tmpfs/tmpfs");
    // `install` logs "driver installed" at info.
    let install = |dir: &str, rust_log: Option<&str>, level: Option<&str>| {
        let mut command = flexd_command(&root.path().join(dir));
        if let Some(rust_log) = rust_log {
            command.env("RUST_LOG", rust_log);
        }
        if let Some(level) = level {
            command.args(["--log-level", level]);
        }
        let out = command
            .args(["install", "--driver", "acme/tmpfs"])
            .arg(&source)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stderr).contains("driver installed")
    };
    assert!(install("a", None, None), "info by default");
    assert!(
        !install("b", Some("error"), None),
        "RUST_LOG without a flag"
    );
    assert!(install("c", Some("error"), Some("debug")), "the flag wins");
    assert!(!install("d", Some("debug"), Some("error")), "the flag wins");
}

#[test]
fn isattached_tells_not_attached_from_an_error() {
    let root = tempfile::tempdir().unwrap();
    let p = root.path().join("plugins");
    install(&p, "attachable/attachable", "acme~yes");
    install_attachable(
        &p,
        "acme~no",
        r#"echo '{"status":"Success","attached":false}'"#,
    );
    install_attachable(
        &p,
        "acme~broken",
        r#"echo '{"status":"Failure","message":"backend down"}'; exit 1"#,
    );
    let isattached = |driver: &str| {
        flexd_command(&p)
            .arg("--state-dir")
            .arg(root.path().join("state"))
            .args(["--node-name", "node-1", "volume", "isattached"])
            .args(["--driver", driver, "--volume-name", "v1"])
            .output()
            .unwrap()
    };
    let yes = isattached("acme/yes");
    assert_eq!(yes.status.code(), Some(0), "{yes:?}");
    assert!(String::from_utf8_lossy(&yes.stdout).contains("v1 is attached to node-1"));
    let no = isattached("acme/no");
    assert_eq!(no.status.code(), Some(3), "{no:?}");
    assert!(String::from_utf8_lossy(&no.stdout).contains("v1 is not attached to node-1"));
    let broken = isattached("acme/broken");
    assert_eq!(broken.status.code(), Some(1), "{broken:?}");
    assert!(
        String::from_utf8_lossy(&broken.stderr).contains("backend down"),
        "{broken:?}"
    );
}

#[test]
fn an_operation_waiting_for_a_lock_says_so_on_stderr() {
    use std::io::BufRead as _;
    use std::time::{Duration, Instant};

    let root = tempfile::tempdir().unwrap();
    let state = root.path().join("state");
    let target = root.path().join("target");
    let unmount = || {
        let mut command = flexd_command(&root.path().join("plugins"));
        command
            .arg("--state-dir")
            .arg(&state)
            .args(["volume", "unmount", "--target"])
            .arg(&target);
        command
    };
    // The target's lock, held here as another flexd would hold it (lock files of volumes
    // without a record are removed when released, so one must be held, not left behind).
    std::fs::create_dir_all(&target).unwrap();
    let held = flexvolume_host::state::StateDir::new(&state)
        .lock(&target)
        .unwrap();
    let lock_file = std::fs::read_dir(state.join("locks"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .next()
        .expect("the held lock's file");

    let mut child = unmount()
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (lines_tx, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr).lines() {
            let Ok(line) = line else { return };
            if lines_tx.send(line).is_err() {
                return;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut seen = Vec::new();
    let waiting = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok(line) if line.contains("another operation holds it") => break line,
            Ok(line) => seen.push(line),
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("no lock-wait message on stderr; saw {seen:?}");
            }
        }
    };
    assert!(
        waiting.contains(&format!("waiting for {}", lock_file.display())),
        "the message names the lock file: {waiting}"
    );
    assert_eq!(
        child.try_wait().unwrap(),
        None,
        "it waits while the lock is held"
    );
    drop(held);
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("unmount did not finish once the lock was released");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status:?}");
}

#[test]
fn completions_are_generated_for_every_shell() {
    let plugin = tempfile::tempdir().unwrap();
    let out = flexd(plugin.path(), &["completions", "bash"]);
    assert!(out.status.success(), "{out:?}");
    let script = String::from_utf8(out.stdout).unwrap();
    for word in [
        "drivers",
        "call",
        "volume",
        "isattached",
        "install",
        "uninstall",
        "check",
        "serve",
        "--state-dir",
        "--node-name",
    ] {
        assert!(script.contains(word), "bash completion lacks {word}");
    }
    for shell in ["zsh", "fish", "elvish", "powershell"] {
        let out = flexd(plugin.path(), &["completions", shell]);
        assert!(out.status.success(), "{shell}: {out:?}");
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("isattached"),
            "{shell}"
        );
    }
    let out = flexd(plugin.path(), &["completions", "tcsh"]);
    assert_eq!(out.status.code(), Some(2), "an unknown shell is bad usage");
}
