//! What the three services' OpenAPI documents share (behind the `openapi` feature): problem bodies
//! typed `application/problem+json`, the answers the standard HTTP stack gives on every route
//! (413 over the body limit, 503 when overloaded or timed out), the `bearer` security scheme, and
//! route aliases. The services' own routes are described where they are handled.

use crate::problem::PROBLEM_CONTENT_TYPE;
use utoipa::openapi::content::ContentBuilder;
use utoipa::openapi::header::HeaderBuilder;
use utoipa::openapi::path::{Operation, Paths};
use utoipa::openapi::schema::{ObjectBuilder, Type};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{OpenApi, Ref, RefOr, Response, ResponseBuilder};

/// Name of the bearer-token security scheme in `components.securitySchemes`.
pub const BEARER_SCHEME: &str = "bearer";

/// Name of the service credential's security scheme: the bearer token the allocator's and the
/// inference server's data routes require (`service_common::auth::ServiceTokens`).
pub const SERVICE_TOKEN_SCHEME: &str = "service_token";

/// Marks every operation outside `open_paths` as requiring the service credential: operations
/// without a security requirement get [`SERVICE_TOKEN_SCHEME`] (the admin routes keep [`BEARER_SCHEME`]:
/// the admin token passes the service check too), and every protected operation documents its 401.
/// Call it before [`complete`].
pub fn require_service_token(openapi: &mut OpenApi, open_paths: &[&str]) {
    use utoipa::openapi::security::SecurityRequirement;
    let mut protected = false;
    for (path, _, operation) in operations_mut(openapi) {
        if open_paths.contains(&path) {
            continue;
        }
        protected = true;
        if operation.security.as_ref().is_none_or(Vec::is_empty) {
            operation.security = Some(vec![SecurityRequirement::new(SERVICE_TOKEN_SCHEME, Vec::<String>::new())]);
        }
        operation.responses.responses.entry("401".to_owned()).or_insert_with(|| {
            RefOr::T(problem_response(
                "No valid bearer token (`urn:problem:unauthorized`, with `WWW-Authenticate: Bearer`); nothing changed.",
            ))
        });
    }
    if protected {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            SERVICE_TOKEN_SCHEME,
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "`Authorization: Bearer <service token>`: the token the service is configured with \
                         (`service_token`), which the control service presents; the admin token passes too",
                    ))
                    .build(),
            ),
        );
    }
}

/// Every operation of a document with its path and method, mutably.
pub fn operations_mut(openapi: &mut OpenApi) -> impl Iterator<Item = (&str, &'static str, &mut Operation)> {
    openapi.paths.paths.iter_mut().flat_map(|(path, item)| {
        [
            ("get", &mut item.get),
            ("put", &mut item.put),
            ("post", &mut item.post),
            ("delete", &mut item.delete),
            ("patch", &mut item.patch),
            ("head", &mut item.head),
            ("options", &mut item.options),
            ("trace", &mut item.trace),
        ]
        .into_iter()
        .filter_map(move |(method, operation)| operation.as_mut().map(|operation| (path.as_str(), method, operation)))
    })
}

/// A response with a `Problem` body (`application/problem+json`).
pub fn problem_response(description: &str) -> Response {
    ResponseBuilder::new()
        .description(description)
        .content(PROBLEM_CONTENT_TYPE, ContentBuilder::new().schema(Some(Ref::from_schema_name("Problem"))).build())
        .build()
}

/// A `Retry-After` header (seconds), for 429 and 503 answers.
fn with_retry_after(response: Response) -> Response {
    let seconds = ObjectBuilder::new().schema_type(Type::Integer).minimum(Some(1));
    let header = HeaderBuilder::new().schema(seconds).description(Some("Seconds to wait before retrying.")).build();
    let mut response = response;
    response.headers.insert("Retry-After".to_owned(), header);
    response
}

/// Completes a service's document:
///
/// - every `Problem` body is typed `application/problem+json` (utoipa writes `application/json`
///   for any `body = ...`);
/// - every operation may answer 503 (the standard stack's load shedding and request timeout, with
///   `Retry-After` when overloaded), and every operation with a body 413 (the body limit); an operation that documents its own 503 keeps it;
/// - 429 answers carry `Retry-After`;
/// - the `bearer` scheme is defined when any operation requires it.
pub fn complete(openapi: &mut OpenApi) {
    let mut uses_bearer = false;
    for (_, _, operation) in operations_mut(openapi) {
        for response in operation.responses.responses.values_mut() {
            if let RefOr::T(response) = response {
                retype_problem(response);
            }
        }
        let responses = &mut operation.responses.responses;
        responses.entry("503".to_owned()).or_insert_with(|| {
            RefOr::T(problem_response("Overloaded (`urn:problem:overloaded`, with `Retry-After`) or timed out."))
        });
        if let Some(RefOr::T(response)) = responses.get_mut("503") {
            *response = with_retry_after(response.clone());
        }
        if let Some(RefOr::T(response)) = responses.get_mut("429") {
            *response = with_retry_after(response.clone());
        }
        if operation.request_body.is_some() {
            responses.entry("413".to_owned()).or_insert_with(|| {
                RefOr::T(problem_response("The body is larger than the service's limit (`http.max_body_bytes`)."))
            });
        }
        uses_bearer |= operation.security.iter().flatten().any(|requirement| {
            serde_json::to_value(requirement)
                .ok()
                .and_then(|value| value.as_object().map(|object| object.contains_key(BEARER_SCHEME)))
                .unwrap_or(false)
        });
    }
    if uses_bearer {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            BEARER_SCHEME,
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some("`Authorization: Bearer <token>`"))
                    .build(),
            ),
        );
    }
}

/// Moves a `Problem` body from `application/json` to `application/problem+json`.
fn retype_problem(response: &mut Response) {
    let Some(content) = response.content.get("application/json") else { return };
    let is_problem =
        matches!(content.schema.as_ref(), Some(RefOr::Ref(reference)) if reference.ref_location.ends_with("/Problem"));
    if is_problem {
        if let Some(content) = response.content.shift_remove("application/json") {
            response.content.insert(PROBLEM_CONTENT_TYPE.to_owned(), content);
        }
    }
}

/// Documents `alias` as the same routes as `path`, with operation ids suffixed `_alias_suffix`.
pub fn alias(paths: &mut Paths, path: &str, alias: &str, suffix: &str) {
    let Some(item) = paths.paths.get(path).cloned() else { return };
    let mut item = item;
    for operation in [
        &mut item.get,
        &mut item.put,
        &mut item.post,
        &mut item.delete,
        &mut item.patch,
        &mut item.head,
        &mut item.options,
        &mut item.trace,
    ]
    .into_iter()
    .flatten()
    {
        if let Some(id) = &mut operation.operation_id {
            id.push('_');
            id.push_str(suffix);
        }
        let note = format!("Same as `{path}`.");
        operation.summary = Some(match operation.summary.take() {
            Some(summary) => format!("{summary} {note}"),
            None => note,
        });
    }
    paths.paths.insert(alias.to_owned(), item);
}

/// Replaces (or adds) property `property` of the object schema `schema` in `components.schemas`:
/// for fields whose derived schema cannot say what the wire form is (a custom serde form, an enum
/// given as a plain string). A missing or non-object schema is left alone.
pub fn set_property(
    openapi: &mut OpenApi,
    schema: &str,
    property: &str,
    value: impl Into<RefOr<utoipa::openapi::schema::Schema>>,
) {
    use utoipa::openapi::schema::Schema;
    let schemas = openapi.components.as_mut().map(|components| &mut components.schemas);
    if let Some(RefOr::T(Schema::Object(object))) = schemas.and_then(|schemas| schemas.get_mut(schema)) {
        object.properties.insert(property.to_owned(), value.into());
    }
}

/// Replaces (or adds) schema `name` in `components.schemas`.
pub fn set_schema(openapi: &mut OpenApi, name: &str, schema: utoipa::openapi::schema::Schema) {
    let components = openapi.components.get_or_insert_with(Default::default);
    components.schemas.insert(name.to_owned(), RefOr::T(schema));
}

/// Replaces the schema of parameter `name` of every operation on `path`.
pub fn set_parameter_schema(
    openapi: &mut OpenApi,
    path: &str,
    name: &str,
    schema: impl Into<RefOr<utoipa::openapi::schema::Schema>>,
) {
    let schema = schema.into();
    for (_, _, operation) in operations_mut(openapi).filter(|(operation_path, _, _)| *operation_path == path) {
        for parameter in operation.parameters.iter_mut().flatten().filter(|parameter| parameter.name == name) {
            parameter.schema = Some(schema.clone());
        }
    }
}
