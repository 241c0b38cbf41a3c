//! llama-cpp-2 runs on the llama.cpp bindings of its own release: `Cargo.lock` holds
//! llama-cpp-2 and llama-cpp-sys-2 at the same version (semver let `^0.1.160` pick a newer
//! llama-cpp-sys-2, a llama.cpp the wrapper was never tested with).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

/// The version `Cargo.lock` records for package `name`.
fn locked_version(lock: &str, name: &str) -> String {
    let header = format!("name = \"{name}\"\nversion = \"");
    let at = lock
        .find(&header)
        .unwrap_or_else(|| panic!("{name} is not in Cargo.lock"));
    let rest = &lock[at + header.len()..];
    rest[..rest.find('"').unwrap()].to_string()
}

#[test]
fn llama_cpp_2_and_its_sys_crate_are_locked_to_one_release() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../Cargo.lock");
    let lock = std::fs::read_to_string(path).unwrap();
    let wrapper = locked_version(&lock, "llama-cpp-2");
    let bindings = locked_version(&lock, "llama-cpp-sys-2");
    assert_eq!(
        wrapper, bindings,
        "bump llama-cpp-2 and llama-cpp-sys-2 together (crates/keel-local/Cargo.toml pins both)"
    );
}
