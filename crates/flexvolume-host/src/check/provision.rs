//! The dynamic provisioning checks, for drivers whose `init` says `provision: true` (provision a
//! scratch volume, which the lifecycle checks then mount, then delete it), and how every check
//! words a driver's non-Success answer (with the error code it named, if any).

use std::time::Instant;

use super::{Report, Verdict, DELETE_CHECK, PROVISION_CHECK};
use crate::plugin::Plugin;
use crate::runner::RunnerConfig;
use flexvolume_protocol::options::Options;
use flexvolume_protocol::spec::VolumeSpec;
use flexvolume_protocol::{CallOut, ErrorCode, Reply};

/// What a driver answered, with the error code it named, if any.
pub(super) fn answered(reply: &Reply) -> String {
    match reply.code {
        Some(code) => format!("answered {:?} ({code}): {}", reply.status, reply.message),
        None => format!("answered {:?}: {}", reply.status, reply.message),
    }
}

/// `provision` of a small scratch volume (the check's options as StorageClass parameters, a
/// name of this run's own): the volume the lifecycle checks then mount, as a user's claim
/// would be. `None` when provision failed (the report says why).
pub(super) fn provision_scratch(
    report: &mut Report,
    plugin: &Plugin,
    spec: &VolumeSpec,
    config: &RunnerConfig,
) -> Option<VolumeSpec> {
    let start = Instant::now();
    let mut scratch = spec.clone();
    scratch.volume_name = format!("flexd-check-{}", std::process::id());
    let asked = Options::for_provision(&scratch, Some(SCRATCH_BYTES));
    match plugin.call(config, &CallOut::provision(&asked)) {
        Ok(reply) => {
            let kept = reply.options.unwrap_or_default();
            let detail = format!(
                "volume {} ({} MiB); options kept by the volume: {kept:?}",
                scratch.volume_name,
                SCRATCH_BYTES >> 20
            );
            scratch.options.extend(kept);
            report.push(
                PROVISION_CHECK,
                true,
                Verdict::Pass,
                start.elapsed(),
                detail,
            );
            Some(scratch)
        }
        Err(e) => {
            let detail = format!("provision: {e}");
            report.push(
                PROVISION_CHECK,
                true,
                Verdict::Fail,
                start.elapsed(),
                detail,
            );
            None
        }
    }
}

/// The size of the provisioned scratch volume: small, but room for a filesystem's metadata.
const SCRATCH_BYTES: u64 = 16 << 20;

/// `delete` of the provisioned scratch volume, then `delete` again: Success each time (the
/// second may say `NotFound`).
pub(super) fn delete_scratch(
    report: &mut Report,
    plugin: &Plugin,
    volume: &VolumeSpec,
    config: &RunnerConfig,
) {
    let start = Instant::now();
    let options = Options::for_provision(volume, None);
    let outcome = [false, true].into_iter().try_for_each(|again| {
        match plugin.call(config, &CallOut::delete(&options)) {
            Ok(_) => Ok(()),
            Err(e) if again && e.code() == Some(ErrorCode::NotFound) => Ok(()),
            Err(e) => Err(format!(
                "{}: {e}",
                if again { "delete again" } else { "delete" }
            )),
        }
    });
    let (verdict, detail) = match outcome {
        Ok(()) => (
            Verdict::Pass,
            format!("volume {} deleted", volume.volume_name),
        ),
        Err(e) => (Verdict::Fail, e),
    };
    report.push(DELETE_CHECK, true, verdict, start.elapsed(), detail);
}
