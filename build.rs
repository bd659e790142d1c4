// embed_migrations! does not notice a new migration folder on its own.
fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
