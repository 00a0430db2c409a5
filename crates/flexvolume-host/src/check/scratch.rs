//! The lifecycle checks: a scratch volume mounted and unmounted through flexd's lifecycle
//! (kubelet's flow, defaults included), and the driver's own mount and unmount run twice, which
//! kubelet does after a restart or a retry.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use super::{
    run_checked, Report, Verdict, ISATTACHED_CHECK, MOUNT_AGAIN_CHECK, MOUNT_CHECK,
    UNMOUNT_AGAIN_CHECK, UNMOUNT_CHECK,
};
use crate::lifecycle::{DriverResolver, Lifecycle, LifecycleError, MountRequest};
use crate::plugin::Plugin;
use crate::runner::CallError;
use crate::runner::RunnerConfig;
use crate::state::{StateDir, VolumeRecord};
use flexvolume_os::mount;
use flexvolume_protocol::options::Options;
use flexvolume_protocol::spec::{PodInfo, VolumeSpec};
use flexvolume_protocol::{CallOut, Reply, Status};

/// A scratch directory for the lifecycle checks; whatever is still mounted below it is
/// unmounted (lazily) and the directory removed when dropped, even if a check failed midway.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        if let Ok(table) = mount::mount_table() {
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

/// The scratch volume is torn down with the plugin that set it up.
struct Same(Arc<Plugin>);

impl DriverResolver for Same {
    fn resolve(&self, _: &VolumeRecord) -> Option<Arc<Plugin>> {
        Some(self.0.clone())
    }
}

/// What the checks share: the driver, its scratch volume and where it is mounted.
struct Bench<'a> {
    plugin: Arc<Plugin>,
    spec: &'a VolumeSpec,
    config: &'a RunnerConfig,
    lifecycle: Lifecycle,
    pod: PodInfo,
    target: PathBuf,
    scratch: Scratch,
}

impl Bench<'_> {
    /// How many times the target is mounted now.
    fn mounted_here(&self) -> usize {
        mount_count(&self.target)
    }
}

fn mount_count(target: &Path) -> usize {
    mount::mount_table()
        .map(|t| t.iter().filter(|m| m.mount_point == target).count())
        .unwrap_or(0)
}

/// `may_need_options`: the scratch volume has no options at all, so a driver's Failure of the
/// mount may mean it needs some ([`Verdict::NeedsOptions`]) rather than that it is broken.
pub(super) fn lifecycle_checks(
    report: &mut Report,
    plugin: Arc<Plugin>,
    spec: &VolumeSpec,
    config: &RunnerConfig,
    may_need_options: bool,
) {
    let scratch = Scratch(std::env::temp_dir().join(format!(
        "flexd-check-{}-{}",
        std::process::id(),
        spec.driver.dir_name()
    )));
    let bench = Bench {
        plugin,
        spec,
        config,
        lifecycle: Lifecycle::new(
            config.clone(),
            StateDir::new(scratch.0.join("state")),
            rustix::system::uname()
                .nodename()
                .to_string_lossy()
                .into_owned(),
        ),
        pod: PodInfo::default(),
        target: scratch.0.join("target"),
        scratch,
    };
    let mounted = check_mount(report, &bench, may_need_options);
    if mounted != Verdict::Pass {
        let why = if mounted == Verdict::NeedsOptions {
            "not run: the mount needs options"
        } else {
            "not run: mount failed"
        };
        report.skip(
            &[
                ISATTACHED_CHECK,
                MOUNT_AGAIN_CHECK,
                UNMOUNT_CHECK,
                UNMOUNT_AGAIN_CHECK,
            ],
            true,
            why,
        );
        return;
    }
    check_isattached(report, &bench);
    check_mount_again(report, &bench);
    check_unmount(report, &bench);
    check_unmount_again(report, &bench);
}

/// The whole flow on the scratch target: Pass when something got mounted there.
fn check_mount(report: &mut Report, bench: &Bench<'_>, may_need_options: bool) -> Verdict {
    let request = MountRequest {
        plugin: &bench.plugin,
        spec: bench.spec,
        pod: &bench.pod,
        fs_group: None,
        fs_group_policy: Default::default(),
        target: &bench.target,
    };
    let start = Instant::now();
    let mounted = bench.lifecycle.mount(&request);
    let elapsed = start.elapsed();
    let (verdict, detail) = match &mounted {
        Ok(outcome) if bench.mounted_here() > 0 => (
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
        // The driver's own answer to a volume without options: it says what it needs.
        Err(LifecycleError::Call(CallError::Failure { kind, message, .. })) if may_need_options => {
            (
                Verdict::NeedsOptions,
                format!(
                    "{kind} answered Failure for a scratch volume without options: {message:?}; \
                 give the options a real volume has with --options '{{\"key\":\"value\"}}'"
                ),
            )
        }
        // Call-out errors are redacted by the runner; the scratch volume has no secrets.
        Err(e) => (Verdict::Fail, e.to_string()),
    };
    report.push(MOUNT_CHECK, true, verdict, elapsed, detail);
    verdict
}

/// isattached, while the volume is attached: kubelet and the controller manager rely on it.
fn check_isattached(report: &mut Report, bench: &Bench<'_>) {
    if !bench.plugin.capabilities.attach {
        report.skip(&[ISATTACHED_CHECK], false, "the driver does not attach");
        return;
    }
    let options = Options::for_volume(bench.spec);
    let call = CallOut::is_attached(&options, &bench.lifecycle.node);
    let attached = |r: &Reply| match r.attached {
        Some(true) => (Verdict::Pass, "attached: true".to_owned()),
        _ => (
            Verdict::Fail,
            "answered attached: false (or nothing) right after attach".to_owned(),
        ),
    };
    check_call(
        report,
        bench,
        ISATTACHED_CHECK,
        &call,
        "treated as attached",
        attached,
    );
}

/// The driver's own mount, again, on the mounted target.
fn check_mount_again(report: &mut Report, bench: &Bench<'_>) {
    let options = Options::for_mount(bench.spec, &bench.pod, None);
    let call = CallOut::mount(&bench.target, &options);
    let stacked = |_: &Reply| match bench.mounted_here() {
        // Each retry by kubelet would leak one more mount.
        n if n > 1 => (
            Verdict::Fail,
            format!("Success, but the target is now mounted {n} times: each repeat stacks a mount"),
        ),
        _ => (Verdict::Pass, "Success".to_owned()),
    };
    check_call(
        report,
        bench,
        MOUNT_AGAIN_CHECK,
        &call,
        "flexd bind-mounts the device",
        stacked,
    );
}

/// flexd's teardown leaves nothing mounted under the scratch directory.
fn check_unmount(report: &mut Report, bench: &Bench<'_>) {
    // Whatever the repeated mount stacked is flexd's lifecycle's to tear down first.
    while bench.mounted_here() > 1 {
        if mount::unmount(&bench.target).is_err() {
            break;
        }
    }
    let start = Instant::now();
    let unmounted = bench
        .lifecycle
        .unmount(&bench.target, &Same(bench.plugin.clone()));
    let elapsed = start.elapsed();
    let leftovers = mount::mount_table()
        .map(|t| {
            t.iter()
                .filter(|m| m.mount_point.starts_with(&bench.scratch.0))
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
}

/// The driver's own unmount, again, on a target that is no longer mounted.
fn check_unmount_again(report: &mut Report, bench: &Bench<'_>) {
    let _ = std::fs::create_dir_all(&bench.target);
    let call = CallOut::unmount(&bench.target);
    check_call(
        report,
        bench,
        UNMOUNT_AGAIN_CHECK,
        &call,
        "flexd unmounts itself",
        |_| (Verdict::Pass, "Success".to_owned()),
    );
}

/// Runs one of the driver's own call-outs on the scratch volume as the required check `check`:
/// Success as `success` judges it, Not supported a pass (flexd's default, `not_supported`,
/// covers it), any other answer or failure a fail.
fn check_call(
    report: &mut Report,
    bench: &Bench<'_>,
    check: &str,
    call: &CallOut,
    not_supported: &str,
    success: impl FnOnce(&Reply) -> (Verdict, String),
) {
    let (reply, _, elapsed) = run_checked(bench.config, &bench.plugin.driver, call);
    let (verdict, detail) = match reply {
        Ok(r) if r.status == Status::Success => success(&r),
        Ok(r) if r.status == Status::NotSupported => {
            (Verdict::Pass, format!("Not supported ({not_supported})"))
        }
        Ok(r) => (Verdict::Fail, super::provision::answered(&r)),
        Err(e) => (Verdict::Fail, e),
    };
    report.push(check, true, verdict, elapsed, detail);
}
