//! Argument checks before exec: what the kernel would refuse is refused first.

use super::*;
use crate::runner::spawn;
use crate::runner::{run_argv, RunnerConfig};
use flexvolume_protocol::ExitStatus;

#[test]
fn argv_the_kernel_would_refuse_is_refused_before_exec() {
    let program = Path::new("/bin/true");
    let kind = CallOutKind::Mount;
    let env = spawn::environment();
    let fits = "x".repeat(max_arg_strlen() - 1);
    assert!(argv_fits(program, kind, &[fits.as_ref()], &env).is_ok());
    let one_more = "x".repeat(max_arg_strlen());
    let err = argv_fits(program, kind, &[one_more.as_ref()], &env).unwrap_err();
    assert!(err.to_string().contains("MAX_ARG_STRLEN"), "{err}");
    let nul = "a\0b";
    assert!(argv_fits(program, kind, &[nul.as_ref()], &env).is_err());
    // Many arguments each within the per-string limit, together beyond ARG_MAX.
    let chunk = "y".repeat(max_arg_strlen() / 2);
    let many: Vec<&std::ffi::OsStr> = (0..(arg_max() / chunk.len() + 2))
        .map(|_| chunk.as_ref())
        .collect();
    let err = argv_fits(program, kind, &many, &env).unwrap_err();
    assert!(err.to_string().contains("ARG_MAX"), "{err}");
    // The real exec agrees: what passes the check runs.
    let config = RunnerConfig::default();
    let out = run_argv(&config, program, kind, &[fits.as_ref()]).unwrap();
    assert_eq!(out.exit, ExitStatus::Code(0));
}
