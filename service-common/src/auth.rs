//! Bearer-token protection of admin routes.

use crate::problem::problem;
use axum::http::{header, HeaderMap};
use axum::response::Response;
use domain::ProblemKind;

/// Checks `Authorization: Bearer <token>`. Without a configured token, admin routes are closed.
pub fn require_bearer(headers: &HeaderMap, token: Option<&str>) -> Result<(), Response> {
    let Some(expected) = token.filter(|t| !t.is_empty()) else {
        return Err(problem(ProblemKind::AdminDisabled, "no admin token is configured for this service"));
    };
    let given =
        headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
    // Compare in constant time for equal lengths, so the token cannot be guessed byte by byte.
    let matches = given.is_some_and(|g| {
        g.len() == expected.len() && g.bytes().zip(expected.bytes()).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
    });
    if matches {
        Ok(())
    } else {
        let mut response = problem(ProblemKind::Unauthorized, "a valid bearer token is required");
        response.headers_mut().insert(header::WWW_AUTHENTICATE, header::HeaderValue::from_static("Bearer"));
        Err(response)
    }
}
