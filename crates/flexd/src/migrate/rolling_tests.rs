//! The rolling strategy's step machine, driven by a simulated engine that does to the journal
//! record what the real one does (cli/migrate/rolling.rs): from every step an apply or a
//! rollback can stop at, `--resume` goes on with exactly what was left, and `--rollback` puts
//! back what was done.

use std::collections::BTreeMap;

use serde_json::json;

use super::*;
use crate::migrate::plan::{PvMove, Unit};
use crate::migrate::strategy::Strategy;

fn w(text: &str) -> WorkloadRef {
    text.parse().unwrap()
}

fn pod(name: &str, uid: &str) -> PodRef {
    PodRef {
        name: name.into(),
        uid: uid.into(),
    }
}

/// A rolling unit: Deployment shop/web (evicted) on PV data, Deployment shop/cache (inline
/// volume, its own rollout).
fn record() -> UnitRecord {
    UnitRecord::new(Unit {
        workloads: vec![w("Deployment shop/cache"), w("Deployment shop/web")],
        pvs: vec![PvMove::example(
            "data",
            "acme/nfs",
            false,
            &["ReadWriteMany"],
        )],
        templates: vec![w("Deployment shop/cache")],
        rollouts: vec![w("Deployment shop/cache")],
        strategy: Strategy::Rolling,
        ..Unit::default()
    })
}

/// The pods each workload has when the list is made.
fn pods_now() -> BTreeMap<WorkloadRef, Vec<PodRef>> {
    BTreeMap::from([
        (w("Deployment shop/cache"), vec![pod("shop/cache-1", "c1")]),
        (
            w("Deployment shop/web"),
            vec![pod("shop/web-b", "b"), pod("shop/web-a", "a")],
        ),
    ])
}

/// Runs `operation` on `record` to its end as the engine does, step by step; the actions,
/// and the record before each.
fn run(mut record: UnitRecord, operation: Operation) -> (Vec<Next>, Vec<UnitRecord>, UnitRecord) {
    let (mut actions, mut before) = (Vec::new(), Vec::new());
    loop {
        let next = next(&record, operation);
        if next == Next::Nothing {
            return (actions, before, record);
        }
        assert!(actions.len() < 50, "no end: {actions:?}");
        before.push(record.clone());
        actions.push(next);
        match next {
            Next::Record => {
                record
                    .old_pvs
                    .insert("data".into(), json!({"kind": "PersistentVolume"}));
                record
                    .old_templates
                    .insert("Deployment shop/cache".into(), json!({"spec": {}}));
            }
            Next::Swap | Next::SwapBack => {
                record.replacing = to_replace(&record, operation, &pods_now());
            }
            Next::BeginRollback => record.replacing.clear(),
            Next::Replace(i) => record.replacing[i].done = true,
            Next::Retain | Next::Finish | Next::Nothing => {}
        }
        if let Some(step) = step_after(next, operation) {
            record.step = step;
        }
    }
}

#[test]
fn an_apply_swaps_under_the_running_pods_then_replaces_them_one_at_a_time() {
    let (actions, _, done) = run(record(), Operation::Apply);
    assert_eq!(
        actions,
        [
            Next::Retain,
            Next::Record,
            Next::Swap,
            Next::Replace(0),
            Next::Replace(1),
            Next::Replace(2),
            Next::Finish,
        ]
    );
    assert_eq!(done.step, Step::Done);
    // The rollout first (its workload comes first), then web's pods by name, each by uid.
    let list: Vec<(String, Option<String>)> = done
        .replacing
        .iter()
        .map(|r| {
            (
                r.workload.to_string(),
                r.pod.as_ref().map(|p| p.uid.clone()),
            )
        })
        .collect();
    assert_eq!(
        list,
        [
            ("Deployment shop/cache".to_owned(), None),
            ("Deployment shop/web".to_owned(), Some("a".to_owned())),
            ("Deployment shop/web".to_owned(), Some("b".to_owned())),
        ]
    );
    assert!(done.replacing.iter().all(|r| r.done));
}

#[test]
fn resume_goes_on_from_every_step_an_apply_can_stop_at() {
    let (actions, before, _) = run(record(), Operation::Apply);
    for (i, stopped) in before.into_iter().enumerate() {
        let (rest, _, end) = run(stopped.clone(), Operation::Apply);
        assert_eq!(rest, actions[i..], "resumed at {:?}", stopped.step);
        assert_eq!(end.step, Step::Done);
    }
    // Finished: nothing more.
    let (_, _, done) = run(record(), Operation::Apply);
    assert_eq!(next(&done, Operation::Apply), Next::Nothing);
}

#[test]
fn rollback_from_every_step_puts_back_what_was_done_pod_by_pod() {
    let (_, before, done) = run(record(), Operation::Apply);
    for stopped in before.into_iter().chain([done]) {
        let step = stopped.step;
        let (actions, _, end) = run(stopped.clone(), Operation::Rollback);
        assert_eq!(end.step, Step::RolledBack, "from {step:?}");
        let expected: Vec<Next> = match step {
            // Nothing changed yet.
            Step::Planned => vec![Next::Finish],
            // Only the reclaim policy: put back, no pod touched.
            Step::Retained => vec![Next::BeginRollback, Next::SwapBack, Next::Finish],
            // Maybe swapped: swapped back under the running pods, which are replaced again
            // the same way, the apply's own list (done or not) dropped first.
            _ => vec![
                Next::BeginRollback,
                Next::SwapBack,
                Next::Replace(0),
                Next::Replace(1),
                Next::Replace(2),
                Next::Finish,
            ],
        };
        assert_eq!(actions, expected, "from {step:?}");
        // A rollback stopped anywhere is resumed with exactly what was left.
        let (_, rollback_before, _) = run(stopped, Operation::Rollback);
        for (i, midway) in rollback_before.into_iter().enumerate() {
            let (rest, _, end) = run(midway.clone(), Operation::Rollback);
            assert_eq!(
                rest,
                expected[i..],
                "from {step:?}, resumed at {:?}",
                midway.step
            );
            assert_eq!(end.step, Step::RolledBack);
        }
    }
}

#[test]
fn an_apply_does_not_act_on_a_unit_a_rollback_took() {
    let mut record = record();
    for step in [Step::RollingBack, Step::SwappedBack, Step::RolledBack] {
        record.step = step;
        assert_eq!(next(&record, Operation::Apply), Next::Nothing, "{step:?}");
    }
}

#[test]
fn a_rollback_rolls_out_only_templates_it_put_back_and_evicts_the_rest() {
    let mut record = record();
    record.old_pvs.insert("data".into(), json!({}));
    // The apply stopped before it journaled cache's template: nothing to roll back there, so
    // its pods (which may mount the PV through CSI) are evicted.
    let list = to_replace(&record, Operation::Rollback, &pods_now());
    let pods: Vec<Option<&str>> = list
        .iter()
        .map(|r| r.pod.as_ref().map(|p| p.name.as_str()))
        .collect();
    assert_eq!(
        pods,
        [Some("shop/cache-1"), Some("shop/web-a"), Some("shop/web-b")]
    );
    // A rollback that swapped nothing replaces nothing.
    record.old_pvs.clear();
    assert_eq!(
        to_replace(&record, Operation::Rollback, &pods_now()),
        vec![]
    );
}

fn object<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> T {
    serde_json::from_value(value).expect("a valid object")
}

fn seen(name: &str, uid: &str, ready: bool, terminating: bool) -> PodSeen {
    PodSeen {
        name: name.into(),
        uid: uid.into(),
        terminating,
        ready,
    }
}

#[test]
fn a_pod_is_evicted_only_while_the_rest_is_up_and_replaced_once_its_successor_is_ready() {
    let a = seen("shop/web-a", "a", true, false);
    let b = seen("shop/web-b", "b", true, false);
    let c = seen("shop/web-c", "c", true, false);
    // All three Ready: evict a.
    assert_eq!(
        pod_next(Some(&a), &[a.clone(), b.clone(), c.clone()], 3),
        PodNext::Evict
    );
    // b is not Ready (a replacement still starting): evicting a would leave one up.
    let b_starting = seen("shop/web-b", "b", false, false);
    assert_eq!(
        pod_next(Some(&a), &[a.clone(), b_starting, c.clone()], 3),
        PodNext::WaitWhole {
            ready: 2,
            desired: 3
        }
    );
    // a itself not Ready: evicting it takes nothing up away.
    let a_down = seen("shop/web-a", "a", false, false);
    assert_eq!(
        pod_next(Some(&a_down), &[a_down.clone(), b.clone(), c.clone()], 3),
        PodNext::Evict
    );
    // Evicted: until it is gone (kubelet unmounts its volumes first).
    let a_going = seen("shop/web-a", "a", true, true);
    assert_eq!(
        pod_next(Some(&a_going), &[a_going.clone(), b.clone(), c.clone()], 3),
        PodNext::WaitGone
    );
    // Gone, its replacement not Ready yet.
    let d = seen("shop/web-d", "d", false, false);
    assert_eq!(
        pod_next(None, &[b.clone(), c.clone(), d], 3),
        PodNext::WaitReplacement {
            ready: 2,
            desired: 3
        }
    );
    let d = seen("shop/web-d", "d", true, false);
    assert_eq!(pod_next(None, &[b, c, d], 3), PodNext::Replaced);
    let text = PodNext::WaitReplacement {
        ready: 2,
        desired: 3,
    }
    .waiting_for("shop/web-a", &w("Deployment shop/web"));
    assert_eq!(
        text,
        "the replacement of Pod shop/web-a to be Ready: Deployment shop/web has 2 of 3 pods Ready"
    );
}

#[test]
fn a_workloads_pods_are_found_by_its_uid_and_a_stateful_sets_successor_by_its_own() {
    let owned = |name: &str, uid: &str, kind: &str, owner_uid: &str| -> Pod {
        object(json!({
            "metadata": {"name": name, "namespace": "shop", "uid": uid,
                         "ownerReferences": [{"apiVersion": "apps/v1", "kind": kind,
                                              "name": "x", "uid": owner_uid, "controller": true}]},
            "status": {"phase": "Running",
                       "conditions": [{"type": "Ready", "status": "True"}]},
        }))
    };
    let rs: ReplicaSet = object(json!({
        "metadata": {"name": "web-1", "namespace": "shop", "uid": "uid-rs",
                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment",
                                          "name": "web", "uid": "uid-web", "controller": true}]},
    }));
    let pods = vec![
        owned("web-1-a", "a", "ReplicaSet", "uid-rs"),
        // Another Deployment's ReplicaSet, and a StatefulSet's pod.
        owned("other-1-x", "x", "ReplicaSet", "uid-other-rs"),
        owned("db-0", "db0-new", "StatefulSet", "uid-db"),
    ];
    let web = pods_of(&w("Deployment shop/web"), "uid-web", &pods, &[rs]);
    assert_eq!(web, [seen("shop/web-1-a", "a", true, false)]);
    // A Deployment of the same name created again (another uid) owns none of them.
    assert_eq!(
        pods_of(&w("Deployment shop/web"), "uid-web-again", &pods, &[]),
        []
    );
    // The StatefulSet's db-0 is there under its name with another uid: the one evicted
    // (uid db0-old) is gone, and db-0 now is its successor.
    let db = pods_of(&w("StatefulSet shop/db"), "uid-db", &pods, &[]);
    assert_eq!(db, [seen("shop/db-0", "db0-new", true, false)]);
    assert_eq!(pod_next(None, &db, 1), PodNext::Replaced);
}

#[test]
fn a_rollout_is_complete_when_every_pod_is_of_the_new_template_and_ready() {
    let object = json!({"metadata": {"generation": 2}, "spec": {"replicas": 3},
                        "status": {"observedGeneration": 2, "updatedReplicas": 2,
                                   "readyReplicas": 3, "replicas": 4}});
    assert_eq!(
        RolloutSeen::of(&object).progress().as_deref(),
        Some("2 of 3 pods updated, 3 Ready, 4 in all")
    );
    let stale = json!({"metadata": {"generation": 3}, "spec": {"replicas": 3},
                       "status": {"observedGeneration": 2, "updatedReplicas": 3,
                                  "readyReplicas": 3, "replicas": 3}});
    assert!(RolloutSeen::of(&stale)
        .progress()
        .unwrap()
        .contains("has not seen the new template"));
    let stuck = json!({"metadata": {"generation": 2}, "spec": {"replicas": 3},
                       "status": {"observedGeneration": 2, "updatedReplicas": 1,
                                  "readyReplicas": 3, "replicas": 4,
                                  "conditions": [{"type": "Progressing", "status": "False",
                                                  "reason": "ProgressDeadlineExceeded",
                                                  "message": "ReplicaSet \"web-2\" has timed out progressing."}]}});
    assert_eq!(
        RolloutSeen::of(&stuck).progress().as_deref(),
        Some(
            "1 of 3 pods updated, 3 Ready, 4 in all; its controller says \
             ProgressDeadlineExceeded: ReplicaSet \"web-2\" has timed out progressing."
        )
    );
    let done = json!({"metadata": {"generation": 3}, "spec": {"replicas": 3},
                      "status": {"observedGeneration": 3, "updatedReplicas": 3,
                                 "readyReplicas": 3, "replicas": 3}});
    assert_eq!(RolloutSeen::of(&done).progress(), None);
}

#[test]
fn replacements_read_back_from_the_journal() {
    let mut record = record();
    record.replacing = to_replace(&record, Operation::Apply, &pods_now());
    let text = serde_json::to_string(&record).unwrap();
    let back: UnitRecord = serde_json::from_str(&text).unwrap();
    assert_eq!(back, record);
    assert!(text.contains("\"strategy\":\"rolling\""), "{text}");
    // A record written before strategies is a scale-down one, with nothing to replace.
    let mut old: serde_json::Value = serde_json::from_str(&text).unwrap();
    for key in ["strategy", "rollouts", "replacing"] {
        old.as_object_mut().unwrap().remove(key);
    }
    let old: UnitRecord = serde_json::from_value(old).unwrap();
    assert_eq!(old.strategy, Strategy::ScaleDown);
    assert!(old.replacing.is_empty());
}
