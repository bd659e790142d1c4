//! One statement of the books' identity. ARCHITECTURE.md states it in the
//! words of [`IDENTITY`]; every other place in the docs that writes it out
//! — prose, a formula, a table of checks, a runbook's SQL — must say the
//! same thing, in any algebraic arrangement. A doc that drops
//! `grant_expired` (an operator would see every account with a lapsed grant
//! as drifting) or flips a sign fails here. The SQL itself runs against a
//! database in `tests/api/docs_sql.rs`.

use std::collections::BTreeMap;
use std::path::Path;

/// The identity, as the docs state it.
pub const IDENTITY: &str = "credited + adjusted − grant_expired = available + reserved + used";

/// The balance columns the identity relates.
const TERMS: [&str; 6] = [
    "credited",
    "adjusted",
    "grant_expired",
    "available",
    "reserved",
    "used",
];

/// Columns of the period's roll-forward, a different identity: a span
/// naming one of them is not this one.
const ROLL_FORWARD: [&str; 3] = ["opening", "closing", "committed"];

fn read(relative: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(relative))
        .unwrap_or_else(|error| panic!("{relative}: {error}"))
}

/// README, ARCHITECTURE, and every docs page, by path.
fn pages() -> Vec<String> {
    let mut pages = vec!["README.md".to_owned(), "ARCHITECTURE.md".to_owned()];
    let docs = crate::docs_agree::docs_pages()
        .into_iter()
        .map(|name| format!("docs/{name}"));
    pages.extend(docs);
    pages
}

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Term(String),
    Other,
    Plus,
    Minus,
    Equals,
    Open,
    Close,
}

/// The text as tokens: the balance columns (a table qualifier such as
/// `a.` dropped, "grant expired" as the console writes it read as
/// `grant_expired`), the operators, parentheses, and `Other` for anything
/// else (a word, a number, a comma), which ends a span.
fn tokens(text: &str) -> Vec<Token> {
    // A paragraph, a list item and a code fence each end a span.
    let text: String = text
        .replace("```", " ¶ ")
        .lines()
        .map(|line| {
            let trimmed = line.trim_start();
            if trimmed.is_empty() || ["- ", "* ", "> "].iter().any(|p| trimmed.starts_with(p)) {
                format!("¶ {trimmed}\n")
            } else {
                format!("{line}\n")
            }
        })
        .collect::<String>()
        .replace("grant expired", "grant_expired");
    let chars: Vec<char> = text.chars().collect();
    let mut found = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() || c == '`' {
            i += 1;
            continue;
        }
        if c.is_ascii_alphanumeric() || c == '_' {
            let start = i;
            while i < chars.len()
                && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == '.')
            {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let word = word.trim_end_matches('.');
            let bare = word.rsplit('.').next().unwrap_or(word).to_owned();
            if TERMS.contains(&bare.as_str()) || ROLL_FORWARD.contains(&bare.as_str()) {
                found.push(Token::Term(bare));
            } else {
                found.push(Token::Other);
            }
            continue;
        }
        found.push(match c {
            '+' => Token::Plus,
            '-' | '−' => Token::Minus,
            '=' => Token::Equals,
            '<' if chars.get(i + 1) == Some(&'>') => {
                i += 1;
                Token::Equals
            }
            '(' => Token::Open,
            ')' => Token::Close,
            _ => Token::Other,
        });
        i += 1;
    }
    found
}

/// The linear form of a span, `left − right` when it has `=` (or `<>`),
/// the expression itself otherwise (a drift column, which is 0 when the
/// books agree). `None` when the span is not the identity: fewer than two
/// of its terms on different sides, or a roll-forward term.
fn linear_form(span: &[Token]) -> Option<BTreeMap<String, i64>> {
    let mut form: BTreeMap<String, i64> = BTreeMap::new();
    let mut side = 1;
    let mut signs = vec![1];
    let mut next = 1;
    for token in span {
        match token {
            Token::Term(name) => {
                if ROLL_FORWARD.contains(&name.as_str()) {
                    return None;
                }
                *form.entry(name.clone()).or_insert(0) +=
                    side * signs.last().copied().unwrap_or(1) * next;
                next = 1;
            }
            Token::Plus => next = 1,
            Token::Minus => next = -1,
            Token::Equals => {
                side = -1;
                signs = vec![1];
                next = 1;
            }
            Token::Open => {
                let outer = signs.last().copied().unwrap_or(1);
                signs.push(outer * next);
                next = 1;
            }
            Token::Close => {
                if signs.len() > 1 {
                    signs.pop();
                }
            }
            Token::Other => unreachable!("spans hold no other token"),
        }
    }
    form.retain(|_, coefficient| *coefficient != 0);
    let inflow = ["credited", "adjusted"]
        .iter()
        .any(|t| form.contains_key(*t));
    let holdings = ["available", "reserved", "used"]
        .iter()
        .any(|t| form.contains_key(*t));
    (inflow && holdings).then_some(form)
}

/// Every statement of the identity in `text`: the maximal runs of balance
/// terms, operators and parentheses. A row of a table of checks whose
/// first cell is `balance_invariant` reads as `expected = actual`.
fn statements(text: &str) -> Vec<(String, BTreeMap<String, i64>)> {
    let mut text = text.to_owned();
    let rows: Vec<String> = text
        .lines()
        .filter(|line| line.starts_with("| `balance_invariant` |"))
        .map(str::to_owned)
        .collect();
    for row in rows {
        let cells: Vec<&str> = row
            .split('|')
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .collect();
        if cells.len() >= 3 {
            text = text.replace(&row, &format!("{} = {}", cells[1], cells[2]));
        }
    }
    let all = tokens(&text);
    let mut found = Vec::new();
    for span in all.split(|token| *token == Token::Other) {
        if let Some(form) = linear_form(span) {
            found.push((describe(span), form));
        }
    }
    found
}

fn describe(span: &[Token]) -> String {
    span.iter()
        .map(|token| match token {
            Token::Term(name) => name.clone(),
            Token::Plus => "+".into(),
            Token::Minus => "−".into(),
            Token::Equals => "=".into(),
            Token::Open => "(".into(),
            Token::Close => ")".into(),
            Token::Other => "…".into(),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn canonical() -> BTreeMap<String, i64> {
    let found = statements(IDENTITY);
    assert_eq!(found.len(), 1, "{found:?}");
    found[0].1.clone()
}

fn agrees(form: &BTreeMap<String, i64>) -> bool {
    let identity = canonical();
    let negated: BTreeMap<String, i64> = identity.iter().map(|(k, v)| (k.clone(), -v)).collect();
    *form == identity || *form == negated
}

#[test]
fn the_identity_is_stated_once_in_architecture_and_read_from_there() {
    assert_eq!(
        canonical().len(),
        6,
        "the identity relates the six balance columns"
    );
    let architecture = read("ARCHITECTURE.md");
    assert!(
        architecture.contains(IDENTITY),
        "ARCHITECTURE.md states the identity as `{IDENTITY}`"
    );
}

#[test]
fn every_doc_and_runbook_query_states_the_same_identity() {
    let mut wrong = Vec::new();
    let mut seen = 0;
    for page in pages() {
        for (statement, form) in statements(&read(&page)) {
            seen += 1;
            if !agrees(&form) {
                wrong.push(format!("{page}: {statement}"));
            }
        }
    }
    assert!(
        seen >= 8,
        "the identity was found only {seen} times: the scan is broken"
    );
    assert!(
        wrong.is_empty(),
        "these state the books' identity otherwise than `{IDENTITY}`: {wrong:#?}"
    );
}

#[test]
fn the_check_finds_the_old_identity_and_accepts_rearrangements() {
    let old = "   WHERE credited + adjusted <> available + reserved + used;";
    assert!(statements(old).iter().all(|(_, form)| !agrees(form)));
    assert_eq!(statements(old).len(), 1);
    let table = "| `balance_invariant` | `credited + adjusted` | `available + reserved + used` |";
    assert!(!agrees(&statements(table)[0].1));
    for right in [
        "credited + adjusted - grant_expired - (available + reserved + used) AS drift",
        "`credited + adjusted = available + reserved + used + grant expired`",
        "a.available + a.reserved + a.used + a.grant_expired <> a.credited + a.adjusted",
    ] {
        let found = statements(right);
        assert_eq!(found.len(), 1, "{right}: {found:?}");
        assert!(agrees(&found[0].1), "{right}");
    }
    assert!(
        statements("opening + credited + adjusted − committed − grant_expired = closing")
            .is_empty()
    );
}
