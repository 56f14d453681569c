//! `/openapi.json` is an OpenAPI 3 document of the routes, and `/docs` serves the Swagger UI
//! (compiled in) that renders it.

use std::path::Path;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use http_body_util::BodyExt;
use tessera_router::{AppState, Infer, app};
use tessera_text::ModelTokenizer;
use tower::ServiceExt;

fn router() -> axum::Router {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/tiny-llama");
    let tokenizer = Arc::new(ModelTokenizer::from_hf_dir(&dir, &[]).expect("fixture tokenizer"));
    let (tx, _rx) = tokio::sync::mpsc::channel(4);
    app(AppState::builder(Infer::new(tx, 4), tokenizer, "tiny").build())
}

async fn get(path: &str) -> (StatusCode, String, String) {
    let req = Request::get(path).body(Body::empty()).expect("request");
    let r = router().oneshot(req).await.expect("response");
    let kind = r
        .headers()
        .get(header::CONTENT_TYPE)
        .map(|v| v.to_str().unwrap_or("").to_owned());
    let status = r.status();
    let body = r.into_body().collect().await.expect("body").to_bytes();
    (
        status,
        kind.unwrap_or_default(),
        String::from_utf8_lossy(&body).into_owned(),
    )
}

#[tokio::test]
async fn openapi_json_documents_the_routes() {
    let (status, kind, body) = get("/openapi.json").await;
    assert_eq!(status, StatusCode::OK);
    assert!(kind.starts_with("application/json"), "{kind}");
    let doc: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert!(
        doc["openapi"].as_str().is_some_and(|v| v.starts_with("3.")),
        "{}",
        doc["openapi"]
    );
    let chat = &doc["paths"]["/v1/chat/completions"]["post"];
    assert_eq!(
        chat["requestBody"]["content"]["application/json"]["schema"]["$ref"],
        "#/components/schemas/ChatCompletionRequest"
    );
    let schemas = &doc["components"]["schemas"];
    assert!(has_property(&schemas["ChatCompletionRequest"], "messages"));
    assert!(has_property(
        &schemas["GenerateParameters"],
        "max_new_tokens"
    ));
}

/// Whether a schema names `field`, directly or in one of its `allOf` parts (flattened fields).
fn has_property(schema: &serde_json::Value, field: &str) -> bool {
    schema["properties"][field].is_object()
        || schema["allOf"]
            .as_array()
            .is_some_and(|parts| parts.iter().any(|p| has_property(p, field)))
}

#[tokio::test]
async fn docs_serve_the_swagger_ui_for_the_document() {
    let (status, kind, body) = get("/docs/").await;
    assert_eq!(status, StatusCode::OK);
    assert!(kind.starts_with("text/html"), "{kind}");
    assert!(body.contains("swagger-ui"), "{body}");
    let (status, _, init) = get("/docs/swagger-initializer.js").await;
    assert_eq!(status, StatusCode::OK);
    assert!(init.contains("/openapi.json"), "{init}");
    let (status, _, _) = get("/docs/swagger-ui-bundle.js").await;
    assert_eq!(status, StatusCode::OK, "the UI's script is compiled in");
}
