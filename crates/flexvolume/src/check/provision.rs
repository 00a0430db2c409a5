//! The dynamic provisioning check, for drivers whose `init` says `provision: true`, and how
//! every check words a driver's non-Success answer (with the error code it named, if any).

use std::time::Instant;

use super::{Report, Verdict, PROVISION_CHECK};
use crate::options::Options;
use crate::plugin::Plugin;
use crate::protocol::{CallOut, ErrorCode, Reply};
use crate::runner::RunnerConfig;
use crate::spec::VolumeSpec;

/// What a driver answered, with the error code it named, if any.
pub(super) fn answered(reply: &Reply) -> String {
    match reply.code {
        Some(code) => format!("answered {:?} ({code}): {}", reply.status, reply.message),
        None => format!("answered {:?}: {}", reply.status, reply.message),
    }
}

/// `provision` of a small scratch volume (the check's options as StorageClass parameters),
/// then `delete` of it, then `delete` again: Success each time (the last may say `NotFound`).
pub(super) fn check_provision(
    report: &mut Report,
    plugin: &Plugin,
    spec: &VolumeSpec,
    config: &RunnerConfig,
) {
    let start = Instant::now();
    let mut scratch = spec.clone();
    scratch.volume_name = "flexd-check-provisioned".to_owned();
    let asked = Options::for_provision(&scratch, Some(16 << 20));
    let outcome = (|| -> Result<String, String> {
        let reply = plugin
            .call(config, &CallOut::provision(&asked))
            .map_err(|e| format!("provision: {e}"))?;
        let kept = reply.options.unwrap_or_default();
        scratch.options.extend(kept.clone());
        let volume = Options::for_provision(&scratch, None);
        for again in [false, true] {
            match plugin.call(config, &CallOut::delete(&volume)) {
                Ok(_) => {}
                Err(e) if again && e.code() == Some(ErrorCode::NotFound) => {}
                Err(e) => {
                    let round = if again { "delete again" } else { "delete" };
                    return Err(format!("{round}: {e}"));
                }
            }
        }
        Ok(format!("options kept by the volume: {kept:?}"))
    })();
    let (verdict, detail) = match outcome {
        Ok(detail) => (Verdict::Pass, detail),
        Err(e) => (Verdict::Fail, e),
    };
    report.push(PROVISION_CHECK, true, verdict, start.elapsed(), detail);
}
