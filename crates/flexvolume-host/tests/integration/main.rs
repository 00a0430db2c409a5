//! flexvolume-host's integration tests as one test binary, a module per area: the library is
//! linked once instead of once per file. One area alone:
//! `cargo test -p flexvolume-host --test integration -- hostile::`. What the modules share
//! (sandboxes, driver writers, waiting) is the `test-support` crate.
//!
//! The modules run in one process, in parallel threads, so nothing in them changes
//! process-wide state. The runner caps drivers in pids cgroups: the first call-out moves this
//! process into its `flexd-daemon` leaf once, for every module, as it did per binary before.

mod hostile;
mod ownership;
mod prober;
mod runner;
