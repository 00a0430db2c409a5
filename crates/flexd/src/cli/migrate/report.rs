//! What `flexd migrate --plan | --apply | --resume | --rollback` says: the plan, each step, a
//! progress bar on a terminal, the summary (JSON lines with `-o json`), and the question.

use std::io::IsTerminal as _;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use flexd::migrate::journal::{self, Journal, Step, UnitRecord};
use flexd::migrate::plan::{Plan, WorkloadRef};
use flexd::migrate::strategy::Strategy;
use serde_json::{json, Value};

use super::apply::Migrator;
use crate::settings::{logging, OutputFormat};

impl Migrator {
    pub(super) fn say(&self, text: &str) {
        match self.output {
            OutputFormat::Text => eprintln!("flexd: {text}"),
            OutputFormat::Json => println!("{}", json!({"event": "message", "message": text})),
        }
    }

    pub(super) fn print_plan(&self, plan: &Plan) -> anyhow::Result<()> {
        match self.output {
            OutputFormat::Json => println!("{}", serde_json::to_string(plan)?),
            OutputFormat::Text => print!("{}", plan_text(plan)),
        }
        Ok(())
    }

    pub(super) fn print_journal(&self, journal: &Journal) {
        if self.output == OutputFormat::Json {
            return;
        }
        eprintln!(
            "flexd: journal {}/{}: {} started {} by {}",
            self.journal_namespace,
            journal::NAME,
            journal.operation.in_words(),
            journal.started,
            journal.by
        );
        for (i, unit) in journal.units.iter().enumerate() {
            let rolling = match unit.strategy {
                Strategy::ScaleDown => String::new(),
                Strategy::Rolling if unit.replacing.is_empty() => " (rolling)".to_owned(),
                Strategy::Rolling => {
                    let done = unit.replacing.iter().filter(|r| r.done).count();
                    format!(" (rolling, {done} of {} replaced)", unit.replacing.len())
                }
            };
            eprintln!(
                "  {}. {}: {}{rolling}",
                i + 1,
                unit.title(),
                unit.step.as_str()
            );
        }
    }

    pub(super) fn report_step(&self, journal: &Journal, unit: usize) {
        let record = &journal.units[unit];
        match self.output {
            OutputFormat::Json => println!(
                "{}",
                json!({
                    "event": "step", "unit": unit + 1, "units": journal.units.len(),
                    "step": record.step.as_str(), "strategy": record.strategy,
                    "workloads": record.workloads, "bare_pods": record.bare_pods,
                    "pvs": record.pvs,
                })
            ),
            OutputFormat::Text => {
                let line = format!(
                    "[{}/{}] {}: {}",
                    unit + 1,
                    journal.units.len(),
                    record.title(),
                    record.step.as_str()
                );
                self.progress_line(journal, line);
            }
        }
    }

    /// A rolling unit's replacement `i`, done: a pod replaced, or a rollout complete.
    pub(super) fn report_replaced(&self, journal: &Journal, unit: usize, i: usize) {
        let record = &journal.units[unit];
        let Some(r) = record.replacing.get(i) else {
            return;
        };
        let of = record.replacing.len();
        match self.output {
            OutputFormat::Json => println!(
                "{}",
                json!({
                    "event": "replaced", "unit": unit + 1, "units": journal.units.len(),
                    "workload": r.workload, "pod": r.pod.as_ref().map(|p| &p.name),
                    "done": i + 1, "of": of,
                })
            ),
            OutputFormat::Text => {
                let what = match &r.pod {
                    Some(pod) => format!("Pod {} replaced", pod.name),
                    None => format!("{} rolled out", r.workload),
                };
                let line = format!(
                    "[{}/{}] {}: {what} ({}/{of})",
                    unit + 1,
                    journal.units.len(),
                    record.title(),
                    i + 1
                );
                self.progress_line(journal, line);
            }
        }
    }

    /// A line of progress: above the bar on a terminal, else on stderr.
    fn progress_line(&self, journal: &Journal, line: String) {
        match &self.bar {
            // A terminal: the bar says where it is and what it waits for; each step still gets
            // its line above it.
            Some(shown) => {
                let finished = journal
                    .units
                    .iter()
                    .filter(|u| matches!(u.step, Step::Done | Step::RolledBack))
                    .count();
                shown.bar().set_position(finished as u64);
                shown.bar().set_message(line.clone());
                shown.bar().println(format!("flexd: {line}"));
            }
            None => eprintln!("flexd: {line}"),
        }
    }

    /// A bar over the units on a terminal (text output); structured lines otherwise.
    pub(super) fn show_bar(&mut self, units: usize) {
        if self.output != OutputFormat::Text || !std::io::stderr().is_terminal() {
            return;
        }
        let bar = indicatif::ProgressBar::with_draw_target(
            Some(units as u64),
            indicatif::ProgressDrawTarget::stderr(),
        )
        .with_style(
            indicatif::ProgressStyle::with_template(
                "{spinner} [{bar:20}] {pos}/{len} units, {elapsed} {msg}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        bar.enable_steady_tick(Duration::from_millis(250));
        self.bar = Some(logging::show_progress(bar));
    }

    pub(super) fn summary(&self, journal: &Journal, done: &str) {
        match self.output {
            OutputFormat::Json => {
                let units: Vec<Value> = journal
                    .units
                    .iter()
                    .map(|u| {
                        let done = || u.replacing.iter().filter(|r| r.done);
                        let pods: Vec<&str> = done()
                            .filter_map(|r| r.pod.as_ref())
                            .map(|p| p.name.as_str())
                            .collect();
                        let rollouts: Vec<_> = done()
                            .filter(|r| r.pod.is_none())
                            .map(|r| &r.workload)
                            .collect();
                        json!({
                            "workloads": u.workloads, "bare_pods": u.bare_pods, "pvs": u.pvs,
                            "step": u.step.as_str(), "strategy": u.strategy,
                            "downtime_seconds": u.downtime_seconds,
                            "pods_replaced": pods, "rollouts": rollouts,
                        })
                    })
                    .collect();
                println!(
                    "{}",
                    json!({"event": "summary", "operation": journal.operation, "units": units})
                );
            }
            OutputFormat::Text => {
                for u in &journal.units {
                    let down = u
                        .downtime_seconds
                        .map(|s| format!(", down {s:.1} s"))
                        .unwrap_or_default();
                    for w in &u.workloads {
                        match u.strategy {
                            Strategy::ScaleDown => println!("{w}: {done}{down}"),
                            Strategy::Rolling => println!("{w}: {done}, rolling: {}", rolled(u, w)),
                        }
                    }
                    for p in &u.bare_pods {
                        println!("Pod {p}: {done} (created again){down}");
                    }
                    if u.workloads.is_empty() && u.bare_pods.is_empty() {
                        for pv in &u.pvs {
                            println!("PersistentVolume {pv}: {done} (no pods used it)");
                        }
                    }
                }
            }
        }
    }
}

/// How a rolling unit's workload `w` was replaced, for the summary.
fn rolled(unit: &UnitRecord, w: &WorkloadRef) -> String {
    let mine = || unit.replacing.iter().filter(|r| r.done && &r.workload == w);
    if mine().any(|r| r.pod.is_none()) {
        return "its own rollout replaced its pods".to_owned();
    }
    match mine().count() {
        0 => "no pod to replace".to_owned(),
        1 => "1 pod replaced".to_owned(),
        n => format!("{n} pods replaced one at a time"),
    }
}

/// Exit 1 when the plan refused something selected (the rest was migrated).
pub(super) fn exit_for(plan: &Plan) -> ExitCode {
    if plan.refused.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

pub(super) fn confirm(yes: bool, question: &str) -> anyhow::Result<bool> {
    if yes {
        return Ok(true);
    }
    if !std::io::stdin().is_terminal() {
        return Ok(false);
    }
    eprint!("{question} [y/N] ");
    let mut answer = String::new();
    std::io::stdin()
        .read_line(&mut answer)
        .context("reading the answer")?;
    Ok(matches!(answer.trim(), "y" | "Y" | "yes"))
}

/// The plan for humans.
pub(super) fn plan_text(plan: &Plan) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let n = plan.units.len();
    let _ = writeln!(
        out,
        "{n} unit{} to migrate, one after the other:",
        if n == 1 { "" } else { "s" }
    );
    for (i, unit) in plan.units.iter().enumerate() {
        let _ = writeln!(out, "{:>3}. {}", i + 1, unit.title());
        for m in &unit.pvs {
            let claim = m
                .claim
                .as_deref()
                .map(|c| format!(", claim {c}"))
                .unwrap_or_default();
            let attaches = if m.attaches { ", attaches" } else { "" };
            let policy = match m.reclaim_policy.as_deref() {
                Some("Retain") | None => String::new(),
                Some(other) => format!(", reclaim policy {other} → Retain"),
            };
            let _ = writeln!(
                out,
                "       PersistentVolume {}: {} → CSI {}{attaches}{claim}{policy}",
                m.name, m.driver, m.csi_driver
            );
        }
        for p in &unit.bare_pods {
            let _ = writeln!(
                out,
                "       Pod {p}: deleted and created again after the swap"
            );
        }
        for w in &unit.templates {
            let _ = writeln!(
                out,
                "       {w}: inline flexVolume → inline csi in its pod template"
            );
        }
        let _ = writeln!(
            out,
            "       {}: {}",
            unit.strategy.as_str(),
            unit.strategy_reason
        );
        let _ = writeln!(out, "       downtime: {}", unit.downtime);
        let pods = if unit.pods.is_empty() {
            "none now".to_owned()
        } else {
            unit.pods.join(", ")
        };
        match unit.strategy {
            Strategy::ScaleDown if !unit.workloads.is_empty() => {
                let _ = writeln!(
                    out,
                    "       scaled to 0 and back; pods that restart: {pods}"
                );
            }
            Strategy::Rolling if !unit.workloads.is_empty() => {
                if !unit.pvs.is_empty() {
                    let _ = writeln!(out, "       swapped under the claims while the pods run");
                }
                for w in &unit.rollouts {
                    let _ = writeln!(out, "       {w}: its own rollout replaces its pods");
                }
                if unit.workloads.iter().any(|w| !unit.rollouts.contains(w)) {
                    let _ = writeln!(
                        out,
                        "       pods evicted one at a time, each replacement Ready before the \
                         next (PodDisruptionBudgets honoured): {pods}"
                    );
                }
            }
            _ => {}
        }
    }
    if !plan.notes.is_empty() {
        let _ = writeln!(out, "Notes:");
        for n in &plan.notes {
            let _ = writeln!(out, "  - {}: {}", n.what, n.note);
        }
    }
    if !plan.refused.is_empty() {
        let _ = writeln!(out, "Refused (not migrated):");
        for r in &plan.refused {
            let _ = writeln!(out, "  - {}: {}", r.what, r.reason);
        }
    }
    out
}
