//! flexd's integration tests as one test binary, a module per area: the crate and its
//! dependencies are linked once instead of once per file. One area alone:
//! `cargo test -p flexd --test integration -- serve::`. What the modules share (sandboxes,
//! driver writers, the flexd runner, the gRPC harness) is the `test-support` crate.
//!
//! The modules run in one process, in parallel threads: a test changes nothing process-wide
//! (umask, rlimits, environment, working directory); what a flexd it starts needs is set in that
//! child only (`test_support::serve::Launch`, `Command::pre_exec`).

mod bounds;
mod cli;
mod cli_reference;
mod concurrency;
mod csi_sanity;
mod deploy;
mod docs_commands;
mod ephemeral;
mod fuzz_seeds;
mod grpc_authority;
mod healthz;
mod hostile_csi;
mod install;
mod list_volumes;
mod loop_driver;
mod manifests;
mod migrate;
mod migrate_cluster;
mod migrate_rolling;
mod mount_namespace;
mod ownership;
mod preflight;
mod provision;
mod rust_version;
mod serve;
mod soak;
mod volume;
mod watch;
