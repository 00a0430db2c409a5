//! `flexd install` / `flexd uninstall`: the deployment script, done atomically
//! (docs/discovery.md#installation).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context as _};
use clap::Args;
use flexvolume_host::install;
use flexvolume_host::DriverName;

use crate::settings::{Global, OutputFormat};

#[derive(Debug, Args)]
pub struct InstallArgs {
    /// The driver's name, as in volume specs: vendor/driver.
    #[arg(
        long,
        value_name = "VENDOR/DRIVER",
        required_unless_present = "builtin",
        conflicts_with = "builtin"
    )]
    pub driver: Option<String>,
    /// The driver executable, or a directory holding it (named after the driver) and its helpers.
    #[arg(required_unless_present = "builtin", conflicts_with = "builtin")]
    pub source: Option<PathBuf>,
    /// Install a driver shipped with flexd: `loop` (as flexd/loop). Copies the standalone
    /// `flexd-loop` beside this executable when there is one, else flexd itself.
    #[arg(long, value_enum)]
    pub builtin: Option<crate::builtin::Builtin>,
    /// `--builtin loop`: a directory the loop driver may keep images in (repeatable; default
    /// /var/lib/flexd-loop alone). Written to `<plugin-dir>/flexd~loop/image-dirs`; a volume's
    /// `imageDir` option (a StorageClass parameter, a PV's options) must name one of them.
    #[arg(long, value_name = "DIR", requires = "builtin")]
    pub image_dir: Vec<PathBuf>,
    /// Stay in the foreground after installing, until SIGTERM/SIGINT (as a DaemonSet container).
    #[arg(long)]
    pub then_sleep: bool,
}

#[derive(Debug, Args)]
pub struct UninstallArgs {
    /// The driver's name: vendor/driver.
    #[arg(long, value_name = "VENDOR/DRIVER")]
    pub driver: String,
    /// Remove the driver even while volumes mounted through it are recorded (they can still
    /// be unmounted, with the copy of the driver pinned when they were mounted).
    #[arg(long)]
    pub force: bool,
}

pub fn run_install(global: &Global, args: InstallArgs) -> anyhow::Result<ExitCode> {
    let (name, source) = match (args.builtin, &args.driver, &args.source) {
        (Some(builtin), _, _) => {
            let name = DriverName::parse(builtin.driver_name())?;
            let exe = builtin
                .executable()
                .context("cannot find flexd's own executable")?;
            tracing::info!(driver = %name, source = %exe.display(), "installing a builtin driver");
            (name, exe)
        }
        (None, Some(driver), Some(source)) => (DriverName::parse(driver)?, source.clone()),
        _ => bail!("give --driver and SOURCE, or --builtin"),
    };
    let termination = match args.then_sleep {
        true => Some(crate::settings::signals::Termination::catch()?),
        false => None,
    };
    // Checked before anything is installed: a bad directory installs nothing.
    let image_dirs = match args.builtin {
        Some(crate::builtin::Builtin::Loop) if args.image_dir.is_empty() => {
            Some(flexvolume_loop::ImageDirs::default())
        }
        Some(crate::builtin::Builtin::Loop) => {
            Some(flexvolume_loop::ImageDirs::new(&args.image_dir).context("--image-dir")?)
        }
        None => None,
    };
    let installed = install::install(&global.plugin_dir, &name, &source, global.layout_policy())
        .with_context(|| format!("cannot install driver {name}"))?;
    if let Some(image_dirs) = image_dirs {
        // Every install says which dirs are allowed, so the file is what the last one asked.
        let path = image_dirs
            .write(&installed.dir)
            .context("cannot configure the loop driver's image dirs")?;
        tracing::info!(path = %path.display(), dirs = %image_dirs.describe(), "loop driver image dirs");
    }
    tracing::info!(driver = %name, path = %installed.path.display(), method = installed.method, replaced = installed.replaced, "driver installed");
    match global.output {
        OutputFormat::Json => super::print_json(&installed)?,
        OutputFormat::Text => println!(
            "{} driver {} at {}",
            if installed.replaced {
                "updated"
            } else {
                "installed"
            },
            name,
            installed.path.display()
        ),
    }
    if let Some(termination) = termination {
        let signal = termination.wait();
        tracing::info!(signal, "stopping");
    }
    Ok(ExitCode::SUCCESS)
}

pub fn run_uninstall(global: &Global, args: UninstallArgs) -> anyhow::Result<ExitCode> {
    let name = DriverName::parse(&args.driver)?;
    let state = global.state();
    let in_use = state
        .volumes_using(&name)
        .with_context(|| format!("cannot tell which volumes use driver {name}"))?;
    if in_use > 0 && !args.force {
        bail!(
            "driver {name} is used by {in_use} mounted volume(s) (flexd volume list --state-dir {}); \
             unmount them first, or pass --force (they stay unmountable)",
            global.state_dir.display()
        );
    }
    if in_use > 0 {
        tracing::warn!(driver = %name, volumes = in_use, "removing a driver that mounted volumes still use");
    }
    let dir = install::uninstall(&global.plugin_dir, &name)
        .with_context(|| format!("cannot uninstall driver {name}"))?;
    match global.output {
        OutputFormat::Json => super::print_json(&serde_json::json!({"name": name, "dir": dir}))?,
        OutputFormat::Text => println!("removed driver {name} ({})", dir.display()),
    }
    Ok(ExitCode::SUCCESS)
}
