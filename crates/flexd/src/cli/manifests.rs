//! `flexd manifests`: everything to deploy flexd to a cluster, as multi-document YAML, for the
//! drivers installed in the plugin dir or named with `--driver`. What the objects are and why:
//! [`flexd::deploy`]. This module only finds out what each driver can do.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context as _};
use clap::error::ErrorKind;
use clap::Args;
use flexvolume_host::prober::{self, Probed, Subject};
use flexvolume_host::{Capabilities, DriverName};

use crate::builtin::Builtin;
use crate::cli::usage_error;
use crate::settings::Global;
use flexd::deploy::kubernetes_version::{self, KubernetesMinor};
use flexd::deploy::{self, checks, DriverProfile, Settings};

#[derive(Debug, Args)]
pub struct ManifestsArgs {
    /// A driver to deploy, repeatable; default: every driver installed in the plugin dir.
    /// `NAME` takes its capabilities from its `init` (a builtin driver's, else the plugin dir's);
    /// `NAME=JSON` gives them as its `init` would answer them (`capabilities` object, e.g.
    /// `acme/nfs={"attach":false}`; absent keys keep the FlexVolume defaults). A driver named
    /// twice is refused.
    #[arg(long = "driver", value_name = "NAME[=CAPABILITIES]", value_parser = checks::driver)]
    pub drivers: Vec<checks::DriverArg>,
    /// The flexd image (built from deploy/Dockerfile, target flexd).
    #[arg(long, value_parser = checks::image, default_value = concat!("registry.example/flexd:", env!("CARGO_PKG_VERSION")))]
    pub image: String,
    /// The namespace of flexd's pods, accounts and controller records (FlexdRecord objects; a
    /// DNS-1123 label).
    #[arg(long, value_parser = checks::dns_label, default_value = "flexd-system")]
    pub namespace: String,
    /// kubelet's root dir (--root-dir): CSI and registration sockets go under it.
    #[arg(long, value_parser = checks::node_path, default_value = "/var/lib/kubelet")]
    pub kubelet_dir: PathBuf,
    /// The nodes' plugin dir (kubelet's --volume-plugin-dir), mounted in flexd's pods. The
    /// global --plugin-dir is only where this command reads drivers from (a scratch dir is
    /// fine there); a temporary dir is never deployed.
    #[arg(long, value_name = "PATH", value_parser = checks::node_path, default_value = flexvolume_host::layout::DEFAULT_PLUGIN_DIR)]
    pub node_plugin_dir: PathBuf,
    /// A driver whose volumes pods may declare inline (a `csi:` volume in the pod, CSIDriver
    /// mode Ephemeral), repeatable; none by default: an inline volume lets any pod author pass
    /// any options to a root driver on the host. Not for drivers that attach.
    #[arg(long = "inline-volumes", value_name = "DRIVER", value_parser = DriverName::parse)]
    pub inline_volumes: Vec<DriverName>,
    /// A driver whose attach and detach set up devices, repeatable: the controller's flexd then
    /// runs privileged with the host's /dev. Without any, the controller runs unprivileged (the
    /// builtin loop driver's attach only claims the volume; its node sets up the device).
    #[arg(long = "privileged-controller", value_name = "DRIVER", value_parser = DriverName::parse)]
    pub privileged_controller: Vec<DriverName>,
    /// Serve the node's /metrics and /healthz on every address of the node, to scrape them from
    /// the network; by default only on the node's loopback (kubelet's probes reach it there).
    #[arg(long)]
    pub expose_metrics: bool,
    /// The controller replicas' fence lease (`flexd serve --fence-lease`): how long a volume
    /// waits for the other replica when one dies mid-call. Default: serve's own, 20s.
    #[arg(long, value_name = "T", value_parser = fence_lease)]
    pub fence_lease: Option<std::time::Duration>,
    /// A host directory the drivers use (an image dir, a config dir), repeatable: mounted at the
    /// same path in flexd's pods. The builtin loop driver's image dir is added for it.
    #[arg(long = "host-dir", value_name = "PATH", value_parser = checks::node_path)]
    pub host_dirs: Vec<PathBuf>,
    /// The cluster's Kubernetes version: its minor (`1.29`), its version (`v1.29.15`), or `-` to
    /// read `kubectl version -o json` from standard input. Chooses the CSI sidecars that minor
    /// supports (docs/compatibility.md); a minor below the oldest supported is refused.
    /// Default: the newest minor tested.
    #[arg(long, value_name = "VERSION")]
    pub kubernetes_version: Option<String>,
    /// csi-attacher image, for drivers that attach. Default: the release for the Kubernetes
    /// version.
    #[arg(long, value_parser = checks::image)]
    pub attacher_image: Option<String>,
    /// csi-provisioner image, for drivers that provision. Default: the release for the
    /// Kubernetes version.
    #[arg(long, value_parser = checks::image)]
    pub provisioner_image: Option<String>,
    /// csi-resizer image, for expanding drivers with a controller side. Default: the release
    /// for the Kubernetes version.
    #[arg(long, value_parser = checks::image)]
    pub resizer_image: Option<String>,
    /// Timeout of each driver's init.
    #[arg(long, value_parser = crate::settings::parse_duration, default_value = "2m")]
    pub timeout: std::time::Duration,
    /// Print instead what upgrades a controller that kept its records on the claim CLAIM (its
    /// old `flexd-controller-state`): the records' resource and identity, and a Job importing
    /// the claim's records into the API server. Apply it, wait for the Job, then apply the
    /// manifests (docs/operator-guide.md#upgrade-state-claim).
    #[arg(long, value_name = "CLAIM", value_parser = checks::dns_subdomain)]
    pub import_state_claim: Option<String>,
    /// Print instead the identity `flexd migrate --apply` runs as: a ServiceAccount, the
    /// ClusterRole and Role it needs and no more, and their bindings
    /// (docs/migration.md#rbac).
    #[arg(long, conflicts_with = "import_state_claim")]
    pub migrator: bool,
    /// With --migrator: also what `flexd migrate --recreate-pods` needs (get, delete and
    /// create pods, a wide grant: only when bare Pods are to be migrated).
    #[arg(long, requires = "migrator")]
    pub recreate_pods: bool,
}

pub fn run(global: &Global, args: ManifestsArgs) -> anyhow::Result<ExitCode> {
    // Paths on the nodes, mounted at the same place in the pods; --kubelet-dir,
    // --node-plugin-dir and --host-dir are checked the same way as they are parsed. The global
    // --plugin-dir is where drivers are read from here, and is not deployed.
    if let Err(e) = checks::check_node_path(&global.state_dir) {
        return Err(usage_error(
            "manifests",
            ErrorKind::ValueValidation,
            format!("invalid value for '--state-dir': {e}"),
        ));
    }
    let mut names: Vec<&DriverName> = args.drivers.iter().map(|d| &d.name).collect();
    names.sort();
    if let Some(twice) = names.windows(2).find(|w| w[0] == w[1]) {
        return Err(usage_error(
            "manifests",
            ErrorKind::ArgumentConflict,
            format!(
                "driver {} is given more than once with --driver (each driver once, with its \
                 capabilities or without)",
                twice[0]
            ),
        ));
    }
    let minor = kubernetes_minor(args.kubernetes_version.as_deref())?;
    if args.migrator {
        let settings = settings(global, &args, minor, Vec::new());
        let objects = deploy::render_migrator(&settings, args.recreate_pods);
        print!("{}", deploy::migrator_to_yaml(&settings, &objects)?);
        return Ok(ExitCode::SUCCESS);
    }
    if let Some(claim) = &args.import_state_claim {
        let settings = settings(global, &args, minor, Vec::new());
        let objects = deploy::render_import(&settings, claim);
        print!("{}", deploy::import_to_yaml(&settings, claim, &objects)?);
        return Ok(ExitCode::SUCCESS);
    }
    let mut host_dirs = args.host_dirs.clone();
    let mut drivers = profiles(global, &args, &mut host_dirs)?;
    host_dirs.sort();
    host_dirs.dedup();
    for dir in &host_dirs {
        // The loop driver's image dirs come from the plugin dir read here.
        if let Err(e) = checks::check_node_path(dir) {
            bail!("a host dir of the drivers cannot be deployed: {e}");
        }
    }
    operator_choices(&args, &mut drivers)?;
    let settings = settings(global, &args, minor, host_dirs);
    let objects = deploy::render(&settings, &drivers)?;
    print!("{}", deploy::to_yaml(&settings, &drivers, &objects)?);
    Ok(ExitCode::SUCCESS)
}

/// A fence lease the controller will accept with its default kill grace (checked again by
/// serve, with the grace it runs with).
fn fence_lease(text: &str) -> Result<std::time::Duration, String> {
    let lease = crate::settings::parse_duration(text)?;
    flexvolume_host::controller_records::FenceSettings::new(
        lease,
        flexvolume_host::runner::DEFAULT_KILL_GRACE,
    )?;
    Ok(lease)
}

/// `--kubernetes-version`, from its value or (`-`) from `kubectl version -o json` on stdin.
fn kubernetes_minor(version: Option<&str>) -> anyhow::Result<KubernetesMinor> {
    let Some(version) = version else {
        return Ok(KubernetesMinor::NEWEST_TESTED);
    };
    let text = if version == "-" {
        std::io::read_to_string(std::io::stdin().lock())
            .context("cannot read `kubectl version -o json` from standard input")?
    } else {
        version.to_owned()
    };
    let minor = kubernetes_version::parse(&text).map_err(|e| {
        usage_error(
            "manifests",
            ErrorKind::ValueValidation,
            format!("invalid value for '--kubernetes-version': {e}"),
        )
    })?;
    if minor.is_untested() {
        tracing::warn!(
            kubernetes = %minor,
            newest_tested = %KubernetesMinor::NEWEST_TESTED,
            "newer than any Kubernetes flexd is tested on: deploying the newest tested sidecars"
        );
    }
    Ok(minor)
}

fn settings(
    global: &Global,
    args: &ManifestsArgs,
    minor: KubernetesMinor,
    host_dirs: Vec<PathBuf>,
) -> Settings {
    let sidecars = minor.sidecars();
    Settings {
        namespace: args.namespace.clone(),
        image: args.image.clone(),
        kubelet_dir: args.kubelet_dir.clone(),
        plugin_dir: args.node_plugin_dir.clone(),
        state_dir: global.state_dir.clone(),
        host_dirs,
        attacher_image: (args.attacher_image.as_deref())
            .unwrap_or(sidecars.attacher)
            .to_owned(),
        provisioner_image: (args.provisioner_image.as_deref())
            .unwrap_or(sidecars.provisioner)
            .to_owned(),
        resizer_image: (args.resizer_image.as_deref())
            .unwrap_or(sidecars.resizer)
            .to_owned(),
        // The minor's flags go with whichever image: one given with --resizer-image must
        // accept them (docs/compatibility.md).
        resizer_flags: sidecars
            .resizer_flags
            .iter()
            .map(|f| (*f).to_owned())
            .collect(),
        expose_metrics: args.expose_metrics,
        fence_lease: args.fence_lease,
    }
}

/// What the operator chose per driver: inline volumes, a privileged controller. A name that is
/// not deployed, or inline volumes for a driver that attaches, is bad usage.
fn operator_choices(args: &ManifestsArgs, drivers: &mut [DriverProfile]) -> anyhow::Result<()> {
    for (flag, names) in [
        ("--inline-volumes", &args.inline_volumes),
        ("--privileged-controller", &args.privileged_controller),
    ] {
        for name in names {
            let Some(driver) = drivers.iter_mut().find(|d| &d.name == name) else {
                return Err(usage_error(
                    "manifests",
                    ErrorKind::ValueValidation,
                    format!("{flag} {name}: not one of the drivers deployed"),
                ));
            };
            if flag == "--inline-volumes" {
                if driver.attach {
                    return Err(usage_error(
                        "manifests",
                        ErrorKind::ValueValidation,
                        format!(
                            "{flag} {name}: the driver attaches, and an inline volume has no \
                             attach step"
                        ),
                    ));
                }
                driver.inline = true;
            } else {
                driver.privileged_controller = true;
            }
        }
    }
    Ok(())
}

/// What each driver can do, sorted by name.
fn profiles(
    global: &Global,
    args: &ManifestsArgs,
    host_dirs: &mut Vec<PathBuf>,
) -> anyhow::Result<Vec<DriverProfile>> {
    // A builtin driver is this flexd's own code: its capabilities are known without a probe.
    let needs_probe = args.drivers.is_empty()
        || args
            .drivers
            .iter()
            .any(|d| d.capabilities.is_none() && builtin_named(d.name.as_str()).is_none());
    let probed = if needs_probe {
        let config = global.runner_config()?.with_timeout_for_all(args.timeout);
        prober::probe_all(
            &global.plugin_dir,
            global.layout_policy(),
            &config,
            prober::default_parallelism(),
        )
        .with_context(|| format!("cannot read plugin dir {}", global.plugin_dir.display()))?
    } else {
        Vec::new()
    };
    let mut found: Vec<(DriverName, Capabilities)> = Vec::new();
    if args.drivers.is_empty() {
        for p in &probed {
            let Subject::Driver(name) = &p.subject else {
                tracing::warn!(entry = ?p.name, "not a driver name; left out");
                continue;
            };
            if builtin_named(name.as_str()).is_some() {
                image_dirs(global, name, host_dirs)?;
            }
            found.push((name.clone(), installed(p)?));
        }
        if found.is_empty() {
            bail!(
                "no drivers in {}: install one, or name drivers with --driver",
                global.plugin_dir.display()
            );
        }
    }
    for given in &args.drivers {
        let name = given.name.clone();
        let capabilities = match given.capabilities {
            Some(capabilities) => capabilities,
            None => match builtin_named(name.as_str()) {
                Some(b) => {
                    image_dirs(global, &name, host_dirs)?;
                    builtin(b)?
                }
                None => match probed
                    .iter()
                    .find(|p| matches!(&p.subject, Subject::Driver(n) if *n == name))
                {
                    Some(p) => installed(p)?,
                    None => bail!(
                        "driver {name} is not installed in {} (give its capabilities: --driver '{name}={{\"attach\":false}}')",
                        global.plugin_dir.display()
                    ),
                },
            },
        };
        found.push((name, capabilities));
    }
    found.sort_by(|a, b| a.0.cmp(&b.0));
    found.dedup_by(|a, b| a.0 == b.0);
    found
        .into_iter()
        .map(|(name, caps)| DriverProfile::new(name, &caps).map_err(anyhow::Error::from))
        .collect()
}

/// A probed driver's capabilities; a driver whose init failed is not deployed blind.
fn installed(p: &Probed) -> anyhow::Result<Capabilities> {
    match &p.result {
        Ok(plugin) => Ok(plugin.capabilities),
        Err(e) => bail!(
            "driver {}: {e} (fix it, or leave it out with --driver)",
            p.name
        ),
    }
}

fn builtin_named(name: &str) -> Option<Builtin> {
    use clap::ValueEnum as _;
    Builtin::value_variants()
        .iter()
        .copied()
        .find(|b| b.driver_name() == name)
}

/// A builtin driver's capabilities, from its own init run in this process.
fn builtin(builtin: Builtin) -> anyhow::Result<Capabilities> {
    match builtin {
        Builtin::Loop => flexvolume_driver::Driver::init(&flexvolume_loop::LoopDriver::default())
            .map_err(|e| anyhow::anyhow!("builtin driver {}: init: {e}", builtin.driver_name())),
    }
}

/// The host directories the builtin loop driver keeps volumes in: the image dirs installed beside
/// it in the plugin dir (`flexd install --builtin loop --image-dir`), or its default one when it is
/// not installed there or was installed without any. Both the node and the controller pods mount
/// them, since the controller's attach and provision make the images the node then mounts.
fn image_dirs(
    global: &Global,
    name: &DriverName,
    host_dirs: &mut Vec<PathBuf>,
) -> anyhow::Result<()> {
    let driver_dir = global.plugin_dir.join(name.dir_name());
    let dirs = flexvolume_loop::ImageDirs::read(&driver_dir)
        .with_context(|| format!("driver {name}: its image dirs"))?;
    host_dirs.extend(dirs.iter().map(Path::to_path_buf));
    Ok(())
}
