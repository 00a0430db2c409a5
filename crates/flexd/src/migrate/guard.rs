//! Whether `flexd migrate` may change an object its journal names: pure, from the uid the
//! journal recorded and the object the cluster holds now (docs/migration.md#journal).
//!
//! A name is not an identity: a PV deleted and created again by someone else, or a workload
//! replaced, keeps its name and gets another uid. Every delete and replace is decided here
//! first, then sent with the recorded uid (and the resourceVersion just read) as its
//! precondition, so the API server refuses it too if the object changes in between.

use std::collections::BTreeMap;

use serde_json::Value;

use super::journal::{Journal, Operation, Step, UnitRecord};
use super::plan::{pod_key, pv_key};
use super::twin::{self, REPLACES};

/// An object as the cluster holds it now: what a decision needs of it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Observed {
    pub uid: String,
    /// Its [`REPLACES`] annotation: the uid of the object flexd created it in place of.
    pub replaces: Option<String>,
    /// What flexd writes of it: a PV's `spec`, a workload's `spec.template`; null for a Pod.
    pub content: Value,
}

impl Observed {
    /// From an object as the API server returns it; `content` is the JSON pointer of the part
    /// flexd writes (`/spec`), or empty for none.
    pub fn of(object: &Value, content: &str) -> Self {
        let meta = &object["metadata"];
        Self {
            uid: meta["uid"].as_str().unwrap_or_default().to_owned(),
            replaces: meta["annotations"][REPLACES].as_str().map(str::to_owned),
            content: match content {
                "" => Value::Null,
                pointer => object.pointer(pointer).cloned().unwrap_or_default(),
            },
        }
    }

    fn has(&self, source: &str) -> bool {
        self.content.get(source).is_some_and(|s| !s.is_null())
    }

    /// A PV whose source is `csi`.
    pub fn is_csi(&self) -> bool {
        self.has("csi")
    }

    /// A PV whose source is `flexVolume`.
    pub fn is_flex(&self) -> bool {
        self.has("flexVolume")
    }
}

/// Why flexd refuses to change an object: it is not what the journal recorded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Changed {
    #[error(
        "{object}: the journal records no uid for it, so flexd cannot tell it from another \
         object of that name"
    )]
    NotRecorded { object: String },
    #[error("{object}: the journal holds no {what} for it")]
    NotInJournal { object: String, what: String },
    #[error("{object} is gone (the journal recorded uid {recorded})")]
    Gone { object: String, recorded: String },
    #[error(
        "{object} is not the object the journal recorded: its uid is {found}, the journal's \
         {recorded} (deleted and created again under that name since)"
    )]
    NameReused {
        object: String,
        recorded: String,
        found: String,
    },
    #[error("{object} changed since flexd wrote it: {}", .differences.join("; "))]
    Modified {
        object: String,
        differences: Vec<String>,
    },
}

/// Whether `found` (a uid, none when the object is gone) is the object the journal recorded:
/// what a patch (scale, reclaim policy, template) needs.
pub fn same(object: &str, recorded: Option<&str>, found: Option<&str>) -> Result<(), Changed> {
    let recorded = recorded.ok_or_else(|| Changed::NotRecorded {
        object: object.to_owned(),
    })?;
    match found {
        Some(uid) if uid == recorded => Ok(()),
        Some(uid) => Err(Changed::NameReused {
            object: object.to_owned(),
            recorded: recorded.to_owned(),
            found: uid.to_owned(),
        }),
        None => Err(Changed::Gone {
            object: object.to_owned(),
            recorded: recorded.to_owned(),
        }),
    }
}

/// What a swap (delete, then create under the same name) does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Swap {
    /// The recorded object is there and not yet what the swap makes: delete it, preconditioned
    /// on the recorded uid, then create.
    Replace,
    /// Nothing is under the name: create.
    Create,
    /// The recorded object is what the swap makes already.
    Done,
    /// What the swap makes, created in place of the recorded object by a run killed before it
    /// journaled its uid (this one): journal it.
    Adopt(String),
}

/// What a swap does under `object`'s name, from the uid the journal recorded for it and what
/// is there now; `is_target`: whether `found` is already what the swap makes. Anything else
/// under the name (reused by someone else) is refused, never deleted.
pub fn swap(
    object: &str,
    recorded: Option<&str>,
    found: Option<&Observed>,
    is_target: bool,
) -> Result<Swap, Changed> {
    let recorded = recorded.ok_or_else(|| Changed::NotRecorded {
        object: object.to_owned(),
    })?;
    match found {
        None => Ok(Swap::Create),
        Some(f) if f.uid == recorded => Ok(if is_target { Swap::Done } else { Swap::Replace }),
        Some(f) if is_target && f.replaces.as_deref() == Some(recorded) => {
            Ok(Swap::Adopt(f.uid.clone()))
        }
        Some(f) => Err(Changed::NameReused {
            object: object.to_owned(),
            recorded: recorded.to_owned(),
            found: f.uid.clone(),
        }),
    }
}

/// What deleting an object (a bare Pod) does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delete {
    /// Nothing is under the name.
    Gone,
    /// Delete the object of this uid (the precondition).
    Uid(String),
}

/// Whether the object under `object`'s name may be deleted: the recorded one, or one flexd
/// created in its place (a run killed before it journaled the new uid).
pub fn delete(
    object: &str,
    recorded: Option<&str>,
    found: Option<&Observed>,
) -> Result<Delete, Changed> {
    let recorded = recorded.ok_or_else(|| Changed::NotRecorded {
        object: object.to_owned(),
    })?;
    match found {
        None => Ok(Delete::Gone),
        Some(f) if f.uid == recorded || f.replaces.as_deref() == Some(recorded) => {
            Ok(Delete::Uid(f.uid.clone()))
        }
        Some(f) => Err(Changed::NameReused {
            object: object.to_owned(),
            recorded: recorded.to_owned(),
            found: f.uid.clone(),
        }),
    }
}

/// Whether `found` is still one of `accepted` (what flexd wrote, or what it keeps); else the
/// differences from the closest.
pub fn unchanged(object: &str, accepted: &[&Value], found: &Value) -> Result<(), Changed> {
    let mut closest: Option<Vec<String>> = None;
    for expected in accepted {
        let differences = differences(expected, found);
        if differences.is_empty() {
            return Ok(());
        }
        if closest.as_ref().is_none_or(|c| differences.len() < c.len()) {
            closest = Some(differences);
        }
    }
    Err(Changed::Modified {
        object: object.to_owned(),
        differences: closest.unwrap_or_default(),
    })
}

/// At most this many differences are named.
const MAX_DIFFERENCES: usize = 5;

/// Where `found` is not `expected`, as `path: expected → found`: every field of `expected`
/// must be in `found` as it is (a zero value may be absent); fields only in `found` are the API
/// server's defaults and do not count. Lists must match item by item.
pub fn differences(expected: &Value, found: &Value) -> Vec<String> {
    let mut out = Vec::new();
    diff("", expected, found, &mut out);
    if out.len() > MAX_DIFFERENCES {
        let more = out.len() - MAX_DIFFERENCES;
        out.truncate(MAX_DIFFERENCES);
        out.push(format!("and {more} more"));
    }
    out
}

/// A zero value is as good as absent: what the API server (Go's `omitempty`) and k8s-openapi
/// leave out.
fn is_empty(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::String(s) => s.is_empty(),
        Value::Object(map) => map.is_empty(),
        Value::Array(items) => items.is_empty(),
    }
}

fn diff(path: &str, expected: &Value, found: &Value, out: &mut Vec<String>) {
    match (expected, found) {
        (Value::Object(e), Value::Object(f)) => {
            for (key, e) in e {
                let path = format!("{path}.{}", key.escape_debug());
                match f.get(key) {
                    Some(f) => diff(&path, e, f, out),
                    None if is_empty(e) => {}
                    None => out.push(format!("{}: {} → absent", &path[1..], show(e))),
                }
            }
        }
        (Value::Array(e), Value::Array(f)) if e.len() == f.len() => {
            for (i, (e, f)) in e.iter().zip(f).enumerate() {
                diff(&format!("{path}[{i}]"), e, f, out);
            }
        }
        _ if expected == found || (is_empty(expected) && found.is_null()) => {}
        _ => out.push(format!(
            "{}: {} → {}",
            path.strip_prefix('.').unwrap_or(path),
            show(expected),
            show(found)
        )),
    }
}

/// A value in a message: compact JSON (control characters escaped), cut at 80 characters.
fn show(value: &Value) -> String {
    let text = value.to_string();
    match text.char_indices().nth(80) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text,
    }
}

/// The cluster's objects a journal acts on now, by key ([`pv_key`], [`pod_key`], `Kind
/// namespace/name`); an object not there is not in it.
pub type Cluster = BTreeMap<String, Observed>;

/// The units a run of `operation` acts on: an apply's unfinished ones; a rollback's every one
/// not rolled back that had begun.
pub fn acted_on(journal: &Journal, operation: Operation) -> Vec<usize> {
    let acts = |u: &UnitRecord| match operation {
        Operation::Apply => u.step < Step::Done,
        Operation::Rollback => !matches!(u.step, Step::Planned | Step::RolledBack),
    };
    (journal.units.iter().enumerate())
        .filter(|(_, u)| acts(u))
        .map(|(i, _)| i)
        .collect()
}

/// Every way the cluster's objects are not those the journal recorded, in the units a run of
/// `operation` acts on: empty when it may go on. A rollback of a unit that was swapped also
/// needs each PV and template to be still what the apply wrote.
pub fn verify(journal: &Journal, operation: Operation, cluster: &Cluster) -> Vec<Changed> {
    let mut out = Vec::new();
    for i in acted_on(journal, operation) {
        verify_unit(&journal.units[i], operation, cluster, &mut out);
    }
    out
}

fn verify_unit(unit: &UnitRecord, operation: Operation, cluster: &Cluster, out: &mut Vec<Changed>) {
    let rollback = operation == Operation::Rollback;
    let recorded = |key: &str| unit.uids.get(key).map(String::as_str);
    let mut check = |result: Result<(), Changed>| out.extend(result.err());
    for w in &unit.workloads {
        let key = w.to_string();
        check(same(
            &key,
            recorded(&key),
            cluster.get(&key).map(|o| o.uid.as_str()),
        ));
    }
    // What the apply wrote: the unit got past the swap.
    let written = matches!(unit.step, Step::Swapped | Step::Done);
    for m in &unit.moves {
        let key = pv_key(&m.name);
        let found = cluster.get(&key);
        let Some(old) = unit.old_pvs.get(&m.name) else {
            // Never swapped: the object of the plan.
            check(same(&key, recorded(&key), found.map(|o| o.uid.as_str())));
            continue;
        };
        let is_target = found.is_some_and(|f| if rollback { f.is_flex() } else { f.is_csi() });
        match swap(&key, recorded(&key), found, is_target) {
            Ok(Swap::Replace) if rollback && written => {
                let made = twin::converted(old, "PersistentVolume").map(|new| new["spec"].clone());
                match (made, found) {
                    (Ok(spec), Some(f)) => check(unchanged(&key, &[&spec], &f.content)),
                    (Err(e), _) => check(Err(Changed::NotInJournal {
                        object: key,
                        what: format!("FlexVolume object that converts ({e})"),
                    })),
                    (Ok(_), None) => {}
                }
            }
            result => check(result.map(drop)),
        }
    }
    if rollback && written {
        for w in &unit.templates {
            let key = w.to_string();
            let Some(found) = cluster.get(&key) else {
                continue; // refused above
            };
            let made = unit
                .old_templates
                .get(&key)
                .map(|old| twin::converted_template(w, old));
            match made {
                Some(Ok(template)) => check(unchanged(&key, &[&template], &found.content)),
                _ => check(Err(Changed::NotInJournal {
                    object: key,
                    what: "pod template that converts".to_owned(),
                })),
            }
        }
    }
    for p in &unit.bare_pods {
        let key = pod_key(p);
        let found = cluster.get(&key);
        let result = if rollback {
            delete(&key, recorded(&key), found).map(drop)
        } else if unit.step < Step::ScaledDown {
            // Gone already is as before: nothing to delete, nothing to create again.
            found.map_or(Ok(()), |f| same(&key, recorded(&key), Some(&f.uid)))
        } else {
            swap(&key, recorded(&key), found, true).map(drop)
        };
        check(result);
    }
}

#[cfg(test)]
#[path = "guard_tests.rs"]
mod tests;
