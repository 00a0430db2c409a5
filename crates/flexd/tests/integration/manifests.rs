//! `flexd manifests` and `flexd drivers`' CSI names through the real binary, against real
//! driver executables in a real plugin dir.

use std::process::Output;

use serde_json::Value;
use test_support::{flexd, install_example as install, stdout_ok, yaml_documents};

/// A plugin dir with each (example, driver dir) installed.
fn plugin_dir(drivers: &[(&str, &str)]) -> tempfile::TempDir {
    let plugin = tempfile::tempdir().unwrap();
    for (example, dir_name) in drivers {
        install(plugin.path(), example, dir_name);
    }
    plugin
}

#[test]
fn drivers_show_the_csi_name_each_driver_is_served_under() {
    let plugin = plugin_dir(&[
        ("tmpfs/tmpfs", "acme~tmpfs"),
        ("attachable/attachable", "Big_Vendor~attachable"),
        // A valid driver name whose CSI form is not a domain name: served by no one.
        ("tmpfs/tmpfs", "a.~tmpfs"),
    ]);
    let p = plugin.path();

    let json: Value =
        serde_json::from_str(&stdout_ok(&flexd(p, &["-o", "json", "drivers"]))).unwrap();
    let csi_names: Vec<(&str, &Value)> = json
        .as_array()
        .unwrap()
        .iter()
        .map(|d| (d["name"].as_str().unwrap(), &d["csiName"]))
        .collect();
    assert_eq!(
        csi_names,
        [
            (
                "Big_Vendor/attachable",
                &Value::from("flexvolume--big-1-vendor--attachable")
            ),
            ("a./tmpfs", &Value::Null),
            ("acme/tmpfs", &Value::from("flexvolume-acme--tmpfs")),
        ]
    );

    let text = stdout_ok(&flexd(p, &["drivers"]));
    let mut lines = text.lines();
    assert!(lines.next().unwrap().contains("CSI NAME"), "{text}");
    let tmpfs = lines.find(|l| l.starts_with("acme/tmpfs")).unwrap();
    assert_eq!(
        tmpfs.split_whitespace().take(4).collect::<Vec<_>>(),
        ["acme/tmpfs", "ready", "no", "flexvolume-acme--tmpfs"],
        "{text}"
    );
}

#[test]
fn manifests_deploy_what_the_plugin_dir_holds_with_each_drivers_capabilities() {
    let plugin = plugin_dir(&[
        ("tmpfs/tmpfs", "acme~tmpfs"),
        ("attachable/attachable", "attachable"),
    ]);
    let p = plugin.path();

    let docs = yaml_documents(&stdout_ok(&flexd(
        p,
        &["manifests", "--image", "flexd:test"],
    )));
    let csi_drivers: Vec<(&str, bool)> = docs
        .iter()
        .filter(|d| d["kind"] == "CSIDriver")
        .map(|d| {
            (
                d["metadata"]["name"].as_str().unwrap(),
                d["spec"]["attachRequired"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        csi_drivers,
        [
            ("flexvolume-acme--tmpfs", false),
            ("flexvolume-attachable", true)
        ]
    );
    // Each driver has the sidecars its capabilities call for (tmpfs provisions, attachable
    // attaches, both expand), on its own socket.
    let sidecars = |docs: &[Value]| -> Vec<(String, String)> {
        let deployment = docs.iter().find(|d| d["kind"] == "Deployment").unwrap();
        deployment["spec"]["template"]["spec"]["containers"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| !c["name"].as_str().unwrap().starts_with("flexd"))
            .map(|c| {
                (
                    c["name"].as_str().unwrap().to_owned(),
                    c["args"][0].as_str().unwrap().to_owned(),
                )
            })
            .collect()
    };
    let expected = [
        ("csi-provisioner-0", "/csi/flexvolume-acme--tmpfs"),
        ("csi-resizer-0", "/csi-capabilities/flexvolume-acme--tmpfs"),
        ("csi-attacher-1", "/csi/flexvolume-attachable"),
        ("csi-resizer-1", "/csi-capabilities/flexvolume-attachable"),
    ]
    .map(|(name, dir)| (name.to_owned(), format!("--csi-address={dir}/csi.sock")));
    assert_eq!(sidecars(&docs), expected);
    let deployment = docs.iter().find(|d| d["kind"] == "Deployment").unwrap();
    assert_eq!(
        deployment["spec"]["template"]["spec"]["containers"][0]["image"],
        "flexd:test"
    );

    // Named drivers: only those.
    let docs = yaml_documents(&stdout_ok(&flexd(
        p,
        &["manifests", "--driver", "attachable"],
    )));
    assert_eq!(docs.iter().filter(|d| d["kind"] == "CSIDriver").count(), 1);
    let expected = [
        ("csi-attacher-0", "/csi/flexvolume-attachable"),
        ("csi-resizer-0", "/csi-capabilities/flexvolume-attachable"),
    ]
    .map(|(name, dir)| (name.to_owned(), format!("--csi-address={dir}/csi.sock")));
    assert_eq!(sidecars(&docs), expected);

    // A driver whose init fails is not deployed blind.
    let dir = p.join("acme~broken");
    std::fs::create_dir(&dir).unwrap();
    std::fs::copy(
        test_support::driver_source("quirks/empty-output"),
        dir.join("broken"),
    )
    .unwrap();
    let out = flexd(p, &["manifests"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("acme/broken"),
        "{stderr}"
    );
}

/// `flexd manifests` with `args` after the given drivers' capabilities (no probe needed).
fn manifests(p: &std::path::Path, args: &[&str]) -> Output {
    flexd(
        p,
        &[
            &["manifests", "--driver", r#"acme/blk={"attach":true}"#][..],
            args,
        ]
        .concat(),
    )
}

#[test]
fn values_kubernetes_would_refuse_are_bad_usage_and_print_nothing() {
    let plugin = tempfile::tempdir().unwrap();
    let p = plugin.path();
    // Once pasted into the header comment unquoted: this printed a ClusterRoleBinding of
    // cluster-admin, exit 0.
    let injection = "x\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding";
    let refused: [(&[&str], &str); 9] = [
        (&["--namespace", injection], "is not a DNS-1123 label"),
        (
            &["--namespace", &"a".repeat(64)],
            "is not a DNS-1123 label (at most 63",
        ),
        (&["--namespace", "Flexd"], "is not a DNS-1123 label"),
        (&["--namespace", "a.b"], "is not a DNS-1123 label"),
        (&["--image", "flexd:1\n---\nkind: x"], "holds '\\n'"),
        (&["--attacher-image", "a\u{1b}[2J"], "holds '\\u{1b}'"),
        (
            &["--kubelet-dir", "/var/lib/kube\rlet"],
            "control character '\\r'",
        ),
        (&["--host-dir", "/srv/../etc"], "holds '..'"),
        (&["--driver", "acme/a.={}"], "is not a valid domain name"),
    ];
    for (args, rule) in refused {
        let out = manifests(p, args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(rule), "{args:?}: {stderr}");
        assert!(out.stdout.is_empty(), "{args:?} printed something");
    }
    // The global directories are printed too.
    let out = flexd(
        p,
        &[
            "--state-dir",
            "/var/lib/flexd\n---",
            "manifests",
            "--driver",
            "acme/blk={}",
        ],
    );
    test_support::assert_fails_saying(&out, 2, &["invalid value for '--state-dir'"]);

    // What is accepted is what the header and the objects say.
    let out = manifests(p, &["--namespace", "storage-1"]);
    let text = stdout_ok(&out);
    assert!(text.contains("\n# in namespace storage-1. "), "{text}");
    let docs = yaml_documents(&text);
    assert!(docs
        .iter()
        .filter(|d| d["kind"] != "Namespace" && d["metadata"]["namespace"].is_string())
        .all(|d| d["metadata"]["namespace"] == "storage-1"));
}

#[test]
fn a_driver_named_twice_is_bad_usage_naming_it() {
    let plugin = tempfile::tempdir().unwrap();
    let p = plugin.path();
    for second in ["acme/blk", r#"acme/blk={"attach":false}"#] {
        let out = manifests(p, &["--driver", "acme/other={}", "--driver", second]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{second}: {stderr}");
        assert!(
            stderr.contains("driver acme/blk is given more than once with --driver"),
            "{stderr}"
        );
        assert!(out.stdout.is_empty());
    }
}

/// One line of `deploy/checkov-accepted.txt`: a check accepted on some objects, and why.
struct Accepted {
    check: String,
    /// Object names (metadata.name); `None`: any object (`*`).
    objects: Option<Vec<String>>,
    reason: String,
    /// `# expected to go: <why>`: accepted until the manifests' hardening fixes it.
    expected_to_go: bool,
}

impl Accepted {
    fn covers(&self, check: &str, object: &str) -> bool {
        self.check == check
            && self
                .objects
                .as_ref()
                .is_none_or(|names| names.iter().any(|n| n == object))
    }
}

const ACCEPTED_LIST: &str = "deploy/checkov-accepted.txt";

fn accepted_list() -> Vec<Accepted> {
    let text = std::fs::read_to_string(test_support::repo_path(ACCEPTED_LIST)).unwrap();
    let mut list = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (entry, comment) = match line.find(" #") {
            Some(at) => (&line[..at], Some(line[at + 2..].trim())),
            None => (line, None),
        };
        let words: Vec<&str> = entry.split_whitespace().collect();
        let (check, objects) = (words[0], words.get(1).copied().unwrap_or(""));
        let reason = words.get(2..).unwrap_or_default().join(" ");
        let at = format!("{ACCEPTED_LIST}:{}", number + 1);
        assert!(
            check.starts_with("CKV") && !objects.is_empty() && !reason.is_empty(),
            "{at}: not `CHECK_ID OBJECTS REASON`: {line}"
        );
        list.push(Accepted {
            check: check.to_owned(),
            objects: (objects != "*").then(|| objects.split(',').map(str::to_owned).collect()),
            reason,
            expected_to_go: comment.is_some_and(|c| c.starts_with("expected to go:")),
        });
    }
    list
}

/// The name checkov gives an object's findings by: its resource is `Kind.namespace.name`
/// (`default` for cluster-scoped objects), a graph check's Pod one `Pod.namespace.name.labels…`.
fn object_name(resource: &str) -> &str {
    resource.split('.').nth(2).unwrap_or(resource)
}

/// checkov's JSON report: one object per framework, a list of them for several, and only a
/// summary (no `results`) when it found nothing to check.
fn checkov_reports(json: &Value) -> Vec<&Value> {
    match json {
        Value::Array(reports) => reports.iter().collect(),
        report => vec![report],
    }
}

/// checkov (the linter, from PyPI) over `flexd manifests` for every driver shape: every finding
/// is one `deploy/checkov-accepted.txt` accepts with a reason, and every line there is still
/// needed by some shape's findings, so the list shrinks as the manifests improve.
#[test]
fn checkov_finds_nothing_unaccepted_in_any_driver_shape() {
    if std::env::var_os("FLEXD_IN_VM").is_some() {
        // It reads YAML, not the kernel; Python under the VM's emulated CPU took minutes.
        test_support::skip!("checkov runs on the host (.ci/run's cargo test), not in the VM suite");
    }
    match std::process::Command::new("checkov")
        .arg("--version")
        .output()
    {
        Ok(out) if out.status.success() => {}
        _ => test_support::skip!(
            "checkov not installed (python3 -m pip install checkov==3.3.30, as .ci/run does)"
        ),
    }
    let accepted = accepted_list();
    let plugin = tempfile::tempdir().unwrap();
    // Not tempfile's default `.tmpXXXX`: checkov skips hidden directories, and found nothing.
    let dir = tempfile::Builder::new()
        .prefix("flexd-manifests-")
        .tempdir()
        .unwrap();
    // Every image pinned by digest, as a production operator deploys them: the flexd image is
    // their own build (deploy/Dockerfile), the sidecars' the tested versions from their mirror.
    let digest = format!("@sha256:{}", "0".repeat(64));
    let image = format!("registry.example/flexd{digest}");
    let sidecars = [
        ("--attacher-image", "csi-attacher"),
        ("--provisioner-image", "csi-provisioner"),
        ("--resizer-image", "csi-resizer"),
    ]
    .map(|(flag, name)| (flag, format!("registry.example/sig-storage/{name}{digest}")));
    // (shape, file, driver argument)
    let mut shapes: Vec<(String, String, String)> = Vec::new();
    for attach in [false, true] {
        for provision in [false, true] {
            for resize in [false, true] {
                shapes.push((
                    format!("attach={attach} provision={provision} requiresFSResize={resize}"),
                    format!("attach-{attach}.provision-{provision}.resize-{resize}.yaml"),
                    format!(
                        r#"acme/x={{"attach":{attach},"provision":{provision},"requiresFSResize":{resize}}}"#
                    ),
                ));
            }
        }
    }
    shapes.push((
        "builtin loop driver".to_owned(),
        "loop.yaml".to_owned(),
        "flexd/loop".to_owned(),
    ));
    // The operator's choice of a privileged controller, for a driver whose attach sets up
    // devices (no shape above has one: not even the loop driver's attach does).
    let privileged = (
        "attach=true, --privileged-controller".to_owned(),
        "attach-privileged.yaml".to_owned(),
        r#"acme/x={"attach":true}"#.to_owned(),
    );
    shapes.push(privileged.clone());
    // The upgrade from a controller on a state claim: the records' objects and the import Job.
    let import = (
        "--import-state-claim (the upgrade's Job)".to_owned(),
        "import-state-claim.yaml".to_owned(),
        String::new(),
    );
    shapes.push(import.clone());
    // The identity of `flexd migrate --apply`, with the bare Pods' grant: RBAC only.
    let migrator = (
        "--migrator (the migration's identity)".to_owned(),
        "migrator.yaml".to_owned(),
        String::new(),
    );
    shapes.push(migrator.clone());
    for (_, file, driver) in &shapes {
        let mut args = vec!["manifests", "--image", &image];
        if *file == import.1 {
            args.extend(["--import-state-claim", "flexd-controller-state"]);
        } else if *file == migrator.1 {
            args.extend(["--migrator", "--recreate-pods"]);
        } else {
            args.extend(["--driver", driver]);
        }
        if *file == privileged.1 {
            args.extend(["--privileged-controller", "acme/x"]);
        }
        for (flag, image) in &sidecars {
            args.extend([*flag, image.as_str()]);
        }
        let yaml = stdout_ok(&flexd(plugin.path(), &args));
        std::fs::write(dir.path().join(file), yaml).unwrap();
    }

    // One run over all the files: checkov takes seconds to start. --soft-fail: exit status 0
    // with findings, so any other status is checkov failing. --compact: no code blocks (MBs).
    // --skip-download: no call to Prisma Cloud for guidelines (CI may have no such network).
    let out = std::process::Command::new("checkov")
        .arg("-d")
        .arg(dir.path())
        .args(["--framework", "kubernetes", "-o", "json", "--compact"])
        .args(["--soft-fail", "--skip-download"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "checkov failed ({}): {}\n{stdout}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let json: Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("checkov's output is not JSON ({e}): {stdout}"));

    // Per file: (passed, failed: (check, name, resource)).
    type Findings = (usize, Vec<(String, String, String)>);
    let mut by_file: std::collections::BTreeMap<String, Findings> = Default::default();
    for report in checkov_reports(&json) {
        let Some(results) = report.get("results") else {
            continue; // a summary only: nothing checked
        };
        let errors = &results["parsing_errors"];
        assert!(
            errors.as_array().is_none_or(Vec::is_empty),
            "checkov could not parse: {errors}"
        );
        for (key, failed) in [("passed_checks", false), ("failed_checks", true)] {
            for check in results[key].as_array().into_iter().flatten() {
                let path = check["file_path"].as_str().unwrap();
                let file = path.rsplit('/').next().unwrap().to_owned();
                let entry = by_file.entry(file).or_default();
                if failed {
                    entry.1.push(
                        ["check_id", "check_name", "resource"]
                            .map(|k| check[k].as_str().unwrap().to_owned())
                            .into(),
                    );
                } else {
                    entry.0 += 1;
                }
            }
        }
    }

    let mut unaccepted = Vec::new();
    let mut used = vec![Vec::<&str>::new(); accepted.len()];
    let version = checkov_reports(&json)
        .iter()
        .find_map(|r| r["summary"]["checkov_version"].as_str())
        .unwrap_or("?");
    let mut summary = format!("checkov {version} over flexd manifests, per driver shape:\n");
    for (shape, file, _) in &shapes {
        let Some((passed, failed)) = by_file.get(file) else {
            panic!("checkov reported nothing on {file} ({shape}): {stdout}");
        };
        let (mut covered, mut to_go) = (0, 0);
        for (check, name, resource) in failed {
            let object = object_name(resource);
            let lines: Vec<usize> = (0..accepted.len())
                .filter(|&i| accepted[i].covers(check, object))
                .collect();
            if lines.is_empty() {
                unaccepted.push(format!(
                    "{check} ({name}) fails on {resource} in shape {shape}"
                ));
                continue;
            }
            covered += 1;
            if lines.iter().any(|&i| accepted[i].expected_to_go) {
                to_go += 1;
            }
            for i in lines {
                used[i].push(object);
            }
        }
        summary.push_str(&format!(
            "  {shape}: {passed} passed, {} failed, {covered} accepted ({to_go} expected to go)\n",
            failed.len()
        ));
    }
    let _ = std::io::Write::write_all(&mut std::io::stderr().lock(), summary.as_bytes());
    assert!(
        unaccepted.is_empty(),
        "checkov findings not accepted in {ACCEPTED_LIST} (fix the manifests, or add the check \
         with its objects and a reason):\n  {}",
        unaccepted.join("\n  ")
    );
    // Every line, and every object it names, must still be needed.
    let mut stale = Vec::new();
    for (entry, used) in accepted.iter().zip(&used) {
        match &entry.objects {
            None if used.is_empty() => stale.push(format!("{} * ({})", entry.check, entry.reason)),
            None => {}
            Some(names) => {
                for name in names.iter().filter(|n| !used.contains(&n.as_str())) {
                    stale.push(format!("{} on {name} ({})", entry.check, entry.reason));
                }
            }
        }
    }
    assert!(
        stale.is_empty(),
        "accepted in {ACCEPTED_LIST} but checkov no longer finds them in any driver shape: \
         delete them there:\n  {}",
        stale.join("\n  ")
    );
}
