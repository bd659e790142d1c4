//! The modules of `src/` form a line (docs/development.md): each may use
//! only modules of its own layer or of the layers before it. This test reads
//! every `crate::<module>` path in the source (comments aside) and fails on
//! a path that points up the line, naming the file and the line.

use std::path::{Path, PathBuf};

/// The line, bottom first. A module not listed fails the test: place a new
/// module in the line when you add it.
const LAYERS: &[&[&str]] = &[
    &[
        "config",
        "secrets",
        "rate_limit",
        "request_path",
        "job_watch",
        "time",
    ],
    &["error", "telemetry", "provider"],
    &["db"],
    &["engine"],
    &["metrics", "coalesce"],
    &["domain"],
    &["webhooks"],
    &["routes", "openapi"],
    &["worker", "scheduler", "startup"],
    &["cli", "lib", "main"],
];

fn layer(module: &str) -> Option<usize> {
    LAYERS.iter().position(|layer| layer.contains(&module))
}

/// The top-level module a source file belongs to (`src/db/models.rs` → db).
fn module_of(path: &Path, src: &Path) -> String {
    let relative = path.strip_prefix(src).expect("under src");
    let first = relative
        .components()
        .next()
        .expect("a component")
        .as_os_str()
        .to_string_lossy()
        .into_owned();
    first.trim_end_matches(".rs").to_owned()
}

fn rust_files(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("a readable directory") {
        let path = entry.expect("an entry").path();
        if path.is_dir() {
            rust_files(&path, found);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            found.push(path);
        }
    }
}

/// The modules named by `crate::<name>` in a line of code.
fn used_modules(line: &str) -> Vec<String> {
    let code = line.split("//").next().unwrap_or("");
    code.match_indices("crate::")
        .map(|(at, _)| {
            code[at + "crate::".len()..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect::<String>()
        })
        .filter(|name| !name.is_empty())
        .collect()
}

#[test]
fn no_module_uses_one_above_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let mut violations = Vec::new();
    for file in &files {
        let module = module_of(file, &src);
        let from = layer(&module)
            .unwrap_or_else(|| panic!("module {module} ({}) is not in LAYERS", file.display()));
        let text = std::fs::read_to_string(file).expect("readable source");
        for (number, line) in text.lines().enumerate() {
            if line.trim_start().starts_with("//") {
                continue;
            }
            for used in used_modules(line) {
                let to = layer(&used).unwrap_or_else(|| {
                    panic!(
                        "module {used} (used in {}) is not in LAYERS",
                        file.display()
                    )
                });
                if to > from {
                    violations.push(format!(
                        "{}:{}: {module} uses {used}",
                        file.strip_prefix(&src).expect("under src").display(),
                        number + 1
                    ));
                }
            }
        }
    }
    assert!(
        violations.is_empty(),
        "modules using a layer above their own:\n{}",
        violations.join("\n")
    );
}

#[test]
fn the_check_sees_an_upward_use() {
    // The reader itself: a path up the line is found, a comment is not.
    assert_eq!(used_modules("use crate::routes::AppState;"), ["routes"]);
    assert_eq!(
        used_modules("let x = crate::db::prepared(q); // crate::startup"),
        ["db"]
    );
    assert!(layer("routes") > layer("db"));
}
