//! docs/high-availability.md shows the Patroni configuration that
//! tests/failover/patroni.sh runs, as it is, and its timings table names
//! the file's values; the production timings it gives keep Patroni's rule.
//! The Patroni version the docs name is the one the script installs, and
//! the strict-mode choice they explain is the file's.

use std::path::Path;

use yaml_rust2::YamlLoader;

fn read(relative: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(relative))
        .unwrap_or_else(|error| panic!("{relative}: {error}"))
}

/// The first ```` ```yaml ```` block of `page`.
fn yaml_block(page: &str) -> String {
    let start = page.find("```yaml\n").expect("a yaml block") + "```yaml\n".len();
    let end = start + page[start..].find("```").expect("its end");
    page[start..end].to_owned()
}

/// The cells of the table row whose first cell is `` `name` ``.
fn row(page: &str, name: &str) -> Vec<String> {
    let line = page
        .lines()
        .find(|line| line.starts_with(&format!("| `{name}` |")))
        .unwrap_or_else(|| panic!("no row for {name}"));
    line.trim_matches('|')
        .split('|')
        .map(|cell| cell.trim().to_owned())
        .collect()
}

/// The number a cell starts with.
fn number(cell: &str) -> i64 {
    cell.split_whitespace()
        .next()
        .and_then(|first| first.parse().ok())
        .unwrap_or_else(|| panic!("no number in {cell:?}"))
}

#[test]
fn the_docs_show_the_patroni_configuration_the_test_runs() {
    let page = read("docs/high-availability.md");
    let file = read("tests/failover/patroni.yml");
    assert_eq!(
        yaml_block(&page),
        file,
        "docs/high-availability.md's yaml block is not tests/failover/patroni.yml"
    );
    let config = &YamlLoader::load_from_str(&file).expect("valid YAML")[0];
    let dcs = &config["bootstrap"]["dcs"];
    let mut production = std::collections::BTreeMap::new();
    for name in ["ttl", "loop_wait", "retry_timeout"] {
        let cells = row(&page, name);
        assert_eq!(
            number(&cells[1]),
            dcs[name].as_i64().expect(name),
            "the test's {name} in the docs' table"
        );
        production.insert(name, number(&cells[2]));
    }
    for (timings, which) in [
        (
            [
                dcs["ttl"].as_i64().expect("ttl"),
                dcs["loop_wait"].as_i64().expect("loop_wait"),
                dcs["retry_timeout"].as_i64().expect("retry_timeout"),
            ],
            "the test's",
        ),
        (
            [
                production["ttl"],
                production["loop_wait"],
                production["retry_timeout"],
            ],
            "production",
        ),
    ] {
        let [ttl, loop_wait, retry_timeout] = timings;
        assert!(ttl >= 20, "{which} ttl {ttl} < 20");
        assert!(
            loop_wait + 2 * retry_timeout <= ttl,
            "{which} timings break loop_wait + 2 × retry_timeout ≤ ttl"
        );
    }
    assert_eq!(dcs["synchronous_mode"].as_bool(), Some(true));
    assert_eq!(
        dcs["postgresql"]["use_pg_rewind"].as_bool(),
        Some(true),
        "a demoted primary rejoins by itself"
    );
}

/// The value of `name=` in a shell script (`name=value`, first match).
fn shell_value(script: &str, name: &str) -> String {
    script
        .lines()
        .find_map(|line| line.strip_prefix(&format!("{name}=")))
        .unwrap_or_else(|| panic!("no {name}= in the script"))
        .trim()
        .to_owned()
}

#[test]
fn the_docs_name_the_patroni_the_test_installs_and_its_strict_mode() {
    let page = read("docs/high-availability.md");
    let script = read("tests/failover/patroni.sh");
    let version = shell_value(&script, "patroni_version");
    for expected in [
        format!("**Patroni {version} from PyPI"),
        format!("'patroni[etcd3]=={version}'"),
    ] {
        assert!(
            page.contains(&expected),
            "docs/high-availability.md does not say {expected:?} (tests/failover/patroni.sh installs {version})"
        );
    }
    let psycopg = shell_value(&script, "psycopg_version");
    assert!(
        page.contains(&format!("'psycopg[binary]=={psycopg}'")),
        "docs/high-availability.md does not install psycopg {psycopg} as the script does"
    );
    let file = read("tests/failover/patroni.yml");
    let config = &YamlLoader::load_from_str(&file).expect("valid YAML")[0];
    let strict = config["bootstrap"]["dcs"]["synchronous_mode_strict"]
        .as_bool()
        .expect("synchronous_mode_strict");
    let explained = format!("**`synchronous_mode: true`, `synchronous_mode_strict: {strict}`.**");
    assert!(
        page.contains(&explained),
        "docs/high-availability.md does not explain the file's choice: {explained}"
    );
}
