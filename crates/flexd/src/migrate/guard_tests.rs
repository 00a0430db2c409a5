//! What flexd may delete and replace, from what the journal recorded and what is there now.

use serde_json::{json, Value};

use super::*;
use crate::migrate::plan::{PvMove, Unit};

fn observed(uid: &str, replaces: Option<&str>, content: Value) -> Observed {
    Observed {
        uid: uid.into(),
        replaces: replaces.map(Into::into),
        content,
    }
}

fn flex_spec() -> Value {
    json!({"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
           "persistentVolumeReclaimPolicy": "Retain",
           "claimRef": {"namespace": "shop", "name": "data", "uid": "c1"},
           "flexVolume": {"driver": "acme/nfs", "options": {"share": "/x"}}})
}

fn old_pv() -> Value {
    json!({"apiVersion": "v1", "kind": "PersistentVolume",
           "metadata": {"name": "data", "uid": "uid-flex", "resourceVersion": "7"},
           "spec": flex_spec(), "status": {"phase": "Bound"}})
}

/// The CSI PV an apply made of [`old_pv`], as the API server returns it (a default added).
fn made_spec() -> Value {
    let mut spec = twin::converted(&old_pv(), "PersistentVolume").unwrap()["spec"].clone();
    spec["volumeMode"] = json!("Filesystem");
    spec
}

#[test]
fn a_swap_replaces_only_the_recorded_object_and_never_a_reused_name() {
    let pv = "PersistentVolume data";
    let old = observed("uid-flex", None, flex_spec());
    assert_eq!(
        swap(pv, Some("uid-flex"), Some(&old), false),
        Ok(Swap::Replace)
    );
    assert_eq!(swap(pv, Some("uid-flex"), None, false), Ok(Swap::Create));
    let made = observed("uid-csi", None, made_spec());
    assert_eq!(swap(pv, Some("uid-csi"), Some(&made), true), Ok(Swap::Done));
    // Created by a run killed before it journaled the uid: flexd's own, by its mark.
    let unjournaled = observed("uid-csi", Some("uid-flex"), made_spec());
    assert_eq!(
        swap(pv, Some("uid-flex"), Some(&unjournaled), true),
        Ok(Swap::Adopt("uid-csi".into()))
    );

    // The name reused since: a PV of the same name someone else created, CSI or not, with or
    // without another object's mark, is neither deleted nor taken for flexd's.
    for found in [
        observed("uid-someone", None, flex_spec()),
        observed("uid-someone", None, made_spec()),
        observed("uid-someone", Some("uid-else"), made_spec()),
    ] {
        let is_csi = found.is_csi();
        assert_eq!(
            swap(pv, Some("uid-flex"), Some(&found), is_csi),
            Err(Changed::NameReused {
                object: pv.into(),
                recorded: "uid-flex".into(),
                found: "uid-someone".into(),
            })
        );
    }
    // A rollback finds a CSI PV flexd did not make under the name.
    let message = swap(
        pv,
        Some("uid-csi"),
        Some(&observed("uid-new", None, made_spec())),
        false,
    )
    .unwrap_err()
    .to_string();
    assert_eq!(
        message,
        "PersistentVolume data is not the object the journal recorded: its uid is uid-new, the \
         journal's uid-csi (deleted and created again under that name since)"
    );
    // A journal without the uid cannot say.
    assert_eq!(
        swap(pv, None, Some(&old), false),
        Err(Changed::NotRecorded { object: pv.into() })
    );
}

#[test]
fn a_pod_is_deleted_only_when_it_is_the_recorded_one_or_flexds_own() {
    let pod = "Pod shop/lonely";
    assert_eq!(delete(pod, Some("p1"), None), Ok(Delete::Gone));
    let recorded = observed("p1", None, Value::Null);
    assert_eq!(
        delete(pod, Some("p1"), Some(&recorded)),
        Ok(Delete::Uid("p1".into()))
    );
    let recreated = observed("p2", Some("p1"), Value::Null);
    assert_eq!(
        delete(pod, Some("p1"), Some(&recreated)),
        Ok(Delete::Uid("p2".into()))
    );
    let someone_elses = observed("p3", None, Value::Null);
    assert!(matches!(
        delete(pod, Some("p1"), Some(&someone_elses)),
        Err(Changed::NameReused { .. })
    ));
}

#[test]
fn a_patch_needs_the_recorded_object() {
    let w = "Deployment shop/web";
    assert_eq!(same(w, Some("d1"), Some("d1")), Ok(()));
    assert_eq!(
        same(w, Some("d1"), None),
        Err(Changed::Gone {
            object: w.into(),
            recorded: "d1".into()
        })
    );
    assert!(matches!(
        same(w, Some("d1"), Some("d2")),
        Err(Changed::NameReused { .. })
    ));
}

#[test]
fn differences_name_each_changed_field_and_ignore_the_api_servers_defaults() {
    let expected = made_spec();
    let mut found = expected.clone();
    found["mountOptions"] = json!([]); // a default: absent in expected
    let mut omitted = expected.clone();
    omitted["csi"]["readOnly"] = json!(false); // Go's omitempty leaves it out
    assert_eq!(differences(&omitted, &found), Vec::<String>::new());
    assert_eq!(differences(&expected, &found), Vec::<String>::new());
    found["persistentVolumeReclaimPolicy"] = json!("Delete");
    found["csi"]["volumeAttributes"]["share"] = json!("/y");
    found.as_object_mut().unwrap().remove("accessModes");
    assert_eq!(
        differences(&expected, &found),
        [
            "accessModes: [\"ReadWriteOnce\"] → absent",
            "csi.volumeAttributes.share: \"/x\" → \"/y\"",
            "persistentVolumeReclaimPolicy: \"Retain\" → \"Delete\"",
        ]
    );
    let many: Value = (1..10).map(|i| (format!("k{i}"), json!(i))).collect();
    let none = json!({});
    let listed = differences(&many, &none);
    assert_eq!(listed.len(), MAX_DIFFERENCES + 1);
    assert_eq!(listed.last().unwrap(), "and 4 more");
}

/// A journal of one unit, Deployment shop/web and PV data, at `step` after an apply: the PV
/// swapped (old_pvs) once past `stopped`.
fn journal_at(step: Step) -> Journal {
    let unit = Unit {
        workloads: vec!["Deployment shop/web".parse().unwrap()],
        pvs: vec![PvMove::example(
            "data",
            "acme/nfs",
            false,
            &["ReadWriteOnce"],
        )],
        uids: BTreeMap::from([
            ("Deployment shop/web".into(), "uid-web".into()),
            ("PersistentVolume data".into(), "uid-flex".into()),
        ]),
        ..Unit::default()
    };
    let mut journal = Journal::new(vec![unit], "t".into(), "me".into());
    let record = &mut journal.units[0];
    record.step = step;
    if step >= Step::Swapping {
        record.old_pvs.insert("data".into(), old_pv());
    }
    if step >= Step::Swapped {
        record
            .uids
            .insert("PersistentVolume data".into(), "uid-csi".into());
    }
    journal
}

fn cluster(web: &str, pv: Observed) -> Cluster {
    Cluster::from([
        (
            "Deployment shop/web".into(),
            observed(web, None, json!({"spec": {}})),
        ),
        ("PersistentVolume data".into(), pv),
    ])
}

#[test]
fn a_finished_journal_rolls_back_only_what_it_made_and_says_what_differs() {
    let journal = journal_at(Step::Done);
    let made = observed("uid-csi", Some("uid-flex"), made_spec());
    assert_eq!(
        verify(
            &journal,
            Operation::Rollback,
            &cluster("uid-web", made.clone())
        ),
        []
    );
    // Nothing of a finished apply is acted on by --resume.
    assert_eq!(acted_on(&journal, Operation::Apply), Vec::<usize>::new());

    // The PV's name reused since, and the Deployment deleted and created again.
    let reused = observed("uid-someone", None, made_spec());
    let refused = verify(&journal, Operation::Rollback, &cluster("uid-web-2", reused));
    assert_eq!(
        refused,
        [
            Changed::NameReused {
                object: "Deployment shop/web".into(),
                recorded: "uid-web".into(),
                found: "uid-web-2".into(),
            },
            Changed::NameReused {
                object: "PersistentVolume data".into(),
                recorded: "uid-csi".into(),
                found: "uid-someone".into(),
            },
        ]
    );

    // The PV flexd made, modified since.
    let mut modified = made;
    modified.content["persistentVolumeReclaimPolicy"] = json!("Delete");
    let refused = verify(&journal, Operation::Rollback, &cluster("uid-web", modified));
    assert_eq!(
        refused.iter().map(ToString::to_string).collect::<Vec<_>>(),
        ["PersistentVolume data changed since flexd wrote it: \
          persistentVolumeReclaimPolicy: \"Retain\" → \"Delete\""]
    );
}

#[test]
fn a_resumed_apply_checks_each_object_against_the_uid_its_step_expects() {
    // Before the swap: the FlexVolume PV of the plan.
    let before = journal_at(Step::Stopped);
    let flex = observed("uid-flex", None, flex_spec());
    assert_eq!(
        verify(&before, Operation::Apply, &cluster("uid-web", flex.clone())),
        []
    );
    let other = observed("uid-other", None, flex_spec());
    assert!(matches!(
        &verify(&before, Operation::Apply, &cluster("uid-web", other))[..],
        [Changed::NameReused { object, .. }] if object == "PersistentVolume data"
    ));
    // Mid-swap: the old one, nothing, or flexd's own new one are all fine; a stranger is not.
    let mid = journal_at(Step::Swapping);
    let gone = Cluster::from([(
        "Deployment shop/web".to_owned(),
        observed("uid-web", None, Value::Null),
    )]);
    assert_eq!(verify(&mid, Operation::Apply, &gone), []);
    assert_eq!(
        verify(&mid, Operation::Apply, &cluster("uid-web", flex)),
        []
    );
    let own = observed("uid-csi", Some("uid-flex"), made_spec());
    assert_eq!(verify(&mid, Operation::Apply, &cluster("uid-web", own)), []);
    let stranger = observed("uid-x", None, made_spec());
    assert_eq!(
        verify(&mid, Operation::Apply, &cluster("uid-web", stranger)).len(),
        1
    );
    // A workload gone is named.
    let no_web = Cluster::new();
    assert!(verify(&before, Operation::Apply, &no_web)
        .iter()
        .any(|c| matches!(c, Changed::Gone { object, .. } if object == "Deployment shop/web")));
}
