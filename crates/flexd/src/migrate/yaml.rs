//! Migrated objects as YAML kubectl reads back exactly as they were written.

use serde_json::Value;

/// A value as block-style YAML. Written here rather than by a YAML library because kubectl
/// reads YAML 1.1, where a plain `yes`, `on` or `0777` is not a string: an annotation
/// `"yes"` printed plain would come back as a boolean and be refused. So a string is plain
/// only when it cannot be read as anything else (a letter, then letters, digits, `.`, `_`,
/// `/` and `-`, and no YAML 1.1 boolean or null word); every other one is JSON-quoted, which
/// YAML reads as a double-quoted scalar.
pub fn to_yaml(value: &Value) -> String {
    let mut out = String::new();
    match value {
        Value::Object(map) if !map.is_empty() => emit_map(map, 0, &mut out),
        Value::Array(items) if !items.is_empty() => emit_list(items, 0, &mut out),
        scalar => {
            out.push_str(&yaml_scalar(scalar));
            out.push('\n');
        }
    }
    out
}

fn yaml_string(text: &str) -> String {
    const WORDS: [&str; 9] = ["y", "n", "yes", "no", "true", "false", "on", "off", "null"];
    let plain = text.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '/' | '-'))
        && !WORDS.iter().any(|w| w.eq_ignore_ascii_case(text));
    if plain {
        return text.to_owned();
    }
    // JSON escapes quotes, backslashes and C0 controls; YAML also wants escaped what it does not
    // print (DEL, C1 controls, BOM, non-characters) and what YAML 1.1 reads as a line break
    // (NEL, LS, PS), which a double-quoted scalar would fold.
    let mut out = String::with_capacity(text.len() + 2);
    for c in Value::String(text.to_owned()).to_string().chars() {
        match c {
            '\u{7f}'..='\u{9f}'
            | '\u{2028}'
            | '\u{2029}'
            | '\u{feff}'
            | '\u{fffe}'
            | '\u{ffff}' => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out
}

/// A scalar, or an empty collection in flow style.
fn yaml_scalar(value: &Value) -> String {
    match value {
        Value::String(text) => yaml_string(text),
        Value::Object(_) => "{}".to_owned(),
        Value::Array(_) => "[]".to_owned(),
        other => other.to_string(),
    }
}

fn is_block(value: &Value) -> bool {
    match value {
        Value::Object(map) => !map.is_empty(),
        Value::Array(items) => !items.is_empty(),
        _ => false,
    }
}

fn emit_map(map: &serde_json::Map<String, Value>, indent: usize, out: &mut String) {
    for (key, value) in map {
        out.push_str(&" ".repeat(indent));
        out.push_str(&yaml_string(key));
        out.push(':');
        match value {
            Value::Object(inner) if !inner.is_empty() => {
                out.push('\n');
                emit_map(inner, indent + 2, out);
            }
            // A list sits at its key's indentation, as kubectl prints it.
            Value::Array(items) if !items.is_empty() => {
                out.push('\n');
                emit_list(items, indent, out);
            }
            scalar => {
                out.push(' ');
                out.push_str(&yaml_scalar(scalar));
                out.push('\n');
            }
        }
    }
}

fn emit_list(items: &[Value], indent: usize, out: &mut String) {
    for item in items {
        out.push_str(&" ".repeat(indent));
        out.push('-');
        if is_block(item) {
            // The item's first line goes after the dash, the rest under it.
            let mut inner = String::new();
            match item {
                Value::Object(map) => emit_map(map, indent + 2, &mut inner),
                Value::Array(list) => emit_list(list, indent + 2, &mut inner),
                _ => {}
            }
            out.push(' ');
            out.push_str(&inner[indent + 2..]);
        } else {
            out.push(' ');
            out.push_str(&yaml_scalar(item));
            out.push('\n');
        }
    }
}
