//! Gives each build of the crate an id (`SYNAPSE_BUILD_ID`, the build's time in nanoseconds),
//! so that `synapse` can tell whether the `synapse-agent` beside it comes from the same build
//! (`cargo run` builds only `synapse`, and may leave an older `synapse-agent` beside it).
//! It runs again whenever a file under `src/` changes, which recompiles the crate anyway.
//!
//! Also packs the executables' relative relocations (`-z pack-relative-relocs`, DT_RELR) when
//! they are linked statically against a glibc that applies them at start (2.36 and later): a
//! static position-independent `synapse` carried 11,119 relocations of 24 bytes each, which
//! every process start read (about 65 pages) before running; packed, they take 394 words.
//! `synapse --version` went from 1.10 to 0.98 ms, `synapse send` from 1.57 to 1.42 ms
//! (tools/README.md, "cli-send"). An older glibc's static start code ignores DT_RELR, so the
//! flag is left off there (and when cross-compiling, where the host's glibc says nothing).

fn main() {
    println!("cargo:rerun-if-changed=src");
    println!("cargo:rerun-if-changed=Cargo.toml");
    println!("cargo:rerun-if-changed=build.rs");
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |elapsed| elapsed.as_nanos());
    println!("cargo:rustc-env=SYNAPSE_BUILD_ID={nanos}-{}", std::process::id());
    if linked_statically_against_glibc() && host_glibc_at_least(2, 36) {
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
}

fn cfg(name: &str) -> String {
    std::env::var(name).unwrap_or_default()
}

fn linked_statically_against_glibc() -> bool {
    cfg("CARGO_CFG_TARGET_OS") == "linux"
        && cfg("CARGO_CFG_TARGET_ENV") == "gnu"
        && cfg("CARGO_CFG_TARGET_FEATURE").split(',').any(|feature| feature == "crt-static")
        && cfg("HOST") == cfg("TARGET")
}

/// The build machine's glibc, from `getconf GNU_LIBC_VERSION` ("glibc 2.36"); false when it
/// cannot be told.
fn host_glibc_at_least(major: u32, minor: u32) -> bool {
    let Ok(output) = std::process::Command::new("getconf").arg("GNU_LIBC_VERSION").output() else { return false };
    let text = String::from_utf8_lossy(&output.stdout);
    let Some(version) = text.trim().strip_prefix("glibc ") else { return false };
    let mut parts = version.split('.').map(|part| part.parse::<u32>().ok());
    match (parts.next().flatten(), parts.next().flatten()) {
        (Some(found_major), Some(found_minor)) => (found_major, found_minor) >= (major, minor),
        _ => false,
    }
}
