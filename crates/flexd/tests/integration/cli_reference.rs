//! docs/cli.md against the real `--help`: every subcommand and every flag `flexd --help` and
//! `flexd SUB --help` (recursively) show must be documented there, and everything documented
//! there must exist. A flag added without its documentation, or documentation left behind by a
//! removed flag, fails this test with the list of what is missing where.
//!
//! docs/cli.md's convention (stated at its top): a section per command headed `flexd <command>`
//! (`flexd volume mount`), the global flags under `Global flags`, and each flag a table row
//! whose first cell names it in backticks. `-h`/`--help` is everywhere and is not listed.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

/// Command path ("" for the global flags, "volume mount" for a subcommand) → its flags.
type Reference = BTreeMap<String, BTreeSet<String>>;

fn help(path: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_flexd"))
        .args(path)
        .arg("--help")
        .env_remove("RUST_LOG")
        .output()
        .expect("run flexd --help");
    assert!(
        out.status.success(),
        "flexd {} --help: {out:?}",
        path.join(" ")
    );
    String::from_utf8(out.stdout).expect("help is UTF-8")
}

/// The flags an option line of clap's help names: `-o, --output <OUTPUT>` gives `-o`, `--output`.
fn option_line_flags(line: &str) -> Vec<String> {
    let indent = line.len() - line.trim_start().len();
    let text = line.trim_start();
    // Option lines are indented 2 (with a short flag) or 6; deeper lines are descriptions and
    // possible values (`- node: ...`).
    if indent > 6 || !text.starts_with('-') || text.starts_with("- ") {
        return Vec::new();
    }
    text.split(|c: char| c.is_whitespace() || c == ',')
        .take_while(|word| !word.starts_with('<') && !word.starts_with('['))
        .filter(|word| word.starts_with('-') && word.len() > 1)
        .filter(|word| *word != "-h" && *word != "--help")
        .map(str::to_owned)
        .collect()
}

/// Subcommands and flags of one command's help. `global` keeps the "Global options" section
/// (wanted once, from the top level); elsewhere it repeats the same flags and is skipped.
fn parse_help(text: &str, global: bool) -> (Vec<String>, BTreeSet<String>) {
    let mut section = "";
    let mut subcommands = Vec::new();
    let mut flags = BTreeSet::new();
    for line in text.lines() {
        if !line.starts_with(' ') && line.ends_with(':') {
            section = match line {
                "Commands:" => "commands",
                "Options:" => "options",
                "Global options:" if global => "options",
                _ => "other",
            };
            continue;
        }
        if !line.starts_with(' ') {
            // "Usage: ...", "Exit status: ...", the description.
            section = if line.is_empty() { section } else { "other" };
            continue;
        }
        match section {
            "commands" => {
                if let Some(name) = line.split_whitespace().next() {
                    if name != "help" && line.starts_with("  ") && !line.starts_with("   ") {
                        subcommands.push(name.to_owned());
                    }
                }
            }
            "options" => flags.extend(option_line_flags(line)),
            _ => {}
        }
    }
    (subcommands, flags)
}

/// Every command's flags, as `--help` shows them, walking subcommands recursively.
fn from_help() -> Reference {
    let mut reference = Reference::new();
    let (top, global) = parse_help(&help(&[]), true);
    reference.insert(String::new(), global);
    let mut todo: Vec<Vec<String>> = top.into_iter().map(|c| vec![c]).collect();
    while let Some(path) = todo.pop() {
        let args: Vec<&str> = path.iter().map(String::as_str).collect();
        let (subcommands, flags) = parse_help(&help(&args), false);
        for sub in subcommands {
            let mut deeper = path.clone();
            deeper.push(sub);
            todo.push(deeper);
        }
        reference.insert(path.join(" "), flags);
    }
    reference
}

/// The first cell of a Markdown table row (`\|` inside it is text, not a border).
fn first_cell(row: &str) -> Option<&str> {
    let rest = row.strip_prefix('|')?;
    let bytes = rest.as_bytes();
    let end = (0..bytes.len()).find(|&i| bytes[i] == b'|' && (i == 0 || bytes[i - 1] != b'\\'))?;
    Some(&rest[..end])
}

/// The flags a first cell names in backticks: `` `--driver NAME[=CAPS]` `` gives `--driver`.
fn cell_flags(cell: &str) -> Vec<String> {
    cell.split('`')
        .skip(1)
        .step_by(2)
        .flat_map(|code| code.split_whitespace())
        .filter(|word| word.starts_with('-') && word.len() > 1)
        .map(|word| {
            let end = word
                .char_indices()
                .skip(1)
                .find(|&(_, c)| !(c.is_ascii_alphanumeric() || c == '-'))
                .map_or(word.len(), |(i, _)| i);
            word[..end].to_owned()
        })
        .collect()
}

fn from_docs(text: &str) -> Reference {
    let mut reference = Reference::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        if line.starts_with('#') {
            let title = line.trim_start_matches('#').trim();
            current = if title == "Global flags" {
                Some(String::new())
            } else {
                title
                    .strip_prefix("flexd ")
                    .map(|path| path.trim().to_owned())
            };
            if let Some(path) = &current {
                reference.entry(path.clone()).or_default();
            }
            continue;
        }
        let (Some(path), Some(cell)) = (&current, first_cell(line)) else {
            continue;
        };
        reference
            .entry(path.clone())
            .or_default()
            .extend(cell_flags(cell));
    }
    reference
}

fn label(path: &str) -> String {
    if path.is_empty() {
        "global flags".to_owned()
    } else {
        format!("flexd {path}")
    }
}

#[test]
fn docs_cli_md_documents_exactly_what_help_shows() {
    let docs_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/cli.md");
    let docs = std::fs::read_to_string(&docs_path)
        .unwrap_or_else(|e| panic!("{}: {e}", docs_path.display()));
    let documented = from_docs(&docs);
    let shown = from_help();

    let mut problems = Vec::new();
    for (path, flags) in &shown {
        match documented.get(path) {
            None => problems.push(format!(
                "{} is in --help but has no section in docs/cli.md",
                label(path)
            )),
            Some(doc_flags) => {
                for flag in flags.difference(doc_flags) {
                    problems.push(format!(
                        "{}: {flag} is in --help but not in docs/cli.md",
                        label(path)
                    ));
                }
                for flag in doc_flags.difference(flags) {
                    problems.push(format!(
                        "{}: {flag} is in docs/cli.md but not in --help",
                        label(path)
                    ));
                }
            }
        }
    }
    for path in documented.keys().filter(|p| !shown.contains_key(*p)) {
        problems.push(format!(
            "{} is in docs/cli.md but not in --help",
            label(path)
        ));
    }
    assert!(
        problems.is_empty(),
        "docs/cli.md and --help disagree:\n  {}",
        problems.join("\n  ")
    );
}

#[test]
fn the_parsers_see_what_they_should() {
    // The help parser: a short and a long flag, a description line, a possible value.
    let (subs, flags) = parse_help(
        "Usage: flexd x\n\nCommands:\n  mount  Mount it\n  help   Print this\n\nOptions:\n  -o, --output <OUTPUT>\n          Output\n          - text: Tables\n      --read-only\n  -h, --help\n\nGlobal options:\n      --plugin-dir <D>\n\nExit status: 0\n",
        false,
    );
    assert_eq!(subs, ["mount"]);
    assert_eq!(
        flags.into_iter().collect::<Vec<_>>(),
        ["--output", "--read-only", "-o"]
    );
    // The docs parser: escaped pipes, two flags in one cell, sections by heading.
    let reference = from_docs(
        "## Global flags\n| flag | what |\n|---|---|\n| `-o`, `--output text\\|json` | x |\n## flexd volume mount\n| `--driver NAME[=CAPS]` | `--not-this` |\n## Other\n| `--ignored` | |\n",
    );
    assert_eq!(reference[""].iter().collect::<Vec<_>>(), ["--output", "-o"]);
    assert_eq!(
        reference["volume mount"].iter().collect::<Vec<_>>(),
        ["--driver"]
    );
    assert_eq!(reference.len(), 2);
}
