//! The documentation stays small enough to read (issue 57): README.md,
//! BENCHMARKS.md, CHANGELOG.md, ARCHITECTURE.md and every page under docs/
//! together are at least 30 % smaller than the 565,137 bytes they held
//! when the issue was filed. Figures that change belong in BENCHMARKS.md's
//! run of record, history in git: a page that grows past the line says
//! which files to cut first.

use std::path::{Path, PathBuf};

/// 70 % of 565,137 bytes, rounded down.
const MOST_BYTES: u64 = 395_595;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Every `*.md` under `dir`, at any depth.
fn markdown_under(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|error| panic!("{dir:?}: {error}")) {
        let path = entry.expect("an entry").path();
        if path.is_dir() {
            markdown_under(&path, found);
        } else if path.extension().is_some_and(|extension| extension == "md") {
            found.push(path);
        }
    }
}

/// (bytes, path relative to the root) of every counted file, largest first.
fn counted_files() -> Vec<(u64, String)> {
    let mut paths: Vec<PathBuf> = [
        "README.md",
        "BENCHMARKS.md",
        "CHANGELOG.md",
        "ARCHITECTURE.md",
    ]
    .iter()
    .map(|name| root().join(name))
    .collect();
    markdown_under(&root().join("docs"), &mut paths);
    let mut files: Vec<(u64, String)> = paths
        .iter()
        .map(|path| {
            let bytes = std::fs::metadata(path)
                .unwrap_or_else(|error| panic!("{path:?}: {error}"))
                .len();
            let relative = path.strip_prefix(root()).expect("under the root");
            (bytes, relative.display().to_string())
        })
        .collect();
    files.sort_by(|a, b| b.cmp(a));
    files
}

#[test]
fn the_docs_stay_30_percent_smaller_than_when_issue_57_was_filed() {
    let files = counted_files();
    assert!(
        files.iter().any(|(_, path)| path == "docs/api.md")
            && files
                .iter()
                .any(|(_, path)| path.starts_with("docs/decisions/")),
        "docs/ was not read whole: {files:?}"
    );
    let total: u64 = files.iter().map(|(bytes, _)| bytes).sum();
    let largest: Vec<String> = files
        .iter()
        .take(6)
        .map(|(bytes, path)| format!("{path} {bytes}"))
        .collect();
    assert!(
        total <= MOST_BYTES,
        "README.md, BENCHMARKS.md, CHANGELOG.md, ARCHITECTURE.md and docs/ hold {total} bytes, \
         more than {MOST_BYTES} (30 % under the 565,137 of issue 57); the largest: {}. \
         Link to what another page says, and leave dated figures to BENCHMARKS.md and history to git",
        largest.join(", ")
    );
}
