//! ARCHITECTURE.md holds: its rule index names functions and tests that
//! exist, its code map names every module of the library, its glossary
//! has the project's terms, and the one-page documents stay one page.

use std::path::{Path, PathBuf};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(relative: &str) -> String {
    std::fs::read_to_string(root().join(relative))
        .unwrap_or_else(|error| panic!("{relative}: {error}"))
}

/// Every file under `dir` (recursively) whose name ends with `suffix`.
fn files(dir: &Path, suffix: &str, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("a readable directory") {
        let path = entry.expect("an entry").path();
        if path.is_dir() {
            files(&path, suffix, found);
        } else if path.to_string_lossy().ends_with(suffix) {
            found.push(path);
        }
    }
}

fn all_text(dir: &str, suffix: &str) -> String {
    let mut found = Vec::new();
    files(&root().join(dir), suffix, &mut found);
    found
        .iter()
        .map(|path| std::fs::read_to_string(path).expect("readable"))
        .collect()
}

/// The rows of the markdown table under `heading`, as cells.
fn table(page: &str, heading: &str) -> Vec<Vec<String>> {
    let start = page
        .find(&format!("\n{heading}\n"))
        .unwrap_or_else(|| panic!("no section {heading}"));
    page[start + heading.len() + 2..]
        .lines()
        .skip_while(|line| !line.starts_with('|'))
        .take_while(|line| line.starts_with('|'))
        .skip(2)
        .map(|line| {
            line.trim_matches('|')
                .split(" | ")
                .map(|cell| cell.trim().to_owned())
                .collect()
        })
        .collect()
}

/// The names in backticks in `cell`.
fn quoted(cell: &str) -> Vec<String> {
    cell.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

#[test]
fn every_function_and_test_of_the_rule_index_exists() {
    let page = read("ARCHITECTURE.md");
    let rows = table(&page, "## Rule index");
    assert!(rows.len() >= 15, "the rule index has {} rules", rows.len());
    // The engine's functions, and the tables' row rules of the migrations.
    let sql = all_text("src", ".sql") + &all_text("migrations", ".sql");
    let rust = all_text("src", ".rs");
    let mut missing = Vec::new();
    for row in &rows {
        assert_eq!(row.len(), 3, "rule | function | test: {row:?}");
        let functions = quoted(&row[1]);
        assert!(!functions.is_empty(), "no function named: {row:?}");
        for function in functions {
            let name = function.rsplit("::").next().unwrap_or(&function).to_owned();
            if !sql.contains(&format!("FUNCTION {name}("))
                && !sql.contains(&format!("FUNCTION public.{name}("))
                && !rust.contains(&format!("fn {name}("))
            {
                missing.push(format!("function {function} ({})", row[0]));
            }
        }
        let tests = quoted(&row[2]);
        assert!(!tests.is_empty(), "no test named: {row:?}");
        for test in tests {
            let (file, name) = test
                .split_once("::")
                .unwrap_or_else(|| panic!("a test is file::name: {test}"));
            let source = ["tests/api", "tests/repository"]
                .iter()
                .find_map(|dir| {
                    std::fs::read_to_string(root().join(format!("{dir}/{file}.rs"))).ok()
                })
                .unwrap_or_default();
            if !source.contains(&format!("fn {name}(")) {
                missing.push(format!("test {test} ({})", row[0]));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md's rule index names what does not exist: {missing:#?}"
    );
}

#[test]
fn the_code_map_names_every_module_and_every_engine_file() {
    let page = read("ARCHITECTURE.md");
    let map: String = table(&page, "## Code map")
        .iter()
        .map(|row| row[0].clone())
        .collect::<Vec<_>>()
        .join(" ");
    let names = quoted(&map);
    let libraries = read("src/lib.rs") + &read("tools/src/lib.rs") + &read("bench/src/lib.rs");
    let unmapped: Vec<String> = libraries
        .lines()
        .filter_map(|line| line.strip_prefix("pub mod "))
        .map(|name| name.trim_end_matches(';').to_owned())
        .filter(|name| !names.contains(name) && !names.contains(&format!("{name}.rs")))
        .collect();
    assert!(
        unmapped.is_empty(),
        "modules ARCHITECTURE.md's code map does not name: {unmapped:?}"
    );
    let mut sql = Vec::new();
    files(&root().join("src/engine/sql"), ".sql", &mut sql);
    let unnamed: Vec<String> = sql
        .iter()
        .filter_map(|path| {
            path.file_stem()
                .map(|stem| stem.to_string_lossy().into_owned())
        })
        .filter(|stem| !page.contains(&format!("`{stem}`")))
        .collect();
    assert!(
        unnamed.is_empty(),
        "engine SQL files ARCHITECTURE.md does not name: {unnamed:?}"
    );
}

#[test]
fn the_glossary_has_the_projects_terms() {
    let page = read("ARCHITECTURE.md");
    let terms: String = table(&page, "## Glossary")
        .iter()
        .map(|row| row[0].to_lowercase())
        .collect::<Vec<_>>()
        .join(" ");
    let missing: Vec<&str> = [
        "pending writes",
        "one path",
        "draw",
        "pool",
        "lapse",
        "line",
        "armed",
        "tally",
        "grant",
        "batch",
        "reaper",
    ]
    .into_iter()
    .filter(|term| !terms.contains(term))
    .collect();
    assert!(missing.is_empty(), "terms the glossary lacks: {missing:?}");
}

/// The pages a newcomer reads first stay one page each.
#[test]
fn the_one_page_documents_stay_short() {
    for (page, most) in [
        ("ARCHITECTURE.md", 200),
        ("BENCHMARKS.md", 250),
        ("CHANGELOG.md", 150),
    ] {
        let lines = read(page).lines().count();
        assert!(lines <= most, "{page} has {lines} lines, at most {most}");
    }
}
