//! `flexd volume` through the real binary, with real mounts (tmpfs, bind, loop devices with a
//! real ext4). Needs root; each test skips with a message otherwise. Every test cleans up its
//! mounts and loop devices in a guard, even when it fails.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::Value;

use test_support::{
    assert_device_mounted, assert_ext4_grew_or_names_cap_sys_resource, assert_fails_saying,
    assert_repeat_kept_the_mount, assert_xfs_doubled, eventually, fill_disk as fill, is_mounted,
    mount_tmpfs, mounts_below, ok, sigkill, Sandbox, ATTACHING_DRIVER as ATTACHING,
    TMPFS_DRIVER as TMPFS_MOUNT,
};

#[test]
fn a_plain_driver_mounts_once_and_unmounts_idempotently() {
    test_support::require_root!();
    let s = Sandbox::with_driver("acme~tmpfs", TMPFS_MOUNT);
    let target = mounted(&s, "acme/tmpfs", "vol", &[]);
    assert!(is_mounted(&target));
    std::fs::write(target.join("file"), "data").unwrap();
    ok(&s.volume_mount("acme/tmpfs", &target, &[]));
    assert_repeat_kept_the_mount(s.calls_of("mount").len(), &target.join("file"), "data");

    let out = s.volume(&["--output", "json", "list"]);
    ok(&out);
    let list: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(list[0]["driver"], "acme/tmpfs");
    assert_eq!(list[0]["stage"], "mounted");

    ok(&s.volume_unmount(&target));
    assert!(!target.exists(), "the target flexd created is removed");
    ok(&s.volume_unmount(&target));
    assert_eq!(s.calls_of("unmount").len(), 1);
    let out = s.volume(&["--output", "json", "list"]);
    assert_eq!(
        serde_json::from_slice::<Value>(&out.stdout).unwrap(),
        serde_json::json!([])
    );
}

#[test]
fn an_attachable_driver_runs_the_whole_flow_with_exact_arguments() {
    test_support::require_root!();
    let s = Sandbox::with_driver("acme~block", ATTACHING);
    let target = s.target("pod-vol");
    let t = target.to_str().unwrap();
    let out = s.volume(
        &[
            [
                "--output",
                "json",
                "mount",
                "--driver",
                "acme/block",
                "--target",
                t,
                "--volume-name",
                "pv-1",
                "--fs-type",
                "ext4",
                "--fs-group",
                "2000",
                "--options",
                r#"{"server":"s1"}"#,
            ]
            .as_slice(),
            &test_support::POD_MOUNT_ARGS,
        ]
        .concat(),
    );
    ok(&out);
    let outcome: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(outcome["device"], "/dev/fake-1");
    let device_dir = s.state().join("devices/acme~block/pv-1");
    assert!(is_mounted(&device_dir) && is_mounted(&target));

    let ops: Vec<String> = s.calls().iter().map(|c| c[0].clone()).collect();
    assert_eq!(
        ops,
        [
            "init",
            "getvolumename",
            "attach",
            "waitforattach",
            "mountdevice",
            "mount"
        ]
    );
    let attach = &s.calls_of("attach")[0];
    assert_eq!(attach[2], "node-1");
    let volume_json: Value = serde_json::from_str(&attach[1]).unwrap();
    assert_eq!(
        volume_json,
        serde_json::json!({"kubernetes.io/fsType":"ext4","kubernetes.io/pvOrVolumeName":"pv-1","kubernetes.io/readwrite":"rw","server":"s1"})
    );
    assert_device_mounted(&s, "/dev/fake-1", &device_dir);
    let mount = &s.calls_of("mount")[0];
    assert_eq!(mount[1], t);
    let mount_json: Value = serde_json::from_str(&mount[2]).unwrap();
    for (key, want) in [
        ("kubernetes.io/pod.name", "web-0"),
        ("kubernetes.io/pod.namespace", "prod"),
        ("kubernetes.io/pod.uid", "uid-1"),
        ("kubernetes.io/serviceAccount.name", "sa"),
        ("kubernetes.io/mounterArgs.FsGroup", "2000"),
        ("kubernetes.io/secret/password", "aHVudGVyMg=="),
        ("kubernetes.io/pvOrVolumeName", "pv-1"),
    ] {
        assert_eq!(mount_json[key], want, "{key}");
    }
    // Secrets reach mount only, never another call-out, the state or the output.
    for call in s.calls().iter().filter(|c| c[0] != "mount") {
        assert!(!call.join(" ").contains("aHVudGVyMg=="), "{call:?}");
    }
    let state_text: String = walk(&s.state())
        .iter()
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .collect();
    assert!(!state_text.contains("hunter2") && !state_text.contains("aHVudGVyMg=="));
    assert!(!String::from_utf8_lossy(&out.stdout).contains("hunter2"));

    ok(&s.volume_unmount(t));
    let ops: Vec<String> = s.calls().iter().map(|c| c[0].clone()).collect();
    assert_eq!(&ops[6..], ["init", "unmount", "unmountdevice", "detach"]);
    let detach = &s.calls_of("detach")[0];
    assert_eq!(
        (detach[1].as_str(), detach[2].as_str()),
        ("pv-1", "node-1"),
        "the PV's name, as kubelet gives detach (getvolumename's answer is ignored)"
    );
    assert!(!is_mounted(&device_dir) && !device_dir.exists() && !target.exists());
}

/// Target `name`, mounted through `driver` with `more` (the mount must succeed).
fn mounted(s: &Sandbox, driver: &str, name: &str, more: &[&str]) -> PathBuf {
    let target = s.target(name);
    ok(&s.volume_mount(driver, &target, more));
    target
}

/// Targets `a` and `b`, both mounted through `driver` with `more` (in that order).
fn mount_a_and_b(s: &Sandbox, driver: &str, more: &[&str]) -> (PathBuf, PathBuf) {
    (mounted(s, driver, "a", more), mounted(s, driver, "b", more))
}

/// `flexd volume unmount` of `target`, which must succeed and leave nothing mounted there.
fn unmounts(s: &Sandbox, target: &Path) {
    ok(&s.volume_unmount(target));
    assert!(!is_mounted(target), "{} is still mounted", target.display());
}

/// Driver acme/raw, whose attach gives a new loop device of `mb` MiB (returned). Only init and
/// attach: every other call-out falls back to Kubernetes' defaults.
fn raw_driver_attaching_a_loop_device(s: &Sandbox, mb: u64) -> String {
    let device = s.loop_device(mb);
    s.driver(
        "acme~raw",
        &format!(
            "init) echo '{{\"status\":\"Success\",\"capabilities\":{{\"attach\":true}}}}';;\nattach) echo '{{\"status\":\"Success\",\"device\":\"{device}\"}}';;"
        ),
    );
    device
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if e.file_type().unwrap().is_dir() {
                stack.push(p);
            } else {
                out.push(p);
            }
        }
    }
    out
}

#[test]
fn two_targets_share_the_device_until_the_last_unmount() {
    test_support::require_root!();
    let s = Sandbox::with_driver("acme~block", ATTACHING);
    let (a, b) = mount_a_and_b(&s, "acme/block", &["--volume-name", "shared"]);
    std::fs::write(a.join("x"), "shared").unwrap();
    assert_eq!(std::fs::read_to_string(b.join("x")).unwrap(), "shared");
    assert_eq!(
        s.calls_of("mountdevice").len(),
        1,
        "the device is mounted once"
    );
    ok(&s.volume_unmount(&a));
    assert!(s.calls_of("unmountdevice").is_empty() && s.calls_of("detach").is_empty());
    assert_eq!(std::fs::read_to_string(b.join("x")).unwrap(), "shared");
    ok(&s.volume_unmount(&b));
    assert_eq!(
        (
            s.calls_of("unmountdevice").len(),
            s.calls_of("detach").len()
        ),
        (1, 1)
    );
}

#[test]
fn defaults_make_a_real_ext4_bind_it_and_never_reformat() {
    test_support::require_root!();
    let s = Sandbox::new();
    let device = raw_driver_attaching_a_loop_device(&s, 64);
    let target = s.target("data");
    let t = target.to_str().unwrap();
    let mount = || {
        s.volume(&[
            "--output",
            "json",
            "mount",
            "--driver",
            "acme/raw",
            "--target",
            t,
            "--volume-name",
            "v",
        ])
    };
    let out = mount();
    ok(&out);
    let outcome: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(outcome["formatted"], true);
    let fs = Command::new("blkid")
        .args(["-p", "-o", "value", "-s", "TYPE", &device])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&fs.stdout).trim(), "ext4");
    std::fs::write(target.join("precious"), "keep me").unwrap();
    ok(&s.volume_unmount(t));
    assert!(!target.exists());

    let out = mount();
    ok(&out);
    let outcome: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        outcome["formatted"], false,
        "a device with a filesystem is never formatted"
    );
    assert_eq!(
        std::fs::read_to_string(target.join("precious")).unwrap(),
        "keep me"
    );
    ok(&s.volume_unmount(t));
}

#[test]
fn concurrent_mounts_of_one_target_call_the_driver_once() {
    test_support::require_root!();
    let s = Sandbox::with_driver("acme~tmpfs", TMPFS_MOUNT);
    let target = s.target("busy");
    let t = target.to_str().unwrap().to_owned();
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..32)
            .map(|_| scope.spawn(|| s.volume_mount("acme/tmpfs", &t, &[])))
            .collect();
        for h in handles {
            ok(&h.join().unwrap());
        }
    });
    assert_eq!(s.calls_of("mount").len(), 1);
    assert!(is_mounted(&target));
}

#[test]
fn different_volumes_mount_in_parallel() {
    test_support::require_root!();
    let s = Sandbox::new();
    // Each mount marks itself active, then waits (up to 20 s) until it sees another mount
    // active at the same time, and records the most it saw. If flexd serialized different
    // volumes, no mount would ever see another one.
    let active = s.path("active");
    std::fs::create_dir(&active).unwrap();
    let seen = s.path("seen");
    s.driver(
        "acme~slow",
        &format!(
            r#"init) echo '{{"status":"Success","capabilities":{{"attach":false}}}}';;
mount) touch '{a}'/$$; i=0; while [ $i -lt 200 ]; do n=$(ls '{a}' | wc -l); [ "$n" -ge 2 ] && break; sleep 0.1; i=$((i+1)); done
  echo "$(ls '{a}' | wc -l)" >> '{seen}'; mount -t tmpfs tmpfs "$2"; rm -f '{a}'/$$; echo '{{"status":"Success"}}';;
unmount) umount "$2"; echo '{{"status":"Success"}}';;"#,
            a = active.display(),
            seen = seen.display()
        ),
    );
    std::thread::scope(|scope| {
        for i in 0..32 {
            let target = s.target(&format!("v{i}"));
            let s = &s;
            scope.spawn(move || ok(&s.volume_mount("acme/slow", &target, &[])));
        }
    });
    assert!((0..32).all(|i| is_mounted(&s.target(&format!("v{i}")))));
    assert_eq!(s.calls_of("mount").len(), 32);
    let most = std::fs::read_to_string(&seen)
        .unwrap()
        .lines()
        .filter_map(|l| l.trim().parse::<u32>().ok())
        .max()
        .unwrap();
    assert!(most >= 2, "mounts of different volumes never overlapped");
    for i in 0..32 {
        ok(&s.volume_unmount(s.target(&format!("v{i}"))));
    }
}

#[test]
fn a_removed_driver_refuses_new_mounts_but_still_unmounts_and_a_replaced_one_is_used() {
    test_support::require_root!();
    let s = Sandbox::with_driver("acme~tmpfs", TMPFS_MOUNT);
    let (a, b) = mount_a_and_b(&s, "acme/tmpfs", &[]);

    // Replaced (atomically) by a version that marks its unmounts: teardown uses the new one.
    let marker = s.path("v2-used");
    s.driver(
        "acme~tmpfs",
        &TMPFS_MOUNT.replace(
            "unmount) umount",
            &format!("unmount) touch '{}'; umount", marker.display()),
        ),
    );
    unmounts(&s, &a);
    assert!(
        marker.exists(),
        "the replaced driver's new version tore the volume down"
    );

    std::fs::remove_dir_all(s.plugin().join("acme~tmpfs")).unwrap();
    assert_fails_saying(
        &s.volume_mount("acme/tmpfs", s.target("c"), &[]),
        1,
        &["driver acme/tmpfs was removed: new mounts through it are refused; its 1 mounted volume(s) can still be unmounted"],
    );
    // Unmount still works, through the copy pinned at mount time.
    unmounts(&s, &b);
}

/// A sandbox with acme/tmpfs, and `pv.yaml` in it: PV pv0001 of that driver, with options,
/// referencing Secret foo-secret (which a mount must then be given).
fn tmpfs_and_a_pv_with_a_secret_ref() -> (Sandbox, PathBuf) {
    let s = Sandbox::with_driver("acme~tmpfs", TMPFS_MOUNT);
    let pv = s.write("pv.yaml", "apiVersion: v1\nkind: PersistentVolume\nmetadata:\n  name: pv0001\nspec:\n  capacity:\n    storage: 1Gi\n  accessModes: [ReadWriteOnce]\n  flexVolume:\n    driver: acme/tmpfs\n    fsType: ext4\n    secretRef:\n      name: foo-secret\n    options:\n      fooVolumeName: bar\n");
    (s, pv)
}

#[test]
fn a_pv_yaml_with_a_secret_ref_and_hostile_yaml() {
    test_support::require_root!();
    let (s, pv) = tmpfs_and_a_pv_with_a_secret_ref();
    let target = s.target("pv");
    let t = target.to_str().unwrap();
    let out = s.volume(&["mount", "-f", pv.to_str().unwrap(), "--target", t]);
    assert_fails_saying(&out, 1, &["references secret \"foo-secret\""]);
    ok(&s.volume(&[
        "mount",
        "-f",
        pv.to_str().unwrap(),
        "--target",
        t,
        "--secret",
        "token=s3cr3t",
    ]));
    let json: Value = serde_json::from_str(&s.calls_of("mount")[0][2]).unwrap();
    assert_eq!(json["kubernetes.io/pvOrVolumeName"], "pv0001");
    assert_eq!(json["fooVolumeName"], "bar");
    assert_eq!(json["kubernetes.io/secret/token"], "czNjcjN0");
    ok(&s.volume_unmount(t));

    let cases = [
        (
            "kind: PersistentVolume\nmetadata: {name: x}\nspec: {flexVolume: {driver: ../etc}}\n",
            "flexVolume.driver",
        ),
        (
            "kind: PersistentVolume\nmetadata: {name: x}\nspec: {}\n",
            "no spec.flexVolume",
        ),
        ("name: v\nflexVolume: {}\n", "driver name is empty"),
        ("[1, 2]\n", "neither a PersistentVolume nor a pod Volume"),
        (
            "kind: PersistentVolume\nspec: {flexVolume: {driver: a/b}}\n",
            "no metadata.name",
        ),
        ("{{{not yaml", "is not YAML or JSON"),
        (
            "name: v\nflexVolume: {driver: nobody/here}\n",
            "no plugin matched driver nobody/here: it is not installed",
        ),
    ];
    for (yaml, want) in cases {
        std::fs::write(&pv, yaml).unwrap();
        let out = s.volume(&["mount", "-f", pv.to_str().unwrap(), "--target", t]);
        assert_eq!(out.status.code(), Some(1), "{yaml}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "{yaml}: {err}");
    }
    assert!(!target.exists(), "failed mounts leave no target behind");
}

#[test]
fn a_secret_never_appears_in_logs_errors_or_state_even_when_the_driver_echoes_it() {
    test_support::require_root!();
    let s = Sandbox::with_driver(
        "acme~leaky",
        "init) echo '{\"status\":\"Success\",\"capabilities\":{\"attach\":false}}';;\nmount) echo \"debug: $*\" >&2; echo \"{\\\"status\\\":\\\"Failure\\\",\\\"message\\\":\\\"bad options $(printf %s \"$3\" | tr -d '\\\"')\\\"}\"; exit 1;;",
    );
    let target = s.target("leak");
    let out = s
        .command()
        .args(["--log-level", "trace", "volume", "--state-dir"])
        .arg(s.state())
        .args([
            "mount",
            "--driver",
            "acme/leaky",
            "--target",
            target.to_str().unwrap(),
            "--secret",
            "password=Sup3rS3cret!",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let shown = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        shown.contains("bad options"),
        "the driver's message is shown: {shown}"
    );
    assert!(shown.contains("<redacted>"), "{shown}");
    let state_text: String = walk(&s.state())
        .iter()
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .collect();
    for secret in ["Sup3rS3cret!", "U3VwM3JTM2NyZXQh"] {
        assert!(!shown.contains(secret), "secret in output: {shown}");
        assert!(!state_text.contains(secret), "secret in state");
    }
}

const ATTACH_LOGGED: &str = r#"init) echo '{"status":"Success","capabilities":{"attach":true}}';;
getvolumename) echo '{"status":"Success","volumeName":"vendor/vol-7"}';;
attach) echo '{"status":"Success","device":"/dev/fake7"}';;
isattached) echo '{"status":"Success","attached":false}';;
detach) echo '{"status":"Success"}';;"#;

#[test]
fn controller_side_attach_isattached_detach_with_exact_argv_and_defaults() {
    // No mounts here, but the state dir and plugin dir are the same sandbox as the rest.
    let s = Sandbox::with_driver("acme~ctl", ATTACH_LOGGED);
    let spec = [
        "--driver",
        "acme/ctl",
        "--volume-name",
        "pv-7",
        "--fs-type",
        "xfs",
        "--options",
        r#"{"pool":"gold"}"#,
    ];
    let run = |op: &str| {
        let mut args = vec!["--output", "json", op];
        args.extend(spec);
        let out = s.volume(&args);
        let json: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        (out, json)
    };
    let (out, json) = run("attach");
    ok(&out);
    assert_eq!(json["device"], "/dev/fake7");
    assert_eq!(json["node"], "node-1");
    let (out, json) = run("isattached");
    assert_eq!(
        out.status.code(),
        Some(3),
        "not attached exits 3 (1 is an error)"
    );
    assert_eq!(json["attached"], false);
    let (out, json) = run("detach");
    ok(&out);
    assert_eq!(
        json["detach_name"], "pv-7",
        "the volume's name, as kubelet gives detach (getvolumename's answer is ignored)"
    );
    let expected_options = r#"{"kubernetes.io/fsType":"xfs","kubernetes.io/pvOrVolumeName":"pv-7","kubernetes.io/readwrite":"rw","pool":"gold"}"#;
    assert_eq!(
        s.calls_of("attach"),
        vec![vec!["attach", expected_options, "node-1"]]
    );
    assert_eq!(
        s.calls_of("isattached"),
        vec![vec!["isattached", expected_options, "node-1"]]
    );
    assert_eq!(s.calls_of("detach"), vec![vec!["detach", "pv-7", "node-1"]]);

    // A driver that supports none of them: Kubernetes' defaults.
    s.driver(
        "acme~none",
        r#"init) echo '{"status":"Success","capabilities":{"attach":true}}';;"#,
    );
    let base = ["--output", "json"];
    let none = ["--driver", "acme/none", "--volume-name", "pv/8"];
    let out = s.volume(&[&base[..], &["attach"], &none[..]].concat());
    ok(&out);
    assert_eq!(
        serde_json::from_slice::<Value>(&out.stdout).unwrap()["device"],
        ""
    );
    let out = s.volume(&[&base[..], &["isattached"], &none[..]].concat());
    ok(&out);
    assert_eq!(
        serde_json::from_slice::<Value>(&out.stdout).unwrap()["attached"],
        true
    );
    let out = s.volume(&[&base[..], &["detach"], &none[..]].concat());
    ok(&out);
    let json: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (
            json["detach_name"].as_str(),
            json["driver_detach_ran"].as_bool()
        ),
        (Some("pv/8"), Some(false))
    );
}

/// Mounts a volume of `fs_type` on a loop device through a driver that only attaches, grows
/// the device as a storage backend would, and runs `flexd volume expand`. Returns the outcome
/// and the filesystem's size before and after.
fn expand_through_the_defaults(fs_type: &str, mb: u64) -> (Output, u64, u64) {
    let s = Sandbox::new();
    let device = raw_driver_attaching_a_loop_device(&s, mb);
    let target = s.target("grow");
    let t = target.to_str().unwrap();
    let more = ["--volume-name", "g", "--fs-type", fs_type];
    ok(&s.volume_mount("acme/raw", t, &more));
    std::fs::write(target.join("keep"), "data").unwrap();
    let size = |p: &Path| {
        let st = rustix::fs::statvfs(p).unwrap();
        st.f_blocks * st.f_frsize
    };
    let before = size(&target);
    // The storage side grows the volume (what a real expandvolume does to a cloud disk):
    // the image file gets bigger and the loop device learns its new capacity.
    let image = s.path("disk0.img");
    let new_bytes = (2 * mb) << 20;
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&image)
        .unwrap();
    f.set_len(new_bytes).unwrap();
    let out = Command::new("losetup")
        .args(["-c", &device])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");

    let size_arg = format!("{}Mi", 2 * mb);
    let out = s.volume(&[
        "--output", "json", "expand", "--target", t, "--size", &size_arg,
    ]);
    let after = size(&target);
    assert_eq!(
        std::fs::read_to_string(target.join("keep")).unwrap(),
        "data"
    );
    // The call-outs got the device mount dir, the device and both sizes.
    let expandfs = &s.calls_of("expandfs")[0];
    assert_eq!(expandfs[2], device);
    assert_eq!(expandfs[4..], [new_bytes.to_string(), before.to_string()]);
    ok(&s.volume_unmount(t));

    let gone = s.volume(&["expand", "--target", t, "--size", "1Gi"]);
    assert_eq!(gone.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&gone.stderr).contains("not a volume flexd manages"));
    let bad = s.volume(&["expand", "--target", t, "--size", "lots"]);
    assert_eq!(bad.status.code(), Some(2), "clap refuses a bad size");
    (out, before, after)
}

#[test]
fn expand_grows_a_real_xfs_with_the_default_expandfs() {
    test_support::require_root!();
    if !test_support::has_mkfs_xfs() {
        test_support::skip!("mkfs.xfs is not installed (.ci/run installs xfsprogs)");
    }
    // XFS needs 300 MB at least; the image is sparse.
    let (out, before, after) = expand_through_the_defaults("xfs", 320);
    let json = assert_xfs_doubled(&out, before, after);
    assert_eq!(json["old_bytes"], before);
    assert_eq!(json["driver_expanded_fs"], false);
}

#[test]
fn expand_of_a_mounted_ext4_grows_it_or_says_which_capability_is_missing() {
    test_support::require_root!();
    let (out, before, after) = expand_through_the_defaults("ext4", 64);
    assert_ext4_grew_or_names_cap_sys_resource(&out, before, after, 48 << 20);
}

#[test]
fn a_broken_update_refuses_mounts_instead_of_using_the_old_version() {
    test_support::require_root!();
    let s = Sandbox::with_driver("acme~tmpfs", TMPFS_MOUNT);
    let a = mounted(&s, "acme/tmpfs", "a", &[]);
    // The new version's init fails.
    s.driver(
        "acme~tmpfs",
        r#"init) echo '{"status":"Failure","message":"backend unreachable"}'; exit 1;;"#,
    );
    let b = s.target("b");
    assert_fails_saying(
        &s.volume_mount("acme/tmpfs", &b, &[]),
        1,
        &["driver acme/tmpfs failed init", "backend unreachable"],
    );
    assert!(!b.exists());
    assert_eq!(s.calls_of("mount").len(), 1, "the old version was not used");
    // The volume mounted before still unmounts (the broken driver's init fails, so the copy
    // pinned at mount time does it).
    unmounts(&s, &a);
}

#[test]
fn secrets_from_a_kubernetes_secret_file() {
    test_support::require_root!();
    let (s, pv) = tmpfs_and_a_pv_with_a_secret_ref();
    // data is base64 in a Secret ("czNjcjN0" is "s3cr3t"); stringData is plain.
    let secret = s.write(
        "secret.yaml",
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: foo-secret\ndata:\n  token: czNjcjN0\nstringData:\n  user: admin\n",
    );
    let target = s.target("sec");
    let t = target.to_str().unwrap();
    let mount = |extra: &[&str]| {
        let args = [
            &["mount", "-f", pv.to_str().unwrap(), "--target", t][..],
            extra,
        ]
        .concat();
        s.volume(&args)
    };
    let out = mount(&["--secret-file", secret.to_str().unwrap()]);
    ok(&out);
    let json: Value = serde_json::from_str(&s.calls_of("mount")[0][2]).unwrap();
    assert_eq!(json["kubernetes.io/secret/token"], "czNjcjN0");
    assert_eq!(json["kubernetes.io/secret/user"], "YWRtaW4=");
    let printed = [out.stdout.as_slice(), out.stderr.as_slice()].concat();
    assert!(!String::from_utf8_lossy(&printed).contains("s3cr3t"));
    let state: Vec<u8> = walk(&s.state())
        .iter()
        .filter(|p| p.is_file())
        .flat_map(|p| std::fs::read(p).unwrap())
        .collect();
    let state = String::from_utf8_lossy(&state);
    assert!(!state.contains("s3cr3t") && !state.contains("czNjcjN0") && !state.contains("admin"));
    ok(&s.volume_unmount(t));

    let cases = [
        (
            "kind: Secret\nmetadata: {name: other}\nstringData: {a: b}\n",
            "holds secret \"other\", but the volume references secret \"foo-secret\"",
        ),
        (
            "kind: Secret\nmetadata: {name: foo-secret}\ndata: {token: 'not base64 !!hunter2'}\n",
            "is not a valid Secret (data values must be base64)",
        ),
        (
            "kind: ConfigMap\ndata: {a: b}\n",
            "is not a Kubernetes Secret",
        ),
        (
            "kind: Secret\nmetadata: {name: foo-secret}\n",
            "has no data",
        ),
    ];
    for (yaml, want) in cases {
        std::fs::write(&secret, yaml).unwrap();
        let out = mount(&["--secret-file", secret.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(1), "{yaml}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "{yaml}: {err}");
        assert!(
            !err.contains("hunter2"),
            "an error quoted a secret value: {err}"
        );
    }
    assert!(!target.exists());
}

#[test]
fn a_driver_orphaned_by_a_killed_flexd_still_holds_its_volume() {
    test_support::require_root!();
    let s = Sandbox::new();
    let started = s.path("started");
    let finished = s.path("finished");
    // The driver's mount outlives a flexd killed while waiting for it (it leads its own
    // process group, so the kill does not reach it), and like real drivers it creates the
    // target itself.
    s.driver(
        "acme~slow",
        &format!(
            r#"init) echo '{{"status":"Success","capabilities":{{"attach":false}}}}';;
mount) touch '{started}'; sleep 1; mkdir -p "$2"; mount -t tmpfs tmpfs "$2"; touch '{finished}'; echo '{{"status":"Success"}}';;
unmount) umount "$2"; echo '{{"status":"Success"}}';;"#,
            started = started.display(),
            finished = finished.display()
        ),
    );
    let target = s.target("orphan");
    let t = target.to_str().unwrap();
    let mut flexd = s
        .volume_command(&["mount", "--driver", "acme/slow", "--target", t])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    eventually("the driver's mount to start", || started.exists());
    sigkill(&mut flexd);
    // The next operation waits for the orphaned driver (it inherited the volume's lock), then
    // finds its mount through the record written ahead of the call, and undoes it.
    ok(&s.volume_unmount(t));
    eventually("the orphaned driver to finish", || finished.exists());
    assert!(!is_mounted(&target), "the orphaned driver's mount leaked");
    let out = s.volume(&["--output", "json", "list"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "[]");
}

#[test]
fn kill_9_at_random_points_of_200_operations_loses_nothing() {
    test_support::require_root!();
    let s = Sandbox::with_driver("acme~tmpfs", TMPFS_MOUNT);
    s.install_example("attachable/attachable", "acme~attachable");
    let targets: Vec<(PathBuf, &str)> = (0..6)
        .map(|i| {
            let driver = if i % 2 == 0 {
                "acme/tmpfs"
            } else {
                "acme/attachable"
            };
            (s.target(&format!("t{i}")), driver)
        })
        .collect();
    let mut seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        | 1;
    eprintln!("seed {seed}");
    let mut random = move |n: u64| {
        // xorshift64: reproducible from the printed seed.
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    let record_exists = |target: &Path| {
        let state = flexvolume_host::state::StateDir::new(s.state());
        state.load(target).map(|r| r.is_some()).unwrap_or(false)
    };
    let mut killed = 0;
    for _ in 0..200 {
        let (target, driver) = &targets[random(targets.len() as u64) as usize];
        let t = target.to_str().unwrap();
        let args: Vec<&str> = if random(2) == 0 {
            vec![
                "mount",
                "--driver",
                driver,
                "--target",
                t,
                "--volume-name",
                t.rsplit('/').next().unwrap(),
            ]
        } else {
            vec!["unmount", "--target", t]
        };
        let mut flexd = s
            .volume_command(&args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_micros(random(15_000)));
        if flexd.try_wait().unwrap().is_none() {
            killed += 1;
        }
        sigkill(&mut flexd);
        // No lost record: every mounted target has one, whatever instant the kill hit.
        for (target, _) in &targets {
            if is_mounted(target) {
                assert!(
                    record_exists(target),
                    "{} is mounted without a record",
                    target.display()
                );
            }
        }
    }
    eprintln!("{killed} of 200 operations were killed before they finished");
    assert!(killed > 0, "no kill landed inside an operation");
    // Restart: every volume is torn down by a normal run (after any orphaned driver is done).
    for (target, _) in &targets {
        ok(&s.volume_unmount(target));
    }
    let leaked = mounts_below(s.root());
    assert!(leaked.is_empty(), "leaked mounts: {leaked:?}");
    let out = s.volume(&["--output", "json", "list"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "[]");
    assert!(
        targets.iter().all(|(t, _)| !t.exists()),
        "a target flexd created was left behind"
    );
}

/// A tmpfs driver whose mount leaves files owned by root's group, as a fresh volume would be.
const TMPFS_WITH_FILES: &str = r#"mount) mkdir -p "$2"; mount -t tmpfs tmpfs "$2" || exit 1; mkdir "$2/data"; echo x > "$2/data/file"; ln -s data/file "$2/link"; chmod 600 "$2/data/file"; chmod 755 "$2" "$2/data"; echo '{"status":"Success"}';;
unmount) umount "$2"; echo '{"status":"Success"}';;"#;

fn gid_mode(path: &Path) -> (u32, u32) {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::symlink_metadata(path).unwrap();
    (meta.gid(), meta.mode() & 0o7777)
}

#[test]
fn set_up_gives_the_volume_its_fs_group_unless_the_driver_opts_out_or_it_is_read_only() {
    test_support::require_root!();
    let s = Sandbox::new();
    s.driver(
        "acme~files",
        &format!("init) echo '{{\"status\":\"Success\",\"capabilities\":{{\"attach\":false}}}}';;\n{TMPFS_WITH_FILES}"),
    );
    s.driver(
        "acme~self-owned",
        &format!("init) echo '{{\"status\":\"Success\",\"capabilities\":{{\"attach\":false,\"fsGroup\":false}}}}';;\n{TMPFS_WITH_FILES}"),
    );
    let mount = |driver: &str, target: &Path, extra: &[&str]| {
        let mut args = vec![
            "--output",
            "json",
            "mount",
            "--driver",
            driver,
            "--target",
            target.to_str().unwrap(),
            "--volume-name",
            "v",
            "--fs-group",
            "3000",
        ];
        args.extend_from_slice(extra);
        let out = s.volume(&args);
        ok(&out);
        serde_json::from_slice::<Value>(&out.stdout).unwrap()
    };

    let owned = s.target("owned");
    let outcome = mount("acme/files", &owned, &[]);
    // root, data, data/file, link
    assert_eq!(outcome["ownership"]["entries"], 4, "{outcome}");
    assert_eq!(outcome["ownership"]["chowned"], 4, "{outcome}");
    assert_eq!(gid_mode(&owned), (3000, 0o2775));
    assert_eq!(gid_mode(&owned.join("data")), (3000, 0o2775));
    assert_eq!(gid_mode(&owned.join("data/file")), (3000, 0o660));
    assert_eq!(gid_mode(&owned.join("link")).0, 3000);
    // Mounting again does nothing more: the volume is already set up.
    let again = mount("acme/files", &owned, &[]);
    assert_eq!(again["mounted_now"], false);
    assert!(again["ownership"].is_null(), "{again}");

    let opted_out = s.target("opted-out");
    let outcome = mount("acme/self-owned", &opted_out, &[]);
    assert!(outcome["ownership"].is_null(), "{outcome}");
    assert_eq!(gid_mode(&opted_out.join("data/file")), (0, 0o600));

    let read_only = s.target("read-only");
    let outcome = mount("acme/files", &read_only, &["--read-only"]);
    assert!(outcome["ownership"].is_null(), "{outcome}");
    assert_eq!(gid_mode(&read_only.join("data/file")), (0, 0o600));

    let policy = s.target("policy");
    let first = mount(
        "acme/files",
        &policy,
        &["--fs-group-policy", "on-root-mismatch"],
    );
    assert_eq!(first["ownership"]["skipped"], false, "{first}");
    assert_eq!(gid_mode(&policy.join("data/file")), (3000, 0o660));

    for t in [&owned, &opted_out, &read_only, &policy] {
        ok(&s.volume_unmount(t));
    }
}

#[test]
fn a_failed_ownership_pass_fails_set_up_and_the_next_mount_finishes_it() {
    test_support::require_root!();
    // The volume's root is immutable: nobody, root included, can change its group.
    let s = Sandbox::with_driver(
        "acme~stuck",
        r#"init) echo '{"status":"Success","capabilities":{"attach":false}}';;
mount) mkdir -p "$2"; mount -t tmpfs tmpfs "$2" || exit 1; echo x > "$2/file"; chattr +i "$2" || { echo '{"status":"Failure","message":"no chattr"}'; exit 1; }; echo '{"status":"Success"}';;
unmount) chattr -i "$2"; umount "$2"; echo '{"status":"Success"}';;"#,
    );
    let target = s.target("stuck");
    let t = target.to_str().unwrap();
    let args = ["--volume-name", "v", "--fs-group", "3000"];
    let failed = s.volume_mount("acme/stuck", t, &args);
    let stderr = String::from_utf8_lossy(&failed.stderr);
    if stderr.contains("no chattr") {
        test_support::skip!("chattr +i is not supported on tmpfs here");
    }
    assert!(!failed.status.success(), "SetUp must fail: {stderr}");
    assert!(stderr.contains("fsGroup ownership failed"), "{stderr}");
    assert!(
        is_mounted(&target),
        "the mount stays, for the retry to finish"
    );
    let listed = s.volume(&["--output", "json", "list"]);
    ok(&listed);
    assert!(String::from_utf8_lossy(&listed.stdout).contains(t));

    let _ = Command::new("chattr").arg("-i").arg(&target).status();
    let retry = s.volume_mount("acme/stuck", t, &args);
    ok(&retry);
    assert_eq!(gid_mode(&target.join("file")).0, 3000);
    // A tmpfs root is 1777: sticky kept, setgid added.
    assert_eq!(gid_mode(&target), (3000, 0o3777));
    assert_eq!(
        s.calls_of("mount").len(),
        1,
        "the retry does not mount again"
    );
    unmounts(&s, &target);
}

/// Volume records and temp files in the state dir `dir` (locks and pinned drivers are kept by
/// design).
fn state_files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = walk(&dir.join("volumes"))
        .into_iter()
        .filter_map(|p| Some(p.strip_prefix(dir).ok()?.to_string_lossy().into_owned()))
        .collect();
    names.sort();
    names
}

/// flexd's state on a full disk: a new mount is refused with a clear error before the driver
/// mounts anything, the records already there survive intact, no temp file is left, and once
/// space is back everything proceeds.
#[test]
fn a_full_state_disk_refuses_new_mounts_clearly_and_loses_nothing() {
    test_support::require_root!();
    let s = Sandbox::new();
    mount_tmpfs(&s.state(), c"size=256k");
    s.driver("acme~tmpfs", TMPFS_MOUNT);
    let (a, b) = (s.target("a"), s.target("b"));
    let (ta, tb) = (a.to_str().unwrap(), b.to_str().unwrap());
    ok(&s.volume_mount("acme/tmpfs", ta, &[]));
    let records = state_files(&s.state());
    assert!(!records.is_empty(), "the mount is recorded");
    let listed = |s: &Sandbox| -> Vec<String> {
        let out = s.volume(&["--output", "json", "list"]);
        ok(&out);
        let list: Value = serde_json::from_slice(&out.stdout).unwrap();
        let mut targets: Vec<String> = list
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v["target"].as_str().unwrap_or_default().to_owned())
            .collect();
        targets.sort();
        targets
    };
    assert_eq!(listed(&s), [ta]);

    let filler = fill(&s.state());
    let out = s.volume_mount("acme/tmpfs", tb, &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a mount without room for its record");
    assert!(err.contains("No space left on device"), "{err}");
    assert!(!is_mounted(&b), "nothing is mounted without a record");
    assert_eq!(s.calls_of("mount").len(), 1, "the driver was not asked");
    assert_eq!(
        state_files(&s.state()),
        records,
        "no temp file, no lost record"
    );
    assert_eq!(listed(&s), [ta]);

    // Unmounting on the full disk either works or fails clearly; either way state and mounts
    // agree.
    let out = s.volume_unmount(ta);
    eprintln!(
        "unmount on a full state disk succeeded: {}",
        out.status.success()
    );
    if out.status.success() {
        assert!(!is_mounted(&a));
        assert_eq!(listed(&s), Vec::<String>::new());
    } else {
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("No space left on device"), "{err}");
        assert!(is_mounted(&a));
        assert_eq!(listed(&s), [ta]);
    }

    std::fs::remove_file(filler).unwrap();
    ok(&s.volume_mount("acme/tmpfs", tb, &[]));
    assert!(is_mounted(&b));
    ok(&s.volume_unmount(ta));
    ok(&s.volume_unmount(tb));
    assert!(!is_mounted(&a) && !is_mounted(&b));
    assert_eq!(listed(&s), Vec::<String>::new());
    assert_eq!(state_files(&s.state()), Vec::<String>::new());
}

/// The pinned driver versions under the state dir (`pinned/<driver dir>/<version>`).
fn pinned_versions(state: &Path) -> Vec<PathBuf> {
    let mut versions: Vec<PathBuf> = std::fs::read_dir(state.join("pinned"))
        .into_iter()
        .flatten()
        .flatten()
        .flat_map(|d| std::fs::read_dir(d.path()).into_iter().flatten().flatten())
        .map(|v| v.path())
        .collect();
    versions.sort();
    versions
}

/// A pinned driver version stays while a volume mounted with it does, and goes with the last
/// one (once its grace period after the last pin has passed, backdated here).
#[test]
fn a_pinned_driver_version_goes_with_the_last_volume_that_used_it() {
    test_support::require_root!();
    let s = Sandbox::with_driver("acme~tmpfs", TMPFS_MOUNT);
    let (a, b) = mount_a_and_b(&s, "acme/tmpfs", &[]);
    let versions = pinned_versions(&s.state());
    assert_eq!(versions.len(), 1, "one version, pinned once: {versions:?}");
    let backdate = || {
        let hour_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
        for v in pinned_versions(&s.state()) {
            std::fs::File::open(&v)
                .unwrap()
                .set_modified(hour_ago)
                .unwrap();
        }
    };
    backdate();
    ok(&s.volume_unmount(&a));
    assert_eq!(pinned_versions(&s.state()), versions, "b still uses it");
    backdate();
    ok(&s.volume_unmount(&b));
    assert_eq!(pinned_versions(&s.state()), Vec::<PathBuf>::new());
}
