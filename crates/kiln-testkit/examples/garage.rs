//! A throwaway Garage (S3) for benchmarks by hand:
//!
//!     cargo run -p kiln-testkit --example garage
//!
//! prints the `--object-store` URL and the credentials to export, and keeps
//! Garage running until its standard input closes (Ctrl-D), then removes it.

fn main() -> anyhow::Result<()> {
    let g = kiln_testkit::TempGarage::start()?;
    println!("KILN_OBJECT_STORE='{}'", g.url("bench"));
    for (k, v) in g.env() {
        println!("{k}={v}");
    }
    let mut sink = String::new();
    while std::io::stdin().read_line(&mut sink)? > 0 {}
    Ok(())
}
