//! Exit statuses, the same meaning in every command, and each command's line about them (its
//! `--help` ends with it; docs/cli.md's exit status table says the same).
//!
//! 1 is any error (main maps every error to it) and 2 is clap's for a bad command line. 3 is a
//! definite "no" that is not an error, so a script can branch on the answer without mistaking a
//! broken driver for it: `call` answering Not supported, `volume isattached` not attached,
//! `check` unable to mount a scratch volume that has no options.

/// The command worked, and the answer is no (Not supported, not attached).
pub const NO: u8 = 3;

pub const PLAIN: &str = "Exit status: 0 done, 1 error, 2 bad usage.";
pub const DRIVERS: &str =
    "Exit status: 0 listed (drivers that failed init are listed as failed), 1 error (e.g. no plugin dir), 2 bad usage.";
pub const CALL: &str = "Exit status: 0 Success, 1 Failure or error, 2 bad usage, 3 Not supported.";
pub const ISATTACHED: &str =
    "Exit status: 0 attached, 3 not attached, 1 error (the driver failed or could not run), 2 bad usage.";
pub const CHECK: &str =
    "Exit status: 0 every required check passed, 1 a required check failed or error, 2 bad usage, 3 none failed but the mount needs options the driver did not get.";
pub const OWNERSHIP: &str =
    "Exit status: 0 every entry has the group, 1 an entry could not be changed or error, 2 bad usage.";
pub const UNTIL_SIGNAL: &str = "Exit status: 0 stopped by SIGTERM or SIGINT, 1 error, 2 bad usage.";
pub const INSTALL: &str =
    "Exit status: 0 installed (with --then-sleep: then stopped by SIGTERM or SIGINT), 1 error, 2 bad usage.";
pub const MANIFESTS: &str =
    "Exit status: 0 printed, 1 error (a driver failed init, is unknown or has no CSI name), 2 bad usage.";
pub const PREFLIGHT: &str =
    "Exit status: 0 no error found (warnings allowed), 1 an error found on the node (or with --cluster in the cluster), or error, 2 bad usage.";
pub const VOLUME: &str = "Exit status: 0 done, 1 error, 2 bad usage; isattached: 3 not attached.";
pub const ALL: &str = "Exit status: 0 done, 1 error, 2 bad usage, 3 a definite no (call: Not supported; volume isattached: not attached; check: the mount needs options). Each command's --help says which apply.";
