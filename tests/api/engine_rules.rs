//! Every money rule of the engine has a name and one body. Each rule below
//! is one SQL function in `src/engine/sql/`; this test reads every engine
//! function (comments aside) and fails when a rule is spelled out anywhere
//! but in its function — a raw `expires_at <=` outside the expiry rules is
//! enough — naming the rule, the function that spelled it and the place it
//! belongs. It also fails when a rule's function is missing or nothing
//! calls it. docs/architecture.md's rule table names the same functions,
//! and the tests that guard each rule.

use std::collections::BTreeMap;
use std::path::Path;

use regex::Regex;

/// A rule, the function that holds it, and how it looks when spelled out.
struct Rule {
    rule: &'static str,
    function: &'static str,
    /// Spellings of the rule (regular expressions over the SQL, comments
    /// removed) that may appear only in `function` and in `shared_with`.
    spellings: &'static [&'static str],
    /// Other named rules that share a spelling (each one's own body).
    shared_with: &'static [&'static str],
}

/// `expires_at <=` / `expires_at >`: the expiry rules, each over its own
/// thing (an API key's own expiry is part of the valid-key rule).
const EXPIRY: &str = r"expires_at\s*(<=|>)";
const EXPIRY_RULES: &[&str] = &[
    "engine_reservation_expired",
    "engine_grant_lapsed",
    "engine_topup_request_expired",
    "engine_valid_key",
];

const RULES: &[Rule] = &[
    Rule {
        rule: "a reservation has expired at an instant",
        function: "engine_reservation_expired",
        spellings: &[EXPIRY],
        shared_with: EXPIRY_RULES,
    },
    Rule {
        rule: "a grant has lapsed at an instant",
        function: "engine_grant_lapsed",
        spellings: &[EXPIRY],
        shared_with: EXPIRY_RULES,
    },
    Rule {
        rule: "the draw order of an account's grants",
        function: "engine_grant_pools",
        spellings: &[r"ORDER BY\s+[\w.]*priority"],
        shared_with: &[],
    },
    Rule {
        rule: "a spend's refusals: status, balance, reservation limit",
        function: "engine_spend_refusal",
        spellings: &[
            r"status\s*<>\s*'active'",
            r"available\s*<\s*[\w.]*amount",
            r"active\w*\s*>=\s*[\w.]*max",
            r"'too_many_active_reservations'\s+END",
        ],
        shared_with: &[],
    },
    Rule {
        rule: "a spend's refusal by its key",
        function: "engine_key_refusal",
        spellings: &[r"engine_spend_authority\s*\(", r"'unauthorized'"],
        // (who may spend where: the key's scope, which only the refusal asks)
        shared_with: &["engine_spend_authority"],
    },
    Rule {
        rule: "a commit takes at most what is held",
        function: "engine_commit_exceeds",
        spellings: &[r"amount\s*>\s*[\w.]*(held|amount)\b"],
        shared_with: &[],
    },
    Rule {
        rule: "an extension is capped by its grants' expiry",
        function: "engine_extension_expiry",
        spellings: &[r"asked\s*<=\s*[\w.]*cap", r"GREATEST\s*\(\s*p_cap"],
        shared_with: &[],
    },
    Rule {
        rule: "one external_ref is booked once",
        function: "engine_external_booking",
        spellings: &[r"FROM\s+(credits|adjustments)\s+\w+\s+WHERE\s+\w+\.external_ref"],
        shared_with: &[],
    },
    Rule {
        rule: "a top-up rule is due (fires below its line, re-arms at it)",
        function: "engine_topup_due",
        spellings: &[
            r"available\s*<\s*[\w.]*(line|topup_threshold)",
            r"unconsumed\s*=\s*0",
        ],
        shared_with: &[],
    },
    Rule {
        rule: "a top-up rule fires only against consumption (its unused tokens)",
        function: "engine_topup_unconsumed",
        spellings: &[r"GREATEST\s*\(\s*[\w.]*(before|unconsumed)\s*-"],
        shared_with: &[],
    },
    Rule {
        rule: "a top-up rule is armed or disarmed",
        function: "engine_topup_arm",
        spellings: &[r"topup_armed\s*="],
        shared_with: &[],
    },
    Rule {
        rule: "a kiosk key's budget left in its period",
        function: "engine_key_budget_left",
        spellings: &[r"budget\w*\s*-\s*CASE"],
        shared_with: &[],
    },
    Rule {
        rule: "a budget's period starts and ends in its time zone",
        function: "engine_key_period_start",
        spellings: &[r"date_trunc\s*\(\s*p_period"],
        shared_with: &["engine_key_period_end"],
    },
    Rule {
        rule: "a priced grant's tokens are valued by a cumulative floor",
        function: "engine_grant_value",
        spellings: &[r"::numeric\s*\*"],
        shared_with: &[],
    },
    Rule {
        rule: "a rollover carries min(unused, max_tokens)",
        function: "engine_rollover_carry",
        spellings: &[r"LEAST\s*\(\s*[\w.]*(unused|remaining)\s*,\s*[\w.]*max"],
        shared_with: &[],
    },
];

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Every engine function's body, comments removed, by name.
fn functions() -> BTreeMap<String, String> {
    let dir = root().join("src/engine/sql");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("src/engine/sql")
        .map(|entry| entry.expect("an entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "sql"))
        .collect();
    files.sort();
    let name = Regex::new(r"^CREATE FUNCTION (\w+)\s*\(").expect("a regex");
    let mut found = BTreeMap::new();
    for file in files {
        let text = std::fs::read_to_string(&file).expect("readable");
        let code: String = text
            .lines()
            .map(|line| line.split("--").next().unwrap_or(""))
            .collect::<Vec<_>>()
            .join("\n");
        for part in code.split("\nCREATE ").skip(1) {
            let part = format!("CREATE {part}");
            if let Some(captures) = name.captures(&part) {
                let function = captures[1].to_owned();
                // Overloads (one name, two signatures) share an entry.
                found
                    .entry(function)
                    .and_modify(|body: &mut String| body.push_str(&part))
                    .or_insert(part);
            }
        }
    }
    found
}

#[test]
fn every_money_rule_is_written_once_in_its_function() {
    let functions = functions();
    let rust: String = walk(&root().join("src"))
        .into_iter()
        .filter(|path| path.extension().is_some_and(|ext| ext == "rs"))
        .map(|path| std::fs::read_to_string(path).expect("readable"))
        .collect();
    let mut broken = Vec::new();
    for rule in RULES {
        match functions.get(rule.function) {
            None => broken.push(format!(
                "{}: its function {} is missing",
                rule.rule, rule.function
            )),
            Some(body) => {
                let call = Regex::new(&format!(r"\b{}\s*\(", rule.function)).expect("a regex");
                let called = functions
                    .iter()
                    .any(|(name, other)| name != rule.function && call.is_match(other))
                    || call.is_match(&rust);
                if !called {
                    broken.push(format!("{}: nothing calls {}", rule.rule, rule.function));
                }
                for spelling in rule.spellings {
                    let pattern = Regex::new(spelling).expect("a regex");
                    if !pattern.is_match(body) {
                        broken.push(format!(
                            "{}: {} no longer reads `{spelling}` (update this test)",
                            rule.rule, rule.function
                        ));
                    }
                }
            }
        }
        for spelling in rule.spellings {
            let pattern = Regex::new(spelling).expect("a regex");
            for (name, body) in &functions {
                if name == rule.function || rule.shared_with.contains(&name.as_str()) {
                    continue;
                }
                if let Some(found) = pattern.find(body) {
                    broken.push(format!(
                        "{}: spelled out in {name} (`{}`); call {} instead",
                        rule.rule,
                        found.as_str(),
                        rule.function
                    ));
                }
            }
        }
    }
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}

/// The rule table of docs/architecture.md names every rule's function.
#[test]
fn the_architecture_rule_table_names_every_rule_function() {
    let doc = std::fs::read_to_string(root().join("docs/architecture.md")).expect("readable");
    let missing: Vec<_> = RULES
        .iter()
        .filter(|rule| !doc.contains(&format!("`{}`", rule.function)))
        .map(|rule| rule.function)
        .collect();
    assert!(
        missing.is_empty(),
        "not in docs/architecture.md: {missing:?}"
    );
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).expect("a directory") {
        let path = entry.expect("an entry").path();
        if path.is_dir() {
            found.extend(walk(&path));
        } else {
            found.push(path);
        }
    }
    found
}
