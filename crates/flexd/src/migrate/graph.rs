//! The graph a plan's units are the connected parts of: PVs, workloads and bare Pods, joined
//! through the pods and templates that link them (union-find).

use std::collections::{BTreeMap, BTreeSet};

use super::plan::{PlanNote, Refused, WorkloadRef};

/// One node of the graph units are the connected parts of.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Member {
    Pv(String),
    Workload(WorkloadRef),
    /// A bare Pod (`namespace/name`): deleted and created again (`--recreate-pods`).
    Pod(String),
}

#[derive(Default)]
pub(super) struct Graph {
    pub(super) members: Vec<Member>,
    index: BTreeMap<Member, usize>,
    parent: Vec<usize>,
    /// Per member: why its unit cannot be migrated.
    pub(super) refusals: Vec<Vec<Refused>>,
    /// Per member: what its unit's plan says about it.
    pub(super) notes: Vec<Vec<PlanNote>>,
    pub(super) pods: Vec<BTreeSet<String>>,
}

impl Graph {
    pub(super) fn add(&mut self, member: Member) -> usize {
        if let Some(&i) = self.index.get(&member) {
            return i;
        }
        let i = self.members.len();
        self.index.insert(member.clone(), i);
        self.members.push(member);
        self.parent.push(i);
        self.refusals.push(Vec::new());
        self.notes.push(Vec::new());
        self.pods.push(BTreeSet::new());
        i
    }

    pub(super) fn root(&mut self, mut i: usize) -> usize {
        while self.parent[i] != i {
            self.parent[i] = self.parent[self.parent[i]];
            i = self.parent[i];
        }
        i
    }

    pub(super) fn join(&mut self, a: usize, b: usize) {
        let (a, b) = (self.root(a), self.root(b));
        if a != b {
            self.parent[b.max(a)] = b.min(a);
        }
    }

    pub(super) fn refuse(&mut self, i: usize, what: impl Into<String>, reason: impl Into<String>) {
        self.refusals[i].push(Refused {
            what: what.into(),
            reason: reason.into(),
        });
    }
}
