//! The official CSI conformance suite, csi-sanity (kubernetes-csi/csi-test, pinned in
//! `tests/e2e/go.mod`), against a real `flexd serve --mode both` for every shape a driver can
//! have: {attaches, does not} × {provisions, does not} × {expands, does not} (one shell driver,
//! `tests/drivers/shape`, with its capabilities written in), the example drivers (rust-tiny
//! included) and the builtin loop driver. Each must have zero failures.
//!
//! What the suite runs is decided by what flexd itself says the driver offers, and the test
//! first checks that this is what the driver's capabilities call for:
//! - no controller side (neither attach nor provision): the endpoint must answer the Controller
//!   service `UNIMPLEMENTED`, and the suite's `[Controller Server]` specs are skipped, as the
//!   suite documents for node-only plugins (kubernetes-csi/csi-test#208);
//! - no `CREATE_DELETE_VOLUME`: the specs that call CreateVolume without asking whether the
//!   plugin offers it (kubernetes-csi/csi-test#214, open) are skipped by name
//!   ([`NEEDS_CREATE_VOLUME`]; docs/testing.md lists them);
//! - `LIST_VOLUMES` for every driver with a controller side, `LIST_VOLUMES_PUBLISHED_NODES` for
//!   one that attaches: the suite's ListVolumes specs run against both.
//!
//! The suite is built from the Go module proxy by `tests/e2e/tools.sh` (cached per machine), or
//! named by `CSI_SANITY`. Without Go, or without root (the suite mounts), these tests say loudly
//! that they skipped.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use test_support::repo_path;
use test_support::serve::{csi, Server};

/// The specs that call CreateVolume whatever the plugin's capabilities
/// (kubernetes-csi/csi-test#214): skipped for a driver that does not provision.
const NEEDS_CREATE_VOLUME: [&str; 12] = [
    "Node Service NodeUnpublishVolume should remove target path",
    "Node Service NodeExpandVolume should fail when no volume path is provided",
    "Node Service NodeExpandVolume should work if node-expand is called after node-publish",
    "Node Service NodeStageVolume should fail when no volume capability is provided",
    "Node Service should work",
    "Node Service should be idempotent",
    "Controller Service [Controller Server] ControllerPublishVolume should fail when the node does not exist",
    "Controller Service [Controller Server] ValidateVolumeCapabilities should fail when no volume capabilities are provided",
    "Controller Service [Controller Server] ValidateVolumeCapabilities should return appropriate values (no optional values added)",
    "Controller Service [Controller Server] volume lifecycle should work",
    "Controller Service [Controller Server] volume lifecycle should be idempotent",
    "Controller Service [Controller Server] ListVolumes check the presence of new volumes and absence of deleted ones in the volume list",
];

/// The csi-sanity binary: `$CSI_SANITY`, else what `tests/e2e/tools.sh csi-sanity` builds (once
/// per machine and pin). `Err` says why there is none.
fn csi_sanity() -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os("CSI_SANITY") {
        return Ok(PathBuf::from(path));
    }
    let out = Command::new(repo_path("tests/e2e/tools.sh"))
        .arg("csi-sanity")
        .stderr(Stdio::piped())
        .output()
        .map_err(|e| format!("cannot run tests/e2e/tools.sh: {e}"))?;
    let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    if out.status.success() && path.is_file() {
        Ok(path)
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_owned())
    }
}

struct Counts {
    passed: u32,
    failed: u32,
    skipped: u32,
}

/// `… 48 Passed | 0 Failed | 1 Pending | 42 Skipped` from ginkgo's summary.
fn counts(output: &str) -> Option<Counts> {
    let line = output.lines().rev().find(|l| l.contains(" Passed | "))?;
    let number = |label: &str| -> Option<u32> {
        let before = &line[..line.find(label)?];
        before.split_whitespace().last()?.parse().ok()
    };
    Some(Counts {
        passed: number(" Passed")?,
        failed: number(" Failed")?,
        skipped: number(" Skipped")?,
    })
}

/// One driver under test: how it is installed, and what its capabilities call for.
struct Subject<'a> {
    /// `flexd install` arguments (`$ROOT` is the test's directory).
    install: Vec<String>,
    /// The suite's `--csi.testvolumeparameters` (YAML; `$ROOT` is the test's directory).
    parameters: Option<&'a str>,
    attaches: bool,
    provisions: bool,
}

/// What flexd's endpoint says the driver offers: the Identity's CONTROLLER_SERVICE and the
/// controller's RPCs (checked to be UNIMPLEMENTED when the service is not offered).
async fn offered(socket: &Path) -> (bool, Vec<i32>) {
    let mut identity = test_support::serve::identity_client(socket).await;
    let controller_service = test_support::serve::plugin_services(&mut identity)
        .await
        .contains(&test_support::serve::CONTROLLER_SERVICE);
    let mut controller = test_support::serve::controller_client(socket).await;
    if controller_service {
        let rpcs = test_support::serve::controller_capabilities(&mut controller).await;
        return (true, rpcs);
    }
    let answer = controller
        .controller_get_capabilities(csi::ControllerGetCapabilitiesRequest {})
        .await;
    assert_eq!(
        answer.map(|_| ()).unwrap_err().code(),
        tonic::Code::Unimplemented,
        "a driver without a controller side must not serve the Controller service"
    );
    (false, Vec::new())
}

/// Installs one driver, serves it in both modes, runs the suite against its socket.
fn conformance(subject: Subject<'_>) {
    if !test_support::is_root() {
        return test_support::report_skip(
            "csi-sanity conformance",
            "needs root (the suite stages and publishes real volumes)",
        );
    }
    let sanity = match csi_sanity() {
        Ok(path) => path,
        Err(why) => {
            return test_support::report_skip(
                "csi-sanity conformance",
                &format!("no csi-sanity (install Go, or set CSI_SANITY): {why}"),
            )
        }
    };
    // The shared harness's sandbox: it unmounts whatever the suite leaves mounted below it.
    let sandbox = test_support::Sandbox::new();
    let root = sandbox.root().to_owned();
    let root = root.as_path();
    let plugins = sandbox.plugin();
    let installed = test_support::flexd_command(&plugins)
        .arg("install")
        .args(
            subject
                .install
                .iter()
                .map(|a| a.replace("$ROOT", &root.display().to_string())),
        )
        .output()
        .unwrap();
    test_support::ok(&installed);
    // The name flexd serves it under, as `flexd drivers` reports it.
    let drivers = test_support::flexd(&plugins, &["drivers", "-o", "json"]);
    test_support::ok(&drivers);
    let drivers: serde_json::Value = serde_json::from_slice(&drivers.stdout).unwrap();
    let csi_name = drivers[0]["csiName"].as_str().unwrap().to_owned();
    let csi_name = csi_name.as_str();
    let server = Server::serve(sandbox, "both", &[]);
    let socket = server.socket(csi_name);

    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (controller_service, rpcs) = runtime.block_on(offered(&socket));
    let provisions =
        rpcs.contains(&(csi::controller_service_capability::rpc::Type::CreateDeleteVolume as i32));
    assert_eq!(
        controller_service,
        subject.attaches || subject.provisions,
        "{csi_name}: the Controller service is offered exactly when the driver attaches or provisions"
    );
    assert_eq!(
        provisions, subject.provisions,
        "{csi_name}: CREATE_DELETE_VOLUME"
    );
    let offers =
        |kind: csi::controller_service_capability::rpc::Type| rpcs.contains(&(kind as i32));
    use csi::controller_service_capability::rpc::Type;
    assert_eq!(
        offers(Type::ListVolumes),
        controller_service,
        "{csi_name}: LIST_VOLUMES, for every driver with a controller side"
    );
    assert_eq!(
        offers(Type::ListVolumesPublishedNodes),
        subject.attaches,
        "{csi_name}: LIST_VOLUMES_PUBLISHED_NODES, for a driver that attaches"
    );

    let mut args = vec![
        format!("--csi.endpoint=unix://{}", socket.display()),
        // The suite creates these itself and wants them absent.
        format!("--csi.mountdir={}", root.join("mnt").display()),
        format!("--csi.stagingdir={}", root.join("staging").display()),
        "--ginkgo.no-color".to_owned(),
        // Volumes that fit the smallest scratch filesystem the tests run on (the VM suite's
        // tmpfs is 2 GiB): the loop driver refuses an image larger than its whole filesystem,
        // and the suite's default is 10 GiB.
        format!("--csi.testvolumesize={}", 64 << 20),
        format!("--csi.testvolumeexpandsize={}", 128 << 20),
    ];
    let mut skips = Vec::new();
    if !controller_service {
        skips.push(r"\[Controller.Server\]".to_owned());
    }
    if !provisions {
        skips.extend(NEEDS_CREATE_VOLUME.iter().map(|s| regex_quote(s)));
    }
    if !skips.is_empty() {
        args.push(format!("--ginkgo.skip={}", skips.join("|")));
    }
    if let Some(yaml) = subject.parameters {
        let file = root.join("parameters.yaml");
        std::fs::write(&file, yaml.replace("$ROOT", &root.display().to_string())).unwrap();
        args.push(format!("--csi.testvolumeparameters={}", file.display()));
    }
    let run = Command::new(&sanity).args(&args).output().unwrap();
    let log = server.flexd_log();
    drop(server);
    let output = String::from_utf8_lossy(&run.stdout);
    let errors = String::from_utf8_lossy(&run.stderr);
    let Some(counts) = counts(&output) else {
        panic!(
            "no csi-sanity summary ({}):\n{output}\n{errors}\nflexd log:\n{log}",
            run.status
        );
    };
    eprintln!(
        "csi-sanity against {csi_name}: {} passed, {} failed, {} skipped",
        counts.passed, counts.failed, counts.skipped
    );
    let failures: Vec<&str> = output.lines().filter(|l| l.contains("[FAIL]")).collect();
    assert!(
        counts.failed == 0 && run.status.success(),
        "csi-sanity against {csi_name}: {} failed:\n{}\n\n{output}\nflexd log:\n{log}",
        counts.failed,
        failures.join("\n")
    );
    assert!(counts.passed > 0);
}

/// A spec's full name as a ginkgo regular expression that matches it literally.
fn regex_quote(name: &str) -> String {
    name.chars()
        .map(|c| {
            if r"\.+*?()|[]{}^$".contains(c) {
                format!("\\{c}")
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// `tests/drivers/shape` with these capabilities, installed as `acme/<name>`.
fn shape(attaches: bool, provisions: bool, expands: bool) {
    let name = format!(
        "{}-{}-{}",
        if attaches { "attach" } else { "noattach" },
        if provisions { "provision" } else { "static" },
        if expands { "expand" } else { "fixed" },
    );
    let source = std::fs::read_to_string(repo_path("tests/drivers/shape")).unwrap();
    let capabilities = format!(
        "CAPABILITIES='{{\"attach\":{attaches},\"provision\":{provisions},\"requiresFSResize\":{expands}}}'"
    );
    let line = source
        .lines()
        .find(|l| l.starts_with("CAPABILITIES="))
        .expect("tests/drivers/shape sets CAPABILITIES");
    let driver = tempfile::tempdir().unwrap();
    let path = driver.path().join(&name);
    test_support::write_exe(&path, &source.replace(line, &capabilities));
    driver_file(&name, &path, attaches, provisions);
}

/// The driver executable at `path`, installed as `acme/<name>`.
fn driver_file(name: &str, path: &Path, attaches: bool, provisions: bool) {
    conformance(Subject {
        install: vec![
            "--driver".into(),
            format!("acme/{name}"),
            path.display().to_string(),
        ],
        parameters: None,
        attaches,
        provisions,
    });
}

/// One test for each capability set of `tests/drivers/shape` (see [`shape`]): `name: attaches,
/// provisions, expands;`.
macro_rules! shape_tests {
    ($($(#[$doc:meta])* $name:ident: $attaches:expr, $provisions:expr, $expands:expr;)*) => {
        $(
            $(#[$doc])*
            #[test]
            fn $name() {
                shape($attaches, $provisions, $expands);
            }
        )*
    };
}

shape_tests! {
    csi_sanity_passes_against_a_driver_that_attaches_provisions_and_expands: true, true, true;
    csi_sanity_passes_against_a_driver_that_attaches_and_provisions: true, true, false;
    csi_sanity_passes_against_a_driver_that_attaches_and_expands: true, false, true;
    csi_sanity_passes_against_a_driver_that_only_attaches: true, false, false;
    csi_sanity_passes_against_a_driver_that_provisions_and_expands: false, true, true;
    csi_sanity_passes_against_a_driver_that_only_provisions: false, true, false;
    csi_sanity_passes_against_a_driver_that_only_expands: false, false, true;
    /// Kubernetes' own e2e `dummy` driver, and most NFS/CIFS-style drivers: `{"attach": false}`,
    /// nothing else (expansion is the protocol's default, so it is turned off here explicitly).
    csi_sanity_passes_against_a_driver_that_only_mounts: false, false, false;
}

#[test]
fn csi_sanity_passes_against_the_builtin_loop_driver() {
    conformance(Subject {
        // Images in the test's own directory, which the operator (the test) allows.
        install: vec![
            "--builtin".into(),
            "loop".into(),
            "--image-dir".into(),
            "$ROOT/images".into(),
        ],
        parameters: Some("imageDir: $ROOT/images\n"),
        attaches: true,
        provisions: true,
    });
}

/// The example driver `examples/drivers/<name>/<name>`, installed as `acme/<name>`.
fn example(name: &str, attaches: bool, provisions: bool) {
    let path = repo_path(&format!("examples/drivers/{name}/{name}"));
    driver_file(name, &path, attaches, provisions);
}

#[test]
fn csi_sanity_passes_against_the_tmpfs_example() {
    example("tmpfs", false, true);
}

#[test]
fn csi_sanity_passes_against_the_attachable_example() {
    example("attachable", true, false);
}

/// `examples/drivers/rust-tiny`, compiled here as `flexd check`'s test compiles it: `init` says
/// only `{"attach": false}`, so it neither attaches nor provisions.
#[test]
fn csi_sanity_passes_against_the_rust_tiny_example() {
    let dir = tempfile::tempdir().unwrap();
    let compiled = test_support::compile_tiny_driver(dir.path(), false);
    let path = dir.path().join("rust-tiny");
    std::fs::rename(compiled, &path).unwrap();
    driver_file("rust-tiny", &path, false, false);
}

#[test]
fn the_summary_line_is_read() {
    let c = counts("Ran 49 of 92 Specs\nFAIL! -- 48 Passed | 1 Failed | 1 Pending | 42 Skipped\n")
        .unwrap();
    assert_eq!((c.passed, c.failed, c.skipped), (48, 1, 42));
}

#[test]
fn spec_names_become_literal_patterns() {
    assert_eq!(
        regex_quote("Controller Service [Controller Server] x (no optional values added)"),
        r"Controller Service \[Controller Server\] x \(no optional values added\)"
    );
}
