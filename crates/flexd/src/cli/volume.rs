//! `flexd volume`: kubelet's node flow for one volume, by hand (mount, unmount, list).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{bail, Context as _};
use clap::{Args, Subcommand};
use flexvolume_host::lifecycle::{Expansion, Lifecycle, MountRequest};
use flexvolume_host::{DriverName, Plugin, PodInfo, Resolver, VolumeSpec};

use flexd::user_manifest::SecretValues;

use crate::settings::{exit, Global, OutputFormat};

/// The state dir and the node name are global flags (`--state-dir`, `--node-name`; `--node`
/// is still understood).
#[derive(Debug, Args)]
pub struct VolumeArgs {
    #[command(subcommand)]
    pub command: VolumeCommand,
}

#[derive(Debug, Subcommand)]
pub enum VolumeCommand {
    /// Attach (if the driver attaches), mount the device, and mount the volume on TARGET.
    #[command(after_help = exit::PLAIN)]
    Mount(Box<MountArgs>),
    /// Tear down exactly what mount did for TARGET.
    #[command(after_help = exit::PLAIN)]
    Unmount(UnmountArgs),
    /// Grow a mounted volume: expandvolume, then expandfs (default: grow the filesystem).
    #[command(after_help = exit::PLAIN)]
    Expand(ExpandArgs),
    /// Attach a volume to --node-name, as the controller manager does; prints the device.
    #[command(after_help = exit::PLAIN)]
    Attach(Box<SpecArgs>),
    /// Whether a volume is attached to --node-name.
    #[command(after_help = exit::ISATTACHED)]
    Isattached(Box<SpecArgs>),
    /// Detach a volume from --node-name, under its own name (as kubelet's detach).
    #[command(after_help = exit::PLAIN)]
    Detach(Box<SpecArgs>),
    /// The volumes flexd manages.
    #[command(after_help = exit::PLAIN)]
    List,
}

/// A volume, as flags or as a Kubernetes object.
#[derive(Debug, Args)]
pub struct SpecArgs {
    /// A PersistentVolume or pod Volume (YAML or JSON) whose flexVolume source describes the volume.
    #[arg(short = 'f', long = "file", conflicts_with = "driver")]
    pub file: Option<PathBuf>,
    /// The driver: vendor/driver.
    #[arg(long, value_name = "VENDOR/DRIVER", required_unless_present = "file")]
    pub driver: Option<String>,
    /// The PV or pod volume name (kubernetes.io/pvOrVolumeName); for mount, default: the
    /// target's name.
    #[arg(long)]
    pub volume_name: Option<String>,
    /// The flexVolume options, a JSON object of strings.
    #[arg(long)]
    pub options: Option<String>,
    /// The filesystem type the driver should use (kubernetes.io/fsType), e.g. ext4 or xfs.
    #[arg(long)]
    pub fs_type: Option<String>,
    /// Mount read-only (kubernetes.io/readwrite: ro).
    #[arg(long)]
    pub read_only: bool,
    /// A secret value, KEY=VALUE (repeatable); passed to mount only, base64, never printed.
    #[arg(long = "secret", value_name = "KEY=VALUE")]
    pub secrets: Vec<String>,
    /// A Kubernetes Secret (YAML or JSON, as `kubectl get secret -o yaml` prints it) whose
    /// data and stringData are the secret values; its name must match the volume's secretRef.
    #[arg(long)]
    pub secret_file: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct MountArgs {
    #[command(flatten)]
    pub spec: SpecArgs,
    /// Where the volume is mounted: the pod's volume directory.
    #[arg(long)]
    pub target: PathBuf,
    /// The group that must own the volume (SetUp(fsGroup); 0 to 4294967294).
    #[arg(long, value_parser = super::ownership::parse_fs_group)]
    pub fs_group: Option<u32>,
    /// When the ownership pass walks the volume (fsGroupChangePolicy).
    #[arg(long, value_enum, default_value_t = super::ownership::PolicyArg::Always)]
    pub fs_group_policy: super::ownership::PolicyArg,
    /// The pod's name (kubernetes.io/pod.name), passed to the driver's mount.
    #[arg(long, default_value = "")]
    pub pod_name: String,
    /// The pod's namespace (kubernetes.io/pod.namespace).
    #[arg(long, default_value = "")]
    pub pod_namespace: String,
    /// The pod's UID (kubernetes.io/pod.uid).
    #[arg(long, default_value = "")]
    pub pod_uid: String,
    /// The pod's service account (kubernetes.io/serviceAccount.name).
    #[arg(long, default_value = "")]
    pub service_account: String,
}

#[derive(Debug, Args)]
pub struct ExpandArgs {
    /// Where the volume is mounted (as given to mount).
    #[arg(long)]
    pub target: PathBuf,
    /// The new size: bytes, or with a Kubernetes suffix (Ki, Mi, Gi, Ti; k, M, G, T).
    #[arg(long, value_parser = parse_size)]
    pub size: u64,
}

/// `--size`: a Kubernetes quantity (see [`flexvolume_protocol::spec::parse_quantity`]).
pub fn parse_size(text: &str) -> Result<u64, String> {
    flexvolume_protocol::spec::parse_quantity(text)
        .ok_or_else(|| format!("{text:?} is not a size (write 1073741824, 512Mi or 1Gi)"))
}

#[derive(Debug, Args)]
pub struct UnmountArgs {
    /// Where the volume is mounted (as given to mount).
    #[arg(long)]
    pub target: PathBuf,
}

/// The flexVolume source of a PersistentVolume or pod Volume, as our spec.
fn spec_from_file(path: &Path) -> anyhow::Result<(VolumeSpec, Option<String>)> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    flexd::user_manifest::volume_spec(&text).map_err(|e| anyhow::anyhow!("{} {e}", path.display()))
}

/// A Secret manifest's name and values. Errors name the file and the problem, never a value.
fn secret_from_file(path: &Path) -> anyhow::Result<(Option<String>, SecretValues)> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    flexd::user_manifest::secret(&text)
        .map_err(|e| anyhow::anyhow!("secret file {} {e}", path.display()))
}

fn build_spec(args: &SpecArgs, default_name: Option<&Path>) -> anyhow::Result<VolumeSpec> {
    let (mut spec, secret_ref) = match &args.file {
        Some(file) => spec_from_file(file)?,
        None => {
            let driver = args.driver.as_deref().unwrap_or_default();
            let driver = DriverName::parse(driver)?;
            let name = args
                .volume_name
                .clone()
                .or_else(|| {
                    default_name
                        .and_then(Path::file_name)
                        .map(|n| n.to_string_lossy().into_owned())
                })
                .context("--volume-name is needed (or a target with a file name, or -f)")?;
            (VolumeSpec::new(name, driver), None)
        }
    };
    if let Some(name) = &args.volume_name {
        spec.volume_name = name.clone();
    }
    if let Some(fs) = &args.fs_type {
        spec.fs_type = fs.clone();
    }
    if args.read_only {
        spec.read_only = true;
    }
    if let Some(json) = &args.options {
        let options: BTreeMap<String, String> =
            serde_json::from_str(json).context("--options must be a JSON object of strings")?;
        spec.options.extend(options);
    }
    for pair in &args.secrets {
        // The error never quotes the value.
        let (key, value) = pair.split_once('=').context("--secret takes KEY=VALUE")?;
        if key.is_empty() {
            bail!("--secret takes KEY=VALUE with a non-empty KEY");
        }
        spec.secrets
            .insert(key.to_owned(), value.as_bytes().to_vec());
    }
    if let Some(path) = &args.secret_file {
        let (name, values) = secret_from_file(path)?;
        if let (Some(wanted), Some(name)) = (&secret_ref, &name) {
            if wanted != name {
                bail!(
                    "{} holds secret {name:?}, but the volume references secret {wanted:?}",
                    path.display()
                );
            }
        }
        // --secret values given on the command line win over the file's.
        for (key, value) in values {
            spec.secrets.entry(key).or_insert(value);
        }
    }
    if let (Some(name), true) = (secret_ref, spec.secrets.is_empty()) {
        bail!("the volume references secret {name:?}; give its values with --secret KEY=VALUE or --secret-file");
    }
    Ok(spec)
}

/// The usable plugin for a spec: a driver that is absent, broken or removed while volumes use
/// it is refused here with the registry's error.
fn plugin_for(
    resolver: &Resolver,
    lifecycle: &Lifecycle,
    spec: &VolumeSpec,
) -> anyhow::Result<Arc<Plugin>> {
    let in_use = || lifecycle.state.volumes_using(&spec.driver).unwrap_or(0);
    Ok(resolver.find(&spec.driver, in_use)?)
}

/// The answer of attach, isattached or detach: under `--output json` one object naming the
/// volume and the node with the command's own `fields`, else the line `text`.
fn print_node_answer(
    output: OutputFormat,
    spec: &VolumeSpec,
    node: &str,
    fields: serde_json::Value,
    text: String,
) -> anyhow::Result<()> {
    match output {
        OutputFormat::Json => {
            let mut answer = serde_json::json!({ "volume": spec.volume_name, "node": node });
            if let (Some(answer), serde_json::Value::Object(fields)) =
                (answer.as_object_mut(), fields)
            {
                answer.extend(fields);
            }
            super::print_json(&answer)
        }
        OutputFormat::Text => {
            println!("{text}");
            Ok(())
        }
    }
}

pub fn run(global: &Global, args: VolumeArgs) -> anyhow::Result<ExitCode> {
    let node = global.node_name();
    let lifecycle = Lifecycle::new(global.runner_config()?, global.state(), node.clone());
    // The installed driver when it is there and initialises, else the pinned copy.
    let resolver = Resolver::probing(
        lifecycle.runner.clone(),
        global.plugin_dir.clone(),
        global.layout_policy(),
    );
    // The volume a command names, and the driver that serves it.
    let volume_of = |spec_args: &SpecArgs, default_name: Option<&Path>| {
        let spec = build_spec(spec_args, default_name)?;
        let plugin = plugin_for(&resolver, &lifecycle, &spec)?;
        anyhow::Ok((spec, plugin))
    };
    match &args.command {
        VolumeCommand::Mount(mount) => {
            let target = std::path::absolute(&mount.target).context("bad --target")?;
            let (spec, plugin) = volume_of(&mount.spec, Some(&target))?;
            let pod = PodInfo {
                name: mount.pod_name.clone(),
                namespace: mount.pod_namespace.clone(),
                uid: mount.pod_uid.clone(),
                service_account: mount.service_account.clone(),
            };
            let request = MountRequest {
                plugin: &plugin,
                spec: &spec,
                pod: &pod,
                fs_group: (mount
                    .fs_group
                    .map(flexvolume_host::ownership::check_gid)
                    .transpose())
                .context("bad --fs-group")?,
                fs_group_policy: mount.fs_group_policy.into(),
                target: &target,
            };
            let outcome = lifecycle.mount(&request).with_context(|| {
                format!(
                    "cannot mount volume {} on {}",
                    spec.volume_name,
                    target.display()
                )
            })?;
            match global.output {
                OutputFormat::Json => super::print_json(&outcome)?,
                OutputFormat::Text if outcome.mounted_now => {
                    println!("mounted {} on {}", spec.volume_name, target.display())
                }
                OutputFormat::Text => println!("{} is already mounted", target.display()),
            }
            if let (OutputFormat::Text, Some(report)) = (global.output, &outcome.ownership) {
                super::ownership::print_summary(report);
            }
        }
        VolumeCommand::Expand(expand) => {
            let target = std::path::absolute(&expand.target).context("bad --target")?;
            let outcome = lifecycle
                .expand(
                    &target,
                    expand.size,
                    Expansion::VolumeThenFilesystem,
                    &resolver,
                )
                .with_context(|| format!("cannot expand {}", target.display()))?;
            match global.output {
                OutputFormat::Json => super::print_json(&outcome)?,
                OutputFormat::Text => println!(
                    "expanded {} from {} to {} bytes",
                    target.display(),
                    outcome.old_bytes,
                    outcome.new_bytes
                ),
            }
        }
        VolumeCommand::Attach(spec_args) => {
            let (spec, plugin) = volume_of(spec_args, None)?;
            let device = lifecycle
                .attach(&plugin, &spec, &node)
                .with_context(|| format!("cannot attach {} to {node}", spec.volume_name))?;
            let shown = if device.is_empty() {
                "(not known yet)"
            } else {
                &device
            };
            let text = format!("attached {} to {node}: device {shown}", spec.volume_name);
            let fields = serde_json::json!({ "device": device });
            print_node_answer(global.output, &spec, &node, fields, text)?;
        }
        VolumeCommand::Isattached(spec_args) => {
            let (spec, plugin) = volume_of(spec_args, None)?;
            let attached = lifecycle
                .is_attached(&plugin, &spec, &node)
                .with_context(|| format!("cannot tell whether {} is attached", spec.volume_name))?;
            let not = if attached { "" } else { "not " };
            let text = format!("{} is {not}attached to {node}", spec.volume_name);
            let fields = serde_json::json!({ "attached": attached });
            print_node_answer(global.output, &spec, &node, fields, text)?;
            if !attached {
                return Ok(ExitCode::from(exit::NO));
            }
        }
        VolumeCommand::Detach(spec_args) => {
            let spec = build_spec(spec_args, None)?;
            // Detach keeps working for a removed driver whose volumes are still recorded.
            let plugin = match plugin_for(&resolver, &lifecycle, &spec) {
                Ok(plugin) => plugin,
                Err(e) => resolver
                    .pinned_for(&lifecycle.state, &spec.driver)
                    .ok_or(e)
                    .with_context(|| format!("cannot detach {}", spec.volume_name))?,
            };
            let (name, ran) = lifecycle
                .detach(&plugin, &spec, &node)
                .with_context(|| format!("cannot detach {} from {node}", spec.volume_name))?;
            let text = format!("detached {name} from {node}");
            let fields = serde_json::json!({ "detach_name": name, "driver_detach_ran": ran });
            print_node_answer(global.output, &spec, &node, fields, text)?;
        }
        VolumeCommand::Unmount(unmount) => {
            let target = std::path::absolute(&unmount.target).context("bad --target")?;
            let outcome = lifecycle
                .unmount(&target, &resolver)
                .with_context(|| format!("cannot unmount {}", target.display()))?;
            match global.output {
                OutputFormat::Json => super::print_json(&outcome)?,
                OutputFormat::Text if outcome.managed => println!("unmounted {}", target.display()),
                OutputFormat::Text => println!(
                    "{} is not a volume flexd manages; nothing to do",
                    target.display()
                ),
            }
        }
        VolumeCommand::List => {
            let records = lifecycle.state.list()?;
            let mut ok = Vec::new();
            let mut unusable = Vec::new();
            for record in records {
                match record {
                    Ok(r) => ok.push(r),
                    Err(e) => {
                        eprintln!("flexd: {e}");
                        unusable.push(e);
                    }
                }
            }
            match global.output {
                // Records as they are; each unusable entry as an object with a `problem`,
                // which no record has, so a script tells them apart.
                OutputFormat::Json => {
                    let mut listed = serde_json::to_value(&ok)?;
                    if let Some(listed) = listed.as_array_mut() {
                        listed.extend(unusable.iter().map(unusable_entry_json));
                    }
                    super::print_json(&listed)?
                }
                OutputFormat::Text => {
                    println!(
                        "{:40}  {:20}  {:16}  {:8}  {:14}  DEVICE",
                        "TARGET", "DRIVER", "VOLUME", "ROLE", "STATE"
                    );
                    let name = |v: serde_json::Value| v.as_str().unwrap_or("?").to_owned();
                    for r in &ok {
                        println!(
                            "{:40}  {:20}  {:16}  {:8}  {:14}  {}",
                            r.target.display(),
                            r.driver,
                            r.volume_name,
                            name(serde_json::to_value(r.role)?),
                            name(serde_json::to_value(r.progress)?),
                            r.device.as_deref().unwrap_or("-")
                        );
                    }
                    // The entry's path in the target column, escaped: its name is anything.
                    for e in &unusable {
                        let (problem, kind) = unusable_entry(e);
                        let entry = e.path().map(|p| format!("{p:?}")).unwrap_or_default();
                        let state = kind.map_or(problem.to_owned(), |k| format!("{problem} ({k})"));
                        println!(
                            "{entry:40}  {:20}  {:16}  {:8}  {state:14}  -",
                            "-", "-", "-"
                        );
                    }
                }
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// What is wrong with an entry `volume list` cannot show as a record: `not-a-record` (with
/// what it is instead: `fifo`, `symlink`, …), `corrupt` or `unreadable`.
fn unusable_entry(e: &flexvolume_host::state::StateError) -> (&'static str, Option<&'static str>) {
    use flexvolume_host::state::StateError;
    match e {
        StateError::NotARecord { kind, .. } => ("not-a-record", Some(kind.as_str())),
        // A listing never gives a torn record (it is no record); were it asked, it is corrupt.
        StateError::Corrupt { .. } | StateError::Torn { .. } => ("corrupt", None),
        StateError::Io { .. } => ("unreadable", None),
    }
}

fn unusable_entry_json(e: &flexvolume_host::state::StateError) -> serde_json::Value {
    let (problem, kind) = unusable_entry(e);
    serde_json::json!({
        "entry": e.path(),
        "problem": problem,
        "kind": kind,
        "error": e.to_string(),
    })
}
