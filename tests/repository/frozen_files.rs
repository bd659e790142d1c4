//! Files that never change once committed, listed with their SHA-256 in
//! `tests/frozen.sha256`:
//! - migrations: diesel records only a migration's version, so a database
//!   that ran the earlier text would keep it silently;
//! - the fixed benchmark references (`bench/reference_*`): a reference that
//!   moved with what it measures would measure nothing.
//!
//! The test fails when a listed file changed or vanished, or when a
//! migration or reference is not listed (add a new one's files to the list
//! in the commit that adds it — from then on they are frozen).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn listed() -> BTreeMap<String, String> {
    let list = std::fs::read_to_string(root().join("tests/frozen.sha256"))
        .expect("tests/frozen.sha256 is readable");
    list.lines()
        .filter(|line| !line.starts_with('#') && !line.trim().is_empty())
        .map(|line| {
            let (hash, path) = line.split_once("  ").expect("`<sha256>  <path>` lines");
            (path.to_owned(), hash.to_owned())
        })
        .collect()
}

/// Every file under `dir` whose name passes `frozen`.
fn files(dir: &Path, frozen: &dyn Fn(&str) -> bool, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("a readable directory") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            files(&path, frozen, found);
        } else if path
            .file_name()
            .is_some_and(|name| frozen(&name.to_string_lossy()))
        {
            found.push(path);
        }
    }
}

#[test]
fn committed_migrations_and_benchmark_references_are_never_edited() {
    let listed = listed();
    let mut changed = Vec::new();
    for (path, hash) in &listed {
        match std::fs::read(root().join(path)) {
            Ok(bytes) => {
                if hex::encode(Sha256::digest(&bytes)) != *hash {
                    changed.push(format!("{path} changed"));
                }
            }
            Err(_) => changed.push(format!("{path} is gone")),
        }
    }
    let mut found = Vec::new();
    files(&root().join("migrations"), &|_| true, &mut found);
    files(
        &root().join("bench"),
        &|name| name.starts_with("reference_"),
        &mut found,
    );
    for path in found {
        let relative = path
            .strip_prefix(root())
            .expect("inside the repository")
            .to_string_lossy()
            .replace('\\', "/");
        if !listed.contains_key(&relative) {
            changed.push(format!(
                "{relative} is not in tests/frozen.sha256 (add it with sha256sum)"
            ));
        }
    }
    assert!(
        changed.is_empty(),
        "committed migrations and benchmark references never change; write a new one instead:\n{}",
        changed.join("\n")
    );
    assert!(listed.len() >= 20, "the list covers every migration so far");
}
