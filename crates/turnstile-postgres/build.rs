// Migrations are embedded with `sqlx::migrate!`; a new migration file must
// trigger a rebuild even when no Rust source changed.
fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
