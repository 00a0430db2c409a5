//! `flexd check --driver DRIVER`: a conformance report for driver authors.
//!
//! Each check runs the driver for real and records what it answered and how long it took.
//! Required checks decide the exit status (0 only when all pass); advisory ones point at
//! behaviour that works with flexd's tolerance but would break kubelet (e.g. log lines before
//! the JSON, which kubelet cannot parse).

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Args;
use flexvolume::protocol::{self, CallOutKind, Status};
use flexvolume::runner::{self, RunnerConfig};
use flexvolume::{layout, CallOut, Driver, DriverName, Options, Plugin, VolumeSpec};
use serde::Serialize;

use crate::settings::{Global, OutputFormat};

const UNKNOWN_CHECK: &str = "unknown call-out answers Not supported";
const GETVOLUMENAME_CHECK: &str = "getvolumename answers valid JSON or Not supported";

const MOUNT_CHECK: &str = "mount through the whole flow (attach path too) on a scratch target";
const ISATTACHED_CHECK: &str = "isattached answers attached (or Not supported) while attached";
const MOUNT_AGAIN_CHECK: &str = "mount of a mounted target answers Success (idempotent)";
const UNMOUNT_CHECK: &str = "unmount (unmountdevice, detach) leaves nothing mounted";
const UNMOUNT_AGAIN_CHECK: &str = "unmount of an unmounted target answers Success (idempotent)";
const LIFECYCLE_CHECKS: [&str; 5] = [
    MOUNT_CHECK,
    ISATTACHED_CHECK,
    MOUNT_AGAIN_CHECK,
    UNMOUNT_CHECK,
    UNMOUNT_AGAIN_CHECK,
];

/// A call-out name no driver implements.
pub const UNKNOWN_CALLOUT: &str = "flexd-check-unknown-callout";

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// The driver to check: vendor/driver.
    #[arg(
        long = "driver",
        value_name = "VENDOR/DRIVER",
        required_unless_present = "driver_word",
        conflicts_with = "driver_word"
    )]
    pub driver: Option<String>,
    // The first spelling, `flexd check vendor/driver`, still works.
    #[arg(hide = true, value_name = "VENDOR/DRIVER")]
    pub driver_word: Option<String>,
    /// Timeout of each call-out.
    #[arg(long, value_parser = crate::settings::parse_duration, default_value = "2m")]
    pub timeout: Duration,
    /// Options of the scratch volume used by the checks (JSON object of strings).
    #[arg(long, default_value = "{}")]
    pub options: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Pass,
    Fail,
    /// Works, but not as the protocol (or kubelet) expects.
    Warn,
    Skip,
}

/// One line of the report.
#[derive(Debug, Serialize)]
pub struct CheckResult {
    pub name: String,
    pub required: bool,
    pub verdict: Verdict,
    /// Wall time of the check, in milliseconds.
    pub ms: f64,
    pub detail: String,
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub driver: String,
    pub path: String,
    pub passed: bool,
    pub checks: Vec<CheckResult>,
}

impl Report {
    fn push(
        &mut self,
        name: &str,
        required: bool,
        verdict: Verdict,
        elapsed: Duration,
        detail: impl Into<String>,
    ) {
        self.checks.push(CheckResult {
            name: name.to_owned(),
            required,
            verdict,
            ms: (elapsed.as_secs_f64() * 10_000.0).round() / 10.0,
            detail: detail.into(),
        });
    }
}

/// Whether the raw output is exactly one JSON object (what kubelet can parse), besides
/// whitespace.
fn is_strict_json(stdout: &[u8]) -> bool {
    serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(stdout.trim_ascii())
        .is_ok()
}

/// Runs one call-out raw and interprets it, so the report can say both what flexd understood
/// and whether kubelet would have.
fn run_checked(
    config: &RunnerConfig,
    driver: &Driver,
    call: &CallOut,
) -> (Result<protocol::Reply, String>, bool, Duration) {
    let start = Instant::now();
    match runner::run(config, &driver.path, call) {
        Ok(raw) => {
            let strict = is_strict_json(&raw.stdout);
            let quote = |b: &[u8]| call.redact(&protocol::excerpt(b));
            let reply = protocol::interpret(call.kind, raw.exit, &raw.stdout, &raw.stderr, quote)
                .map_err(|e| e.to_string());
            (reply, strict, start.elapsed())
        }
        Err(e) => (Err(e.to_string()), false, start.elapsed()),
    }
}

fn parse_options(text: &str) -> anyhow::Result<std::collections::BTreeMap<String, String>> {
    serde_json::from_str(text)
        .context("--options must be a JSON object of strings, e.g. {\"server\":\"nfs.example\"}")
}

pub fn run(global: &Global, args: CheckArgs) -> anyhow::Result<ExitCode> {
    let wanted = args.driver.or(args.driver_word).unwrap_or_default();
    let name = DriverName::parse(&wanted)?;
    let driver = layout::locate(&global.plugin_dir, &name, global.layout_policy())
        .with_context(|| format!("driver {name} is not usable"))?;
    let config = global.runner_config().with_timeout_for_all(args.timeout);
    let mut spec = VolumeSpec::new("flexd-check".to_owned(), name.clone());
    spec.options = parse_options(&args.options)?;
    let mut report = Report {
        driver: name.to_string(),
        path: driver.path.display().to_string(),
        passed: false,
        checks: Vec::new(),
    };

    // init: required, and everything else depends on it.
    let (init, strict, elapsed) = run_checked(&config, &driver, &CallOut::init());
    let plugin = match init {
        Ok(reply) if reply.status == Status::Success => {
            let caps = reply.capabilities.unwrap_or_default();
            let detail = format!(
                "capabilities: attach={} fsGroup={} supportsMetrics={} requiresFSResize={} selinuxRelabel={}{}",
                caps.attach,
                caps.fs_group,
                caps.supports_metrics,
                caps.requires_fs_resize,
                caps.selinux_relabel,
                if reply.capabilities.is_none() { " (none in the reply: defaults)" } else { "" }
            );
            report.push(
                "init answers Success with capabilities",
                true,
                Verdict::Pass,
                elapsed,
                detail,
            );
            Some(Plugin::from_init_reply(driver.clone(), &reply))
        }
        Ok(reply) => {
            let detail = format!("answered {:?}: {}", reply.status, reply.message);
            report.push(
                "init answers Success with capabilities",
                true,
                Verdict::Fail,
                elapsed,
                detail,
            );
            None
        }
        Err(e) => {
            report.push(
                "init answers Success with capabilities",
                true,
                Verdict::Fail,
                elapsed,
                e,
            );
            None
        }
    };
    let strict_verdict = if strict { Verdict::Pass } else { Verdict::Warn };
    let strict_detail = if strict {
        "stdout is exactly one JSON object"
    } else {
        "stdout has more than the JSON reply; flexd copes, kubelet would fail to parse it"
    };
    report.push(
        "init output is strict JSON (kubelet-compatible)",
        false,
        strict_verdict,
        elapsed,
        strict_detail,
    );

    if plugin.is_none() {
        for name in [UNKNOWN_CHECK, GETVOLUMENAME_CHECK] {
            report.push(
                name,
                true,
                Verdict::Skip,
                Duration::ZERO,
                "not run: init failed",
            );
        }
    } else {
        // An unknown call-out must answer Not supported, so future call-outs degrade safely.
        let start = Instant::now();
        let argv = [std::ffi::OsStr::new(UNKNOWN_CALLOUT)];
        let outcome = runner::run_argv(&config, &driver.path, CallOutKind::Init, &argv);
        let elapsed = start.elapsed();
        let (verdict, detail) = match outcome {
            Ok(raw) => match protocol::find_reply(&raw.stdout).or_else(|| protocol::find_reply(&raw.stderr)) {
                Some(reply) if reply.status == Status::NotSupported => (Verdict::Pass, "Not supported".to_owned()),
                Some(reply) => (Verdict::Fail, format!("answered {:?}; unknown call-outs must answer Not supported", reply.status)),
                None => (Verdict::Fail, format!("no JSON reply ({}); unknown call-outs must answer {{\"status\":\"Not supported\"}}", raw.exit)),
            },
            Err(e) => (Verdict::Fail, e.to_string()),
        };
        report.push(UNKNOWN_CHECK, true, verdict, elapsed, detail);

        // getvolumename: valid JSON or Not supported (kubelet ignores the name, detach uses it).
        let options = Options::for_volume(&spec);
        let (reply, _, elapsed) =
            run_checked(&config, &driver, &CallOut::get_volume_name(&options));
        let (verdict, detail) = match reply {
            Ok(r) if r.status == Status::Success => match r.volume_name {
                Some(v) if !v.is_empty() => (Verdict::Pass, format!("volumeName {v:?}")),
                _ => (Verdict::Fail, "Success without a volumeName".to_owned()),
            },
            Ok(r) if r.status == Status::NotSupported => (
                Verdict::Pass,
                "Not supported (the volume's name is used)".to_owned(),
            ),
            Ok(r) => (Verdict::Warn, format!("Failure: {}", r.message)),
            Err(e) => (Verdict::Fail, e),
        };
        report.push(GETVOLUMENAME_CHECK, true, verdict, elapsed, detail);
    }
    match &plugin {
        Some(plugin) if rustix::process::geteuid().is_root() => {
            lifecycle_checks(&mut report, plugin, &spec, &config)
        }
        _ => {
            let why = match plugin {
                None => "not run: init failed",
                Some(_) => "not run: mounting needs root",
            };
            for name in LIFECYCLE_CHECKS {
                report.push(name, true, Verdict::Skip, Duration::ZERO, why);
            }
        }
    }

    report.passed = report
        .checks
        .iter()
        .all(|c| !c.required || c.verdict == Verdict::Pass);
    match global.output {
        OutputFormat::Json => super::print_json(&report)?,
        OutputFormat::Text => print_table(&report),
    }
    Ok(if report.passed {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn print_table(report: &Report) {
    println!("driver {} ({})", report.driver, report.path);
    let width = report
        .checks
        .iter()
        .map(|c| c.name.len())
        .max()
        .unwrap_or(5);
    for c in &report.checks {
        let verdict = match c.verdict {
            Verdict::Pass => "PASS",
            Verdict::Fail => "FAIL",
            Verdict::Warn => "WARN",
            Verdict::Skip => "SKIP",
        };
        let kind = if c.required { "required" } else { "advisory" };
        println!(
            "{verdict}  {:width$}  {kind:8}  {:>8.1} ms  {}",
            c.name, c.ms, c.detail
        );
    }
    println!(
        "{}",
        if report.passed {
            "all required checks passed"
        } else {
            "some required checks FAILED"
        }
    );
}

/// A scratch directory for the lifecycle checks; whatever is still mounted below it is
/// unmounted (lazily) and the directory removed when dropped, even if a check failed midway.
struct Scratch(std::path::PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        if let Ok(table) = flexvolume::mount::mount_table() {
            let mut below: Vec<_> = table
                .into_iter()
                .map(|m| m.mount_point)
                .filter(|m| m.starts_with(&self.0))
                .collect();
            below.sort_by_key(|m| std::cmp::Reverse(m.as_os_str().len()));
            for m in below {
                let _ = rustix::mount::unmount(&m, rustix::mount::UnmountFlags::DETACH);
            }
        }
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Mount and unmount a scratch volume through flexd's lifecycle (kubelet's flow, defaults
/// included), and ask the driver itself to mount and unmount twice, which kubelet does after a
/// restart or a retry.
fn lifecycle_checks(
    report: &mut Report,
    plugin: &Plugin,
    spec: &VolumeSpec,
    config: &RunnerConfig,
) {
    use flexvolume::lifecycle::{DriverResolver, Lifecycle, MountRequest};
    use flexvolume::mount;
    use flexvolume::state::{StateDir, VolumeRecord};

    struct Same<'a>(&'a Plugin);
    impl DriverResolver for Same<'_> {
        fn resolve(&self, _: &VolumeRecord) -> Option<std::sync::Arc<Plugin>> {
            let ok = protocol::find_reply(br#"{"status":"Success"}"#)?;
            Some(std::sync::Arc::new(Plugin::from_init_reply(
                self.0.driver.clone(),
                &ok,
            )))
        }
    }

    let scratch = Scratch(std::env::temp_dir().join(format!(
        "flexd-check-{}-{}",
        std::process::id(),
        spec.driver.dir_name()
    )));
    let target = scratch.0.join("target");
    let lifecycle = Lifecycle {
        runner: config.clone(),
        state: StateDir::new(scratch.0.join("state")),
        node: rustix::system::uname()
            .nodename()
            .to_string_lossy()
            .into_owned(),
    };
    let pod = flexvolume::PodInfo::default();
    let request = MountRequest {
        plugin,
        spec,
        pod: &pod,
        fs_group: None,
        fs_group_policy: Default::default(),
        target: &target,
    };
    let mounted_here = || {
        mount::mount_table()
            .map(|t| t.iter().filter(|m| m.mount_point == target).count())
            .unwrap_or(0)
    };

    let start = Instant::now();
    let mounted = lifecycle.mount(&request);
    let elapsed = start.elapsed();
    let (verdict, detail) = match &mounted {
        Ok(outcome) if mounted_here() > 0 => (
            Verdict::Pass,
            match &outcome.device {
                Some(device) => format!("mounted; device {device}"),
                None => "mounted".to_owned(),
            },
        ),
        Ok(_) => (
            Verdict::Fail,
            "the driver answered Success but nothing is mounted on the target".to_owned(),
        ),
        // Call-out errors are redacted by the runner; the scratch volume has no secrets.
        Err(e) => (Verdict::Fail, e.to_string()),
    };
    let mount_failed = verdict == Verdict::Fail;
    report.push(MOUNT_CHECK, true, verdict, elapsed, detail);
    if mount_failed {
        for name in [
            ISATTACHED_CHECK,
            MOUNT_AGAIN_CHECK,
            UNMOUNT_CHECK,
            UNMOUNT_AGAIN_CHECK,
        ] {
            report.push(
                name,
                true,
                Verdict::Skip,
                Duration::ZERO,
                "not run: mount failed",
            );
        }
        return;
    }

    // isattached, while the volume is attached: kubelet and the controller manager rely on it.
    if plugin.capabilities.attach {
        let options = Options::for_volume(spec);
        let call = CallOut::is_attached(&options, &lifecycle.node);
        let (reply, _, elapsed) = run_checked(config, &plugin.driver, &call);
        let (verdict, detail) = match reply {
            Ok(r) if r.status == Status::Success && r.attached == Some(true) => {
                (Verdict::Pass, "attached: true".to_owned())
            }
            Ok(r) if r.status == Status::Success => (
                Verdict::Fail,
                "answered attached: false (or nothing) right after attach".to_owned(),
            ),
            Ok(r) if r.status == Status::NotSupported => (
                Verdict::Pass,
                "Not supported (treated as attached)".to_owned(),
            ),
            Ok(r) => (
                Verdict::Fail,
                format!("answered {:?}: {}", r.status, r.message),
            ),
            Err(e) => (Verdict::Fail, e),
        };
        report.push(ISATTACHED_CHECK, true, verdict, elapsed, detail);
    } else {
        report.push(
            ISATTACHED_CHECK,
            false,
            Verdict::Skip,
            Duration::ZERO,
            "the driver does not attach",
        );
    }

    // The driver's own mount, again, on the mounted target.
    let options = Options::for_mount(spec, &pod, None);
    let (reply, _, elapsed) =
        run_checked(config, &plugin.driver, &CallOut::mount(&target, &options));
    let (verdict, detail) = match reply {
        // Each retry by kubelet would leak one more mount.
        Ok(r) if r.status == Status::Success && mounted_here() > 1 => (
            Verdict::Fail,
            format!(
                "Success, but the target is now mounted {} times: each repeat stacks a mount",
                mounted_here()
            ),
        ),
        Ok(r) if r.status == Status::Success => (Verdict::Pass, "Success".to_owned()),
        Ok(r) if r.status == Status::NotSupported => (
            Verdict::Pass,
            "Not supported (flexd bind-mounts the device)".to_owned(),
        ),
        Ok(r) => (
            Verdict::Fail,
            format!("answered {:?}: {}", r.status, r.message),
        ),
        Err(e) => (Verdict::Fail, e),
    };
    report.push(MOUNT_AGAIN_CHECK, true, verdict, elapsed, detail);

    // Whatever the repeated mount stacked is flexd's lifecycle's to tear down first.
    while mounted_here() > 1 {
        if mount::unmount(&target).is_err() {
            break;
        }
    }
    let start = Instant::now();
    let unmounted = lifecycle.unmount(&target, &Same(plugin));
    let elapsed = start.elapsed();
    let leftovers = mount::mount_table()
        .map(|t| {
            t.iter()
                .filter(|m| m.mount_point.starts_with(&scratch.0))
                .count()
        })
        .unwrap_or(0);
    let (verdict, detail) = match unmounted {
        Ok(_) if leftovers == 0 => (Verdict::Pass, "nothing left mounted".to_owned()),
        Ok(_) => (
            Verdict::Fail,
            format!("{leftovers} mount(s) left behind under the scratch directory"),
        ),
        Err(e) => (Verdict::Fail, e.to_string()),
    };
    report.push(UNMOUNT_CHECK, true, verdict, elapsed, detail);

    // The driver's own unmount, again, on a target that is no longer mounted.
    let _ = std::fs::create_dir_all(&target);
    let (reply, _, elapsed) = run_checked(config, &plugin.driver, &CallOut::unmount(&target));
    let (verdict, detail) = match reply {
        Ok(r) if r.status == Status::Success => (Verdict::Pass, "Success".to_owned()),
        Ok(r) if r.status == Status::NotSupported => (
            Verdict::Pass,
            "Not supported (flexd unmounts itself)".to_owned(),
        ),
        Ok(r) => (
            Verdict::Fail,
            format!("answered {:?}: {}", r.status, r.message),
        ),
        Err(e) => (Verdict::Fail, e),
    };
    report.push(UNMOUNT_AGAIN_CHECK, true, verdict, elapsed, detail);
}
