//! The objects `flexd migrate --apply` creates, pure: an old object's CSI twin, an object as
//! it can be created again, and the mark that ties each to the object it replaces.

use serde_json::{json, Value};

use super::plan::WorkloadRef;

/// The annotation on every object flexd creates in place of another: that one's uid. A run
/// killed between the create and the journal write finds its own object by it, and tells it
/// from one someone else created under the same name ([`super::guard::swap`]).
pub const REPLACES: &str = "migrate.flexd.io/replaces";

/// Why an object from the journal has no CSI twin.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TwinError {
    #[error("cannot convert {kind}: {reasons}")]
    Refused { kind: String, reasons: String },
    #[error("{kind} has no flexVolume to convert")]
    NothingToConvert { kind: String },
}

/// `object` through `flexd migrate`'s conversion: the CSI twin, what the API server owns
/// dropped.
pub fn converted(object: &Value, kind: &str) -> Result<Value, TwinError> {
    let mut object = object.clone();
    if object.get("kind").is_none() {
        object["kind"] = json!(kind);
        object["apiVersion"] = json!("v1");
    }
    // Attaching is asked only of inline volumes, and the plan refused inline volumes of
    // attaching drivers already.
    let mut attaches = |_: &flexvolume_host::DriverName| Ok(false);
    let migration = super::migrate(&object.to_string(), &mut attaches).map_err(|refusals| {
        TwinError::Refused {
            kind: kind.to_owned(),
            reasons: refusals
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; "),
        }
    })?;
    migration
        .objects
        .into_iter()
        .next()
        .ok_or_else(|| TwinError::NothingToConvert {
            kind: kind.to_owned(),
        })
}

/// A workload's pod template with its inline flexVolumes converted.
pub fn converted_template(w: &WorkloadRef, template: &Value) -> Result<Value, TwinError> {
    let object = json!({
        "apiVersion": "apps/v1", "kind": w.kind.as_str(),
        "metadata": {"name": w.name, "namespace": w.namespace},
        "spec": {"template": template},
    });
    let mut new = converted(&object, w.kind.as_str())?;
    Ok(new["spec"]["template"].take())
}

/// What the API server owns, dropped, so the object can be created again.
pub fn fresh(object: &mut Value) {
    if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        for key in [
            "uid",
            "resourceVersion",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "generation",
            "managedFields",
        ] {
            meta.remove(key);
        }
    }
    if let Some(map) = object.as_object_mut() {
        map.remove("status");
    }
}

/// Marks `object` as created in place of the object of uid `replaced` ([`REPLACES`]).
pub fn mark_replacing(object: &mut Value, replaced: &str) {
    if !object["metadata"].is_object() {
        object["metadata"] = json!({});
    }
    if !object["metadata"]["annotations"].is_object() {
        object["metadata"]["annotations"] = json!({});
    }
    object["metadata"]["annotations"][REPLACES] = json!(replaced);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_template_converts_and_a_twin_is_marked_with_what_it_replaces() {
        let w: WorkloadRef = "Deployment shop/cache".parse().unwrap();
        let old = json!({"spec": {"containers": [{"name": "c"}], "volumes": [
            {"name": "v", "flexVolume": {"driver": "acme/nfs", "options": {"share": "/x"}}},
        ]}});
        let new = converted_template(&w, &old).unwrap();
        assert_eq!(
            new["spec"]["volumes"][0]["csi"]["driver"],
            "flexvolume-acme--nfs"
        );
        assert!(new["spec"]["volumes"][0].get("flexVolume").is_none());

        let mut pv = json!({"metadata": {"name": "a", "uid": "1", "resourceVersion": "9"},
                            "spec": {}, "status": {"phase": "Bound"}});
        fresh(&mut pv);
        mark_replacing(&mut pv, "uid-old");
        assert_eq!(
            pv,
            json!({"metadata": {"name": "a", "annotations": {REPLACES: "uid-old"}}, "spec": {}})
        );
        assert!(matches!(
            converted(
                &json!({"kind": "Pod", "apiVersion": "v1", "metadata": {"name": "p"}, "spec": {}}),
                "Pod"
            ),
            Err(TwinError::NothingToConvert { .. })
        ));
    }
}
