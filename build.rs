//! Gives each build of the crate an id (`SYNAPSE_BUILD_ID`, the build's time in nanoseconds),
//! so that `synapse` can tell whether the `synapse-agent` beside it comes from the same build
//! (`cargo run` builds only `synapse`, and may leave an older `synapse-agent` beside it).
//! It runs again whenever a file under `src/` changes, which recompiles the crate anyway.

fn main() {
    println!("cargo:rerun-if-changed=src");
    println!("cargo:rerun-if-changed=Cargo.toml");
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |elapsed| elapsed.as_nanos());
    println!("cargo:rustc-env=SYNAPSE_BUILD_ID={nanos}-{}", std::process::id());
}
