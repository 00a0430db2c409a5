//! `flexd preflight`: run on a node before deploying flexd, says what the node means for flexd
//! (the kernel, cgroups, the plugin dir, kubelet's dir and its mount, SELinux, loop devices,
//! host tools), each finding with what to do. It only looks: nothing is created or changed. The
//! Kubernetes API is asked only with `--cluster`, and only read: the cluster's version and
//! kube-controller-manager's pods. The verdicts are [`flexd::preflight`]; this module gathers
//! the facts ([`facts`], [`cluster`]) and prints.

mod cluster;
mod facts;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::error::ErrorKind;
use clap::Args;
use flexd::preflight::{self, Report, Severity};

use crate::settings::{Global, OutputFormat};

/// kubelet's default `--root-dir`.
const DEFAULT_KUBELET_DIR: &str = "/var/lib/kubelet";

#[derive(Debug, Args)]
pub struct PreflightArgs {
    /// kubelet's root dir (its --root-dir), where kubelet keeps plugins_registry/ and the pods'
    /// volumes.
    #[arg(long, value_name = "DIR", value_parser = crate::settings::parse_dir, default_value = DEFAULT_KUBELET_DIR)]
    pub kubelet_dir: PathBuf,
    /// Check the cluster too, after the node: the API server's Kubernetes version (and what
    /// flexd manifests deploys for it), and whether kube-controller-manager can run FlexVolume
    /// drivers. Only reads: /version, and pods in kube-system.
    #[arg(long)]
    pub cluster: bool,
    /// The cluster (with --cluster): this kubeconfig; default: KUBECONFIG, ~/.kube/config, or
    /// in-cluster.
    #[arg(long, value_name = "PATH", requires = "cluster")]
    pub kubeconfig: Option<PathBuf>,
}

pub fn run(global: &Global, args: PreflightArgs) -> anyhow::Result<ExitCode> {
    // Inside flexd's pod the mounts, /dev and PATH are the container's, not the node's:
    // findings about them would describe the wrong machine.
    if let Some(namespace) = &global.driver_mount_namespace {
        return Err(super::usage_error(
            "preflight",
            ErrorKind::ArgumentConflict,
            format!(
                "--driver-mount-namespace {} (or FLEXD_DRIVER_MOUNT_NAMESPACE) cannot be used: \
                 preflight looks at the node from where it runs, so run it on the node itself",
                namespace.display()
            ),
        ));
    }
    let facts = facts::gather(&global.plugin_dir, &args.kubelet_dir);
    tracing::debug!(?facts, "node facts");
    let mut findings = preflight::findings(&facts);
    if args.cluster {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("starting the async runtime")?;
        let facts = runtime.block_on(cluster::gather(args.kubeconfig.as_deref()));
        findings.extend(preflight::cluster_findings(&facts));
    }
    let report = Report::new(findings);
    match global.output {
        OutputFormat::Json => super::print_json(&report)?,
        OutputFormat::Text => print_text(&report, args.cluster),
    }
    Ok(exit_code(&report))
}

/// 0 with warnings too: a warning is something to know, not something that stops flexd.
fn exit_code(report: &Report) -> ExitCode {
    if report.errors > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

fn print_text(report: &Report, cluster: bool) {
    let severity_width = "WARNING".len();
    let check_width = report
        .findings
        .iter()
        .map(|f| f.check.name().len())
        .max()
        .unwrap_or(0);
    let indent = " ".repeat(severity_width + 2 + check_width + 2);
    for f in &report.findings {
        println!(
            "{:severity_width$}  {:check_width$}  {}",
            f.severity.label(),
            f.check.name(),
            f.summary
        );
        if let Some(advice) = &f.advice {
            println!("{indent}what to do: {advice}");
        }
    }
    println!("{}", closing_line(report, cluster));
}

/// The counts, and what they mean for the node (and with `--cluster`, the cluster).
fn closing_line(report: &Report, cluster: bool) -> String {
    let (subject, is) = if cluster {
        ("this node and cluster", "are")
    } else {
        ("this node", "is")
    };
    let count = |n: usize, what: &str| match n {
        0 => format!("no {what}s"),
        1 => format!("1 {what}"),
        n => format!("{n} {what}s"),
    };
    let counts = format!(
        "{}, {}",
        count(report.errors, "error"),
        count(report.warnings, "warning")
    );
    let worst = report.findings.iter().map(|f| f.severity).max();
    match worst {
        Some(Severity::Error) => {
            format!("{counts}: fix the errors before deploying flexd on {subject}")
        }
        Some(Severity::Warning) => format!("{counts}: flexd can be deployed; read the warnings"),
        Some(Severity::Ok) | None => format!("{counts}: {subject} {is} ready for flexd"),
    }
}

#[cfg(test)]
mod tests {
    use flexd::preflight::{Check, Finding};

    use super::*;

    fn report(severities: &[Severity]) -> Report {
        Report::new(
            severities
                .iter()
                .map(|&severity| Finding {
                    check: Check::Kernel,
                    severity,
                    summary: String::new(),
                    advice: None,
                })
                .collect(),
        )
    }

    #[test]
    fn errors_alone_fail_the_command() {
        use Severity::{Error, Ok as Good, Warning};
        for (severities, code, line) in [
            (
                &[Good, Good][..],
                ExitCode::SUCCESS,
                "no errors, no warnings: this node is ready for flexd",
            ),
            (
                &[Good, Warning],
                ExitCode::SUCCESS,
                "no errors, 1 warning: flexd can be deployed",
            ),
            (
                &[Error, Warning, Warning],
                ExitCode::from(1),
                "1 error, 2 warnings: fix the errors",
            ),
            (
                &[Error, Error],
                ExitCode::from(1),
                "2 errors, no warnings: fix",
            ),
        ] {
            let report = report(severities);
            assert_eq!(exit_code(&report), code, "{severities:?}");
            assert!(
                closing_line(&report, false).starts_with(line),
                "{severities:?}: {}",
                closing_line(&report, false)
            );
        }
    }

    #[test]
    fn with_the_cluster_the_closing_line_names_both() {
        use Severity::{Error, Ok as Good};
        assert_eq!(
            closing_line(&report(&[Good]), true),
            "no errors, no warnings: this node and cluster are ready for flexd"
        );
        assert_eq!(
            closing_line(&report(&[Error]), true),
            "1 error, no warnings: fix the errors before deploying flexd on this node and cluster"
        );
    }
}
