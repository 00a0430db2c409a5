//! The parts of `flexd` that are pure enough to share with the fuzzers: manifest parsing.
//! Everything else lives in the binary (src/main.rs, src/cli/, src/serve/).

pub mod manifest;
