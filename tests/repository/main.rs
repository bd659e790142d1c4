//! Repository checks: the docs, the compose files, the frozen files and the
//! architecture page agree with the code. No database, no server: this
//! binary runs in seconds (`cargo test --test repository`).

mod architecture;
mod books_identity;
mod compose;
mod deployment;
mod docs_agree;
mod docs_blocks;
mod docs_size;
mod frozen_files;
mod patroni;
