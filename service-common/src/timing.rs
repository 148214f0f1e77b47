//! Per-stage timing of a request in its answer: the `Server-Timing` header (W3C Server Timing),
//! `name;dur=<milliseconds>` per stage, which browsers' developer tools, curl and the benches read
//! without any change to the JSON bodies. A caller that passes an upstream's stages on prefixes
//! them ([`prefixed`]), so one answer says where the time of the whole path went.

use axum::extract::{FromRequest, Request};
use axum::http::{HeaderName, HeaderValue};
use std::fmt::Write;
use std::time::{Duration, Instant};

/// The header's name.
pub const SERVER_TIMING: HeaderName = HeaderName::from_static("server-timing");

/// A `Server-Timing` value of `stages`, each a name (a token: letters, digits, `-`, `_`) and its
/// duration, in milliseconds to the microsecond.
pub fn server_timing<'a>(stages: impl IntoIterator<Item = (&'a str, Duration)>) -> HeaderValue {
    let mut value = String::with_capacity(128);
    for (name, duration) in stages {
        if !value.is_empty() {
            value.push_str(", ");
        }
        // Writing to a String cannot fail.
        let _ = write!(value, "{name};dur={:.3}", duration.as_secs_f64() * 1_000.0);
    }
    // Names are the services' own constants and the durations digits: always a valid value; an
    // empty value stands for one that is not.
    HeaderValue::from_str(&value).unwrap_or_else(|_| HeaderValue::from_static(""))
}

/// The stages of an upstream's `Server-Timing` value, each name prefixed with `prefix`, to append
/// to a value of this service's (entries that are not `name;dur=...` are dropped).
pub fn prefixed(upstream: &str, prefix: &str) -> String {
    let mut value = String::with_capacity(upstream.len() + 8 * prefix.len());
    for entry in upstream.split(',').map(str::trim) {
        let Some((name, params)) = entry.split_once(';') else { continue };
        let is_token = !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        let is_duration =
            params.trim().strip_prefix("dur=").is_some_and(|d| d.bytes().all(|b| b.is_ascii_digit() || b == b'.'));
        if is_token && is_duration {
            if !value.is_empty() {
                value.push_str(", ");
            }
            let _ = write!(value, "{prefix}{name};{}", params.trim());
        }
    }
    value
}

/// An extractor `E` with when its extraction began and what it took (reading and parsing the
/// body, for a body extractor): the first stage of a handler's `Server-Timing`.
pub struct Timed<E> {
    pub value: E,
    pub started: Instant,
    pub took: Duration,
}

impl<S, E> FromRequest<S> for Timed<E>
where
    S: Send + Sync,
    E: FromRequest<S>,
{
    type Rejection = E::Rejection;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        let started = Instant::now();
        let value = E::from_request(request, state).await?;
        Ok(Timed { value, started, took: started.elapsed() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stages_are_written_in_milliseconds_and_read_back_with_a_prefix() {
        let value = server_timing([("parse", Duration::from_micros(12)), ("commit", Duration::from_micros(1_234))]);
        assert_eq!(value.to_str().unwrap(), "parse;dur=0.012, commit;dur=1.234");
        assert_eq!(prefixed(value.to_str().unwrap(), "alloc-"), "alloc-parse;dur=0.012, alloc-commit;dur=1.234");
    }

    #[test]
    fn entries_that_are_not_plain_durations_are_dropped() {
        assert_eq!(
            prefixed("a;dur=1, b, c;desc=\"x\", d e;dur=2, ;dur=3, f;dur=1e3, g; dur=0.5", "x-"),
            "x-a;dur=1, x-g;dur=0.5"
        );
        assert_eq!(prefixed("", "x-"), "");
    }
}
