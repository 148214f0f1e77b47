//! For tests that need a lab: skip loudly where labs cannot be made, fail where they must.
//!
//! A test that silently passes without its lab proves nothing, so a skip prints a banner with the
//! reason and the fix, and `NETLAB_REQUIRE=1` (set it on CI and the project's machines, where labs
//! are available) turns the skip into a failure.

use crate::error::LabError;
use crate::lab::Lab;

/// The environment variable that makes an unavailable lab a test failure.
pub const REQUIRE_ENV: &str = "NETLAB_REQUIRE";

/// Whether labs can be made here. If not: with `NETLAB_REQUIRE` set (not `0`), panics with the
/// reason; otherwise prints a banner naming `test` and the reason, and returns `false` (the test
/// should return at once).
pub fn lab_or_skip(test: &str) -> bool {
    match Lab::available() {
        Ok(()) => true,
        Err(e) => skip(test, &e),
    }
}

fn skip(test: &str, error: &LabError) -> bool {
    let required = std::env::var(REQUIRE_ENV).is_ok_and(|value| !value.is_empty() && value != "0");
    if required {
        panic!("{test}: a network lab is required ({REQUIRE_ENV} is set) but cannot be made: {error}");
    }
    eprintln!(
        "\n==================== SKIPPED {test} ====================\n\
         netlab: network namespaces cannot be used here: {error}\n\
         (set {REQUIRE_ENV}=1 to make this a failure)\n\
         ========================================================\n"
    );
    false
}
