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

pub use cli::*;
pub use sandbox::*;

/// Raises this test process's soft open-file limit to its hard one: for tests that hold more
/// connections than the default 1024 allows.
pub fn raise_open_files() {
    flexvolume_os::open_files::raise().expect("raise the open-file limit");
}
