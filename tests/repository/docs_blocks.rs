//! Every shell block of the docs is run by CI as a reader pastes it
//! (tests/readme/run.sh: the README's blocks, then each page's marked
//! `<!-- readme-test: run -->`, in order), or says why not: a block of
//! `docs/*.md` must be marked `run` or `skip` (the reason in the text
//! beside it). An unmarked block is one nobody decided about.

use std::path::Path;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// (line, marker) of every ```sh block of `text`, fenced at any indent.
fn shell_blocks(text: &str) -> Vec<(usize, Option<String>)> {
    let mut found = Vec::new();
    let mut marker: Option<String> = None;
    let mut inside = false;
    for (number, line) in text.lines().enumerate() {
        let trimmed = line.trim();
        if inside {
            if trimmed.starts_with("```") {
                inside = false;
            }
            continue;
        }
        if let Some(rest) = trimmed
            .strip_prefix("<!--")
            .and_then(|rest| rest.strip_suffix("-->"))
        {
            if let Some(kind) = rest.trim().strip_prefix("readme-test:") {
                marker = Some(kind.trim().to_owned());
                continue;
            }
        }
        if let Some(info) = trimmed.strip_prefix("```") {
            inside = true;
            if info.trim() == "sh" {
                found.push((number + 1, marker.take()));
            }
        }
        if !trimmed.is_empty() {
            marker = None;
        }
    }
    found
}

#[test]
fn every_shell_block_of_the_docs_is_run_by_ci_or_says_why_not() {
    let pages = crate::docs_agree::docs_pages();
    let mut undecided = Vec::new();
    let mut run = 0;
    for page in pages {
        let text = std::fs::read_to_string(root().join("docs").join(&page)).expect("readable");
        for (line, marker) in shell_blocks(&text) {
            match marker.as_deref() {
                Some("run") => run += 1,
                Some("skip") => {}
                other => undecided.push(format!("docs/{page}:{line} ({other:?})")),
            }
        }
    }
    assert!(run >= 10, "only {run} blocks of docs/ run in CI");
    assert!(
        undecided.is_empty(),
        "shell blocks neither run by tests/readme/run.sh nor marked skip: {undecided:#?}"
    );
}

#[test]
fn the_check_reads_markers_and_indented_blocks() {
    let text = "<!-- readme-test: run -->\n```sh\necho a\n```\n\n1. step\n\n   <!-- readme-test: skip -->\n   ```sh\n   echo b\n   ```\n\n```sh\necho c\n```\n";
    assert_eq!(
        shell_blocks(text),
        vec![
            (2, Some("run".to_owned())),
            (9, Some("skip".to_owned())),
            (13, None)
        ]
    );
}
