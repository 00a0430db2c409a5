//! `--driver-mount-namespace`: call-outs run in another mount namespace, as drivers of a flexd
//! DaemonSet run in the host's. Real namespaces (`unshare --mount=<file>` keeps one alive on a
//! file), real mounts, the real binary.
//!
//! Each test's scratch root is a private tmpfs in the test's namespace. A namespace made from it
//! gets its own copy of that tmpfs; a tmpfs mounted there on `hostonly/` (holding the
//! "host-only tool") exists only there. Nothing mounted in either namespace under the scratch
//! root reaches the other, except below `shared/`, which propagates both ways as a DaemonSet's
//! kubelet dir does with `mountPropagation: Bidirectional`.

use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use test_support::serve::{node_client, publish_request, unpublish_request, Server};

fn run(command: &mut Command) -> Output {
    let what = format!("{command:?} failed");
    test_support::output_ok(command.stdin(Stdio::null()), what)
}

fn mount_points(mountinfo: &str) -> Vec<PathBuf> {
    mountinfo
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(PathBuf::from)
        .collect()
}

/// A scratch root with a persistent mount namespace (`ns`) made from it, a host-only tool inside
/// that namespace, and a plugin dir holding one driver. Unmounts everything on drop, failed
/// test or not.
struct Scratch {
    root: tempfile::TempDir,
    mounted_root: bool,
    ns_bound: bool,
}

const DRIVER: &str = "test~nsdrv";

impl Scratch {
    fn new() -> Self {
        let root = tempfile::tempdir().unwrap();
        let mut scratch = Self {
            root,
            mounted_root: false,
            ns_bound: false,
        };
        let root = scratch.root.path().to_owned();
        run(Command::new("mount")
            .args(["-t", "tmpfs", "flexd-ns-test"])
            .arg(&root));
        scratch.mounted_root = true;
        run(Command::new("mount").arg("--make-private").arg(&root));
        for dir in ["hostonly", "vols", "shared", "slave", "state", "exec"] {
            std::fs::create_dir(root.join(dir)).unwrap();
        }
        // `shared/` is what a DaemonSet's kubelet dir is with Bidirectional propagation: a mount
        // made below it in either namespace appears in the other. `slave/` is HostToContainer:
        // made shared now, the test's side becomes a slave once the namespace exists.
        for dir in ["shared", "slave"] {
            let dir = root.join(dir);
            run(Command::new("mount").arg("--bind").arg(&dir).arg(&dir));
            run(Command::new("mount").arg("--make-shared").arg(&dir));
        }
        std::fs::write(scratch.ns(), "").unwrap();
        // `unchanged`: the copy of `shared/` stays its peer; the rest of the scratch is private.
        run(Command::new("unshare")
            .arg(format!("--mount={}", scratch.ns().display()))
            .args(["--propagation", "unchanged", "true"]));
        scratch.ns_bound = true;
        run(Command::new("mount")
            .arg("--make-slave")
            .arg(root.join("slave")));
        // The host-only tool: on a tmpfs that exists only in the namespace.
        let tool = scratch.tool();
        run(scratch.in_ns("sh").arg("-c").arg(format!(
            "mount -t tmpfs hostonly '{dir}' && printf '#!/bin/sh\\necho host-tool-ran\\n' > \
             '{tool}' && chmod 755 '{tool}'",
            dir = root.join("hostonly").display(),
            tool = tool.display(),
        )));
        assert!(
            !tool.exists(),
            "the host-only tool leaked into the test's namespace"
        );
        scratch.install_driver();
        scratch
    }

    fn path(&self, name: &str) -> PathBuf {
        self.root.path().join(name)
    }

    fn ns(&self) -> PathBuf {
        self.path("mnt-ns")
    }

    fn tool(&self) -> PathBuf {
        self.path("hostonly/host-tool")
    }

    /// A command run inside the namespace.
    fn in_ns(&self, program: &str) -> Command {
        let mut command = Command::new("nsenter");
        command
            .arg(format!("--mount={}", self.ns().display()))
            .arg("--")
            .arg(program);
        command
    }

    /// The `case` body of a driver whose every call-out needs the host-only tool, and whose
    /// mount mounts a tmpfs.
    fn driver_cases(&self) -> String {
        format!(
            r#"init|mount|unmount)
  if [ "$('{tool}' 2>&1)" != host-tool-ran ]; then
    echo '{{"status":"Failure","message":"the host tool is missing"}}'; exit 1
  fi
  case "$1" in
  init) echo '{{"status":"Success","capabilities":{{"attach":false}}}}';;
  mount) mount -t tmpfs nsdrv-vol "$2" || {{ echo '{{"status":"Failure","message":"mount failed"}}'; exit 1; }}
    echo '{{"status":"Success"}}';;
  unmount) umount "$2" || {{ echo '{{"status":"Failure","message":"umount failed"}}'; exit 1; }}
    echo '{{"status":"Success"}}';;
  esac;;"#,
            tool = self.tool().display()
        )
    }

    fn install_driver(&self) {
        let dir = self.path("exec").join(DRIVER);
        std::fs::create_dir_all(&dir).unwrap();
        test_support::write_exe(
            &test_support::executable_of(&self.path("exec"), DRIVER),
            &test_support::driver_script(&self.driver_cases()),
        );
    }

    /// `flexd <args>` with this scratch's plugin and state dirs, and the namespace when `ns`.
    fn flexd(&self, ns: bool) -> Command {
        self.flexd_with_state(ns, &self.path("state"))
    }

    /// `flexd call test/nsdrv <callout>`, in the driver mount namespace when `ns`.
    fn call(&self, ns: bool, callout: &str) -> Command {
        let mut command = self.flexd(ns);
        command.args(["call", "test/nsdrv", callout]);
        command
    }

    fn flexd_with_state(&self, ns: bool, state_dir: &std::path::Path) -> Command {
        let mut command = test_support::clean_flexd();
        command
            .arg("--plugin-dir")
            .arg(self.path("exec"))
            .arg("--state-dir")
            .arg(state_dir);
        if ns {
            command.arg("--driver-mount-namespace").arg(self.ns());
        }
        command.stdin(Stdio::null());
        command
    }

    /// The namespace's mount table, read from a process living in it.
    fn ns_mountinfo(&self) -> String {
        let mut sleeper = self.in_ns("sleep").arg("600").spawn().unwrap();
        let want = format!("mnt:[{}]", std::fs::metadata(self.ns()).unwrap().ino());
        let link = format!("/proc/{}/ns/mnt", sleeper.id());
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::fs::read_link(&link)
            .ok()
            .map(|l| l.display().to_string())
            != Some(want.clone())
        {
            assert!(
                Instant::now() < deadline,
                "nsenter never entered the namespace"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        let table = std::fs::read_to_string(format!("/proc/{}/mountinfo", sleeper.id()));
        let _ = sleeper.kill();
        let _ = sleeper.wait();
        table.unwrap()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        // The namespace (and every mount in it) goes with its last reference, the file's bind.
        if self.ns_bound {
            let _ = Command::new("umount").arg(self.ns()).status();
        }
        if self.mounted_root {
            let _ = Command::new("umount")
                .arg("--lazy")
                .arg(self.root.path())
                .status();
        }
    }
}

#[test]
fn a_driver_finds_a_host_only_tool_only_through_the_driver_mount_namespace() {
    test_support::require_root!("needs root (mounts, namespaces)");
    let scratch = Scratch::new();
    let without = scratch.call(false, "init").output().unwrap();
    assert!(
        !without.status.success(),
        "init ran the host tool in flexd's namespace"
    );
    assert!(
        test_support::stdout_of(&without).contains("the host tool is missing")
            || test_support::stderr_of(&without).contains("the host tool is missing"),
        "{}{}",
        test_support::stdout_of(&without),
        test_support::stderr_of(&without)
    );

    let with = scratch.call(true, "init").output().unwrap();
    assert!(
        with.status.success(),
        "init through the namespace failed: {}{}",
        test_support::stdout_of(&with),
        test_support::stderr_of(&with)
    );
    // Also through the environment, as a DaemonSet sets it.
    let with_env = scratch
        .flexd(false)
        .env("FLEXD_DRIVER_MOUNT_NAMESPACE", scratch.ns())
        .args(["call", "test/nsdrv", "init"])
        .output()
        .unwrap();
    test_support::ok(&with_env);
    // Relative plugin and state dirs mean flexd's working directory, not the namespace's root.
    let relative = test_support::clean_flexd()
        .current_dir(scratch.root.path())
        .args(["--plugin-dir", "exec", "--state-dir", "state"])
        .arg("--driver-mount-namespace")
        .arg(scratch.ns())
        .args(["call", "test/nsdrv", "init"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    test_support::ok(&relative);
}

#[test]
fn a_drivers_mount_lands_in_the_driver_mount_namespace_and_not_in_flexds() {
    test_support::require_root!("needs root (mounts, namespaces)");
    let scratch = Scratch::new();
    let target = scratch.path("vols/v1");
    std::fs::create_dir(&target).unwrap();
    test_support::output_ok(scratch.call(true, "mount").arg(&target).arg("{}"), "mount");

    assert!(
        mount_points(&scratch.ns_mountinfo()).contains(&target),
        "the driver's mount is not in the driver mount namespace"
    );
    let ours = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !mount_points(&ours).contains(&target),
        "the driver's mount is in flexd's namespace"
    );

    test_support::output_ok(scratch.call(true, "unmount").arg(&target), "unmount");
    assert!(
        !mount_points(&scratch.ns_mountinfo()).contains(&target),
        "the driver's unmount did not happen in the driver mount namespace"
    );
}

#[test]
fn a_path_that_is_not_a_mount_namespace_stops_flexd_at_start() {
    test_support::require_root!("needs root (mounts, namespaces)");
    let scratch = Scratch::new();
    let plain = scratch.path("not-a-namespace");
    std::fs::write(&plain, "").unwrap();
    let cases: [(PathBuf, &str); 3] = [
        (plain, "is not a namespace file"),
        (
            PathBuf::from("/proc/self/ns/net"),
            "is a namespace, but not a mount namespace",
        ),
        (
            scratch.path("missing"),
            "cannot open the driver mount namespace",
        ),
    ];
    for (path, want) in &cases {
        let out = scratch
            .flexd(false)
            .arg("--driver-mount-namespace")
            .arg(path)
            .args(["call", "test/nsdrv", "init"])
            .output()
            .unwrap();
        assert!(!out.status.success(), "{}: call succeeded", path.display());
        assert!(
            test_support::stderr_of(&out).contains(want),
            "{}: {}",
            path.display(),
            test_support::stderr_of(&out)
        );

        // serve refuses to start: no socket, an exit instead of serving.
        let csi_dir = scratch.path("plugins");
        let mut serve = scratch
            .flexd(false)
            .arg("--driver-mount-namespace")
            .arg(path)
            .arg("serve")
            .arg("--csi-dir")
            .arg(&csi_dir)
            .arg("--registration-dir")
            .arg(scratch.path("registry"))
            .args(["--metrics-address", "127.0.0.1:0"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(status) = serve.try_wait().unwrap() {
                break status;
            }
            if Instant::now() >= deadline {
                let _ = serve.kill();
                let _ = serve.wait();
                panic!("{}: serve kept running", path.display());
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut text = String::new();
        std::io::Read::read_to_string(&mut serve.stderr.take().unwrap(), &mut text).unwrap();
        assert!(!status.success(), "{}: serve exited 0", path.display());
        assert!(text.contains(want), "{}: {text}", path.display());
        assert!(
            !csi_dir.exists(),
            "serve made its socket dir before refusing"
        );
    }
}

#[test]
fn a_plugin_dir_missing_in_the_driver_mount_namespace_is_refused_at_start() {
    test_support::require_root!("needs root (mounts, namespaces)");
    let scratch = Scratch::new();
    // Hide the plugin dir inside the namespace only: drivers could not be executed there.
    run(scratch
        .in_ns("mount")
        .args(["-t", "tmpfs", "hide"])
        .arg(scratch.path("exec")));
    let out = scratch.call(true, "init").output().unwrap();
    assert!(!out.status.success());
    assert!(
        test_support::stderr_of(&out)
            .contains("must be the same directory at the same path in both"),
        "{}",
        test_support::stderr_of(&out)
    );
}

#[test]
fn a_state_dir_whose_mounts_do_not_propagate_both_ways_is_warned_about() {
    test_support::require_root!("needs root (mounts, namespaces)");
    let scratch = Scratch::new();
    let warned = |state_dir: PathBuf| {
        std::fs::create_dir_all(&state_dir).unwrap();
        let out = scratch
            .flexd_with_state(true, &state_dir)
            .args(["call", "test/nsdrv", "init"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", test_support::stderr_of(&out));
        test_support::stderr_of(&out)
    };
    let both = warned(scratch.path("shared/state"));
    assert!(!both.contains("WARN"), "{both}");
    let slave = warned(scratch.path("slave/state"));
    assert!(
        slave.contains("mounts flexd makes itself below this directory")
            && slave.contains("Bidirectional"),
        "{slave}"
    );
    let private = warned(scratch.path("vols/state"));
    assert!(
        private.contains("mounts drivers make below this directory will not be visible to flexd"),
        "{private}"
    );
}

/// The DaemonSet's shape: `flexd serve` with the flag, volumes below a directory that propagates
/// both ways. The driver mounts in its namespace (where kubelet looks); flexd's own mount-table
/// checks, in its own namespace, see that mount through propagation: a repeated publish does not
/// mount again, and unpublish calls the driver's unmount.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_publishes_through_the_driver_mount_namespace() {
    test_support::require_root!("needs root (mounts, namespaces)");
    let scratch = Scratch::new();
    let ns: &'static str = Box::leak(scratch.ns().display().to_string().into_boxed_str());
    let env: &'static [(&str, &str)] =
        Box::leak(vec![("FLEXD_DRIVER_MOUNT_NAMESPACE", ns)].into_boxed_slice());
    let server = Server::start_with("node", env, |_| {});
    server.driver(DRIVER, &scratch.driver_cases());
    let sock = server.socket("flexvolume-test--nsdrv");
    let mut node = node_client(&sock).await;

    let target = scratch.path("shared/pods/uid-1/volumes/v");
    let publish = publish_request("vol-ns", &target, None);
    node.node_publish_volume(publish.clone()).await.unwrap();
    assert!(
        mount_points(&scratch.ns_mountinfo()).contains(&target),
        "not mounted where kubelet looks"
    );
    assert!(
        test_support::is_mounted(&target),
        "not propagated to flexd's namespace"
    );
    node.node_publish_volume(publish).await.unwrap();
    assert_eq!(server.calls_of("mount").len(), 1, "mounted twice");

    node.node_unpublish_volume(unpublish_request("vol-ns", &target))
        .await
        .unwrap();
    assert!(!mount_points(&scratch.ns_mountinfo()).contains(&target));
    assert!(!test_support::is_mounted(&target));
    assert_eq!(server.ops(), ["mount", "unmount"]);
    assert!(server.records().is_empty());
}
