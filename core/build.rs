//! Rebuild when a migration is added or changed: `sqlx::migrate!` embeds the directory at
//! compile time, and processes refuse a database whose schema version differs from the
//! embedded one, so a stale embedding would be a startup failure, not just stale docs.

fn main() {
    println!("cargo:rerun-if-changed=../migrations");
}
