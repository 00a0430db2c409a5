//! Opening files under the state dir without trusting what is there.
//!
//! Only root writes the state dir, but a node's disk, a backup restore or a mistaken `cp -a`
//! can leave anything in it: a FIFO named like a record blocked the reader in `open(2)` for
//! good (and with it every operation queued behind the listing), and a symlink to `/dev/zero`
//! was read until memory ran out. So every file is opened `O_NOFOLLOW | O_NONBLOCK` (an open
//! of a FIFO or a device returns at once, a symlink is refused), checked with `fstat` to be a
//! regular file, and a record is read only up to [`MAX_RECORD_BYTES`].

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

/// The largest record file read. A real record is well under 4 KiB (paths, names, a few
/// options; options are capped far below this by CSI's own request limits); 1 MiB is far above
/// any, and small enough that reading a bogus one costs nothing noticeable.
pub const MAX_RECORD_BYTES: u64 = 1024 * 1024;

/// What an entry named like a state file is, when it is not a regular file one can use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    Symlink,
    Fifo,
    Directory,
    CharDevice,
    BlockDevice,
    Socket,
    /// A regular file larger than [`MAX_RECORD_BYTES`].
    Oversized {
        bytes: u64,
    },
}

impl EntryKind {
    /// A short stable name, for metrics and JSON (`fifo`, `symlink`, …).
    pub fn as_str(&self) -> &'static str {
        match self {
            EntryKind::Symlink => "symlink",
            EntryKind::Fifo => "fifo",
            EntryKind::Directory => "directory",
            EntryKind::CharDevice => "char-device",
            EntryKind::BlockDevice => "block-device",
            EntryKind::Socket => "socket",
            EntryKind::Oversized { .. } => "oversized",
        }
    }

    /// What a file type is when it is not a regular file.
    pub(super) fn of(file_type: fs::FileType) -> Option<Self> {
        if file_type.is_file() {
            None
        } else if file_type.is_symlink() {
            Some(EntryKind::Symlink)
        } else if file_type.is_fifo() {
            Some(EntryKind::Fifo)
        } else if file_type.is_dir() {
            Some(EntryKind::Directory)
        } else if file_type.is_char_device() {
            Some(EntryKind::CharDevice)
        } else if file_type.is_block_device() {
            Some(EntryKind::BlockDevice)
        } else {
            Some(EntryKind::Socket)
        }
    }
}

impl std::fmt::Display for EntryKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EntryKind::Symlink => f.write_str("a symbolic link"),
            EntryKind::Fifo => f.write_str("a FIFO"),
            EntryKind::Directory => f.write_str("a directory"),
            EntryKind::CharDevice => f.write_str("a character device"),
            EntryKind::BlockDevice => f.write_str("a block device"),
            EntryKind::Socket => f.write_str("a socket"),
            EntryKind::Oversized { bytes } => write!(
                f,
                "a file of {bytes} bytes (a record is at most {MAX_RECORD_BYTES})"
            ),
        }
    }
}

/// Why a state file could not be opened or read.
#[derive(Debug)]
pub(super) enum OpenError {
    Io(io::Error),
    NotRegular(EntryKind),
}

impl From<io::Error> for OpenError {
    fn from(e: io::Error) -> Self {
        OpenError::Io(e)
    }
}

/// `O_NOFOLLOW | O_NONBLOCK | O_NOCTTY` (std adds `O_CLOEXEC`): never follows a symlink,
/// never waits for a FIFO's other end or a device.
const GUARDED: i32 = libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY;

/// The open file at `path` when it is a regular one. `O_NOFOLLOW` answers `ELOOP` for a
/// symlink; a socket, or a FIFO opened for writing with no reader, answers `ENXIO`.
fn checked(path: &Path, opened: io::Result<File>) -> Result<File, OpenError> {
    let file = match opened {
        Ok(file) => file,
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(OpenError::NotRegular(EntryKind::Symlink))
        }
        Err(e) if e.raw_os_error() == Some(libc::ENXIO) => {
            let kind = fs::symlink_metadata(path)
                .ok()
                .and_then(|m| EntryKind::of(m.file_type()));
            return Err(OpenError::NotRegular(kind.unwrap_or(EntryKind::Socket)));
        }
        Err(e) => return Err(e.into()),
    };
    match EntryKind::of(file.metadata()?.file_type()) {
        None => Ok(file),
        Some(kind) => Err(OpenError::NotRegular(kind)),
    }
}

/// The bytes of the record file at `path`: the one reader of record files (volume records,
/// provisioned volumes).
pub(super) fn read_record(path: &Path) -> Result<Vec<u8>, OpenError> {
    let mut file = checked(
        path,
        OpenOptions::new()
            .read(true)
            .custom_flags(GUARDED)
            .open(path),
    )?;
    let size = file.metadata()?.len();
    if size > MAX_RECORD_BYTES {
        return Err(OpenError::NotRegular(EntryKind::Oversized { bytes: size }));
    }
    // Bounded again while reading: the file may grow after the fstat.
    let mut bytes = Vec::with_capacity(size as usize);
    (&mut file)
        .take(MAX_RECORD_BYTES + 1)
        .read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_RECORD_BYTES {
        let bytes = file.metadata().map_or(bytes.len() as u64, |m| m.len());
        return Err(OpenError::NotRegular(EntryKind::Oversized { bytes }));
    }
    Ok(bytes)
}

/// Opens (creating it when missing, never truncating) a regular file for writing: markers and
/// lock files. Something else at the path is an error, not followed or waited on.
pub(super) fn open_for_writing(path: &Path) -> Result<File, OpenError> {
    checked(
        path,
        OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(GUARDED)
            .open(path),
    )
}

/// Creates `path` afresh as an empty regular file for writing: whatever was there (a file a
/// crash left, or anything else that is not a directory) is removed first, so nothing is
/// followed or waited on. For files only this process writes (a record's temporary file).
pub(crate) fn create_fresh(path: &Path) -> io::Result<File> {
    match fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(GUARDED)
        .open(path)
}

/// Creates `path` and its missing parents owner-only (0700), whatever the umask: the state
/// dir holds volume options and pinned drivers that only flexd reads.
pub(crate) fn create_private_dir_all(path: &Path) -> io::Result<()> {
    use std::os::unix::fs::DirBuilderExt as _;
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)
}

/// Opens a directory to sync it or set its times; anything else at the path is an error.
pub(crate) fn open_dir(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(GUARDED | libc::O_DIRECTORY)
        .open(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(result: Result<Vec<u8>, OpenError>) -> Option<EntryKind> {
        match result {
            Err(OpenError::NotRegular(kind)) => Some(kind),
            _ => None,
        }
    }

    #[test]
    fn reads_a_regular_file_and_refuses_everything_else_without_waiting() {
        let dir = tempfile::tempdir().unwrap();
        let at = |name: &str| dir.path().join(name);
        fs::write(at("good.json"), b"{}").unwrap();
        assert_eq!(read_record(&at("good.json")).unwrap(), b"{}");

        rustix::fs::mknodat(
            rustix::fs::CWD,
            at("fifo.json"),
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o644),
            0,
        )
        .unwrap();
        std::os::unix::fs::symlink("/dev/zero", at("zero.json")).unwrap();
        std::os::unix::fs::symlink(at("good.json"), at("link.json")).unwrap();
        fs::create_dir(at("dir.json")).unwrap();
        let _socket = std::os::unix::net::UnixListener::bind(at("socket.json")).unwrap();
        let big = File::create(at("big.json")).unwrap();
        big.set_len(MAX_RECORD_BYTES + 1).unwrap();

        // Each answers at once (a FIFO's open would block without O_NONBLOCK, /dev/zero's read
        // would never end): a hang here is the bug.
        let refused = [
            (at("fifo.json"), EntryKind::Fifo),
            (at("zero.json"), EntryKind::Symlink),
            (at("link.json"), EntryKind::Symlink),
            (at("dir.json"), EntryKind::Directory),
            (at("socket.json"), EntryKind::Socket),
            (
                at("big.json"),
                EntryKind::Oversized {
                    bytes: MAX_RECORD_BYTES + 1,
                },
            ),
            ("/dev/zero".into(), EntryKind::CharDevice),
        ];
        for (path, expected) in refused {
            assert_eq!(kind(read_record(&path)), Some(expected), "{path:?}");
        }
        // At the cap exactly: read.
        big.set_len(MAX_RECORD_BYTES).unwrap();
        assert_eq!(
            read_record(&at("big.json")).unwrap().len() as u64,
            MAX_RECORD_BYTES
        );
        assert!(matches!(
            read_record(&at("missing.json")),
            Err(OpenError::Io(e)) if e.kind() == io::ErrorKind::NotFound
        ));

        // Writers neither follow nor wait either; a fresh file replaces what was there.
        assert!(matches!(
            open_for_writing(&at("fifo.json")),
            Err(OpenError::NotRegular(EntryKind::Fifo))
        ));
        assert!(matches!(
            open_for_writing(&at("link.json")),
            Err(OpenError::NotRegular(EntryKind::Symlink))
        ));
        assert_eq!(fs::read(at("good.json")).unwrap(), b"{}", "not truncated");
        create_fresh(&at("fifo.json")).unwrap();
        assert!(fs::symlink_metadata(at("fifo.json")).unwrap().is_file());
        assert!(open_dir(&at("good.json")).is_err());
        assert!(open_dir(dir.path()).is_ok());
    }
}
