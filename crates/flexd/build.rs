//! Compiles the CSI and plugin-registration protos with protox (a protobuf compiler in Rust),
//! so building flexd needs no `protoc` on the machine; and names the commit `flexd --version`
//! prints.

use std::process::Command;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = ["proto/csi.proto", "proto/pluginregistration.proto"];
    for proto in protos {
        println!("cargo:rerun-if-changed={proto}");
    }
    let descriptors = protox::compile(protos, ["proto"])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(descriptors)?;

    println!(
        "cargo:rustc-env=FLEXD_VERSION={} (commit {})",
        env!("CARGO_PKG_VERSION"),
        commit()
    );
    Ok(())
}

/// The commit flexd is built from: `FLEXD_COMMIT` (an image build, whose context has no .git),
/// else git's HEAD, else "unknown". Rebuilt when either changes.
fn commit() -> String {
    println!("cargo:rerun-if-env-changed=FLEXD_COMMIT");
    if let Ok(commit) = std::env::var("FLEXD_COMMIT") {
        if !commit.is_empty() {
            return commit;
        }
    }
    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|out| out.status.success())
            .and_then(|out| String::from_utf8(out.stdout).ok())
            .map(|out| out.trim().to_owned())
            .filter(|out| !out.is_empty())
    };
    if let Some(head) = git(&["rev-parse", "--git-path", "HEAD"]) {
        println!("cargo:rerun-if-changed={head}");
        if let Some(reference) = git(&["symbolic-ref", "-q", "HEAD"]) {
            // A packed ref has no file: a path that does not exist would rerun every build.
            if let Some(path) = git(&["rev-parse", "--git-path", &reference])
                .filter(|path| std::path::Path::new(path).exists())
            {
                println!("cargo:rerun-if-changed={path}");
            }
        }
    }
    git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".to_owned())
}
