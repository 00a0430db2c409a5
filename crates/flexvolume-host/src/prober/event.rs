//! What a processed change means: the transition from what was known about a driver directory
//! to what its re-probe found. Pure.

use std::path::PathBuf;
use std::sync::Arc;

use serde::Serialize;

use crate::plugin::Plugin;
use crate::prober::Probed;
use flexvolume_protocol::name::{DriverName, NameError};

/// What a plugin-dir entry stands for, decided once from its file name: a driver, or an entry
/// whose name is not a driver name (reported so the operator sees it, never registered or
/// served). Code that acts on drivers matches on this instead of parsing a name again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Subject {
    Driver(DriverName),
    InvalidEntry {
        /// The entry's file name as read (lossy if not UTF-8).
        dir_name: String,
        reason: NameError,
    },
}

impl Subject {
    /// The subject of the plugin-dir entry `dir_name` (`vendor~driver`).
    #[cfg(test)]
    pub(crate) fn of_dir_name(dir_name: &str) -> Self {
        Self::of_name(dir_name, DriverName::from_dir_name(dir_name))
    }

    /// The subject of a plugin-dir entry, from the name the layout read.
    pub(crate) fn of_entry(entry: &crate::layout::Entry) -> Self {
        Self::of_name(&entry.dir_name, entry.name.clone())
    }

    fn of_name(dir_name: &str, name: Result<DriverName, NameError>) -> Self {
        match name {
            Ok(name) => Self::Driver(name),
            Err(reason) => Self::InvalidEntry {
                dir_name: dir_name.to_owned(),
                reason,
            },
        }
    }

    pub fn driver(&self) -> Option<&DriverName> {
        match self {
            Self::Driver(name) => Some(name),
            Self::InvalidEntry { .. } => None,
        }
    }

    /// How reports name it: `vendor/driver`, or the best reading of an invalid entry's name.
    pub fn label(&self) -> String {
        match self {
            Self::Driver(name) => name.to_string(),
            Self::InvalidEntry { dir_name, .. } => dir_name.replace('~', "/"),
        }
    }
}

/// The kind of a [`ProbeEvent`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EventKind {
    /// The driver is ready and was not before (new, or fixed after a failure).
    Add,
    /// The driver was ready, changed, and is ready again (maybe a new version).
    Update,
    /// The driver is gone (it had been reported, ready or failed).
    Remove,
    /// The driver's layout or init failed; it is not usable (an older version is not kept).
    Failed,
}

/// One processed change of one driver directory.
#[derive(Debug, Clone)]
pub struct ProbeEvent {
    pub kind: EventKind,
    /// The driver the change is about, or the invalid entry it is about.
    pub subject: Subject,
    /// [`Subject::label`], for printing: `vendor/driver` (or the best reading of an invalid
    /// entry's name). Nothing parses it; code that acts on the driver uses `subject`.
    pub driver: String,
    /// The plugin-dir entry (`vendor~driver`) the change was in.
    pub dir_name: String,
    /// The executable's path, when the entry has a valid name.
    pub path: Option<PathBuf>,
    /// The loaded plugin, for add and update.
    pub plugin: Option<Arc<Plugin>>,
    /// Why it failed, for failed.
    pub error: Option<String>,
}

/// What is known about a driver directory between changes.
#[derive(Debug, Clone, Default)]
pub(crate) enum Known {
    #[default]
    Absent,
    Ready {
        subject: Subject,
        path: Option<PathBuf>,
    },
    Failed {
        subject: Subject,
        path: Option<PathBuf>,
    },
}

/// The event for a re-probe (`None` = the entry is gone) given what was known, and the new
/// knowledge. `None` event: nothing to say (absent before and after).
pub(crate) fn transition(
    dir_name: &str,
    before: &Known,
    found: Option<&Probed>,
) -> (Option<ProbeEvent>, Known) {
    let event = |kind, subject: Subject, path: Option<PathBuf>, plugin, error| ProbeEvent {
        kind,
        driver: subject.label(),
        subject,
        dir_name: dir_name.to_owned(),
        path,
        plugin,
        error,
    };
    match (before, found) {
        (Known::Absent, None) => (None, Known::Absent),
        (Known::Ready { subject, path } | Known::Failed { subject, path }, None) => (
            Some(event(
                EventKind::Remove,
                subject.clone(),
                path.clone(),
                None,
                None,
            )),
            Known::Absent,
        ),
        (before, Some(probed)) => {
            let subject = probed.subject.clone();
            let path = probed.path.clone();
            match &probed.result {
                Ok(plugin) => {
                    let kind = match before {
                        Known::Ready { .. } => EventKind::Update,
                        Known::Absent | Known::Failed { .. } => EventKind::Add,
                    };
                    (
                        Some(event(
                            kind,
                            subject.clone(),
                            path.clone(),
                            Some(plugin.clone()),
                            None,
                        )),
                        Known::Ready { subject, path },
                    )
                }
                Err(e) => (
                    Some(event(
                        EventKind::Failed,
                        subject.clone(),
                        path.clone(),
                        None,
                        Some(e.to_string()),
                    )),
                    Known::Failed { subject, path },
                ),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{InstalledDriver, LayoutError};
    use crate::prober::ProbeError;
    use flexvolume_protocol::name::DriverName;

    fn ready() -> Probed {
        let driver = InstalledDriver {
            name: DriverName::parse("v/d").unwrap(),
            dir: "/p/v~d".into(),
            path: "/p/v~d/d".into(),
        };
        let reply = flexvolume_protocol::find_reply(br#"{"status":"Success"}"#).unwrap();
        Probed {
            subject: Subject::of_dir_name("v~d"),
            name: "v/d".into(),
            dir: "/p/v~d".into(),
            path: Some("/p/v~d/d".into()),
            result: Ok(Arc::new(Plugin::from_init_reply(driver, &reply))),
        }
    }

    fn failed() -> Probed {
        Probed {
            subject: Subject::of_dir_name("v~d"),
            name: "v/d".into(),
            dir: "/p/v~d".into(),
            path: None,
            result: Err(Arc::new(ProbeError::Layout(
                LayoutError::MissingExecutable {
                    path: "/p/v~d/d".into(),
                },
            ))),
        }
    }

    fn kind(before: &Known, found: Option<&Probed>) -> (Option<EventKind>, &'static str) {
        let (event, after) = transition("v~d", before, found);
        let after = match after {
            Known::Absent => "absent",
            Known::Ready { .. } => "ready",
            Known::Failed { .. } => "failed",
        };
        (event.map(|e| e.kind), after)
    }

    #[test]
    fn every_transition() {
        let r = Known::Ready {
            subject: Subject::of_dir_name("v~d"),
            path: None,
        };
        let f = Known::Failed {
            subject: Subject::of_dir_name("v~d"),
            path: None,
        };
        let a = Known::Absent;
        assert_eq!(kind(&a, None), (None, "absent"));
        assert_eq!(kind(&a, Some(&ready())), (Some(EventKind::Add), "ready"));
        assert_eq!(
            kind(&a, Some(&failed())),
            (Some(EventKind::Failed), "failed")
        );
        assert_eq!(kind(&r, None), (Some(EventKind::Remove), "absent"));
        assert_eq!(kind(&r, Some(&ready())), (Some(EventKind::Update), "ready"));
        assert_eq!(
            kind(&r, Some(&failed())),
            (Some(EventKind::Failed), "failed")
        );
        assert_eq!(kind(&f, None), (Some(EventKind::Remove), "absent"));
        assert_eq!(kind(&f, Some(&ready())), (Some(EventKind::Add), "ready"));
        assert_eq!(
            kind(&f, Some(&failed())),
            (Some(EventKind::Failed), "failed")
        );
    }

    #[test]
    fn an_invalid_entry_name_is_its_own_subject() {
        let subject = Subject::of_dir_name("acme~-x");
        assert!(subject.driver().is_none());
        assert!(matches!(subject, Subject::InvalidEntry { .. }));
        assert_eq!(subject.label(), "acme/-x");
        let driver = Subject::of_dir_name("acme~x");
        assert_eq!(driver.driver().map(|n| n.as_str()), Some("acme/x"));
    }

    #[test]
    fn events_carry_the_plugin_or_the_error() {
        let (event, _) = transition("v~d", &Known::Absent, Some(&ready()));
        let event = event.unwrap();
        assert!(event.plugin.is_some() && event.error.is_none());
        assert_eq!(
            event.path.as_deref(),
            Some(std::path::Path::new("/p/v~d/d"))
        );
        let (event, _) = transition("v~d", &Known::Absent, Some(&failed()));
        let event = event.unwrap();
        assert!(event.plugin.is_none());
        assert!(event.error.unwrap().contains("missing"));
    }
}
