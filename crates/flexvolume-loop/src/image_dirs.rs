//! The image directories the operator allows: a volume's `imageDir` option (a StorageClass
//! parameter, a PV's options) may only name one of them.
//!
//! They are a file beside the driver executable, `<plugin-dir>/flexd~loop/image-dirs`, written
//! by `flexd install --builtin loop --image-dir DIR...`: a driver's environment is whatever
//! its caller's is (kubelet's, flexd's), while the file travels with the install. One absolute
//! path per line; blank lines and `#` comments are ignored. No file: [`DEFAULT_IMAGE_DIR`]
//! alone.

use std::fs;
use std::io;
use std::path::{Component, Path, PathBuf};

use crate::DEFAULT_IMAGE_DIR;

/// The file's name in the driver's directory.
pub const FILE_NAME: &str = "image-dirs";

/// The allowed image directories, normalised (`//a/./b/` is `/a/b`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageDirs(Vec<PathBuf>);

/// Why the allowed set cannot be known; every call-out fails with it rather than guess.
#[derive(Debug, thiserror::Error)]
pub enum ImageDirsError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path} line {line}: {dir:?} is not an absolute path without '..'")]
    NotAbsolute {
        path: PathBuf,
        line: usize,
        dir: String,
    },
    #[error("image dir {dir:?} is not an absolute path without '..'")]
    BadDir { dir: PathBuf },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// `dir` as an absolute path with no `.`, `..` or repeated `/`, or `None`.
pub fn normalise(dir: &Path) -> Option<PathBuf> {
    let plain = dir.is_absolute()
        && dir.components().all(|c| {
            matches!(
                c,
                Component::RootDir | Component::CurDir | Component::Normal(_)
            )
        });
    plain.then(|| dir.components().collect())
}

impl Default for ImageDirs {
    fn default() -> Self {
        Self(vec![PathBuf::from(DEFAULT_IMAGE_DIR)])
    }
}

impl ImageDirs {
    /// Exactly these directories (each checked and normalised).
    pub fn new<P: AsRef<Path>>(dirs: impl IntoIterator<Item = P>) -> Result<Self, ImageDirsError> {
        let mut out = Vec::new();
        for dir in dirs {
            let dir = dir.as_ref();
            let normal = normalise(dir).ok_or_else(|| ImageDirsError::BadDir {
                dir: dir.to_owned(),
            })?;
            if !out.contains(&normal) {
                out.push(normal);
            }
        }
        Ok(Self(out))
    }

    /// The set configured in `driver_dir` (the default one when there is no file).
    pub fn read(driver_dir: &Path) -> Result<Self, ImageDirsError> {
        let path = driver_dir.join(FILE_NAME);
        let text = match fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Self::default()),
            Err(source) => return Err(ImageDirsError::Read { path, source }),
        };
        let mut dirs = Vec::new();
        for (index, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let dir = normalise(Path::new(line)).ok_or_else(|| ImageDirsError::NotAbsolute {
                path: path.clone(),
                line: index + 1,
                dir: line.to_owned(),
            })?;
            if !dirs.contains(&dir) {
                dirs.push(dir);
            }
        }
        Ok(Self(dirs))
    }

    /// The set configured beside the running executable (its plugin dir entry).
    pub fn beside_executable() -> Result<Self, ImageDirsError> {
        let exe = std::env::current_exe().map_err(|source| ImageDirsError::Read {
            path: PathBuf::from("/proc/self/exe"),
            source,
        })?;
        Self::read(exe.parent().unwrap_or(Path::new("/")))
    }

    /// Writes the set into `driver_dir` atomically (a new temp file, fsync, rename).
    pub fn write(&self, driver_dir: &Path) -> Result<PathBuf, ImageDirsError> {
        let path = driver_dir.join(FILE_NAME);
        let temp = driver_dir.join(format!(".{FILE_NAME}.{}", std::process::id()));
        let mut text = String::from(
            "# Image dirs the flexd/loop driver may use (written by flexd install --builtin loop)\n",
        );
        for dir in &self.0 {
            text.push_str(&dir.to_string_lossy());
            text.push('\n');
        }
        // Made anew and renamed into place: never written through a symlink at either name.
        crate::files::write_atomically(&path, &temp, text.as_bytes(), 0o644).map_err(|source| {
            ImageDirsError::Write {
                path: path.clone(),
                source,
            }
        })?;
        Ok(path)
    }

    /// Where a volume whose options name no `imageDir` lives: the first dir the operator gave.
    pub fn default_dir(&self) -> &Path {
        self.0
            .first()
            .map_or(Path::new(DEFAULT_IMAGE_DIR), PathBuf::as_path)
    }

    pub fn contains(&self, dir: &Path) -> bool {
        self.0.iter().any(|d| d == dir)
    }

    pub fn iter(&self) -> impl Iterator<Item = &Path> {
        self.0.iter().map(PathBuf::as_path)
    }

    /// For messages: `/a, /b` (or `none`).
    pub fn describe(&self) -> String {
        if self.0.is_empty() {
            return "none".to_owned();
        }
        let shown: Vec<_> = self.0.iter().map(|d| d.display().to_string()).collect();
        shown.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_file_is_the_default_dir_and_a_file_is_exactly_its_dirs() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(ImageDirs::read(dir.path()).unwrap(), ImageDirs::default());
        let set = ImageDirs::new(["/srv/a/", "//srv/./b", "/srv/a"]).unwrap();
        set.write(dir.path()).unwrap();
        let read = ImageDirs::read(dir.path()).unwrap();
        assert_eq!(read, set);
        assert!(read.contains(Path::new("/srv/a")) && read.contains(Path::new("/srv/b")));
        assert!(!read.contains(Path::new(DEFAULT_IMAGE_DIR)));
        assert_eq!(read.describe(), "/srv/a, /srv/b");
    }

    #[test]
    fn writing_never_follows_a_symlink_planted_at_either_name() {
        let dir = tempfile::tempdir().unwrap();
        let driver_dir = dir.path().join("driver");
        fs::create_dir(&driver_dir).unwrap();
        let victims = [dir.path().join("victim"), dir.path().join("temp-victim")];
        for victim in &victims {
            fs::write(victim, "host data\n").unwrap();
        }
        let temp = driver_dir.join(format!(".{FILE_NAME}.{}", std::process::id()));
        std::os::unix::fs::symlink(&victims[0], driver_dir.join(FILE_NAME)).unwrap();
        std::os::unix::fs::symlink(&victims[1], &temp).unwrap();
        let set = ImageDirs::new(["/srv/a"]).unwrap();
        set.write(&driver_dir).unwrap();
        for victim in &victims {
            assert_eq!(fs::read_to_string(victim).unwrap(), "host data\n");
        }
        let written = fs::symlink_metadata(driver_dir.join(FILE_NAME)).unwrap();
        assert!(written.is_file(), "the link is replaced");
        assert!(!temp.exists());
        assert_eq!(ImageDirs::read(&driver_dir).unwrap(), set);
    }

    #[test]
    fn a_relative_or_dotted_dir_is_refused_with_its_line() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join(FILE_NAME), "# c\n\n/ok\nrelative\n").unwrap();
        let err = ImageDirs::read(dir.path()).unwrap_err().to_string();
        assert!(err.contains("line 4") && err.contains("relative"), "{err}");
        fs::write(dir.path().join(FILE_NAME), "/srv/../etc\n").unwrap();
        assert!(ImageDirs::read(dir.path()).is_err());
        assert!(ImageDirs::new(["/srv/../etc"]).is_err());
        assert!(ImageDirs::new(["srv"]).is_err());
    }
}
