//! The workspace's `rust-version` (root Cargo.toml, `[workspace.package]`) is the oldest Rust
//! that builds it: the highest `rust-version` among the locked packages, as `cargo metadata
//! --locked` reports them. Every workspace member must carry the workspace's (they inherit it),
//! so what sets the minimum is the dependencies. A dependency update that needs a newer Rust, or
//! a `rust-version` changed by hand, fails here naming the packages that set the real minimum.
//! Every package of the lock file counts, whatever its platform or kind of dependency: `cargo
//! metadata` lists them all.

use std::collections::BTreeMap;
use std::process::Command;

use test_support::repo_path;

/// `1.89` or `1.89.0` as comparable numbers (a missing part is 0).
fn parse(version: &str) -> (u64, u64, u64) {
    let mut parts = version.split('.').map(|p| {
        p.parse::<u64>()
            .unwrap_or_else(|_| panic!("rust-version {version:?} is not N.N[.N]"))
    });
    let mut next = || parts.next().unwrap_or(0);
    (next(), next(), next())
}

#[test]
fn the_workspace_rust_version_is_the_highest_any_locked_package_needs() {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = Command::new(&cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--locked",
            "--manifest-path",
        ])
        .arg(repo_path("Cargo.toml"))
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cargo:?} metadata: {e}"));
    assert!(
        out.status.success(),
        "cargo metadata --locked failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let metadata: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let members: Vec<&str> = metadata["workspace_members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|id| id.as_str().unwrap())
        .collect();

    // Members (`name version` → their rust-version), and each dependency's rust-version.
    let mut member_versions = BTreeMap::new();
    let mut dependencies = Vec::new();
    for package in metadata["packages"].as_array().unwrap() {
        let label = format!(
            "{} {}",
            package["name"].as_str().unwrap(),
            package["version"].as_str().unwrap()
        );
        let rust_version = package["rust_version"].as_str().map(str::to_owned);
        if members.contains(&package["id"].as_str().unwrap()) {
            member_versions.insert(label, rust_version);
        } else if let Some(v) = rust_version {
            dependencies.push((parse(&v), v, label));
        }
    }

    // Every member inherits the workspace's (`rust-version.workspace = true`), so flexd's is it.
    let workspace = member_versions
        .iter()
        .find(|(label, _)| label.starts_with("flexd "))
        .and_then(|(_, v)| v.clone())
        .expect("flexd has a rust-version (rust-version.workspace = true)");
    let not_inheriting: Vec<String> = member_versions
        .iter()
        .filter(|(_, v)| v.as_deref() != Some(workspace.as_str()))
        .map(|(label, v)| format!("{label} ({})", v.as_deref().unwrap_or("none")))
        .collect();
    assert!(
        not_inheriting.is_empty(),
        "workspace members without the workspace's rust-version {workspace} (add \
         `rust-version.workspace = true`): {}",
        not_inheriting.join(", ")
    );

    // The members all say the workspace's, so the minimum is set by the dependencies.
    let wanted = parse(&workspace);
    let above: Vec<String> = dependencies
        .iter()
        .filter(|(parsed, ..)| *parsed > wanted)
        .map(|(_, v, label)| format!("{label} (rust-version {v})"))
        .collect();
    assert!(
        above.is_empty(),
        "root Cargo.toml says rust-version = {workspace:?}, but locked dependencies need more: \
         raise it to the highest of {}",
        above.join(", ")
    );
    let highest = dependencies.iter().map(|(parsed, ..)| *parsed).max();
    let setting: Vec<String> = dependencies
        .iter()
        .filter(|(parsed, ..)| Some(*parsed) == highest)
        .map(|(_, v, label)| format!("{label} (rust-version {v})"))
        .collect();
    assert_eq!(
        Some(wanted),
        highest,
        "root Cargo.toml says rust-version = {workspace:?}, more than any locked dependency \
         needs: lower it to what {} need",
        setting.join(", ")
    );
}
