//! Embeds the SQL migrations: writes `$OUT_DIR/migrations.rs`, a list of
//! `(file name, contents)` per backend that `src/migrations.rs` turns into
//! sqlx migrators at start-up. (sqlx's `migrate!` macro does the same at
//! compile time, but needs sqlx's `macros` feature, which compiles sqlx's
//! drivers a second time for the macro.) Every `.sql` file of
//! `migrations/<backend>` is listed, in name order, so a new migration is
//! embedded by adding its file.

use std::fmt::Write;
use std::path::Path;

fn main() {
    let mut code = String::new();
    for backend in ["sqlite", "postgres"] {
        let dir = Path::new("migrations").join(backend);
        println!("cargo:rerun-if-changed={}", dir.display());
        let mut files: Vec<String> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
            .map(|entry| {
                let name = entry.expect("a directory entry").file_name();
                name.into_string().expect("a UTF-8 migration file name")
            })
            .filter(|name| name.ends_with(".sql"))
            .collect();
        files.sort();
        let constant = backend.to_uppercase();
        writeln!(
            code,
            "/// Every `migrations/{backend}/*.sql`, as `(file name, SQL)`."
        )
        .unwrap();
        writeln!(code, "pub(crate) const {constant}: &[(&str, &str)] = &[").unwrap();
        for file in &files {
            writeln!(
                code,
                "    ({file:?}, include_str!(concat!(env!(\"CARGO_MANIFEST_DIR\"), \
                 \"/migrations/{backend}/{file}\"))),"
            )
            .unwrap();
        }
        code.push_str("];\n");
    }
    let out = std::env::var("OUT_DIR").expect("cargo sets OUT_DIR");
    std::fs::write(Path::new(&out).join("migrations.rs"), code).expect("write migrations.rs");
}
