//! Build-time facts the service embeds.
//!
//! - `embed_migrations!` does not notice a new migration folder on its own.
//! - The money engine's SQL files (`src/engine/sql/*.sql`, installed in
//!   name order) are embedded, and the schema they are installed into is
//!   named by their content: `engine_` and the first 16 hex digits of the
//!   SHA-256 of every file's name and text. The list and the name are
//!   written to `$OUT_DIR/engine_sql.rs` (read by `engine::install`), and the
//!   name is also `TOKEN_BILLING_ENGINE_SCHEMA` (read by the pool, which
//!   puts it first on every connection's search_path).
use std::fmt::Write as _;
use std::path::Path;

use sha2::{Digest, Sha256};

fn main() {
    println!("cargo:rerun-if-changed=migrations");
    let directory = Path::new("src/engine/sql");
    println!("cargo:rerun-if-changed={}", directory.display());
    let mut files: Vec<_> = std::fs::read_dir(directory)
        .expect("src/engine/sql is readable")
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|path| path.extension().is_some_and(|extension| extension == "sql"))
        .collect();
    files.sort();
    let mut hasher = Sha256::new();
    let mut list = String::from("/// The engine's SQL files, in install order: (name, text).\n");
    list.push_str("pub const FILES: &[(&str, &str)] = &[\n");
    for path in &files {
        println!("cargo:rerun-if-changed={}", path.display());
        let name = path.file_name().expect("a file name").to_string_lossy();
        let text = std::fs::read_to_string(path).expect("an engine SQL file is UTF-8");
        hasher.update(name.as_bytes());
        hasher.update([0]);
        hasher.update(text.as_bytes());
        hasher.update([0]);
        // Named from the crate's directory at its compile time, not by an
        // absolute path written here: cargo reuses this output for another
        // checkout of the same crate in a shared CARGO_TARGET_DIR (CI's
        // fresh clones), and a path into a clone since deleted broke that
        // build.
        writeln!(
            list,
            "    ({name:?}, include_str!(concat!(env!(\"CARGO_MANIFEST_DIR\"), {:?}))),",
            format!("/{}", path.display())
        )
        .expect("writing to a String");
    }
    list.push_str("];\n");
    let digest = hasher.finalize();
    let hex: String = digest[..8]
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect();
    let schema = format!("engine_{hex}");
    writeln!(
        list,
        "/// The schema these files are installed into.\npub const SCHEMA: &str = {schema:?};"
    )
    .expect("writing to a String");
    let out = std::env::var("OUT_DIR").expect("cargo sets OUT_DIR");
    std::fs::write(Path::new(&out).join("engine_sql.rs"), list).expect("writing engine_sql.rs");
    println!("cargo:rustc-env=TOKEN_BILLING_ENGINE_SCHEMA={schema}");
}
