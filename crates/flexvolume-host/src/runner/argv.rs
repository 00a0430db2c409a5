//! The kernel's limits on argv and environment, checked before any exec.

use std::ffi::{CString, OsStr};
use std::path::Path;

use flexvolume_protocol::CallOutKind;

use super::error::CallError;

/// The kernel's limit on one argv or environment string, NUL included (`MAX_ARG_STRLEN`: 32
/// pages). The options JSON is one such string, so it bounds everything a mount carries.
pub(crate) fn max_arg_strlen() -> usize {
    32 * rustix::param::page_size()
}

/// The kernel's limit on argv and environment together (`ARG_MAX`, a quarter of the stack
/// limit); 128 KiB, the historic minimum, when it cannot be read.
pub(crate) fn arg_max() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_ARG_MAX) };
    usize::try_from(n)
        .ok()
        .filter(|n| *n > 0)
        .unwrap_or(128 * 1024)
}

/// Refuses, before any exec, a call-out that the kernel would refuse with E2BIG (or that holds
/// a NUL byte, which no argv string can): a typed error that names the limit, instead of an
/// "Argument list too long" from the exec.
pub(super) fn argv_fits(
    program: &Path,
    kind: CallOutKind,
    argv: &[&OsStr],
    envp: &[CString],
) -> Result<(), CallError> {
    use std::os::unix::ffi::OsStrExt;
    let refuse = |reason: String| CallError::Arguments {
        path: program.to_owned(),
        kind,
        reason,
    };
    let per_string = max_arg_strlen();
    for (i, arg) in argv.iter().enumerate() {
        let bytes = arg.as_bytes();
        if bytes.contains(&0) {
            return Err(refuse(format!("argument {} contains a NUL byte", i + 1)));
        }
        if bytes.len() + 1 > per_string {
            return Err(refuse(format!(
                "argument {} is {} bytes; the kernel takes at most {} per argument (MAX_ARG_STRLEN)",
                i + 1,
                bytes.len(),
                per_string - 1
            )));
        }
    }
    let pointer = std::mem::size_of::<usize>();
    let strings = |items: &mut dyn Iterator<Item = usize>| -> usize {
        items.map(|len| len + 1 + pointer).sum::<usize>() + pointer
    };
    let env = strings(&mut envp.iter().map(|pair| pair.as_bytes().len()));
    let args = strings(
        &mut std::iter::once(program.as_os_str().len()).chain(argv.iter().map(|a| a.len())),
    );
    let limit = arg_max();
    if env + args > limit {
        return Err(refuse(format!(
            "its arguments and environment are {} bytes; the kernel takes at most {limit} (ARG_MAX)",
            env + args
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
