//! The baseline for bench/ownership.sh: Kubernetes' SetVolumeOwnership (pkg/volume/
//! volume_linux.go) ported as it is: one thread, `filepath.Walk` (lstat of every full path),
//! then lchown and chmod on every entry whether it needs it or not.
//!
//! Usage: kubernetes_ownership_walk DIR GID

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

fn walk(path: &Path, gid: u32) -> std::io::Result<()> {
    let meta = std::fs::symlink_metadata(path)?;
    std::os::unix::fs::lchown(path, None, Some(gid))?;
    if !meta.file_type().is_symlink() {
        let mut mode = meta.permissions().mode() | 0o660;
        if meta.is_dir() {
            mode |= 0o2110;
        }
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    }
    if meta.is_dir() {
        for entry in std::fs::read_dir(path)? {
            walk(&entry?.path(), gid)?;
        }
    }
    Ok(())
}

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let (Some(dir), Some(gid)) = (args.get(1), args.get(2).and_then(|g| g.parse().ok())) else {
        eprintln!("usage: kubernetes_ownership_walk DIR GID");
        return std::process::ExitCode::from(2);
    };
    match walk(Path::new(dir), gid) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{dir}: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
