//! The layer rule, checked: base → wire → transport → proto → api → services (`job`). A
//! source file of one layer's folder may name only its own layer and the layers below it,
//! whether by `use crate::…`, a `crate::…` path in code, a grouped `crate::{…}` import, or
//! enough `super::` to reach the crate root. An upward reference fails this test with the
//! file, the line and the rule it breaks. `ARCHITECTURE.md` explains the layers.

use std::path::{Path, PathBuf};

/// The layers, lowest first, as folders of `src/`.
const LAYERS: [&str; 6] = ["base", "wire", "transport", "proto", "api", "job"];

fn rank(layer: &str) -> Option<usize> {
    LAYERS.iter().position(|l| *l == layer)
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The identifier at the start of `s`.
fn ident(s: &str) -> &str {
    let end = s.find(|c: char| !is_ident(c)).unwrap_or(s.len());
    &s[..end]
}

/// The first path segment of each top-level item of a `{…}` group that starts `s` (after
/// the brace); stops at the matching brace.
fn group_heads(s: &str) -> Vec<&str> {
    let mut heads = Vec::new();
    let mut depth = 0usize;
    let mut at_item = true;
    let mut i = 0;
    let b = s.as_bytes();
    while i < b.len() {
        let c = b[i] as char;
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => break,
            '}' => depth -= 1,
            ',' if depth == 0 => at_item = true,
            c if at_item && depth == 0 && is_ident(c) => {
                heads.push(ident(&s[i..]));
                at_item = false;
            }
            _ => {}
        }
        i += 1;
    }
    heads
}

/// The layers that `code` (a file's text, comments removed) names through the crate root,
/// with the 1-based line of each. `depth`: how deep the file's module lies below the root
/// (`layer/mod.rs` 1, `layer/x.rs` 2, ...), for `super::` paths.
fn named_layers(code: &str, depth: usize) -> Vec<(usize, &'static str)> {
    let mut found = Vec::new();
    let line_of = |at: usize| code[..at].matches('\n').count() + 1;
    let push = |at: usize, seg: &str, found: &mut Vec<(usize, &'static str)>| {
        if let Some(l) = LAYERS.iter().find(|l| **l == seg) {
            found.push((line_of(at), *l));
        }
    };
    let mut i = 0;
    while i < code.len() {
        let rest = &code[i..];
        let starts_path = code[..i].chars().last().is_none_or(|c| !is_ident(c));
        // `crate::` or `super::super::…` reaching the root.
        let root = if !starts_path {
            None
        } else if let Some(after) = rest.strip_prefix("crate::") {
            Some(after)
        } else if rest.starts_with("super::") {
            let mut after = rest;
            let mut ups = 0;
            while let Some(a) = after.strip_prefix("super::") {
                after = a;
                ups += 1;
            }
            (ups == depth).then_some(after)
        } else {
            None
        };
        match root {
            Some(after) => {
                let at = code.len() - after.len();
                if let Some(group) = after.strip_prefix('{') {
                    for h in group_heads(group) {
                        push(at, h, &mut found);
                    }
                } else {
                    push(at, ident(after), &mut found);
                }
                i = at;
            }
            None => i += rest.chars().next().map_or(1, char::len_utf8),
        }
    }
    found
}

/// `text` with `//` comments blanked (lines kept, so line numbers stay).
fn strip_comments(text: &str) -> String {
    text.lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

/// How deep below the crate root the module of `file` (under `src/`) lies.
fn module_depth(src: &Path, file: &Path) -> usize {
    let rel = file.strip_prefix(src).unwrap_or(file);
    let parts = rel.components().count();
    if file.file_name().is_some_and(|n| n == "mod.rs") {
        parts - 1
    } else {
        parts
    }
}

/// Every upward reference in `src/`: (file, line, its layer, the layer it names).
fn upward_references(src: &Path) -> Vec<(PathBuf, usize, &'static str, &'static str)> {
    let mut bad = Vec::new();
    for layer in LAYERS {
        let mut files = Vec::new();
        rust_files(&src.join(layer), &mut files);
        files.sort();
        for f in files {
            let text = std::fs::read_to_string(&f).expect("a readable source file");
            let code = strip_comments(&text);
            for (line, named) in named_layers(&code, module_depth(src, &f)) {
                if rank(named) > rank(layer) {
                    bad.push((f.clone(), line, layer, named));
                }
            }
        }
    }
    bad
}

#[test]
fn no_layer_imports_a_layer_above_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    for layer in ["base", "wire", "transport", "proto", "api"] {
        assert!(
            src.join(layer).is_dir(),
            "layer folder src/{layer} is missing: the rule would check nothing"
        );
    }
    let report: Vec<String> = upward_references(&src)
        .iter()
        .map(|(f, n, layer, named)| {
            format!(
                "{}:{n}: {layer} may not use {named}, a layer above it",
                f.display()
            )
        })
        .collect();
    assert!(report.is_empty(), "upward imports:\n{}", report.join("\n"));
}

/// The checker itself: it sees `use crate::` lines, paths in code, grouped imports across
/// lines and `super::` paths that reach the root, and ignores comments and look-alikes.
#[test]
fn the_checker_finds_upward_paths() {
    let layers = |code: &str, depth| -> Vec<&'static str> {
        named_layers(&strip_comments(code), depth)
            .into_iter()
            .map(|(_, l)| l)
            .collect()
    };
    assert_eq!(layers("use crate::proto::State;", 2), ["proto"]);
    assert_eq!(
        layers("let x = crate::api::Worker::new(); // crate::job", 2),
        ["api"]
    );
    assert!(layers("// use crate::api::Worker;", 2).is_empty());
    assert!(layers("use courier_crate::api;", 2).is_empty());
    assert!(layers("use crate::apix::Y;", 2).is_empty());
    assert_eq!(
        layers(
            "use crate::{\n    base::Config,\n    wire::{Kind, Frame},\n};",
            2
        ),
        ["base", "wire"]
    );
    assert_eq!(layers("use super::super::api::X;", 2), ["api"]);
    assert!(
        layers("use super::api::X;", 2).is_empty(),
        "a sibling, not the root"
    );
    assert_eq!(layers("use super::proto;", 1), ["proto"]);
    // A fixture tree with one upward import.
    let dir = std::env::temp_dir().join(format!("courier-layers-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("wire")).expect("fixture dir");
    std::fs::write(
        dir.join("wire/x.rs"),
        "use crate::base::Error;\nuse crate::proto::State;\n",
    )
    .expect("fixture file");
    let bad = upward_references(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(bad.len(), 1, "{bad:?}");
    assert_eq!((bad[0].1, bad[0].2, bad[0].3), (2, "wire", "proto"));
}
