//! `flexd watch` through the real binary, with drivers installed, updated and removed by
//! `flexd install` / `flexd uninstall`: the discovery design's testing plan (initial install,
//! update, another driver, removal) as the operator sees it (docs/discovery.md#guarantees).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

use test_support::{flexd, install_driver, json_says, ok, Sandbox, Watch};

fn driver_source(dir: &Path, name: &str, attach: bool) -> PathBuf {
    let path = dir.join(name);
    test_support::write_exe(&path, &test_support::init_only_script(attach));
    path
}

#[test]
fn install_update_add_another_and_remove_are_each_one_line() {
    let s = Sandbox::new();
    let plugin = s.plugin();
    let src = tempfile::tempdir().unwrap();
    let v1 = driver_source(src.path(), "v1", false);
    let v2 = driver_source(src.path(), "v2", true);
    std::fs::create_dir(plugin.join("pre~existing")).unwrap();
    std::fs::copy(&v1, plugin.join("pre~existing/existing")).unwrap();

    let watch = Watch::start(&plugin, "300ms");
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
    assert!(install_driver(&plugin, "acme/drv", &v1).status.success());
    let e = watch.next();
    assert_eq!(
        (e["event"].as_str(), e["driver"].as_str()),
        (Some("add"), Some("acme/drv"))
    );
    assert_eq!(e["capabilities"]["attach"], false);
    assert!(e["path"].as_str().unwrap().ends_with("acme~drv/drv"));
    // 2. update of the same driver
    assert!(install_driver(&plugin, "acme/drv", &v2).status.success());
    let e = watch.next();
    assert_eq!(
        (e["event"].as_str(), e["capabilities"]["attach"].as_bool()),
        (Some("update"), Some(true))
    );
    // 3. another driver
    assert!(install_driver(&plugin, "other/drv", &v1).status.success());
    let e = watch.next();
    assert_eq!(
        (e["event"].as_str(), e["driver"].as_str()),
        (Some("add"), Some("other/drv"))
    );
    // 4. removal
    let state = s.state();
    let state = state.to_str().unwrap();
    assert!(flexd(
        &plugin,
        &["uninstall", "--driver", "acme/drv", "--state-dir", state]
    )
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
    let s = Sandbox::new();
    let plugin = s.path("not-yet");
    let watch = Watch::start(&plugin, "300ms");
    test_support::eventually("the plugin dir to be created", || plugin.is_dir());
    std::fs::create_dir(plugin.join("acme~bad")).unwrap();
    std::fs::write(plugin.join("acme~bad/readme.txt"), "no executable here").unwrap();
    let e = watch.next();
    assert_eq!(
        (e["event"].as_str(), e["driver"].as_str()),
        (Some("failed"), Some("acme/bad"))
    );
    assert!(json_says(&e["error"], "missing"), "{e}");
}

/// A driver, or its directory, made writable by others while flexd watches is reported failed
/// with the reason at once, and ready again once fixed (docs/discovery.md#trust).
#[test]
fn watch_reports_a_driver_anyone_could_write_as_failed_until_it_is_fixed() {
    use std::os::unix::fs::PermissionsExt;
    let s = Sandbox::new();
    let plugin = s.plugin();
    let src = tempfile::tempdir().unwrap();
    let source = driver_source(src.path(), "drv", false);
    std::fs::create_dir(plugin.join("acme~drv")).unwrap();
    std::fs::copy(&source, plugin.join("acme~drv/drv")).unwrap();
    let chmod = |path: &Path, mode: u32| {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap()
    };
    let watch = Watch::start(&plugin, "300ms");
    let event = |kind: &str| {
        let e = watch.next();
        assert_eq!(
            (e["event"].as_str(), e["driver"].as_str()),
            (Some(kind), Some("acme/drv")),
            "{e}"
        );
        e
    };
    event("add");
    for (path, why) in [
        (
            plugin.join("acme~drv/drv"),
            "acme~drv/drv: writable by others (mode 757)",
        ),
        (
            plugin.join("acme~drv"),
            "acme~drv: writable by others (mode 757)",
        ),
    ] {
        chmod(&path, 0o757);
        let e = event("failed");
        assert!(json_says(&e["error"], why), "{e}");
        assert!(json_says(&e["error"], "chown root and chmod go-w"), "{e}");
        chmod(&path, 0o755);
        event("add");
    }
    // An untrusted driver present at start is reported failed too.
    drop(watch);
    chmod(&plugin.join("acme~drv/drv"), 0o777);
    let watch = Watch::start(&plugin, "300ms");
    let e = watch.next();
    assert_eq!(e["event"], "failed", "{e}");
    assert!(
        json_says(&e["error"], "writable by group and others (mode 777)"),
        "{e}"
    );
}

/// A driver whose every volume is a tmpfs holding a file `version` with `version`'s text: a
/// mount proves which version of the driver did it.
fn versioned_driver(dir: &Path, version: &str) -> PathBuf {
    let path = dir.join(format!("story-{version}"));
    test_support::write_exe(
        &path,
        &test_support::driver_script(&format!(
            r#"init) echo '{{"status":"Success","capabilities":{{"attach":false}}}}';;
mount) mkdir -p "$2"; grep -q " $2 " /proc/self/mountinfo || mount -t tmpfs tmpfs "$2" || {{ echo '{{"status":"Failure","message":"mount failed"}}'; exit 1; }}
  echo {version} > "$2/version"; echo '{{"status":"Success"}}';;
unmount) grep -q " $2 " /proc/self/mountinfo && umount "$2"; echo '{{"status":"Success"}}';;"#
        )),
    );
    path
}

#[test]
fn the_seed_user_stories_end_to_end_with_volumes() {
    test_support::require_root!();
    let s = Sandbox::new();
    let plugin = s.plugin();
    let state = s.state();
    let src = s.path("src");
    std::fs::create_dir(&src).unwrap();
    let state_arg = state.to_str().unwrap();
    let volume = |args: &[&str]| s.volume(args);
    let mount = |driver: &str, target: &str| {
        let t = s.target(target);
        let out = volume(&["mount", "--driver", driver, "--target", t.to_str().unwrap()]);
        (out, t)
    };
    let uninstall = |driver: &str, more: &[&str]| {
        let args = [
            &["uninstall", "--driver", driver, "--state-dir", state_arg][..],
            more,
        ];
        flexd(&plugin, &args.concat())
    };
    let install = |driver: &str, source: &Path| {
        ok(&flexd(
            &plugin,
            &["install", "--driver", driver, source.to_str().unwrap()],
        ));
    };
    let watch = Watch::start(&plugin, "300ms");
    // A repeat of the event before is skipped: on a slow machine (the VM suite, emulated) the
    // watcher can see one install's steps in two probes and report its update twice, which
    // tells the user nothing wrong.
    let last = std::cell::RefCell::new((String::new(), String::new()));
    let event = |kind: &str, driver: &str| {
        let mut e = watch.next();
        while (e["event"].as_str(), e["driver"].as_str())
            == (
                Some(last.borrow().0.as_str()),
                Some(last.borrow().1.as_str()),
            )
            && (kind, driver) != (last.borrow().0.as_str(), last.borrow().1.as_str())
        {
            e = watch.next();
        }
        assert_eq!(
            (e["event"].as_str(), e["driver"].as_str()),
            (Some(kind), Some(driver)),
            "{e}"
        );
        *last.borrow_mut() = (kind.to_owned(), driver.to_owned());
    };

    // 1. Initial installation: add, then a volume mounts through it.
    install("acme/story", &versioned_driver(&src, "v1"));
    event("add", "acme/story");
    let (out, a) = mount("acme/story", "a");
    ok(&out);
    assert_eq!(std::fs::read_to_string(a.join("version")).unwrap(), "v1\n");

    // 2. Update: update, and the next mount uses the new version.
    install("acme/story", &versioned_driver(&src, "v2"));
    event("update", "acme/story");
    let (out, b) = mount("acme/story", "b");
    ok(&out);
    assert_eq!(std::fs::read_to_string(b.join("version")).unwrap(), "v2\n");

    // 3. Another driver: add; both usable.
    install("other/story", &versioned_driver(&src, "other"));
    event("add", "other/story");
    let (out, c) = mount("other/story", "c");
    ok(&out);
    assert_eq!(
        std::fs::read_to_string(c.join("version")).unwrap(),
        "other\n"
    );
    let (out, d) = mount("acme/story", "d");
    ok(&out);
    assert_eq!(std::fs::read_to_string(d.join("version")).unwrap(), "v2\n");

    // 4. Removal. While volumes use it, uninstall is refused...
    let out = uninstall("acme/story", &[]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("driver acme/story is used by 3 mounted volume(s)"),
        "{err}"
    );
    assert!(plugin.join("acme~story/story").exists());
    // ...until they are unmounted; then remove, and a mount through it fails clearly.
    for t in [&a, &b, &d] {
        ok(&volume(&["unmount", "--target", t.to_str().unwrap()]));
    }
    ok(&uninstall("acme/story", &[]));
    event("remove", "acme/story");
    let (out, e) = mount("acme/story", "e");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no plugin matched driver acme/story"), "{err}");
    assert!(!e.exists());

    // --force removes a driver in use: new mounts are refused, its volume still unmounts.
    ok(&uninstall("other/story", &["--force"]));
    event("remove", "other/story");
    let (out, _) = mount("other/story", "f");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("driver other/story was removed: new mounts through it are refused; its 1 mounted volume(s) can still be unmounted"),
        "{err}"
    );
    ok(&volume(&["unmount", "--target", c.to_str().unwrap()]));
    assert!(!flexvolume_os::mount::is_mount_point(&c).unwrap());
    let out = volume(&["--output", "json", "list"]);
    ok(&out);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "[]");
    assert_eq!(watch.terminate(), Some(0));
}
