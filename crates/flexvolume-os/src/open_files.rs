//! The open-file limit (`RLIMIT_NOFILE`): raised for the host, put back for its drivers.
//!
//! A daemon that serves sockets runs out of descriptors at the default soft limit (1024) long
//! before the hard one (often 524288 or more), and a flood of idle connections on one listener
//! then starves every other. The soft limit is raised to the hard one at start, as Go's runtime
//! does. Drivers get the limit flexd was started with back ([`original`]): some programs close
//! every descriptor up to the soft limit, or use `select(2)`, which breaks above 1024.

use std::sync::OnceLock;

use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};

/// The limit this process was started with, before [`raise`] changed it.
static ORIGINAL: OnceLock<Rlimit> = OnceLock::new();

/// What [`raise`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Raised {
    /// The soft limit before (`None`: unlimited).
    pub before: Option<u64>,
    /// The soft limit now.
    pub after: Option<u64>,
}

/// Raises the soft open-file limit to the hard one, remembering the original for
/// [`original`]. Called once at start, before any thread that spawns drivers.
pub fn raise() -> Result<Raised, rustix::io::Errno> {
    let limit = getrlimit(Resource::Nofile);
    let _ = ORIGINAL.set(limit);
    let raised = Rlimit {
        current: limit.maximum,
        maximum: limit.maximum,
    };
    if raised.current != limit.current {
        setrlimit(Resource::Nofile, raised)?;
    }
    Ok(Raised {
        before: limit.current,
        after: raised.current,
    })
}

/// The soft and hard limits to give a driver: `None` when [`raise`] was never called (the
/// process's own limit is then the original).
pub fn original() -> Option<(Option<u64>, Option<u64>)> {
    ORIGINAL.get().map(|limit| (limit.current, limit.maximum))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_soft_limit_becomes_the_hard_one_and_the_original_is_kept() {
        let before = getrlimit(Resource::Nofile);
        let raised = raise().unwrap();
        let now = getrlimit(Resource::Nofile);
        assert_eq!(now.current, before.maximum);
        assert_eq!(raised.after, before.maximum);
        assert_eq!(original(), Some((before.current, before.maximum)));
    }
}
