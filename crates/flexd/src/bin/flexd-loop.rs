//! `flexd-loop`: the builtin loop driver as a small executable of its own. `flexd install
//! --builtin loop` installs it (as `<plugin-dir>/flexd~loop/loop`) when it sits beside flexd,
//! and flexd itself (which runs the driver when invoked as `loop`) otherwise.
fn main() -> std::process::ExitCode {
    flexvolume_driver::run(&flexvolume_loop::LoopDriver::configured())
}
