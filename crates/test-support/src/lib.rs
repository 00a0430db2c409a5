//! What the integration tests and benches of flexvolume-host and flexd share, as one crate instead
//! of files included by `#[path]` (ripgrep's tests share one util the same way):
//!
//! - [`sandbox`]: a test's directories that never leak a mount, driver writers, root checks
//!   that say visibly when a test did not run ([`require_root!`], [`skip!`]), waiting;
//! - [`cli`]: the real `flexd` binary run with a clean environment, on a sandbox;
//! - `serve` (feature `flexd`): the one gRPC harness, a `flexd serve` and CSI clients;
//! - `fuzz` (feature `flexd`): the fuzz targets' checks, which the normal suite runs on the
//!   committed seeds.
//!
//! Everything is re-exported at the root but the harness and the checks, so a test says
//! `test_support::Sandbox` and `test_support::serve::Server`.

pub mod cli;
#[cfg(feature = "flexd")]
pub mod fuzz;
pub mod sandbox;
#[cfg(feature = "flexd")]
pub mod serve;

// The common helpers at the root, named so a reader sees what the crate offers.
pub use cli::{
    assert_ext4_grew_or_names_cap_sys_resource, assert_fails_saying, assert_xfs_doubled,
    check_named, clean_flexd, flexd, flexd_command, flexd_exe, flexd_loop_exe, has_mkfs_xfs,
    install_driver, json_says, ok, output_ok, run_flexd, serve_command, stderr_of, stdout_json,
    stdout_of, stdout_ok, yaml_documents, Watch, ATTACHING_DRIVER, POD_MOUNT_ARGS, TMPFS_DRIVER,
};
pub use sandbox::{
    assert_device_mounted, assert_repeat_kept_the_mount, compile_tiny_driver, driver_script,
    driver_source, eventually, examples, executable_of, fill_disk, init_case, init_only_script,
    install_example, install_exe, is_dead, is_mounted, is_root, kill, loop_devices_below,
    make_fifo, mount_points, mount_tmpfs, mounts_below, output_of_new_executable, proc_stat,
    read_pid, repo_path, report_skip, sigkill, terminate, unmount_all_below, wait_dead,
    wait_for_path, wait_until, write_exe, Sandbox,
};

/// Raises this test process's soft open-file limit to its hard one: for tests that hold more
/// connections than the default 1024 allows. The limit is the whole process's, shared with
/// the tests running beside it; every flexd they start still gets the original one (see
/// `cli::clean_flexd`).
pub fn raise_open_files() {
    flexvolume_os::open_files::raise().expect("raise the open-file limit");
}
