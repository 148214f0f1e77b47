//! The OpenAPI responses the services' documents share, each written once: a handler's
//! `#[utoipa::path(responses(...))]` names them beside its own tuples (`responses((status = 200,
//! ...), AdminRefusals, NotJson)`) instead of repeating their text. Each is a
//! [`utoipa::IntoResponses`] type whose responses go into the operation inline, as the tuples' do,
//! so a document reads the same either way. A service declares the ones only it repeats with
//! [`problem_responses!`](crate::problem_responses).
//!
//! Also the liveness probe, [`healthz`]: one handler, documented once, in every service.

use std::collections::BTreeMap;
use utoipa::openapi::content::ContentBuilder;
use utoipa::openapi::schema::{ObjectBuilder, Type};
use utoipa::openapi::{RefOr, Response, ResponseBuilder};

/// Declares unit types whose [`utoipa::IntoResponses`] are problem responses (a `Problem` body,
/// `application/problem+json`), each listed as `status: "description"`:
///
/// ```
/// service_common::problem_responses! {
///     /// A change the store could not take.
///     pub struct NotDurable { 503: "The change could not be made durable; retry." }
/// }
/// // Named in a route's `#[utoipa::path(responses(..., NotDurable))]`.
/// let responses = <NotDurable as utoipa::IntoResponses>::responses();
/// assert_eq!(responses.keys().collect::<Vec<_>>(), ["503"]);
/// ```
#[macro_export]
macro_rules! problem_responses {
    ($($(#[$meta:meta])* $vis:vis struct $name:ident { $($status:literal: $description:expr),+ $(,)? })*) => {$(
        $(#[$meta])*
        $vis struct $name;

        impl ::utoipa::IntoResponses for $name {
            fn responses() -> ::std::collections::BTreeMap<
                ::std::string::String,
                ::utoipa::openapi::RefOr<::utoipa::openapi::Response>,
            > {
                $crate::openapi::problems(&[$(($status, $description)),+])
            }
        }
    )*};
}

/// The responses of `problems` (status, description), each with a `Problem` body: what
/// [`problem_responses!`](crate::problem_responses) expands to.
pub fn problems(problems: &[(u16, &str)]) -> BTreeMap<String, RefOr<Response>> {
    problems
        .iter()
        .map(|(status, description)| (status.to_string(), RefOr::T(domain::openapi::problem_response(description))))
        .collect()
}

problem_responses! {
    /// The refusals of an admin route ([`crate::auth::AdminAuth`]).
    pub struct AdminRefusals {
        401: "No valid admin token.",
        403: "No admin token is configured: the admin API is off.",
    }

    /// A JSON body that does not parse into the request ([`crate::ValidJson`]).
    pub struct BadJson { 400: "Malformed JSON, a wrong type, a missing or unknown field." }

    /// A body not declared JSON ([`crate::ValidJson`]).
    pub struct NotJson { 415: "The body is not declared `application/json`." }

    /// A JSON body that parses but breaks a rule of the request ([`crate::ValidJson`]).
    pub struct BrokenRule { 422: "A field breaks a rule (named in `errors`)." }

    /// A route on one VM whose path or query does not parse.
    pub struct BadPathOrQuery { 400: "An unknown query parameter, or a malformed path." }
}

/// The answers of `GET /metrics`: the Prometheus text, or 404 from a service that records none.
pub struct MetricsResponses;

impl utoipa::IntoResponses for MetricsResponses {
    fn responses() -> BTreeMap<String, RefOr<Response>> {
        let mut responses = problems(&[(404, "This server records no metrics.")]);
        responses.insert("200".to_owned(), RefOr::T(text("The metrics.")));
        responses
    }
}

/// A `text/plain` response of a string.
fn text(description: &str) -> Response {
    let string = ObjectBuilder::new().schema_type(Type::String);
    ResponseBuilder::new()
        .description(description)
        .content("text/plain", ContentBuilder::new().schema(Some(string)).build())
        .build()
}

/// The process is up.
#[utoipa::path(get, path = "/healthz", responses((status = 200, description = "Alive: `ok`.", body = String, content_type = "text/plain")))]
pub async fn healthz() -> &'static str {
    "ok"
}

#[cfg(test)]
mod tests {
    use super::*;
    use utoipa::OpenApi;

    #[utoipa::path(post, path = "/written-out",
        responses((status = 401, description = "No valid admin token.", body = domain::Problem),
                  (status = 403, description = "No admin token is configured: the admin API is off.", body = domain::Problem),
                  (status = 404, description = "This server records no metrics.", body = domain::Problem),
                  (status = 200, description = "The metrics.", body = String, content_type = "text/plain")))]
    #[allow(dead_code)]
    async fn written_out() {}

    #[utoipa::path(post, path = "/named", responses(AdminRefusals, MetricsResponses))]
    #[allow(dead_code)]
    async fn named() {}

    #[derive(OpenApi)]
    #[openapi(paths(written_out, named), components(schemas(domain::Problem)))]
    struct Both;

    /// What a route's document says is the same whether its responses are written out as tuples
    /// or named: the services' documents did not change when they began naming them.
    #[test]
    fn named_responses_read_as_the_tuples_they_replace() {
        let mut openapi = Both::openapi();
        domain::openapi::complete(&mut openapi);
        let responses = |path: &str| {
            let operation = openapi.paths.paths[path].post.as_ref().expect("a POST operation");
            serde_json::to_value(&operation.responses).expect("serializable")
        };
        assert_eq!(responses("/written-out"), responses("/named"));
        let named = responses("/named");
        for status in ["200", "401", "403", "404"] {
            assert!(named[status].is_object(), "{status}: {named}");
        }
    }
}
