//! `flexd-loop`: the loop driver as its own executable (install it as `<plugin-dir>/flexd~loop/loop`).
//! flexd itself runs the same driver when invoked as `loop` (see `flexd install --builtin loop`).
fn main() -> std::process::ExitCode {
    flexvolume_driver::run(&flexvolume_loop::LoopDriver)
}
