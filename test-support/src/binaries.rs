//! The workspace's binaries, found beside the running test or bench: a crate knows only its own
//! binaries by `env!("CARGO_BIN_EXE_...")`, and the tests that start the whole stack need the
//! other crates' too.

use std::path::PathBuf;

/// Set to a directory, [`workspace_binary`] finds the binaries there instead of this build's (a
/// bench's before/after in one run: the directory holds an older commit's).
pub const BINARIES_DIR_VARIABLE: &str = "STACK_BINARIES_DIR";

/// The directory of this build's binaries: the target profile directory (`target/release`), the
/// grandparent of the running executable (`target/release/deps/<test>-<hash>`; benches too).
pub fn binaries_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_else(|e| panic!("the test's own executable: {e}"));
    exe.parent()
        .and_then(|deps| deps.parent())
        .unwrap_or_else(|| panic!("{} is not in <target>/<profile>/deps", exe.display()))
        .to_path_buf()
}

/// The binary `name` of a workspace package: this build's ([`binaries_dir`]), or the one in
/// [`BINARIES_DIR_VARIABLE`] when it is set. `cargo test --release --workspace` builds every
/// member's binaries before it runs any test (and a package's own tests build its binaries); a
/// missing one fails here, naming the command.
pub fn workspace_binary(name: &str) -> PathBuf {
    let dir = std::env::var_os(BINARIES_DIR_VARIABLE).map_or_else(binaries_dir, PathBuf::from);
    let path = dir.join(name);
    assert!(
        path.is_file(),
        "{} is missing: this test starts the real `{name}` binary of the workspace; build the binaries with \
         `cargo build --release --workspace --bins` (or run the tests with `cargo test --release --workspace`, \
         which builds them first)",
        path.display()
    );
    path
}
