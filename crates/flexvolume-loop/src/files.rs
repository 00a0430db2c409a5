//! Files in an image dir, opened and written so that a planted name does nothing. In a cluster the
//! image dir is shared storage: another node's root, or any client of the NFS export, can put a
//! symlink, a FIFO or a device node where the driver expects its own file. So no path is ever
//! followed through a symlink, nothing but a regular file is ever opened (a FIFO would block; a
//! device node is some disk of this host), and every file the driver writes is a new one it made
//! itself, renamed into place: whatever was at the name is replaced, never written through.

use std::fs::{self, File, Metadata, OpenOptions};
use std::io::{self, Read as _, Write as _};
use std::os::fd::{AsRawFd as _, OwnedFd};
use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags};

/// A file's identity: the device it is on and its inode, as the kernel compares them (a loop
/// device's backing file included).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Identity {
    pub major: u32,
    pub minor: u32,
    pub ino: u64,
}

impl Identity {
    pub(crate) fn of(meta: &Metadata) -> Self {
        Self {
            major: rustix::fs::major(meta.dev()),
            minor: rustix::fs::minor(meta.dev()),
            ino: meta.ino(),
        }
    }
}

/// What `file_type` is, for messages: "a symlink", "a FIFO", "a block device" …
pub(crate) fn describe(file_type: fs::FileType) -> &'static str {
    if file_type.is_file() {
        "a regular file"
    } else if file_type.is_symlink() {
        "a symlink"
    } else if file_type.is_dir() {
        "a directory"
    } else if file_type.is_fifo() {
        "a FIFO"
    } else if file_type.is_block_device() {
        "a block device"
    } else if file_type.is_char_device() {
        "a character device"
    } else if file_type.is_socket() {
        "a socket"
    } else {
        "a file of unknown type"
    }
}

/// The error for a name that holds `file_type`, not a regular file.
pub(crate) fn not_regular(file_type: fs::FileType) -> io::Error {
    let what = describe(file_type);
    let never = if file_type.is_symlink() {
        " (never followed)"
    } else {
        ""
    };
    io::Error::other(format!("it is {what}{never}, not a regular file"))
}

/// A regular file found at a path without following a symlink and without opening it: an
/// `O_PATH` descriptor opens nothing (no FIFO's open blocks, no device's driver runs).
#[derive(Debug)]
pub(crate) struct Found {
    fd: OwnedFd,
    pub identity: Identity,
}

/// The regular file at `path`; anything else there (a symlink, even to a regular file, a FIFO, a
/// device, a directory) is an error saying what it is. `NotFound` when there is nothing.
pub(crate) fn look(path: &Path) -> io::Result<Found> {
    let fd = rustix::fs::open(
        path,
        OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let meta = File::from(fd.try_clone()?).metadata()?;
    if !meta.file_type().is_file() {
        return Err(not_regular(meta.file_type()));
    }
    Ok(Found {
        fd,
        identity: Identity::of(&meta),
    })
}

impl Found {
    /// The file itself, opened with `flags` (an access mode and more) through the `O_PATH`
    /// descriptor: `/proc/self/fd/N` names the inode already found, not a path anyone can change
    /// meanwhile. Never `NotFound`: the file was there.
    pub(crate) fn open(&self, flags: OFlags) -> io::Result<File> {
        let via = format!("/proc/self/fd/{}", self.fd.as_raw_fd());
        let fd = rustix::fs::open(
            via.as_str(),
            flags | OFlags::CLOEXEC | OFlags::NOCTTY,
            Mode::empty(),
        )
        .map_err(|e| {
            let e = io::Error::from(e);
            match e.kind() {
                io::ErrorKind::NotFound => {
                    io::Error::other(format!("cannot open it through {via} (is /proc mounted?)"))
                }
                _ => e,
            }
        })?;
        let file = File::from(fd);
        let meta = file.metadata()?;
        if !meta.file_type().is_file() || Identity::of(&meta) != self.identity {
            return Err(io::Error::other("it was replaced while being opened"));
        }
        Ok(file)
    }
}

/// The regular file at `path`, opened with `flags` (see [`look`] and [`Found::open`]).
pub(crate) fn open_regular(path: &Path, flags: OFlags) -> io::Result<File> {
    look(path)?.open(flags)
}

/// At most `limit` bytes of the regular file at `path`.
pub(crate) fn read_regular(path: &Path, limit: u64) -> io::Result<Vec<u8>> {
    let file = open_regular(path, OFlags::RDONLY)?;
    let mut bytes = Vec::new();
    file.take(limit).read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// A new file at `path`, made here (`O_CREAT | O_EXCL`: nothing already at the name, not even a
/// dangling symlink, is ever opened); `AlreadyExists` when the name is taken.
pub(crate) fn create_new(path: &Path, mode: u32) -> io::Result<File> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .custom_flags((OFlags::NOFOLLOW | OFlags::NOCTTY).bits() as i32)
        .open(path)
}

/// The regular file at `path` opened for writing (for a lock: nothing is written), created when
/// there is nothing at the name.
pub(crate) fn open_or_create(path: &Path, mode: u32) -> io::Result<File> {
    // A file removed or made between the two steps (another caller's) is looked at again.
    for _ in 0..100 {
        match open_regular(path, OFlags::WRONLY) {
            Ok(file) => return Ok(file),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        match create_new(path, mode) {
            Ok(file) => return Ok(file),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::other(
        "it keeps appearing and disappearing; retry",
    ))
}

/// `path` with `.tmp` added: where [`write_atomically`] writes a file before renaming it.
pub(crate) fn temp_beside(path: &Path) -> PathBuf {
    let mut temp = path.as_os_str().to_owned();
    temp.push(".tmp");
    PathBuf::from(temp)
}

/// Writes `bytes` to `path` atomically, never through anything at either name: the temporary
/// file `temp` is made anew (whatever was left or planted there is removed first; unlinking a
/// name never touches what a symlink points to), written, fsync-ed, then renamed over `path`,
/// which replaces a symlink or a device node at `path` rather than writing to its target.
pub(crate) fn write_atomically(
    path: &Path,
    temp: &Path,
    bytes: &[u8],
    mode: u32,
) -> io::Result<()> {
    match fs::remove_file(temp) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let mut file = create_new(temp, mode)?;
    let written = file
        .write_all(bytes)
        .and_then(|()| file.sync_all())
        .and_then(|()| fs::rename(temp, path));
    if written.is_err() {
        let _ = fs::remove_file(temp);
    }
    written
}
