//! The pure parts of `flexd`, built once and shared by the binary, the fuzzers and the tests:
//! the CSI name of a driver, the Kubernetes manifests flexd deploys with (`deploy`), users' own
//! manifests read as volume specs (`user_manifest`), the FlexVolume-to-CSI migration, what a
//! node's facts mean for flexd (`preflight`), how errors are printed, the generated CSI code
//! (server and client: the tests' harness talks to `flexd serve` with it) and the HTTP/2 pieces
//! every gRPC server on a Unix socket needs under tonic (`http2`: the bench's CSI floor uses them
//! too). No I/O here; everything that runs (the CLI, `flexd serve`) lives in the binary
//! (src/main.rs, src/cli/, src/serve/).

pub mod controller_records;
pub mod deploy;
pub mod errors;
pub mod http2;
pub mod migrate;
pub mod naming;
pub mod preflight;
pub mod proto;
pub mod user_manifest;
