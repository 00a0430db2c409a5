//! The manifests in deploy/ are valid Kubernetes objects: each document parses into its typed
//! k8s-openapi object, and nothing in it is silently dropped by that parse (a misspelt field
//! such as `mountPropogation` would be), and the pieces fit together. `deploy/flexd.yaml` is
//! exactly what `flexd manifests --driver flexd/loop` prints, and flexd accepts its pods'
//! arguments.

use std::path::PathBuf;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{
    Container, Namespace, PodSpec, PodTemplateSpec, Secret, ServiceAccount, Volume, VolumeMount,
};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::api::storage::v1::CSIDriver;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

fn deploy_dir() -> PathBuf {
    test_support::repo_path("deploy")
}

fn documents(file: &str) -> Vec<Value> {
    test_support::yaml_documents(&std::fs::read_to_string(deploy_dir().join(file)).unwrap())
}

/// Every key of `original` must survive the typed round trip (null and empty values aside).
fn assert_nothing_dropped(original: &Value, round_trip: &Value, path: &str) {
    match (original, round_trip) {
        (Value::Object(a), Value::Object(b)) => {
            for (key, value) in a {
                let here = format!("{path}.{key}");
                match b.get(key) {
                    Some(other) => assert_nothing_dropped(value, other, &here),
                    None => panic!("{here} is not a field of the typed object (misspelt?)"),
                }
            }
        }
        (Value::Array(a), Value::Array(b)) => {
            assert_eq!(a.len(), b.len(), "{path}");
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                assert_nothing_dropped(x, y, &format!("{path}[{i}]"));
            }
        }
        // Quantities and int-or-strings may be normalised; scalars are compared loosely.
        (a, b) => assert!(
            a == b || a.to_string().trim_matches('"') == b.to_string().trim_matches('"'),
            "{path}: {a} became {b}"
        ),
    }
}

fn typed<T: DeserializeOwned + Serialize>(doc: &Value) -> T {
    let object: T = serde_json::from_value(doc.clone())
        .unwrap_or_else(|e| panic!("invalid {}: {e}", doc["kind"]));
    let back = serde_json::to_value(&object).unwrap();
    assert_nothing_dropped(doc, &back, doc["kind"].as_str().unwrap_or("?"));
    object
}

/// The selector selects the pod template, every mount is of a declared volume, and every
/// probe's named port is declared.
fn check_pod(selector: &LabelSelector, template: &PodTemplateSpec) {
    let selector = selector.match_labels.as_ref().unwrap();
    let labels = template.metadata.as_ref().unwrap().labels.as_ref().unwrap();
    for (k, v) in selector {
        assert_eq!(
            labels.get(k),
            Some(v),
            "selector {k} does not match the pod template"
        );
    }
    let pod = template.spec.as_ref().unwrap();
    for container in &pod.containers {
        for mount in container.volume_mounts.iter().flatten() {
            assert!(
                pod.volumes.iter().flatten().any(|v| v.name == mount.name),
                "mount of undeclared volume {}",
                mount.name
            );
        }
        let ports: Vec<&str> = container
            .ports
            .iter()
            .flatten()
            .filter_map(|p| p.name.as_deref())
            .collect();
        for probe in [&container.liveness_probe, &container.readiness_probe]
            .into_iter()
            .flatten()
        {
            let port = &probe.http_get.as_ref().unwrap().port;
            if let k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String(name) = port {
                assert!(
                    ports.contains(&name.as_str()),
                    "probe of undeclared port {name}"
                );
            }
        }
    }
}

fn check_daemonset(ds: &DaemonSet) {
    let spec = ds.spec.as_ref().unwrap();
    check_pod(&spec.selector, &spec.template);
}

fn check_deployment(deployment: &Deployment) {
    let spec = deployment.spec.as_ref().unwrap();
    check_pod(&spec.selector, &spec.template);
}

#[test]
fn every_manifest_is_a_valid_typed_object() {
    let mut kinds = Vec::new();
    for entry in std::fs::read_dir(deploy_dir()).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("yaml") {
            continue;
        }
        let file = path.file_name().unwrap().to_str().unwrap().to_owned();
        for doc in documents(&file) {
            let kind = format!(
                "{}/{}",
                doc["apiVersion"].as_str().unwrap(),
                doc["kind"].as_str().unwrap()
            );
            match kind.as_str() {
                "apps/v1/DaemonSet" => check_daemonset(&typed::<DaemonSet>(&doc)),
                "apps/v1/Deployment" => check_deployment(&typed::<Deployment>(&doc)),
                "v1/Namespace" => drop(typed::<Namespace>(&doc)),
                "v1/ServiceAccount" => drop(typed::<ServiceAccount>(&doc)),
                "v1/Secret" => drop(typed::<Secret>(&doc)),
                "policy/v1/PodDisruptionBudget" => drop(typed::<PodDisruptionBudget>(&doc)),
                "apiextensions.k8s.io/v1/CustomResourceDefinition" => {
                    drop(typed::<CustomResourceDefinition>(&doc))
                }
                "rbac.authorization.k8s.io/v1/ClusterRole" => drop(typed::<ClusterRole>(&doc)),
                "rbac.authorization.k8s.io/v1/ClusterRoleBinding" => {
                    drop(typed::<ClusterRoleBinding>(&doc))
                }
                "rbac.authorization.k8s.io/v1/Role" => drop(typed::<Role>(&doc)),
                "rbac.authorization.k8s.io/v1/RoleBinding" => drop(typed::<RoleBinding>(&doc)),
                "storage.k8s.io/v1/CSIDriver" => drop(typed::<CSIDriver>(&doc)),
                other => panic!("{file}: unexpected kind {other}"),
            }
            kinds.push(kind);
        }
    }
    assert!(
        kinds.iter().filter(|k| k.ends_with("DaemonSet")).count() >= 2,
        "{kinds:?}"
    );
}

#[test]
fn the_installer_daemonset_mounts_the_host_plugin_dir_at_flexmnt() {
    let docs = documents("installer-daemonset.yaml");
    let ds: DaemonSet = typed(&docs[0]);
    let pod = ds.spec.unwrap().template.spec.unwrap();
    let mount = mount_where(&pod.containers[0], |m| m.mount_path == "/flexmnt");
    let volume = volume_where(&pod, |v| v.name == mount.name);
    assert_eq!(
        volume.host_path.as_ref().unwrap().path,
        "/usr/libexec/kubernetes/kubelet-plugins/volume/exec"
    );
    // Finding 6: it added capabilities it does not need and mounted a token. Root's uid writes
    // the root-owned plugin dir without any capability (tests/integration/install.rs shows it).
    assert_eq!(pod.automount_service_account_token, Some(false));
    let security = pod.containers[0].security_context.as_ref().unwrap();
    let capabilities = security.capabilities.as_ref().unwrap();
    assert_eq!(capabilities.drop.as_deref(), Some(&["ALL".to_owned()][..]));
    assert_eq!(capabilities.add, None);
    assert_eq!(security.allow_privilege_escalation, Some(false));
    assert_eq!(
        pod.security_context
            .as_ref()
            .and_then(|c| c.seccomp_profile.as_ref())
            .map(|p| p.type_.as_str()),
        Some("RuntimeDefault")
    );
    // The image's entry point installs into /flexmnt and sleeps.
    let dockerfile = std::fs::read_to_string(deploy_dir().join("Dockerfile")).unwrap();
    assert!(
        dockerfile.contains("--plugin-dir /flexmnt install") && dockerfile.contains("--then-sleep")
    );
}

/// `flexd manifests` with the given arguments, with no environment that would change it.
fn manifests(args: &[&str]) -> std::process::Output {
    test_support::clean_flexd()
        .arg("manifests")
        .args(args)
        .output()
        .unwrap()
}

/// What `flexd manifests` with the arguments prints; it must succeed.
fn manifests_ok(args: &[&str]) -> String {
    let out = manifests(args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn the_committed_manifests_are_what_flexd_manifests_prints() {
    let printed = manifests_ok(&["--driver", "flexd/loop"]);
    let committed = std::fs::read_to_string(deploy_dir().join("flexd.yaml")).unwrap();
    assert!(
        printed == committed,
        "deploy/flexd.yaml is stale: regenerate it with\n  flexd manifests --driver flexd/loop > deploy/flexd.yaml"
    );
}

fn one<T: DeserializeOwned + Serialize>(docs: &[Value], kind: &str) -> T {
    let found: Vec<&Value> = docs.iter().filter(|d| d["kind"] == kind).collect();
    assert_eq!(found.len(), 1, "one {kind}");
    typed(found[0])
}

fn flexd_container(template: &PodTemplateSpec) -> Container {
    let pod = template.spec.as_ref().unwrap();
    pod.containers
        .iter()
        .find(|c| c.name == "flexd")
        .unwrap()
        .clone()
}

/// The pod's volume `pick` chooses; there must be one.
fn volume_where(pod: &PodSpec, pick: impl Fn(&Volume) -> bool) -> &Volume {
    pod.volumes.iter().flatten().find(|v| pick(v)).unwrap()
}

/// The container's volume mount `pick` chooses; there must be one.
fn mount_where(container: &Container, pick: impl Fn(&VolumeMount) -> bool) -> &VolumeMount {
    container
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| pick(m))
        .unwrap()
}

/// `--help` after the real arguments: clap validates everything before it, then prints help.
fn assert_flexd_accepts(args: &[String]) {
    test_support::output_ok(
        std::process::Command::new(test_support::flexd_exe())
            .args(args)
            .arg("--help"),
        format!("flexd refused the arguments {args:?}"),
    );
}

fn value_of<'a>(args: &'a [String], flag: &str) -> &'a str {
    args.iter()
        .find_map(|a| a.strip_prefix(&format!("{flag}=")))
        .unwrap_or_else(|| panic!("no {flag} in {args:?}"))
}

#[test]
fn the_flexd_pods_arguments_are_accepted_by_flexd() {
    let docs = documents("flexd.yaml");
    let ds: DaemonSet = one(&docs, "DaemonSet");
    let template = &ds.spec.as_ref().unwrap().template;
    let pod = template.spec.as_ref().unwrap();
    assert_eq!(
        pod.host_pid,
        Some(true),
        "flexd must not be pid 1 (orphaned driver helpers need a reaper), and /proc/1 must be the host's init"
    );
    assert_eq!(
        pod.host_network,
        Some(true),
        "drivers must run in the host's network namespace, as kubelet ran them"
    );
    assert_ne!(
        pod.share_process_namespace,
        Some(true),
        "refused with hostPID"
    );
    let node = flexd_container(template);
    let args = node.args.clone().unwrap();
    assert_flexd_accepts(&args);
    assert_eq!(
        value_of(&args, "--driver-mount-namespace"),
        "/proc/1/ns/mnt",
        "drivers must run in the host's mount namespace"
    );
    assert!(args.contains(&"--mode=node".to_owned()));
    let mounts: Vec<(String, Option<String>)> = node
        .volume_mounts
        .iter()
        .flatten()
        .map(|m| (m.mount_path.clone(), m.mount_propagation.clone()))
        .collect();
    // Mounts made for kubelet propagate back to the host; nothing else of kubelet's dir.
    for dir in ["pods", "plugins"] {
        assert!(mounts.contains(&(
            format!("/var/lib/kubelet/{dir}"),
            Some("Bidirectional".to_owned())
        )));
    }
    assert!(!mounts.iter().any(|(path, _)| path == "/var/lib/kubelet"));
    // The loop driver's images must outlive the pod.
    assert!(mounts.iter().any(|(path, _)| path == "/var/lib/flexd-loop"));

    let deployment: Deployment = one(&docs, "Deployment");
    let template = &deployment.spec.as_ref().unwrap().template;
    let controller = flexd_container(template);
    let args = controller.args.clone().unwrap();
    assert_flexd_accepts(&args);
    // No claim: the state dir is scratch, and what detach and delete need is kept in the API
    // server, by a token of the records' own ServiceAccount that only the flexd container
    // mounts, whose Role allows the records and nothing else.
    assert!(!docs.iter().any(|d| d["kind"] == "PersistentVolumeClaim"));
    let spec = deployment.spec.as_ref().unwrap();
    assert!(spec.replicas.unwrap_or(1) >= 2, "{:?}", spec.replicas);
    assert_eq!(
        spec.strategy.as_ref().and_then(|s| s.type_.as_deref()),
        Some("RollingUpdate")
    );
    let pod = template.spec.as_ref().unwrap();
    let state_mount = mount_where(&controller, |m| {
        m.mount_path == value_of(&args, "--state-dir")
    });
    let state_volume = volume_where(pod, |v| v.name == state_mount.name);
    assert!(state_volume.empty_dir.is_some(), "{state_volume:?}");
    assert!(args.contains(&"--controller-records=kubernetes".to_owned()));
    let token: Secret = one(&docs, "Secret");
    let records_sa =
        token.metadata.annotations.as_ref().unwrap()["kubernetes.io/service-account.name"].clone();
    let credentials = mount_where(&controller, |m| {
        m.mount_path == value_of(&args, "--records-credentials")
    });
    let credentials_volume = volume_where(pod, |v| v.name == credentials.name);
    assert_eq!(
        credentials_volume.secret.as_ref().unwrap().secret_name,
        token.metadata.name
    );
    for container in &pod.containers {
        let holds = container
            .volume_mounts
            .iter()
            .flatten()
            .any(|m| m.name == credentials.name);
        assert_eq!(holds, container.name == "flexd", "{}", container.name);
    }
    let binding: RoleBinding = docs
        .iter()
        .filter(|d| d["kind"] == "RoleBinding")
        .map(typed::<RoleBinding>)
        .find(|b| b.subjects.iter().flatten().any(|s| s.name == records_sa))
        .unwrap();
    assert_eq!(binding.subjects.as_ref().unwrap().len(), 1);
    let role: Role = docs
        .iter()
        .filter(|d| d["kind"] == "Role")
        .map(typed::<Role>)
        .find(|r| r.metadata.name.as_ref() == Some(&binding.role_ref.name))
        .unwrap();
    let rules = role.rules.unwrap();
    assert_eq!(rules.len(), 1);
    assert_eq!(
        rules[0].resources.as_deref(),
        Some(&["flexdrecords".to_owned()][..])
    );
    assert!(!docs.iter().any(|d| d["kind"] == "ClusterRoleBinding"
        && d["subjects"]
            .as_array()
            .is_some_and(|s| s.iter().any(|s| s["name"] == records_sa.as_str()))));
    let crd: CustomResourceDefinition = one(&docs, "CustomResourceDefinition");
    assert_eq!(crd.spec.scope, "Namespaced");

    // The controller attaches and provisions for any node; the resizers' flexd only answers
    // capabilities.
    assert!(args.contains(&"--mode=controller".to_owned()), "{args:?}");
    // Each sidecar talks to a socket a flexd of the pod serves its driver on, through a
    // volume both mount at that flexd's --csi-dir.
    let drivers: Vec<CSIDriver> = docs
        .iter()
        .filter(|d| d["kind"] == "CSIDriver")
        .map(typed)
        .collect();
    let mut sockets: Vec<(String, String)> = Vec::new();
    for flexd in pod
        .containers
        .iter()
        .filter(|c| c.name.starts_with("flexd"))
    {
        let args = flexd.args.clone().unwrap();
        assert_flexd_accepts(&args);
        let csi_dir = value_of(&args, "--csi-dir");
        let volume = flexd
            .volume_mounts
            .iter()
            .flatten()
            .find(|m| m.mount_path == csi_dir)
            .unwrap_or_else(|| panic!("{} shares no {csi_dir}", flexd.name))
            .name
            .clone();
        for driver in &drivers {
            let name = driver.metadata.name.as_ref().unwrap();
            sockets.push((format!("{csi_dir}/{name}/csi.sock"), volume.clone()));
        }
    }
    let sidecars: Vec<&Container> = pod
        .containers
        .iter()
        .filter(|c| !c.name.starts_with("flexd"))
        .collect();
    let names: Vec<&str> = sidecars.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(
        names,
        ["csi-attacher-0", "csi-provisioner-0", "csi-resizer-0"]
    );
    for sidecar in sidecars {
        let args = sidecar.args.clone().unwrap();
        let address = value_of(&args, "--csi-address");
        let (_, volume) = sockets
            .iter()
            .find(|(socket, _)| socket == address)
            .unwrap_or_else(|| panic!("{address} is served by no flexd of the pod"));
        assert!(args.contains(&"--leader-election".to_owned()), "{args:?}");
        let dir = std::path::Path::new(address)
            .parent()
            .unwrap()
            .parent()
            .unwrap();
        let shared = sidecar
            .volume_mounts
            .iter()
            .flatten()
            .any(|m| &m.name == volume && std::path::Path::new(&m.mount_path) == dir);
        assert!(shared, "{} does not see {address}", sidecar.name);
    }
    // The controller's account is what the sidecars' roles are bound to (the records' own
    // account aside).
    let account = pod.service_account_name.clone().unwrap();
    for doc in docs.iter().filter(|d| {
        (d["kind"] == "ClusterRoleBinding" || d["kind"] == "RoleBinding")
            && d["metadata"]["name"] != binding.metadata.name.as_deref().unwrap()
    }) {
        let subjects = doc["subjects"].as_array().unwrap();
        assert!(
            subjects.iter().any(|s| s["name"] == account.as_str()),
            "{doc}"
        );
    }

    let loop_driver = &drivers[0];
    assert_eq!(
        loop_driver.metadata.name.as_deref(),
        Some("flexvolume-flexd--loop")
    );
    assert_eq!(loop_driver.spec.attach_required, Some(true));
    assert_eq!(loop_driver.spec.fs_group_policy.as_deref(), Some("File"));
    assert_eq!(loop_driver.spec.pod_info_on_mount, Some(true));
}

#[test]
fn manifests_take_capabilities_from_the_command_line() {
    let out = manifests(&[
        "--plugin-dir",
        "/nonexistent/plugins",
        "--driver",
        r#"acme/nfs={"attach":false,"fsGroup":false}"#,
        "--inline-volumes",
        "acme/nfs",
        "--namespace",
        "storage",
        "--kubelet-dir",
        "/data/kubelet",
        "--node-plugin-dir",
        "/etc/kubernetes/kubelet-plugins/volume/exec",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let docs = test_support::yaml_documents(&String::from_utf8(out.stdout).unwrap());
    // Nothing attaches: no controller, no permissions.
    for kind in ["Deployment", "ClusterRole", "PersistentVolumeClaim"] {
        assert!(!docs.iter().any(|d| d["kind"] == kind), "{kind}");
    }
    let driver: CSIDriver = one(&docs, "CSIDriver");
    assert_eq!(
        driver.metadata.name.as_deref(),
        Some("flexvolume-acme--nfs")
    );
    assert_eq!(driver.spec.attach_required, Some(false));
    assert_eq!(driver.spec.fs_group_policy.as_deref(), Some("None"));
    assert_eq!(
        driver.spec.volume_lifecycle_modes,
        Some(vec!["Persistent".to_owned(), "Ephemeral".to_owned()])
    );
    let ds: DaemonSet = one(&docs, "DaemonSet");
    assert_eq!(ds.metadata.namespace.as_deref(), Some("storage"));
    let args = flexd_container(&ds.spec.unwrap().template).args.unwrap();
    assert_eq!(value_of(&args, "--csi-dir"), "/data/kubelet/plugins");
    assert_eq!(
        value_of(&args, "--plugin-dir"),
        "/etc/kubernetes/kubelet-plugins/volume/exec"
    );

    // A driver that is neither given, nor builtin, nor installed is an error, not a guess.
    let empty = tempfile::tempdir().unwrap();
    let plugin_dir = empty.path().to_str().unwrap();
    let out = manifests(&["--plugin-dir", plugin_dir, "--driver", "acme/x"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("not installed"),
        "{stderr}"
    );
    let out = manifests(&[
        "--plugin-dir",
        plugin_dir,
        "--driver",
        "flexd/loop",
        "--host-dir",
        "x",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.code() == Some(2)
            && stderr.contains("for '--host-dir <PATH>': \"x\" is not an absolute path"),
        "{stderr}"
    );
    let out = manifests(&["--plugin-dir", plugin_dir]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("no drivers"),
        "{stderr}"
    );
}

/// Found by the e2e cluster's storage suite: the loop driver's images are made by the controller
/// (attach, provision) and mounted by the node, so both pods must mount the image dirs the
/// operator installed it with, whether the driver is named or found in the plugin dir; before,
/// only the default dir was mounted, and only when the driver was named.
#[test]
fn both_pods_mount_the_loop_drivers_installed_image_dirs() {
    let dir = tempfile::tempdir().unwrap();
    let plugins = dir.path().join("plugins");
    // Paths on the nodes, never made here: a temporary dir is never deployed.
    let node = PathBuf::from(format!("/srv/flexd-deploy-test-{}", std::process::id()));
    let images = [node.join("images-a"), node.join("images-b")];
    test_support::ok(&test_support::flexd(
        &plugins,
        &[
            "install",
            "--builtin",
            "loop",
            "--image-dir",
            images[0].to_str().unwrap(),
            "--image-dir",
            images[1].to_str().unwrap(),
        ],
    ));
    let plugin_dir = plugins.to_str().unwrap();
    for named in [&["--driver", "flexd/loop"][..], &[]] {
        let out = manifests(&[&["--plugin-dir", plugin_dir][..], named].concat());
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let docs = test_support::yaml_documents(&String::from_utf8(out.stdout).unwrap());
        let ds: DaemonSet = one(&docs, "DaemonSet");
        let deployment: Deployment = one(&docs, "Deployment");
        for template in [
            &ds.spec.unwrap().template,
            &deployment.spec.unwrap().template,
        ] {
            let pod = template.spec.as_ref().unwrap();
            let flexd = flexd_container(template);
            for image_dir in &images {
                let path = image_dir.to_str().unwrap();
                let mount = mount_where(&flexd, |m| m.mount_path == path);
                let volume = volume_where(pod, |v| v.name == mount.name);
                assert_eq!(volume.host_path.as_ref().unwrap().path, path, "{named:?}");
            }
            assert!(
                !flexd
                    .volume_mounts
                    .iter()
                    .flatten()
                    .any(|m| m.mount_path == "/var/lib/flexd-loop"),
                "{named:?}: the default dir, which the driver was not installed with"
            );
        }
    }
}

/// The sidecar images `flexd manifests` names by default are the versions the e2e cluster runs
/// Kubernetes' storage suite with (each pinned in tests/e2e/sidecars/<name>/go.mod): a default
/// is a tested version, and bumping one pin without the other fails here.
#[test]
fn default_sidecar_images_are_the_versions_the_e2e_suite_runs() {
    let out = manifests(&[
        "--plugin-dir",
        "/nonexistent/plugins",
        "--driver",
        r#"acme/block={"attach":true,"provision":true,"requiresFSResize":true}"#,
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let sidecars = deploy_dir().join("../tests/e2e/sidecars");
    for (name, module) in [
        ("csi-attacher", "external-attacher"),
        ("csi-provisioner", "external-provisioner"),
        ("csi-resizer", "external-resizer"),
    ] {
        let go_mod = std::fs::read_to_string(sidecars.join(name).join("go.mod")).unwrap();
        let pinned = go_mod
            .lines()
            .find_map(|l| {
                // `require M V` or, in the require block, `M V // indirect` (a tool's module).
                let l = l.trim();
                let mut words = l.strip_prefix("require ").unwrap_or(l).split_whitespace();
                let module_path = words.next()?;
                let version = words.next()?;
                (module_path.starts_with(&format!("github.com/kubernetes-csi/{module}"))
                    && version.starts_with('v'))
                .then(|| version.to_owned())
            })
            .unwrap_or_else(|| panic!("no require of {module} in {name}/go.mod"));
        let image = format!("image: registry.k8s.io/sig-storage/{name}:{pinned}");
        assert!(text.contains(&image), "manifests lack {image}");
    }
}

/// Finding 3: `manifests` wrote the dir it read drivers from (a scratch dir such as /tmp/p)
/// into the privileged pods as a hostPath, so a local user who made that path first on a node
/// got root there. The nodes' plugin dir is now its own flag, and no temporary dir is deployed.
#[test]
fn the_nodes_plugin_dir_is_not_the_one_read_and_no_temporary_dir_is_deployed() {
    let scratch = tempfile::tempdir().unwrap();
    test_support::install_example(scratch.path(), "tmpfs/tmpfs", "acme~tmpfs");
    let read_from = scratch.path().to_str().unwrap();
    let out = manifests(&["--plugin-dir", read_from]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        !text.contains(read_from),
        "the scratch dir was deployed:\n{text}"
    );
    let docs = test_support::yaml_documents(&text);
    let ds: DaemonSet = one(&docs, "DaemonSet");
    let template = ds.spec.unwrap().template;
    let pod = template.spec.as_ref().unwrap();
    let default = "/usr/libexec/kubernetes/kubelet-plugins/volume/exec";
    assert!(volume_where(pod, |v| v
        .host_path
        .as_ref()
        .is_some_and(|h| h.path == default))
    .host_path
    .is_some());

    for refused in [
        &["--node-plugin-dir", "/tmp/p"][..],
        &["--kubelet-dir", "/var/tmp/kubelet"],
        &["--host-dir", "/dev/shm/images"],
        &["--state-dir", "/tmp/state"],
    ] {
        let out = manifests(&[&["--plugin-dir", read_from][..], refused].concat());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.code() == Some(2) && stderr.contains("never given a temporary directory"),
            "{refused:?}: {stderr}"
        );
    }
}

/// Finding 2: every node-only driver accepted inline volumes from any pod author. Now only the
/// drivers the operator names, and never one that attaches.
#[test]
fn inline_volumes_only_for_the_drivers_the_operator_names() {
    let both = [
        "--plugin-dir",
        "/nonexistent",
        "--driver",
        r#"acme/nfs={"attach":false}"#,
        "--driver",
        r#"acme/block={"attach":true}"#,
    ];
    let out = manifests(&both);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let docs = test_support::yaml_documents(&String::from_utf8(out.stdout).unwrap());
    for driver in docs.iter().filter(|d| d["kind"] == "CSIDriver") {
        assert_eq!(
            driver["spec"]["volumeLifecycleModes"],
            serde_json::json!(["Persistent"])
        );
    }
    for (name, says) in [
        ("acme/block", "the driver attaches"),
        ("acme/other", "not one of the drivers deployed"),
    ] {
        let out = manifests(&[&both[..], &["--inline-volumes", name]].concat());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.code() == Some(2) && stderr.contains(says),
            "{stderr}"
        );
    }
}

/// `--import-state-claim`: the records' resource and identity, and a Job whose flexd
/// arguments flexd accepts, reading the claim read-only with the records token alone.
#[test]
fn the_import_job_reads_the_old_claim_read_only_with_the_records_token() {
    let text = manifests_ok(&["--import-state-claim", "flexd-controller-state"]);
    assert!(
        text.contains("docs/operator-guide.md#upgrade-state-claim"),
        "{text}"
    );
    let docs = test_support::yaml_documents(&text);
    let kinds: Vec<&str> = docs.iter().map(|d| d["kind"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "CustomResourceDefinition",
            "ServiceAccount",
            "Role",
            "RoleBinding",
            "Secret",
            "Job"
        ]
    );
    let job: k8s_openapi::api::batch::v1::Job = one(&docs, "Job");
    let pod = job.spec.unwrap().template.spec.unwrap();
    assert_eq!(pod.automount_service_account_token, Some(false));
    let container = &pod.containers[0];
    let args = container.args.clone().unwrap();
    assert_flexd_accepts(&args);
    assert!(args.contains(&"--controller-records=kubernetes".to_owned()));
    let old = mount_where(container, |m| m.mount_path == value_of(&args, "--from"));
    assert_eq!(old.read_only, Some(true));
    let claim = volume_where(&pod, |v| v.name == old.name);
    let source = claim.persistent_volume_claim.as_ref().unwrap();
    assert_eq!(source.claim_name, "flexd-controller-state");
    assert_eq!(source.read_only, Some(true));
    let credentials = mount_where(container, |m| {
        m.mount_path == value_of(&args, "--records-credentials")
    });
    let secret = volume_where(&pod, |v| v.name == credentials.name);
    assert_eq!(
        secret.secret.as_ref().unwrap().secret_name.as_deref(),
        Some("flexd-controller-records")
    );
    let security = container.security_context.as_ref().unwrap();
    assert_eq!(security.allow_privilege_escalation, Some(false));
    assert_eq!(
        security.capabilities.as_ref().unwrap().drop.as_deref(),
        Some(&["ALL".to_owned()][..])
    );
}

/// docs/compatibility.md's per-minor table is what `flexd manifests --kubernetes-version`
/// chooses: printed from the same table, so a changed choice fails here until the doc says it.
#[test]
fn the_compatibility_guide_lists_what_each_minor_gets() {
    let doc = std::fs::read_to_string(deploy_dir().join("../docs/compatibility.md")).unwrap();
    let begin = "<!-- versions:begin -->\n";
    let end = "<!-- versions:end -->";
    let start = doc
        .find(begin)
        .expect("docs/compatibility.md: no versions:begin marker")
        + begin.len();
    let stop = doc[start..].find(end).expect("no versions:end marker") + start;
    let expected = flexd::deploy::kubernetes_version::markdown_table();
    assert_eq!(
        &doc[start..stop],
        expected,
        "docs/compatibility.md's table between the versions markers should read:\n{expected}"
    );
}

/// Each minor's sidecars are the ones the e2e builds for it (tools.sh: before 1.34,
/// csi-provisioner and csi-resizer from tests/e2e/sidecars/csi-provisioner-v5 and
/// csi-resizer-v1), with csi-resizer's gate off where the API server has it off, and a minor
/// below the oldest is refused with the minimum named.
#[test]
fn manifests_choose_the_sidecars_of_the_kubernetes_version() {
    let driver = r#"acme/block={"attach":true,"provision":true,"requiresFSResize":true}"#;
    let with_version = |version: &str| {
        manifests(&[
            "--plugin-dir",
            "/nonexistent/plugins",
            "--driver",
            driver,
            "--kubernetes-version",
            version,
        ])
    };
    let pinned = |dir: &str, module: &str| {
        let go_mod = std::fs::read_to_string(
            deploy_dir()
                .join("../tests/e2e/sidecars")
                .join(dir)
                .join("go.mod"),
        )
        .unwrap();
        go_mod
            .lines()
            .find_map(|l| {
                let mut words = l.trim().strip_prefix("require ")?.split_whitespace();
                (words.next()? == module).then(|| words.next().map(str::to_owned))?
            })
            .unwrap_or_else(|| panic!("{dir}/go.mod requires {module}"))
    };
    let v5 = pinned(
        "csi-provisioner-v5",
        "github.com/kubernetes-csi/external-provisioner/v5",
    );
    let v1 = pinned(
        "csi-resizer-v1",
        "github.com/kubernetes-csi/external-resizer",
    );
    let gate = "--feature-gates=RecoverVolumeExpansionFailure=false";
    for (version, provisioner, resizer, gated) in [
        ("v1.29.15", v5.as_str(), v1.as_str(), true),
        ("1.31", v5.as_str(), v1.as_str(), true),
        ("1.33", v5.as_str(), v1.as_str(), false),
        ("v1.34.4", "v6.4.0", "v2.3.0", false),
        ("1.37", "v6.4.0", "v2.3.0", false),
        ("1.38", "v6.4.0", "v2.3.0", false),
    ] {
        let out = with_version(version);
        assert!(
            out.status.success(),
            "{version}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8(out.stdout).unwrap();
        for image in [
            format!("image: registry.k8s.io/sig-storage/csi-provisioner:{provisioner}\n"),
            format!("image: registry.k8s.io/sig-storage/csi-resizer:{resizer}\n"),
            "image: registry.k8s.io/sig-storage/csi-attacher:v4.13.0\n".to_owned(),
        ] {
            assert!(text.contains(&image), "{version}: manifests lack {image}");
        }
        assert_eq!(text.contains(gate), gated, "{version}: {gate}");
    }
    let out = with_version("v1.28.9");
    assert_eq!(out.status.code(), Some(2), "a usage error");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("Kubernetes 1.28 is older than flexd supports: the oldest is 1.29"),
        "{stderr}"
    );
    assert!(out.stdout.is_empty(), "nothing deployable is printed");
    // An explicit image still wins over the version's choice.
    let out = manifests(&[
        "--plugin-dir",
        "/nonexistent/plugins",
        "--driver",
        driver,
        "--kubernetes-version",
        "1.29",
        "--provisioner-image",
        "registry.example/csi-provisioner:mine",
    ]);
    assert!(String::from_utf8_lossy(&out.stdout)
        .contains("image: registry.example/csi-provisioner:mine\n"));
}

/// `--kubernetes-version -` reads `kubectl version -o json` from standard input, as the
/// compatibility guide pipes it.
#[test]
fn manifests_read_kubectl_versions_json_from_stdin() {
    use std::io::Write as _;
    let mut child = test_support::clean_flexd()
        .args([
            "manifests",
            "--plugin-dir",
            "/nonexistent/plugins",
            "--driver",
            r#"acme/block={"attach":true,"provision":true}"#,
            "--kubernetes-version",
            "-",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(br#"{"clientVersion":{"major":"1","minor":"37"},"serverVersion":{"major":"1","minor":"30+","gitVersion":"v1.30.14-gke.1"}}"#)
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("csi-provisioner:v5.3.0\n"));
}
