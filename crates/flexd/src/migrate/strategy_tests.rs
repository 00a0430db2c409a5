//! Which strategy each unit gets, why, and what downtime the plan says remains.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use super::*;
use crate::migrate::plan::{self, PvMove, Selection};

fn w(text: &str) -> WorkloadRef {
    text.parse().unwrap()
}

fn pv(name: &str, driver: &str, attaches: bool, modes: &[&str]) -> PvMove {
    PvMove {
        reclaim_policy: Some("Retain".into()),
        ..PvMove::example(name, driver, attaches, modes)
    }
}

fn unit(workloads: &[&str], pvs: Vec<PvMove>) -> Unit {
    Unit {
        workloads: workloads.iter().map(|x| w(x)).collect(),
        pvs,
        ..Unit::default()
    }
}

/// Deployments with the API server's default RollingUpdate (25% / 25%).
fn deployments(replicas: &[(&str, i32)]) -> BTreeMap<WorkloadRef, WorkloadFacts> {
    let mut facts = BTreeMap::new();
    for (name, r) in replicas {
        let default = Inventory {
            deployments: vec![serde_json::from_value(json!({
                "metadata": {"name": "x", "namespace": "shop"},
                "spec": {"replicas": r, "selector": {}, "template": {}},
            }))
            .unwrap()],
            ..Inventory::default()
        };
        let f = super::facts(&default)[&w("Deployment shop/x")];
        facts.insert(w(name), f);
    }
    facts
}

fn rolling_refused(result: Result<Choice, RollingRefused>) -> String {
    match result {
        Err(refused) => refused.to_string(),
        Ok(choice) => panic!("rolling was not refused: {choice:?}"),
    }
}

#[test]
fn a_replicated_deployment_on_a_shared_volume_rolls_with_no_downtime() {
    let u = unit(
        &["Deployment shop/web"],
        vec![pv("web-data", "acme/nfs", false, &["ReadWriteMany"])],
    );
    let facts = deployments(&[("Deployment shop/web", 3)]);
    for requested in [Requested::Auto, Requested::Rolling] {
        let choice = choose(&u, &facts, requested).unwrap();
        assert_eq!(choice.strategy, Strategy::Rolling, "{requested:?}");
        assert_eq!(
            choice.reason,
            "PersistentVolume web-data is ReadWriteMany and driver acme/nfs does not attach: \
             old and new pods mount it at once; Deployment shop/web keeps 2 of its 3 pods up \
             (evicted one at a time)"
        );
        assert_eq!(
            choice.downtime,
            "none: a pod of each workload stays up throughout"
        );
        // Its template is not rewritten: its pods are evicted, not rolled out.
        assert_eq!(choice.rollouts, Vec::<WorkloadRef>::new());
    }
    // ReadOnlyMany shares as well.
    let ro = unit(
        &["Deployment shop/web"],
        vec![pv("web-data", "acme/nfs", false, &["ReadOnlyMany"])],
    );
    assert_eq!(
        choose(&ro, &facts, Requested::Auto).unwrap().strategy,
        Strategy::Rolling
    );
}

#[test]
fn read_write_once_on_an_attaching_driver_scales_down_and_says_what_downtime_remains() {
    let u = unit(
        &["StatefulSet shop/db"],
        vec![pv("db-0", "flexd/loop", true, &["ReadWriteOnce"])],
    );
    let facts = BTreeMap::from([(
        w("StatefulSet shop/db"),
        WorkloadFacts {
            replicas: 3,
            rollout: Rollout::OnDelete,
        },
    )]);
    let choice = choose(&u, &facts, Requested::Auto).unwrap();
    assert_eq!(choice.strategy, Strategy::ScaleDown);
    assert!(
        choice
            .reason
            .starts_with("PersistentVolume db-0: driver flexd/loop attaches"),
        "{}",
        choice.reason
    );
    assert_eq!(
        choice.downtime,
        "its pods, from the scale-down until they are Ready again on CSI, the detach of its \
         FlexVolume volumes included"
    );
    // Asked for, it is refused, saying why and what migrates it.
    let refused = rolling_refused(choose(&u, &facts, Requested::Rolling));
    assert!(
        refused
            .starts_with("--strategy rolling: PersistentVolume db-0: driver flexd/loop attaches"),
        "{refused}"
    );
    assert!(
        refused.ends_with("--strategy auto or scale-down migrates it with downtime"),
        "{refused}"
    );
}

#[test]
fn read_write_once_on_a_driver_that_does_not_attach_is_not_shared_either() {
    let u = unit(
        &["Deployment shop/web"],
        vec![pv("web-data", "acme/nfs", false, &["ReadWriteOnce"])],
    );
    let facts = deployments(&[("Deployment shop/web", 3)]);
    let choice = choose(&u, &facts, Requested::Auto).unwrap();
    assert_eq!(choice.strategy, Strategy::ScaleDown);
    assert_eq!(
        choice.reason,
        "PersistentVolume web-data is ReadWriteOnce: two pods on different nodes may not mount \
         it at once"
    );
    assert_eq!(
        choice.downtime,
        "its pods, from the scale-down until they are Ready again on CSI"
    );
    assert!(rolling_refused(choose(&u, &facts, Requested::Rolling)).contains("ReadWriteOnce"));
}

#[test]
fn one_replica_scales_down_unless_rolling_is_asked_for_and_then_says_its_gap() {
    let u = unit(
        &["Deployment shop/web"],
        vec![pv("web-data", "acme/nfs", false, &["ReadWriteMany"])],
    );
    let facts = deployments(&[("Deployment shop/web", 1)]);
    let auto = choose(&u, &facts, Requested::Auto).unwrap();
    assert_eq!(auto.strategy, Strategy::ScaleDown);
    assert_eq!(
        auto.reason,
        "Deployment shop/web has 1 replica: it is down while its pod is replaced: rolling \
         would not keep it up either"
    );
    // Safe for the storage: asked for, it rolls, and the plan says the gap.
    let rolling = choose(&u, &facts, Requested::Rolling).unwrap();
    assert_eq!(rolling.strategy, Strategy::Rolling);
    assert_eq!(
        rolling.downtime,
        "Deployment shop/web has 1 replica: it is down while its pod is replaced"
    );
    // No replicas: nothing to replace, nothing down.
    let zero = deployments(&[("Deployment shop/web", 0)]);
    assert_eq!(
        choose(&u, &zero, Requested::Auto).unwrap().strategy,
        Strategy::Rolling
    );
}

#[test]
fn a_bare_pod_is_deleted_and_created_again_and_never_rolls() {
    let mut u = unit(&[], vec![]);
    u.bare_pods = vec!["shop/debug".into()];
    let choice = choose(&u, &BTreeMap::new(), Requested::Auto).unwrap();
    assert_eq!(choice.strategy, Strategy::ScaleDown);
    assert_eq!(
        choice.reason,
        "Pod shop/debug is a bare Pod: no controller starts a replacement, so it is deleted and \
         created again"
    );
    assert!(
        rolling_refused(choose(&u, &BTreeMap::new(), Requested::Rolling))
            .contains("Pod shop/debug is a bare Pod")
    );
}

#[test]
fn scale_down_asked_for_is_what_every_unit_gets() {
    let u = unit(
        &["Deployment shop/web"],
        vec![pv("web-data", "acme/nfs", false, &["ReadWriteMany"])],
    );
    let facts = deployments(&[("Deployment shop/web", 3)]);
    let choice = choose(&u, &facts, Requested::ScaleDown).unwrap();
    assert_eq!(choice.strategy, Strategy::ScaleDown);
    assert_eq!(choice.reason, "--strategy scale-down");
}

#[test]
fn an_inline_volume_rolls_through_its_deployments_own_rollout_even_with_one_replica() {
    let mut u = unit(&["Deployment shop/cache"], vec![]);
    u.templates = vec![w("Deployment shop/cache")];
    // The default 25%: maxSurge 1, maxUnavailable 0 for one replica.
    let facts = deployments(&[("Deployment shop/cache", 1)]);
    let choice = choose(&u, &facts, Requested::Auto).unwrap();
    assert_eq!(choice.strategy, Strategy::Rolling);
    assert_eq!(choice.rollouts, [w("Deployment shop/cache")]);
    assert_eq!(
        choice.reason,
        "its inline volumes' drivers do not attach; Deployment shop/cache keeps 1 of its 1 pod \
         up through its own rollout (maxUnavailable 0, maxSurge 1)"
    );

    // Recreate stops every pod first: not kept up, so auto scales down.
    let recreate = BTreeMap::from([(
        w("Deployment shop/cache"),
        WorkloadFacts {
            replicas: 3,
            rollout: Rollout::Recreate,
        },
    )]);
    let auto = choose(&u, &recreate, Requested::Auto).unwrap();
    assert_eq!(auto.strategy, Strategy::ScaleDown);
    assert!(auto.reason.contains("Recreate"), "{}", auto.reason);

    // A paused Deployment would never roll out: refused when asked for.
    let paused = BTreeMap::from([(
        w("Deployment shop/cache"),
        WorkloadFacts {
            replicas: 3,
            rollout: Rollout::Deployment {
                max_unavailable: 0,
                max_surge: 1,
                paused: true,
            },
        },
    )]);
    assert!(rolling_refused(choose(&u, &paused, Requested::Rolling)).contains("is paused"));
}

#[test]
fn a_stateful_set_partition_keeps_pods_on_the_old_template_so_it_cannot_roll() {
    let mut u = unit(&["StatefulSet shop/db"], vec![]);
    u.templates = vec![w("StatefulSet shop/db")];
    let partitioned = BTreeMap::from([(
        w("StatefulSet shop/db"),
        WorkloadFacts {
            replicas: 3,
            rollout: Rollout::StatefulSet {
                max_unavailable: 1,
                partition: 2,
            },
        },
    )]);
    assert!(
        rolling_refused(choose(&u, &partitioned, Requested::Rolling))
            .contains("rollingUpdate.partition is 2")
    );
    // OnDelete: the template is rewritten and each evicted pod comes back with it.
    let on_delete = BTreeMap::from([(
        w("StatefulSet shop/db"),
        WorkloadFacts {
            replicas: 3,
            rollout: Rollout::OnDelete,
        },
    )]);
    let choice = choose(&u, &on_delete, Requested::Auto).unwrap();
    assert_eq!(choice.strategy, Strategy::Rolling);
    assert_eq!(choice.rollouts, Vec::<WorkloadRef>::new());
}

#[test]
fn the_controllers_bounds_are_resolved_as_they_resolve_them() {
    let inventory = Inventory {
        deployments: vec![serde_json::from_value(json!({
            "metadata": {"name": "a", "namespace": "shop"},
            "spec": {"replicas": 10, "selector": {}, "template": {},
                     "strategy": {"rollingUpdate": {"maxSurge": "15%", "maxUnavailable": "15%"}}},
        }))
        .unwrap()],
        stateful_sets: vec![serde_json::from_value(json!({
            "metadata": {"name": "b", "namespace": "shop"},
            "spec": {"selector": {}, "serviceName": "b", "template": {},
                     "updateStrategy": {"rollingUpdate": {"partition": 1}}},
        }))
        .unwrap()],
        ..Inventory::default()
    };
    let facts = facts(&inventory);
    // 15% of 10: surge rounds up to 2, unavailable down to 1.
    assert_eq!(
        facts[&w("Deployment shop/a")],
        WorkloadFacts {
            replicas: 10,
            rollout: Rollout::Deployment {
                max_unavailable: 1,
                max_surge: 2,
                paused: false
            }
        }
    );
    assert_eq!(
        facts[&w("StatefulSet shop/b")],
        WorkloadFacts {
            replicas: 1,
            rollout: Rollout::StatefulSet {
                max_unavailable: 1,
                partition: 1
            }
        }
    );
}

fn object<T: serde::de::DeserializeOwned>(value: Value) -> T {
    serde_json::from_value(value).expect("a valid object")
}

/// The plan of a 3-replica Deployment on `modes` of acme/nfs (which does not attach).
fn planned(modes: Value, strategy: Requested) -> plan::Plan {
    let volumes = json!([{"name": "d", "persistentVolumeClaim": {"claimName": "data"}}]);
    let inventory = Inventory {
        persistent_volumes: vec![object(json!({
            "metadata": {"name": "data", "uid": "uid-data-pv"},
            "spec": {"accessModes": modes, "capacity": {"storage": "1Gi"},
                     "claimRef": {"namespace": "shop", "name": "data", "uid": "uid-claim"},
                     "flexVolume": {"driver": "acme/nfs", "options": {"share": "/x"}}},
        }))],
        persistent_volume_claims: vec![object(json!({
            "metadata": {"name": "data", "namespace": "shop", "uid": "uid-claim"},
            "spec": {"volumeName": "data"},
        }))],
        deployments: vec![object(json!({
            "metadata": {"name": "web", "namespace": "shop", "uid": "uid-web"},
            "spec": {"replicas": 3, "selector": {},
                     "template": {"spec": {"containers": [], "volumes": volumes}}},
        }))],
        csi_drivers: vec![object(json!({
            "metadata": {"name": "flexvolume-acme--nfs"}, "spec": {"attachRequired": false},
        }))],
        ..Inventory::default()
    };
    let selection = Selection {
        all: true,
        strategy,
        ..Selection::default()
    };
    plan::plan(&inventory, &selection)
}

#[test]
fn the_plan_says_each_units_strategy_and_refuses_what_rolling_cannot_move() {
    let plan = planned(json!(["ReadWriteMany"]), Requested::Auto);
    assert_eq!(plan.refused, vec![]);
    let unit = &plan.units[0];
    assert_eq!(unit.strategy, Strategy::Rolling);
    assert_eq!(unit.pvs[0].access_modes, ["ReadWriteMany"]);
    let json = serde_json::to_value(unit).unwrap();
    assert_eq!(json["strategy"], "rolling");
    assert!(json["strategy_reason"]
        .as_str()
        .unwrap()
        .contains("keeps 2 of its 3 pods up"));

    let plan = planned(json!(["ReadWriteOnce"]), Requested::Rolling);
    assert_eq!(plan.units, vec![]);
    assert_eq!(plan.refused.len(), 1);
    assert_eq!(
        plan.refused[0].what,
        "Deployment shop/web, PersistentVolume data"
    );
    assert!(plan.refused[0].reason.starts_with(
        "--strategy rolling: PersistentVolume data is ReadWriteOnce: two pods on different \
         nodes may not mount it at once"
    ));
}

#[test]
fn where_pods_may_not_be_evicted_auto_scales_down_and_rolling_is_refused() {
    let denied = std::collections::BTreeSet::from(["shop".to_owned()]);
    for (requested, rolled) in [(Requested::Auto, false), (Requested::Rolling, true)] {
        let mut plan = planned(json!(["ReadWriteMany"]), requested);
        assert_eq!(plan.units[0].strategy, Strategy::Rolling);
        without_evictions(&mut plan, &denied, requested);
        let why = "this identity may not evict pods in namespace shop (create on pods/eviction)";
        if rolled {
            assert_eq!(plan.units, vec![]);
            assert_eq!(
                plan.refused[0].reason,
                format!(
                    "--strategy rolling: {why}; --strategy auto or scale-down migrates it with \
                     downtime"
                )
            );
        } else {
            assert_eq!(plan.units[0].strategy, Strategy::ScaleDown);
            assert_eq!(plan.units[0].strategy_reason, why);
        }
    }
    // A workload rolled out by its own controller evicts nothing: nothing to ask.
    let mut u = unit(&["Deployment shop/cache"], vec![]);
    u.strategy = Strategy::Rolling;
    u.rollouts = vec![w("Deployment shop/cache")];
    assert_eq!(evicts_in(&u).count(), 0);
}
