//! `flexd ownership apply`: the SetUp(fsGroup) pass on its own, for operators fixing a volume
//! by hand and for the benchmark.

use std::io::IsTerminal as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::{Args, Subcommand, ValueEnum};
use flexvolume_host::ownership::{self, Counters, OwnershipReport, OwnershipRequest, Policy};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::settings::{exit, logging, Global, OutputFormat};

#[derive(Debug, Args)]
pub struct OwnershipArgs {
    #[command(subcommand)]
    pub command: OwnershipCommand,
}

#[derive(Debug, Subcommand)]
pub enum OwnershipCommand {
    /// Give every entry under DIR the group, g+rw (g+r read-only), and dirs g+x and setgid.
    #[command(after_help = exit::OWNERSHIP)]
    Apply(ApplyArgs),
}

#[derive(Debug, Args)]
pub struct ApplyArgs {
    /// The volume's root.
    pub dir: PathBuf,
    /// The group that must own the volume (0 to 4294967294: 4294967295 is the unset id).
    #[arg(long, value_parser = parse_fs_group)]
    pub fs_group: u32,
    /// When to walk the tree (fsGroupChangePolicy): always, or only when the root's group or
    /// mode is not right yet.
    #[arg(long, value_enum, default_value_t = PolicyArg::Always)]
    pub policy: PolicyArg,
    /// A read-only volume: g+r instead of g+rw.
    #[arg(long)]
    pub read_only: bool,
    /// Walker threads (0: one per core); at most 64 are accepted, and a pass runs at most
    /// 4 per core whatever it asks for.
    #[arg(long, default_value_t = 0, value_parser = threads_parser())]
    pub threads: usize,
}

/// A group id a volume can be given: every `u32` but [`ownership::UNSET_ID`], which chown
/// reads as "no change". Out of range is bad usage (exit 2), with the range and the reason.
pub fn parse_fs_group(text: &str) -> Result<u32, String> {
    let range = format!("0..={}", ownership::UNSET_ID - 1);
    let gid: u32 = text
        .parse()
        .map_err(|e| format!("{e}: a group id is in {range}"))?;
    ownership::check_gid(gid).map_err(|e| format!("{e}: a group id is in {range}"))
}

/// Refused rather than clamped: a number this large is a typo or an attack, and saying so
/// beats silently running with fewer. Values up to the limit are clamped by the library to a
/// few walkers per core (the report says how many ran).
fn threads_parser() -> clap::builder::RangedU64ValueParser<usize> {
    clap::builder::RangedU64ValueParser::new().range(0..=ownership::MAX_WALKERS as u64)
}

/// `fsGroupChangePolicy`, as flags spell it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PolicyArg {
    /// Walk every entry, every time.
    Always,
    /// Walk only when the root does not have the group and mode yet.
    OnRootMismatch,
}

impl From<PolicyArg> for Policy {
    fn from(policy: PolicyArg) -> Self {
        match policy {
            PolicyArg::Always => Policy::Always,
            PolicyArg::OnRootMismatch => Policy::OnRootMismatch,
        }
    }
}

pub fn run(global: &Global, args: OwnershipArgs) -> anyhow::Result<ExitCode> {
    let OwnershipCommand::Apply(apply) = args.command;
    let root = std::path::absolute(&apply.dir).context("bad DIR")?;
    let request = OwnershipRequest {
        root: &root,
        gid: apply.fs_group,
        policy: apply.policy.into(),
        read_only: apply.read_only,
        threads: apply.threads,
    };
    let counters = Counters::default();
    let show_bar = std::io::stderr().is_terminal();
    let finished = AtomicBool::new(false);
    let report = std::thread::scope(|scope| {
        if show_bar {
            let total = ownership::estimate_entries(&root);
            let (counters, finished) = (&counters, &finished);
            scope.spawn(move || progress_bar(counters, total, finished));
        }
        let report = ownership::apply(&request, &counters);
        finished.store(true, Ordering::Relaxed);
        report
    })
    .with_context(|| format!("ownership pass on {} failed", root.display()))?;
    match global.output {
        OutputFormat::Json => super::print_json(&report)?,
        OutputFormat::Text => print_summary(&report),
    }
    Ok(if report.error_count == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// The pass in one line (plus the entries that failed), for humans.
pub fn print_summary(report: &OwnershipReport) {
    if report.skipped {
        println!(
            "{}: root already has group {} (OnRootMismatch): nothing walked",
            report.root.display(),
            report.gid
        );
        return;
    }
    println!(
        "{}: group {}: {} entries, {} group changes, {} mode changes, {} vanished, {} errors, {:.2}s, {} walkers",
        report.root.display(),
        report.gid,
        report.entries,
        report.chowned,
        report.chmodded,
        report.vanished,
        report.error_count,
        report.seconds,
        report.walkers
    );
    for error in &report.errors {
        println!(
            "  {}: {} failed: {}",
            error.path.display(),
            error.operation,
            error.error
        );
    }
    let unlisted = report
        .error_count
        .saturating_sub(report.errors.len() as u64);
    if unlisted > 0 {
        println!("  ... and {unlisted} more");
    }
}

/// A progress bar on stderr (log lines go above it); the total is the filesystem's used
/// inodes when DIR is a whole filesystem (a guess otherwise, so the bar never claims 100%
/// before the end).
fn progress_bar(counters: &Counters, total: Option<u64>, finished: &AtomicBool) {
    let started = Instant::now();
    let bar = match total {
        Some(total) => {
            ProgressBar::with_draw_target(Some(total.max(1)), ProgressDrawTarget::stderr())
                .with_style(
                    ProgressStyle::with_template("[{bar:30}] {percent:>2}% {msg}")
                        .unwrap_or_else(|_| ProgressStyle::default_bar())
                        .progress_chars("## "),
                )
        }
        None => ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr()).with_style(
            ProgressStyle::with_template("{spinner} {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_spinner()),
        ),
    };
    let shown = logging::show_progress(bar);
    while !finished.load(Ordering::Relaxed) {
        let done = counters.entries();
        if let Some(total) = total {
            // 99% at most until the walk says it is done.
            shown.bar().set_position(done.min(total.max(1) * 99 / 100));
        } else {
            shown.bar().tick();
        }
        shown.bar().set_message(format!(
            "{done} entries, {} changed, {}s",
            counters.changed(),
            started.elapsed().as_secs()
        ));
        std::thread::sleep(Duration::from_millis(200));
    }
}
