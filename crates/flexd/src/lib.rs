//! The parts of `flexd` that are pure enough to share with the fuzzers and the tests: manifest
//! parsing, the FlexVolume-to-CSI conversion, and the CSI name of a driver. Everything else
//! lives in the binary (src/main.rs, src/cli/, src/serve/).

pub mod manifest;
pub mod migrate;
/// The very file `flexd serve` names its endpoints with, so a migrated object and the server
/// can never disagree on a driver's CSI name.
#[path = "serve/naming.rs"]
pub mod naming;
