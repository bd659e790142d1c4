//! The documentation agrees with the code: every public field (a property
//! of a schema of the OpenAPI document) and every metric is named in the
//! docs, every docs page is linked from the README, every field of the
//! finance report is described in the document, every variable has its
//! row in docs/configuration.md, and the promised files
//! (LICENSE, CHANGELOG.md, SECURITY.md) exist.

use std::collections::BTreeSet;
use std::path::Path;

use serde_json::Value;

fn read(relative: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(relative))
        .unwrap_or_else(|error| panic!("{relative}: {error}"))
}

/// The pages of docs/ (`*.md`, their file names), in name order: every
/// check of this binary that reads the docs reads these.
pub(crate) fn docs_pages() -> Vec<String> {
    let mut pages: Vec<String> =
        std::fs::read_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs"))
            .expect("docs/")
            .map(|entry| {
                entry
                    .expect("entry")
                    .file_name()
                    .to_string_lossy()
                    .into_owned()
            })
            .filter(|name| name.ends_with(".md"))
            .collect();
    pages.sort();
    pages
}

/// Every docs page and the README, as one text.
fn all_docs() -> String {
    let mut text = read("README.md");
    for page in docs_pages() {
        text.push_str(&read(&format!("docs/{page}")));
    }
    text
}

fn document() -> Value {
    serde_json::from_str(token_billing::openapi::document_json().expect("document")).expect("JSON")
}

/// (schema, property) for every property of every component schema,
/// nested objects and `allOf`/`oneOf` members included.
fn properties(schema_name: &str, schema: &Value, found: &mut Vec<(String, String, Value)>) {
    if let Some(map) = schema.get("properties").and_then(Value::as_object) {
        for (name, property) in map {
            found.push((schema_name.to_owned(), name.clone(), property.clone()));
            properties(schema_name, property, found);
        }
    }
    for key in ["allOf", "oneOf", "anyOf"] {
        for member in schema
            .get(key)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            properties(schema_name, member, found);
        }
    }
    if let Some(items) = schema.get("items") {
        properties(schema_name, items, found);
    }
}

fn all_properties() -> Vec<(String, String, Value)> {
    let document = document();
    let mut found = Vec::new();
    for (name, schema) in document["components"]["schemas"]
        .as_object()
        .expect("schemas")
    {
        properties(name, schema, &mut found);
    }
    found
}

/// The API's reference pages: a field must be named where a reader of the
/// API looks for it, not only in passing elsewhere.
fn reference_docs() -> String {
    [
        "docs/api.md",
        "docs/webhooks.md",
        "docs/finance.md",
        "docs/fleet.md",
        "docs/topups.md",
    ]
    .iter()
    .map(|page| read(page))
    .collect()
}

#[test]
fn every_public_field_is_named_in_the_docs() {
    let docs = reference_docs();
    let missing: BTreeSet<String> = all_properties()
        .into_iter()
        .filter(|(_, field, _)| {
            !docs.contains(&format!("`{field}`")) && !docs.contains(&format!("\"{field}\":"))
        })
        .map(|(schema, field, _)| format!("{schema}.{field}"))
        .collect();
    assert!(
        missing.is_empty(),
        "fields of the API that docs/api.md, webhooks.md, finance.md, fleet.md and topups.md do not name (as `field`, or \"field\": in an example): {missing:#?}"
    );
}

#[test]
fn every_metric_is_named_in_the_docs() {
    let docs = all_docs();
    let rendered = token_billing::metrics::Metrics::new()
        .expect("metrics")
        .render();
    // Vectors without a sample yet do not render: read the names the
    // source registers too.
    let source = read("src/metrics.rs");
    let mut names: BTreeSet<String> = rendered
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|line| line.split_whitespace().next())
        .filter_map(|name| name.strip_prefix("token_billing_"))
        .map(str::to_owned)
        .collect();
    let registered: Vec<String> = source
        .split('"')
        .skip(1)
        .step_by(2)
        .filter(|literal| {
            literal.chars().all(|c| c.is_ascii_lowercase() || c == '_')
                && [
                    "_total",
                    "_seconds",
                    "_size",
                    "_info",
                    "_violations",
                    "_reservations",
                    "_tokens",
                    "_pending",
                    "_in_flight",
                ]
                .iter()
                .any(|suffix| literal.ends_with(suffix))
        })
        .map(str::to_owned)
        .collect();
    assert!(
        registered.len() >= 10,
        "the source's metric names were not found: {registered:?}"
    );
    names.extend(registered);
    let missing: Vec<&String> = names
        .iter()
        .filter(|name| {
            !docs.contains(&format!("`{name}`")) && !docs.contains(&format!("token_billing_{name}"))
        })
        .collect();
    assert!(
        missing.is_empty(),
        "metrics no docs page names: {missing:?}"
    );
    // And each in the reference table of docs/api.md, not just mentioned.
    let table = section(&read("docs/api.md"), "## Metrics");
    let untabled: Vec<&String> = names
        .iter()
        .filter(|name| !table.contains(&format!("`{name}`")))
        .collect();
    assert!(
        untabled.is_empty(),
        "metrics missing from docs/api.md's metrics table: {untabled:?}"
    );
}

/// The text of a markdown section: from its heading to the next heading of
/// the same level.
fn section(page: &str, heading: &str) -> String {
    let start = page
        .find(&format!("\n{heading}\n"))
        .unwrap_or_else(|| panic!("no section {heading}"));
    let rest = &page[start + 1..];
    let level = heading.split(' ').next().expect("a heading");
    let end = rest[heading.len()..]
        .find(&format!("\n{level} "))
        .map_or(rest.len(), |end| end + heading.len());
    rest[..end].to_owned()
}

#[test]
fn every_table_is_in_the_api_tables_section() {
    let migrations = Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations");
    let mut tables = BTreeSet::new();
    for entry in std::fs::read_dir(migrations).expect("migrations/") {
        let up = entry.expect("entry").path().join("up.sql");
        let sql = std::fs::read_to_string(&up).unwrap_or_default();
        for line in sql
            .lines()
            .filter(|line| !line.trim_start().starts_with("--"))
        {
            if let Some(rest) = line.split("CREATE TABLE ").nth(1) {
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                tables.insert(name);
            }
        }
    }
    assert!(tables.len() >= 15, "tables found: {tables:?}");
    let section = section(&read("docs/api.md"), "## Tables");
    let missing: Vec<&String> = tables
        .iter()
        .filter(|table| !section.contains(&format!("`{table}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "tables missing from docs/api.md's table list: {missing:?}"
    );
}

#[test]
fn the_readme_links_every_docs_page_and_the_project_files_exist() {
    let readme = read("README.md");
    let unlinked: Vec<String> = docs_pages()
        .into_iter()
        .filter(|page| !readme.contains(&format!("(docs/{page}")))
        .collect();
    assert!(
        unlinked.is_empty(),
        "docs pages the README does not link: {unlinked:?}"
    );
    for file in [
        "LICENSE",
        "CHANGELOG.md",
        "SECURITY.md",
        "ARCHITECTURE.md",
        "BENCHMARKS.md",
    ] {
        assert!(
            readme.contains(&format!("({file})")),
            "the README links {file}"
        );
        assert!(!read(file).trim().is_empty(), "{file} has content");
    }
    let manifest = read("Cargo.toml");
    assert!(manifest.contains("license = \"MIT\""));
    assert!(read("LICENSE").starts_with("MIT License"));
}

#[test]
fn every_field_of_the_finance_report_is_described() {
    let missing: Vec<String> = all_properties()
        .into_iter()
        .filter(|(schema, _, _)| {
            ["Report", "AccountLine", "Totals", "Discrepancy"].contains(&schema.as_str())
        })
        .filter(|(_, _, property)| {
            property
                .get("description")
                .and_then(Value::as_str)
                .is_none_or(|text| text.trim().is_empty())
        })
        .map(|(schema, field, _)| format!("{schema}.{field}"))
        .collect();
    assert!(missing.is_empty(), "undescribed report fields: {missing:?}");
}

#[test]
fn summaries_have_no_literal_backticks() {
    // Swagger UI shows an operation's summary as plain text: a backtick
    // there is printed as is.
    let document = document();
    let mut with_backticks = Vec::new();
    for (path, item) in document["paths"].as_object().expect("paths") {
        for (method, operation) in item.as_object().expect("item") {
            if let Some(summary) = operation.get("summary").and_then(Value::as_str) {
                if summary.contains('`') {
                    with_backticks.push(format!("{method} {path}: {summary}"));
                }
            }
        }
    }
    assert!(with_backticks.is_empty(), "{with_backticks:#?}");
}

/// Right after the command that starts the service, the README says how to
/// start it on another port and another database, with the variables and
/// flags the service reads.
#[test]
fn the_readme_says_how_to_change_the_port_and_the_database() {
    let readme = read("README.md");
    let serve = readme
        .find("<!-- readme-test: serve -->")
        .expect("the serve block");
    let next_section = readme[serve..]
        .find("\n## ")
        .map_or(readme.len(), |end| serve + end);
    let around = &readme[serve..next_section];
    use clap::CommandFactory;
    let command = token_billing::cli::Cli::command();
    let serve_command = command.find_subcommand("serve").expect("serve");
    let reads = |flag: &str, variable: &str| {
        command
            .get_arguments()
            .chain(serve_command.get_arguments())
            .any(|argument| {
                argument.get_long() == Some(flag)
                    && argument.get_env().and_then(|env| env.to_str()) == Some(variable)
            })
    };
    for (flag, variable) in [("bind-addr", "BIND_ADDR"), ("database-url", "DATABASE_URL")] {
        assert!(reads(flag, variable), "--{flag} / {variable}");
        assert!(
            around.contains(&format!("--{flag}")) && around.contains(variable),
            "the README's serve section does not say --{flag} / {variable}"
        );
    }
}

/// Every variable the service reads (every command's, `serve`'s included)
/// has its row in docs/configuration.md, by its name in backticks.
#[test]
fn every_variable_is_in_the_configuration_table() {
    use clap::CommandFactory;
    fn variables(command: &clap::Command, found: &mut BTreeSet<String>) {
        found.extend(command.get_arguments().filter_map(|argument| {
            argument
                .get_env()
                .map(|env| env.to_string_lossy().into_owned())
        }));
        for subcommand in command.get_subcommands() {
            variables(subcommand, found);
        }
    }
    let mut found = BTreeSet::new();
    variables(&token_billing::cli::Cli::command(), &mut found);
    assert!(found.contains("AUTH_FAILURE_TRACKED_MAX"), "{found:?}");
    let table = read("docs/configuration.md");
    let missing: Vec<&String> = found
        .iter()
        .filter(|variable| !table.contains(&format!("`{variable}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "not in docs/configuration.md: {missing:?}"
    );
}

/// The docs speak of any machine, never of the one they were written on.
#[test]
fn no_doc_names_a_path_of_one_machine() {
    let mut pages = vec![
        "README.md".to_owned(),
        "clients/python/README.md".to_owned(),
        "clients/typescript/README.md".to_owned(),
        "SECURITY.md".to_owned(),
    ];
    pages.extend(docs_pages().into_iter().map(|page| format!("docs/{page}")));
    for page in pages {
        let text = read(&page);
        for local in ["/root/", "/home/", "/Users/", "/work/", ".pyenv/versions/"] {
            assert!(
                !text.contains(local),
                "{page} names {local}, a path of one machine"
            );
        }
    }
}

/// Beside its test command, the README says how to point the tests at
/// another PostgreSQL server, by the variable the tests read.
#[test]
fn the_readme_says_how_to_point_the_tests_at_another_server() {
    let readme = read("README.md");
    let test_command = readme
        .find("cargo test\n")
        .expect("the README's test command");
    let around = &readme[test_command.saturating_sub(800)..test_command];
    assert!(
        around.contains("TEST_DATABASE_SERVER="),
        "the README's test section does not say TEST_DATABASE_SERVER=…"
    );
    assert!(
        read("tests/api/helpers.rs").contains("std::env::var(\"TEST_DATABASE_SERVER\")"),
        "the tests read TEST_DATABASE_SERVER"
    );
}
