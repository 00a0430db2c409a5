//! The names of the controller's records in the API server, shared by `flexd manifests`
//! (which defines their resource and grants them) and `flexd serve` (which keeps them).

/// The API group and version of the `FlexdRecord` resource.
pub const GROUP: &str = "flexd.io";
pub const VERSION: &str = "v1alpha1";
pub const KIND: &str = "FlexdRecord";
pub const PLURAL: &str = "flexdrecords";

/// Where the controller's own credentials for its records are mounted: `token`, `ca.crt`,
/// `namespace` (a ServiceAccount token Secret allowed only `flexdrecords` in flexd's
/// namespace; never the sidecars' token).
pub const DEFAULT_CREDENTIALS: &str = "/var/run/secrets/flexd.io/controller-records";
