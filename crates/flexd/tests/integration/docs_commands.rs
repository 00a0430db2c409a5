//! Every `flexd` command the docs tell a reader to run is one this flexd accepts: each `sh`
//! block of README.md, CONTRIBUTING.md, docs/*.md and the crates' READMEs is read, each
//! `flexd ...` in it (also after `sudo`, `kubectl exec ... --`, or in a pipeline) is run as
//! `flexd ARGS --help`, which fails on an unknown subcommand or flag and on a value a flag
//! refuses, and succeeds without doing anything. A flag renamed or removed without its docs, or
//! a doc naming one that never was, fails this test with the file, line and clap's message.
//!
//! Placeholders a reader fills in (`$version`, `<dir>`, `sha256:3f1d…`) are replaced by `x`,
//! which every flag that takes a name or path accepts; a lone `...` (the reader's other flags)
//! is dropped.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The markdown files whose commands are checked.
fn documents() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut files = vec![root.join("README.md"), root.join("CONTRIBUTING.md")];
    for dir in [
        "docs",
        "crates/flexvolume-driver",
        "crates/flexvolume-protocol",
    ] {
        let mut found: Vec<PathBuf> = std::fs::read_dir(root.join(dir))
            .unwrap_or_else(|e| panic!("read {dir}: {e}"))
            .map(|entry| entry.expect("dir entry").path())
            .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
            .collect();
        found.sort();
        files.extend(found);
    }
    files
}

/// The shell lines of a document's `sh`/`bash`/`shell`/`console` blocks, with their line
/// numbers; continuation lines joined, comments removed.
fn shell_lines(text: &str) -> Vec<(usize, String)> {
    let mut lines = Vec::new();
    let mut in_block = false;
    let mut console = false;
    let mut pending: Option<(usize, String)> = None;
    for (number, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        if let Some(info) = trimmed.strip_prefix("```") {
            if in_block {
                in_block = false;
            } else {
                let info = info.trim();
                in_block = matches!(info, "sh" | "bash" | "shell" | "console");
                console = info == "console";
            }
            continue;
        }
        if !in_block {
            continue;
        }
        let mut text = strip_comment(trimmed).trim_end().to_owned();
        if console && pending.is_none() {
            match text.strip_prefix("$ ") {
                Some(command) => text = command.to_owned(),
                None => continue,
            }
        }
        let (start, mut joined) = pending.take().unwrap_or((number + 1, String::new()));
        match text.strip_suffix('\\') {
            Some(head) => {
                joined.push_str(head);
                joined.push(' ');
                pending = Some((start, joined));
            }
            None => {
                joined.push_str(&text);
                lines.push((start, joined));
            }
        }
    }
    lines
}

/// The line without a `#` comment (one that starts a word, outside quotes).
fn strip_comment(line: &str) -> &str {
    let mut quote: Option<char> = None;
    let mut previous = ' ';
    for (at, c) in line.char_indices() {
        match quote {
            Some(q) if c == q => quote = None,
            Some(_) => {}
            None if c == '\'' || c == '"' => quote = Some(c),
            None if c == '#' && previous.is_whitespace() => return &line[..at],
            None => {}
        }
        previous = c;
    }
    line
}

/// The argument lists of the `flexd` commands in a shell line.
fn flexd_commands(line: &str) -> Vec<Vec<String>> {
    let Some(words) = shlex::split(line) else {
        return Vec::new();
    };
    let mut commands = Vec::new();
    for segment in words.split(|w| matches!(w.as_str(), "|" | "&&" | "||" | ";")) {
        // flexd as the command: first, or after sudo, an assignment, or kubectl exec's `--`
        // (not a container named flexd: `kubectl exec -c flexd`).
        let leads = |at: usize| {
            segment[..at].iter().all(|w| w == "sudo" || w.contains('='))
                || segment[..at].last().is_some_and(|w| w == "--")
        };
        let Some(at) = (0..segment.len()).find(|&at| segment[at] == "flexd" && leads(at)) else {
            continue;
        };
        let args = segment[at + 1..]
            .iter()
            .take_while(|w| !is_redirection(w))
            // "..." stands for "the rest of your flags".
            .filter(|w| !matches!(w.as_str(), "..." | "…"))
            .map(|w| placeholder(w))
            .collect();
        commands.push(args);
    }
    commands
}

fn is_redirection(word: &str) -> bool {
    word.starts_with('>')
        || word.starts_with('<')
        || word.starts_with("2>")
        || word.starts_with("1>")
        || word.starts_with("&>")
}

/// A word a reader fills in becomes `x`; the rest stays as written.
fn placeholder(word: &str) -> String {
    if word.contains('$') || word.contains('…') || (word.contains('<') && word.contains('>')) {
        // Keep a flag's name when its value is the placeholder: `--image=$IMAGE`.
        match word.split_once('=') {
            Some((flag, _)) if flag.starts_with("--") => format!("{flag}=x"),
            _ => "x".to_owned(),
        }
    } else {
        word.to_owned()
    }
}

#[test]
fn every_flexd_command_in_the_docs_is_accepted_by_flexd() {
    let mut checked = 0;
    let mut failures = Vec::new();
    for document in documents() {
        let text = std::fs::read_to_string(&document)
            .unwrap_or_else(|e| panic!("read {}: {e}", document.display()));
        let name = document
            .strip_prefix(Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."))
            .unwrap_or(&document)
            .display()
            .to_string();
        for (number, line) in shell_lines(&text) {
            for args in flexd_commands(&line) {
                // `flexd --help` and `flexd help ...` are themselves what this runs.
                if args
                    .iter()
                    .any(|a| a == "--help" || a == "-h" || a == "help")
                {
                    continue;
                }
                let out = Command::new(env!("CARGO_BIN_EXE_flexd"))
                    .args(&args)
                    .arg("--help")
                    .env_remove("RUST_LOG")
                    .output()
                    .expect("run flexd");
                checked += 1;
                if !out.status.success() {
                    failures.push(format!(
                        "{name}:{number}: flexd {}\n    {}",
                        args.join(" "),
                        String::from_utf8_lossy(&out.stderr)
                            .lines()
                            .next()
                            .unwrap_or_default()
                    ));
                }
            }
        }
    }
    assert!(
        checked >= 25,
        "only {checked} flexd commands found in the docs: is the extraction broken?"
    );
    assert!(
        failures.is_empty(),
        "{} of {checked} flexd commands in the docs are refused by flexd:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn commands_are_extracted_as_a_reader_would_type_them() {
    let doc = "text\n```sh\nflexd manifests --image $IMAGE > f.yaml   # a comment\n\
               sudo flexd install --driver a/b \\\n  ./b\nkubectl exec ds/x -c flexd -- flexd drivers | jq .\n\
               echo flexd is here\n```\n```text\nflexd not a command\n```\n";
    let commands: Vec<Vec<String>> = shell_lines(doc)
        .iter()
        .flat_map(|(_, line)| flexd_commands(line))
        .collect();
    assert_eq!(
        commands,
        vec![
            vec!["manifests", "--image", "x"],
            vec!["install", "--driver", "a/b", "./b"],
            vec!["drivers"],
        ]
    );
}
