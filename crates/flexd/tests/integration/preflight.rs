//! `flexd preflight` through the real binary, on a sandbox's plugin and kubelet dirs: the
//! findings about them as text and JSON, and the exit status (1 only for an error finding).
//! The other findings (kernel, cgroups, SELinux, …) are this machine's and may be anything but
//! an error; their every verdict is unit-tested in `flexd::preflight`. With `--cluster`, an API
//! server out of reach: the cluster's findings after the node's, and no credential printed (a
//! real cluster's are the e2e's).

use std::path::{Path, PathBuf};
use std::process::Output;

use serde_json::Value;

use test_support::{flexd_command, mount_tmpfs, stderr_of, stdout_json, stdout_of, Sandbox};

/// Every check, in the order they are printed.
const CHECKS: [&str; 8] = [
    "kernel",
    "cgroups",
    "plugin-dir",
    "kubelet-dir",
    "mount-propagation",
    "selinux",
    "loop-devices",
    "tools",
];

fn preflight(plugin_dir: &Path, kubelet_dir: &Path, more: &[&str]) -> Output {
    flexd_command(plugin_dir)
        .arg("preflight")
        .arg("--kubelet-dir")
        .arg(kubelet_dir)
        .args(more)
        .output()
        .expect("flexd runs")
}

/// A kubelet dir as kubelet leaves it: with `plugins_registry/`.
fn kubelet_dir(s: &Sandbox) -> PathBuf {
    let dir = s.path("kubelet");
    std::fs::create_dir_all(dir.join("plugins_registry")).unwrap();
    dir
}

/// With `--cluster`, after [`CHECKS`].
const CLUSTER_CHECKS: [&str; 2] = ["kubernetes-version", "kube-controller-manager"];

/// The JSON report, checked for its shape: every check once, in order; advice exactly for
/// warnings and errors; the counts matching the findings.
fn report(out: &Output) -> Value {
    report_of(out, &CHECKS)
}

fn report_of(out: &Output, expected: &[&str]) -> Value {
    let report = stdout_json(out);
    let findings = report["findings"].as_array().expect("findings");
    let checks: Vec<&str> = findings
        .iter()
        .map(|f| f["check"].as_str().unwrap())
        .collect();
    assert_eq!(checks, expected, "{report:#}");
    let mut counts = (0, 0);
    for f in findings {
        let severity = f["severity"].as_str().unwrap();
        assert!(f["summary"].as_str().is_some_and(|s| !s.is_empty()), "{f}");
        match severity {
            "ok" => assert!(f["advice"].is_null(), "{f}"),
            "warning" | "error" => {
                assert!(f["advice"].as_str().is_some_and(|a| !a.is_empty()), "{f}");
                if severity == "error" {
                    counts.0 += 1;
                } else {
                    counts.1 += 1;
                }
            }
            other => panic!("severity {other:?}: {f}"),
        }
    }
    assert_eq!(
        (report["errors"].as_u64(), report["warnings"].as_u64()),
        (Some(counts.0), Some(counts.1)),
        "{report:#}"
    );
    report
}

fn finding<'a>(report: &'a Value, check: &str) -> &'a Value {
    report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["check"] == check)
        .unwrap_or_else(|| panic!("no {check} finding in {report:#}"))
}

/// The text line of a check: `SEVERITY  check  summary`, and the advice line after it, if any.
fn text_finding(text: &str, check: &str) -> (String, Option<String>) {
    let lines: Vec<&str> = text.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.split_whitespace().nth(1) == Some(check))
        .unwrap_or_else(|| panic!("no {check} line in:\n{text}"));
    let advice = lines
        .get(at + 1)
        .filter(|l| l.trim_start().starts_with("what to do: "))
        .map(|l| l.trim_start().to_owned());
    (lines[at].to_owned(), advice)
}

#[test]
fn good_dirs_pass_as_text_and_as_json() {
    let s = Sandbox::new();
    let (plugin, kubelet) = (s.plugin(), kubelet_dir(&s));

    let out = preflight(&plugin, &kubelet, &[]);
    let text = stdout_of(&out);
    // Only the plugin and kubelet dirs can make an error, and these are good.
    assert_eq!(out.status.code(), Some(0), "{text}{}", stderr_of(&out));
    for check in CHECKS {
        let (line, advice) = text_finding(&text, check);
        let severity = line.split_whitespace().next().unwrap();
        assert!(
            ["OK", "WARNING"].contains(&severity),
            "{line}\n(all:\n{text})"
        );
        assert_eq!(advice.is_some(), severity == "WARNING", "{text}");
    }
    let (line, _) = text_finding(&text, "plugin-dir");
    assert!(line.starts_with("OK "), "{line}");
    assert!(
        line.contains(&format!("{} exists and is writable", plugin.display())),
        "{line}"
    );
    let (line, _) = text_finding(&text, "kubelet-dir");
    assert!(line.starts_with("OK "), "{line}");
    assert!(line.contains("plugins_registry/"), "{line}");
    let last = text.lines().last().unwrap();
    assert!(last.starts_with("no errors, "), "{last}");

    let out = preflight(&plugin, &kubelet, &["--output", "json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let report = report(&out);
    assert_eq!(report["errors"], 0);
    assert_eq!(finding(&report, "plugin-dir")["severity"], "ok");
    assert_eq!(finding(&report, "kubelet-dir")["severity"], "ok");
    // One JSON document, on one line, as every command prints it.
    assert_eq!(stdout_of(&out).lines().count(), 1);
}

#[test]
fn a_kubelet_dir_without_plugins_registry_is_an_error() {
    let s = Sandbox::new();
    let bare = s.dir("kubelet-without-registry");
    for (kubelet, says) in [
        (bare, "has no plugins_registry/"),
        (s.path("no-kubelet"), "does not exist"),
    ] {
        let out = preflight(&s.plugin(), &kubelet, &[]);
        let text = stdout_of(&out);
        assert_eq!(out.status.code(), Some(1), "{text}{}", stderr_of(&out));
        let (line, advice) = text_finding(&text, "kubelet-dir");
        assert!(line.starts_with("ERROR "), "{line}");
        assert!(line.contains(says), "{line}");
        let advice = advice.expect("advice for an error");
        assert!(advice.contains("another --root-dir"), "{advice}");
        assert!(advice.contains("flexd manifests --kubelet-dir"), "{advice}");
        assert!(
            text.lines().last().unwrap().starts_with("1 error, "),
            "{text}"
        );

        let out = preflight(&s.plugin(), &kubelet, &["-o", "json"]);
        assert_eq!(out.status.code(), Some(1));
        let report = report(&out);
        assert_eq!(report["errors"], 1, "{report:#}");
        let f = finding(&report, "kubelet-dir");
        assert_eq!(f["severity"], "error");
        assert!(f["summary"].as_str().unwrap().contains(says), "{f}");
    }
}

#[test]
fn a_missing_plugin_dir_on_a_writable_mount_is_a_warning() {
    let s = Sandbox::new();
    let plugin = s.path("nothing-yet/exec");
    let out = preflight(&plugin, &kubelet_dir(&s), &["-o", "json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let f = finding(&report(&out), "plugin-dir").clone();
    assert_eq!(f["severity"], "warning", "{f}");
    assert!(
        f["advice"]
            .as_str()
            .unwrap()
            .contains("another --volume-plugin-dir"),
        "{f}"
    );
    assert!(!plugin.exists(), "preflight only looks");
}

/// Unmounts its mount when dropped, so a failing test leaves nothing mounted.
struct Mounted(PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        use rustix::mount::{unmount, UnmountFlags};
        if unmount(&self.0, UnmountFlags::empty()).is_err() {
            let _ = unmount(&self.0, UnmountFlags::DETACH);
        }
    }
}

/// A read-only tmpfs at `at` holding an empty directory `exec`.
fn read_only_tmpfs(at: &Path) -> Mounted {
    mount_tmpfs(at, c"size=64k");
    let mounted = Mounted(at.to_owned());
    std::fs::create_dir(at.join("exec")).unwrap();
    rustix::mount::mount_remount(at, rustix::mount::MountFlags::RDONLY, c"").unwrap();
    assert!(
        std::fs::create_dir(at.join("probe")).is_err(),
        "the tmpfs is read-only"
    );
    mounted
}

/// A plugin dir on a read-only mount, or missing below one (a read-only /usr, as on
/// CoreOS-like hosts and k3os), is an error that says how to use another dir.
#[test]
fn a_plugin_dir_on_a_read_only_mount_is_an_error() {
    test_support::require_root!("needs root to mount a read-only tmpfs");
    let s = Sandbox::new();
    let ro = s.path("ro");
    let _mounted = read_only_tmpfs(&ro);
    let kubelet = kubelet_dir(&s);
    for (plugin, says) in [
        (
            ro.join("exec"),
            format!(
                "exec is on a read-only mount (the mount at {})",
                ro.display()
            ),
        ),
        (
            ro.join("libexec/kubernetes/exec"),
            format!(
                "does not exist and cannot be created: {} is a read-only mount",
                ro.display()
            ),
        ),
    ] {
        let out = preflight(&plugin, &kubelet, &[]);
        let text = stdout_of(&out);
        assert_eq!(out.status.code(), Some(1), "{text}{}", stderr_of(&out));
        let (line, advice) = text_finding(&text, "plugin-dir");
        assert!(line.starts_with("ERROR "), "{line}");
        assert!(line.contains(&says), "{line}");
        let advice = advice.expect("advice for an error");
        for needed in [
            "writable directory",
            "--volume-plugin-dir=",
            "flexd manifests --node-plugin-dir",
        ] {
            assert!(advice.contains(needed), "no {needed:?} in {advice}");
        }

        let out = preflight(&plugin, &kubelet, &["--output", "json"]);
        assert_eq!(out.status.code(), Some(1));
        let report = report(&out);
        assert_eq!(report["errors"], 1, "{report:#}");
        assert_eq!(finding(&report, "plugin-dir")["severity"], "error");
    }
}

#[test]
fn preflight_looks_at_the_node_from_where_it_runs_only() {
    let s = Sandbox::new();
    let out = flexd_command(&s.plugin())
        .args(["--driver-mount-namespace", "/proc/1/ns/mnt", "preflight"])
        .output()
        .expect("flexd runs");
    test_support::assert_fails_saying(&out, 2, &["run it on the node itself"]);
    assert!(stdout_of(&out).is_empty());
}

/// A kubeconfig whose API server is out of reach (nothing listens on port 1), with a token that
/// must never be printed.
const FAKE_TOKEN: &str = "fake-token-PREFLIGHT-6b1f0c9e";

fn unreachable_kubeconfig(s: &Sandbox) -> PathBuf {
    let kubeconfig = s.path("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\n\
             clusters: [{{name: c, cluster: {{server: \"https://127.0.0.1:1\", \
             insecure-skip-tls-verify: true}}}}]\n\
             users: [{{name: u, user: {{token: {FAKE_TOKEN}}}}}]\n\
             contexts: [{{name: x, context: {{cluster: c, user: u}}}}]\ncurrent-context: x\n"
        ),
    )
    .unwrap();
    kubeconfig
}

#[test]
fn an_api_server_out_of_reach_is_an_error_finding_after_the_node_ones() {
    let s = Sandbox::new();
    let (plugin, kubelet) = (s.plugin(), kubelet_dir(&s));
    let kubeconfig = unreachable_kubeconfig(&s);
    let cluster = ["--cluster", "--kubeconfig", kubeconfig.to_str().unwrap()];

    let out = preflight(&plugin, &kubelet, &cluster);
    let (text, stderr) = (stdout_of(&out), stderr_of(&out));
    assert_eq!(out.status.code(), Some(1), "{text}{stderr}");
    for output in [&text, &stderr] {
        assert!(
            !output.contains(FAKE_TOKEN),
            "the token is printed:\n{output}"
        );
    }
    // The node's findings first, as without --cluster.
    for check in CHECKS.iter().chain(&CLUSTER_CHECKS) {
        text_finding(&text, check);
    }
    let (line, advice) = text_finding(&text, "kubernetes-version");
    assert!(line.starts_with("ERROR "), "{line}");
    assert!(
        line.contains("cannot ask the API server at https://127.0.0.1:1 for its version: "),
        "{line}"
    );
    assert!(line.contains("Connection refused"), "{line}");
    assert!(advice.expect("advice").contains("--kubeconfig"), "{text}");
    let (line, _) = text_finding(&text, "kube-controller-manager");
    assert!(line.starts_with("WARNING "), "{line}");
    assert!(line.contains("not checked"), "{line}");
    let last = text.lines().last().unwrap();
    assert!(
        last.starts_with("1 error, ") && last.ends_with("on this node and cluster"),
        "{last}"
    );

    let mut json = cluster.to_vec();
    json.extend(["-o", "json"]);
    let out = preflight(&plugin, &kubelet, &json);
    assert_eq!(out.status.code(), Some(1), "{}", stderr_of(&out));
    for output in [stdout_of(&out), stderr_of(&out)] {
        assert!(
            !output.contains(FAKE_TOKEN),
            "the token is printed:\n{output}"
        );
    }
    let expected: Vec<&str> = CHECKS.iter().chain(&CLUSTER_CHECKS).copied().collect();
    let report = report_of(&out, &expected);
    assert_eq!(report["errors"], 1, "{report:#}");
    let f = finding(&report, "kubernetes-version");
    assert_eq!(f["severity"], "error", "{f}");
    assert!(
        f["summary"]
            .as_str()
            .unwrap()
            .contains("Connection refused"),
        "{f}"
    );
    assert_eq!(
        finding(&report, "kube-controller-manager")["severity"],
        "warning"
    );
}

#[test]
fn the_cluster_is_asked_only_with_cluster() {
    let s = Sandbox::new();
    // --kubeconfig alone is bad usage, and nothing is checked.
    let kubeconfig = unreachable_kubeconfig(&s);
    let out = preflight(
        &s.plugin(),
        &kubelet_dir(&s),
        &["--kubeconfig", kubeconfig.to_str().unwrap()],
    );
    test_support::assert_fails_saying(&out, 2, &["--cluster"]);
    assert!(stdout_of(&out).is_empty());
    // --cluster in flexd's pod is refused as the node's checks are.
    let out = flexd_command(&s.plugin())
        .args([
            "--driver-mount-namespace",
            "/proc/1/ns/mnt",
            "preflight",
            "--cluster",
        ])
        .output()
        .expect("flexd runs");
    test_support::assert_fails_saying(&out, 2, &["run it on the node itself"]);
    assert!(stdout_of(&out).is_empty());
}
