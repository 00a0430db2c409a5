//! The conformance report for driver authors (`flexd check --driver DRIVER`).
//!
//! Each check runs the driver for real and records what it answered and how long it took.
//! Required checks decide whether the driver passes; advisory ones point at behaviour that works
//! with flexd's tolerance but would break kubelet (e.g. log lines before the JSON, which kubelet
//! cannot parse). A check that cannot run (its prerequisite failed, or mounting needs root) is
//! reported as skipped, with why.

mod provision;
mod scratch;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::layout::InstalledDriver;
use crate::plugin::Plugin;
use crate::runner::{self, RunnerConfig};
use flexvolume_protocol::options::Options;
use flexvolume_protocol::spec::VolumeSpec;
use flexvolume_protocol::{CallOut, CallOutKind, Reply, Status};

pub(crate) const INIT_CHECK: &str = "init answers Success with capabilities";
pub(crate) const STRICT_JSON_CHECK: &str = "init output is strict JSON (kubelet-compatible)";
pub(crate) const UNKNOWN_CHECK: &str = "unknown call-out answers Not supported";
pub(crate) const GETVOLUMENAME_CHECK: &str = "getvolumename answers valid JSON or Not supported";
pub(crate) const PROVISION_CHECK: &str = "provision creates a volume (provision: true)";
pub(crate) const DELETE_CHECK: &str =
    "delete removes the provisioned volume, and again (idempotent)";
pub(crate) const MOUNT_CHECK: &str =
    "mount through the whole flow (attach path too) on a scratch target";
pub(crate) const ISATTACHED_CHECK: &str =
    "isattached answers attached (or Not supported) while attached";
pub(crate) const MOUNT_AGAIN_CHECK: &str = "mount of a mounted target answers Success (idempotent)";
pub(crate) const UNMOUNT_CHECK: &str = "unmount (unmountdevice, detach) leaves nothing mounted";
pub(crate) const UNMOUNT_AGAIN_CHECK: &str =
    "unmount of an unmounted target answers Success (idempotent)";
const LIFECYCLE_CHECKS: [&str; 5] = [
    MOUNT_CHECK,
    ISATTACHED_CHECK,
    MOUNT_AGAIN_CHECK,
    UNMOUNT_CHECK,
    UNMOUNT_AGAIN_CHECK,
];

/// A call-out name no driver implements.
pub(crate) const UNKNOWN_CALLOUT: &str = "flexd-check-unknown-callout";

/// The outcome of one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    Pass,
    Fail,
    /// Works, but not as the protocol (or kubelet) expects.
    Warn,
    Skip,
    /// Could not run as the driver needs: it refused the scratch volume for want of options
    /// (an NFS driver without a server), which `--options` can give it. Neither pass nor fail.
    NeedsOptions,
}

/// One line of the report.
#[derive(Debug, Clone, Serialize)]
pub struct CheckResult {
    pub name: String,
    /// Required checks decide [`Report::passed`]; the others are advisory.
    pub required: bool,
    pub verdict: Verdict,
    /// Wall time of the check, in milliseconds.
    pub ms: f64,
    pub detail: String,
}

/// Every check of one driver, in the order they ran.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub driver: String,
    pub path: String,
    /// Whether every required check passed.
    pub passed: bool,
    /// Whether a required check could not run because the driver needs options it did not
    /// get (see [`Verdict::NeedsOptions`]).
    pub needs_options: bool,
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

    fn skip(&mut self, names: &[&str], required: bool, why: &str) {
        for name in names {
            self.push(name, required, Verdict::Skip, Duration::ZERO, why);
        }
    }
}

/// Runs every check against an installed driver, with `options` as the scratch volume's
/// options. The lifecycle checks mount for real, so they run only as root.
pub fn run(
    driver: &InstalledDriver,
    config: &RunnerConfig,
    options: BTreeMap<String, String>,
) -> Report {
    let mut spec = VolumeSpec::new("flexd-check".to_owned(), driver.name.clone());
    spec.options = options;
    let mut report = Report {
        driver: driver.name.to_string(),
        path: driver.path.display().to_string(),
        passed: false,
        needs_options: false,
        checks: Vec::new(),
    };
    // init is required, and everything else depends on it.
    let plugin = check_init(&mut report, config, driver);
    match &plugin {
        Some(_) => {
            check_unknown_callout(&mut report, config, driver);
            check_getvolumename(&mut report, config, driver, &spec);
        }
        None => report.skip(
            &[UNKNOWN_CHECK, GETVOLUMENAME_CHECK],
            true,
            "not run: init failed",
        ),
    }
    let plugin = plugin.map(Arc::new);
    // A driver that provisions is checked on a volume it provisioned, as a user's claim is.
    let provisioned = match &plugin {
        Some(plugin) if plugin.capabilities.provision => {
            provision::provision_scratch(&mut report, plugin, &spec, config)
        }
        _ => {
            report.skip(
                &[PROVISION_CHECK, DELETE_CHECK],
                false,
                "not run: the driver does not provision",
            );
            None
        }
    };
    let volume = provisioned.as_ref().unwrap_or(&spec);
    // A scratch volume with no options at all that the driver refuses may just need them.
    let may_need_options = provisioned.is_none() && spec.options.is_empty();
    match &plugin {
        Some(plugin) if rustix::process::geteuid().is_root() => scratch::lifecycle_checks(
            &mut report,
            plugin.clone(),
            volume,
            config,
            may_need_options,
        ),
        Some(_) => report.skip(&LIFECYCLE_CHECKS, true, "not run: mounting needs root"),
        None => report.skip(&LIFECYCLE_CHECKS, true, "not run: init failed"),
    }
    match (&plugin, &provisioned) {
        (Some(plugin), Some(volume)) => {
            provision::delete_scratch(&mut report, plugin, volume, config)
        }
        (Some(plugin), None) if plugin.capabilities.provision => {
            report.skip(&[DELETE_CHECK], true, "not run: provision failed")
        }
        _ => {}
    }
    report.needs_options = report
        .checks
        .iter()
        .any(|c| c.verdict == Verdict::NeedsOptions);
    report.passed = report
        .checks
        .iter()
        .all(|c| !c.required || c.verdict == Verdict::Pass);
    report
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
    driver: &InstalledDriver,
    call: &CallOut,
) -> (Result<Reply, String>, bool, Duration) {
    let start = Instant::now();
    match runner::run(config, &driver.path, call) {
        Ok(raw) => {
            let strict = is_strict_json(&raw.stdout);
            let quote = |b: &[u8]| call.redact(&flexvolume_protocol::excerpt(b));
            let reply = flexvolume_protocol::interpret(
                call.kind,
                raw.exit,
                &raw.stdout,
                &raw.stderr,
                quote,
            )
            .map_err(|e| e.to_string());
            (reply, strict, start.elapsed())
        }
        Err(e) => (Err(e.to_string()), false, start.elapsed()),
    }
}

/// `init` answers Success (required) with strict JSON (advisory); the plugin if it succeeded.
fn check_init(
    report: &mut Report,
    config: &RunnerConfig,
    driver: &InstalledDriver,
) -> Option<Plugin> {
    let (init, strict, elapsed) = run_checked(config, driver, &CallOut::init());
    let (verdict, detail, plugin) = match init {
        Ok(reply) if reply.status == Status::Success => {
            let caps = reply.capabilities.unwrap_or_default();
            let detail = format!(
                "capabilities: attach={} fsGroup={} supportsMetrics={} requiresFSResize={} selinuxRelabel={} provision={}{}",
                caps.attach,
                caps.fs_group,
                caps.supports_metrics,
                caps.requires_fs_resize,
                caps.selinux_relabel,
                caps.provision,
                if reply.capabilities.is_none() { " (none in the reply: defaults)" } else { "" }
            );
            let plugin = Plugin::from_init_reply(driver.clone(), &reply);
            (Verdict::Pass, detail, Some(plugin))
        }
        Ok(reply) => (Verdict::Fail, provision::answered(&reply), None),
        Err(e) => (Verdict::Fail, e, None),
    };
    report.push(INIT_CHECK, true, verdict, elapsed, detail);
    let (verdict, detail) = if strict {
        (Verdict::Pass, "stdout is exactly one JSON object")
    } else {
        (
            Verdict::Warn,
            "stdout has more than the JSON reply; flexd copes, kubelet would fail to parse it",
        )
    };
    report.push(STRICT_JSON_CHECK, false, verdict, elapsed, detail);
    plugin
}

/// An unknown call-out must answer Not supported, so future call-outs degrade safely.
fn check_unknown_callout(report: &mut Report, config: &RunnerConfig, driver: &InstalledDriver) {
    let start = Instant::now();
    let argv = [std::ffi::OsStr::new(UNKNOWN_CALLOUT)];
    let outcome = runner::run_argv(config, &driver.path, CallOutKind::Init, &argv);
    let elapsed = start.elapsed();
    let (verdict, detail) = match outcome {
        Ok(raw) => match flexvolume_protocol::find_reply(&raw.stdout)
            .or_else(|| flexvolume_protocol::find_reply(&raw.stderr))
        {
            Some(reply) if reply.status == Status::NotSupported => {
                (Verdict::Pass, "Not supported".to_owned())
            }
            Some(reply) => (
                Verdict::Fail,
                format!(
                    "answered {:?}; unknown call-outs must answer Not supported",
                    reply.status
                ),
            ),
            None => (
                Verdict::Fail,
                format!(
                    "no JSON reply ({}); unknown call-outs must answer {{\"status\":\"Not supported\"}}",
                    raw.exit
                ),
            ),
        },
        Err(e) => (Verdict::Fail, e.to_string()),
    };
    report.push(UNKNOWN_CHECK, true, verdict, elapsed, detail);
}

/// getvolumename: valid JSON or Not supported (kubelet and flexd ignore the name; a failure
/// fails the operation).
fn check_getvolumename(
    report: &mut Report,
    config: &RunnerConfig,
    driver: &InstalledDriver,
    spec: &VolumeSpec,
) {
    let options = Options::for_volume(spec);
    let (reply, _, elapsed) = run_checked(config, driver, &CallOut::get_volume_name(&options));
    let (verdict, detail) = match reply {
        Ok(r) if r.status == Status::Success => match r.volume_name {
            Some(v) if !v.is_empty() => (Verdict::Pass, format!("volumeName {v:?}")),
            _ => (Verdict::Fail, "Success without a volumeName".to_owned()),
        },
        Ok(r) if r.status == Status::NotSupported => (
            Verdict::Pass,
            "Not supported (the volume's name is used)".to_owned(),
        ),
        Ok(r) => (Verdict::Warn, provision::answered(&r)),
        Err(e) => (Verdict::Fail, e),
    };
    report.push(GETVOLUMENAME_CHECK, true, verdict, elapsed, detail);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strict_json_is_one_object_and_nothing_else() {
        assert!(is_strict_json(b" {\"status\":\"Success\"}\n"));
        assert!(!is_strict_json(b"starting\n{\"status\":\"Success\"}"));
        assert!(!is_strict_json(b"[1]"));
    }

    #[test]
    fn durations_are_tenths_of_a_ms_and_skips_say_why() {
        let mut report = Report {
            driver: "a/x".into(),
            path: "/p/a~x/x".into(),
            passed: false,
            needs_options: false,
            checks: Vec::new(),
        };
        report.push(
            "advisory",
            false,
            Verdict::Warn,
            Duration::from_micros(1234),
            "",
        );
        report.skip(&[MOUNT_CHECK], true, "not run: mounting needs root");
        assert_eq!(report.checks[0].ms, 1.2);
        assert_eq!(report.checks[1].verdict, Verdict::Skip);
        assert_eq!(report.checks[1].detail, "not run: mounting needs root");
    }
}
