//! `flexd manifests --migrator`: the least privilege `flexd migrate --apply` needs
//! (docs/migration.md#rbac). Cluster-wide what it must read and change across namespaces (PVs,
//! the workloads' scale and templates); its journal, and nothing else of flexd's namespace.

use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, Subject,
};

use super::objects::{meta, role_ref, service_account};
use super::sidecar::rule;
use super::{Object, Settings};
use crate::migrate::journal;

/// The migrator's identity and roles.
pub const MIGRATOR: &str = "flexd-migrator";

fn subject(namespace: &str) -> Vec<Subject> {
    vec![Subject {
        kind: "ServiceAccount".to_owned(),
        name: MIGRATOR.to_owned(),
        namespace: Some(namespace.to_owned()),
        ..Default::default()
    }]
}

/// What the migrator does, rule by rule; `recreate_pods`: bare Pods are read, deleted and
/// created again (`flexd migrate --recreate-pods`), which only that asks for: creating pods
/// anywhere is a wide grant.
fn cluster_rules(recreate_pods: bool) -> Vec<PolicyRule> {
    let mut rules = vec![
        // The swap: Retain, delete (finalizer removed), create with the same name.
        rule(
            "",
            &["persistentvolumes"],
            &["get", "list", "patch", "delete", "create"],
        ),
        // Which pods use what, until they are gone; claims until Bound again.
        rule("", &["pods"], &["list"]),
        // The rolling strategy: one pod at a time through the Eviction API, which honours the
        // workload's PodDisruptionBudget. No wider than the scale to zero it replaces.
        rule("", &["pods/eviction"], &["create"]),
        rule("", &["persistentvolumeclaims"], &["get"]),
        // kube-controller-manager's detach, seen in the node's status.
        rule("", &["nodes"], &["get"]),
        // Scale to zero and back; inline volumes through the template; Ready.
        rule(
            "apps",
            &["deployments", "statefulsets", "replicasets"],
            &["get", "list", "patch"],
        ),
        rule(
            "apps",
            &[
                "deployments/scale",
                "statefulsets/scale",
                "replicasets/scale",
            ],
            &["get", "patch"],
        ),
        // That flexd serves the drivers, where; CSI detach before a rollback's swap.
        rule(
            "storage.k8s.io",
            &["csidrivers", "csinodes", "volumeattachments"],
            &["list"],
        ),
    ];
    if recreate_pods {
        rules.push(rule("", &["pods"], &["get", "delete", "create"]));
    }
    rules
}

/// The journal: created once, then read and updated by name only.
fn journal_rules() -> Vec<PolicyRule> {
    let mut named = rule("", &["configmaps"], &["get", "update"]);
    named.resource_names = Some(vec![journal::NAME.to_owned()]);
    // `create` cannot be limited by name (the object does not exist yet).
    vec![rule("", &["configmaps"], &["create"]), named]
}

pub fn render_migrator(settings: &Settings, recreate_pods: bool) -> Vec<Object> {
    let ns = settings.namespace.as_str();
    vec![
        Object::ServiceAccount(Box::new(service_account(MIGRATOR, ns, true))),
        Object::ClusterRole(Box::new(ClusterRole {
            metadata: meta(MIGRATOR, None),
            rules: Some(cluster_rules(recreate_pods)),
            ..Default::default()
        })),
        Object::ClusterRoleBinding(Box::new(ClusterRoleBinding {
            metadata: meta(MIGRATOR, None),
            role_ref: role_ref("ClusterRole", MIGRATOR),
            subjects: Some(subject(ns)),
        })),
        Object::Role(Box::new(Role {
            metadata: meta(MIGRATOR, Some(ns)),
            rules: Some(journal_rules()),
        })),
        Object::RoleBinding(Box::new(RoleBinding {
            metadata: meta(MIGRATOR, Some(ns)),
            role_ref: role_ref("Role", MIGRATOR),
            subjects: Some(subject(ns)),
        })),
    ]
}

/// [`render_migrator`]'s objects as YAML, after a comment saying what they are for.
pub fn migrator_to_yaml(
    settings: &Settings,
    objects: &[Object],
) -> Result<String, super::RenderError> {
    let mut out = format!(
        "# flexd: the identity `flexd migrate --apply` needs, and no more (namespace {}).\n\
         # Run it as ServiceAccount {MIGRATOR}, or bind your own user to ClusterRole {MIGRATOR}\n\
         # and Role {MIGRATOR}: docs/migration.md#rbac\n",
        settings.namespace
    );
    for object in objects {
        out.push_str("---\n");
        out.push_str(&serde_yaml_ng::to_string(object)?);
    }
    Ok(out)
}
