//! The smallest useful FlexVolume driver: answers `init` (non-attachable) and says
//! `Not supported` to everything else. Compiled, so the call-out benchmark measures flexd's
//! overhead rather than a shell's start-up.
fn main() {
    let op = std::env::args().nth(1).unwrap_or_default();
    if op == "init" {
        println!(r#"{{"status":"Success","capabilities":{{"attach":false}}}}"#);
    } else {
        println!(r#"{{"status":"Not supported","message":"tiny driver: {op} not implemented"}}"#);
        std::process::exit(1);
    }
}
