//! What a processed change means: the transition from what was known about a driver directory
//! to what its re-probe found. Pure.

use std::path::PathBuf;
use std::sync::Arc;

use serde::Serialize;

use crate::plugin::Plugin;
use crate::prober::Probed;

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
    /// `vendor/driver` (or the best reading of an invalid entry's name).
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
pub enum Known {
    #[default]
    Absent,
    Ready {
        driver: String,
        path: Option<PathBuf>,
    },
    Failed {
        driver: String,
        path: Option<PathBuf>,
    },
}

/// The event for a re-probe (`None` = the entry is gone) given what was known, and the new
/// knowledge. `None` event: nothing to say (absent before and after).
pub fn transition(
    dir_name: &str,
    before: &Known,
    found: Option<&Probed>,
) -> (Option<ProbeEvent>, Known) {
    let event = |kind, driver: String, path: Option<PathBuf>, plugin, error| ProbeEvent {
        kind,
        driver,
        dir_name: dir_name.to_owned(),
        path,
        plugin,
        error,
    };
    match (before, found) {
        (Known::Absent, None) => (None, Known::Absent),
        (Known::Ready { driver, path } | Known::Failed { driver, path }, None) => (
            Some(event(
                EventKind::Remove,
                driver.clone(),
                path.clone(),
                None,
                None,
            )),
            Known::Absent,
        ),
        (before, Some(probed)) => {
            let driver = probed.name.clone();
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
                            driver.clone(),
                            path.clone(),
                            Some(plugin.clone()),
                            None,
                        )),
                        Known::Ready { driver, path },
                    )
                }
                Err(e) => (
                    Some(event(
                        EventKind::Failed,
                        driver.clone(),
                        path.clone(),
                        None,
                        Some(e.to_string()),
                    )),
                    Known::Failed { driver, path },
                ),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{Driver, LayoutError};
    use crate::name::DriverName;
    use crate::prober::ProbeError;

    fn ready() -> Probed {
        let driver = Driver {
            name: DriverName::parse("v/d").unwrap(),
            dir: "/p/v~d".into(),
            path: "/p/v~d/d".into(),
        };
        let reply = crate::protocol::find_reply(br#"{"status":"Success"}"#).unwrap();
        Probed {
            name: "v/d".into(),
            dir: "/p/v~d".into(),
            path: Some("/p/v~d/d".into()),
            result: Ok(Arc::new(Plugin::from_init_reply(driver, &reply))),
        }
    }

    fn failed() -> Probed {
        Probed {
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
            driver: "v/d".into(),
            path: None,
        };
        let f = Known::Failed {
            driver: "v/d".into(),
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
