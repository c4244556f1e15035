// `sqlx::migrate!` embeds the migration files at compile time; without this,
// a new or changed migration would not rebuild the crate.
fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
