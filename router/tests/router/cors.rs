//! `--cors-allow-origin`: browsers' preflight and simple requests get CORS headers for the
//! allowed origins only, before authentication; without the flag no CORS headers are sent.

use std::path::Path;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderValue, Request, StatusCode, header};
use tessera_router::{AppState, Infer, app};
use tessera_text::ModelTokenizer;
use tower::ServiceExt;

fn router(origins: &[&str]) -> Router {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/tiny-llama");
    let tokenizer = Arc::new(ModelTokenizer::from_hf_dir(&dir, &[]).expect("fixture tokenizer"));
    let (tx, _rx) = tokio::sync::mpsc::channel(4);
    let origins = origins
        .iter()
        .map(|o| HeaderValue::from_str(o).expect("origin"))
        .collect();
    let state = AppState::builder(Infer::new(tx, 4), tokenizer, "tiny")
        .api_key(Some("secret".into()))
        .cors_allow_origin(origins)
        .build();
    app(state)
}

fn preflight(origin: &str) -> Request<Body> {
    Request::options("/v1/chat/completions")
        .header(header::ORIGIN, origin)
        .header(header::ACCESS_CONTROL_REQUEST_METHOD, "POST")
        .header(
            header::ACCESS_CONTROL_REQUEST_HEADERS,
            "authorization,content-type,x-request-timeout",
        )
        .body(Body::empty())
        .expect("request")
}

fn allowed_origin(r: &axum::response::Response) -> Option<&str> {
    r.headers()
        .get(header::ACCESS_CONTROL_ALLOW_ORIGIN)
        .and_then(|v| v.to_str().ok())
}

#[tokio::test]
async fn listed_origins_pass_preflight_before_authentication() {
    let app = router(&["https://app.example"]);
    let r = app.clone().oneshot(preflight("https://app.example")).await;
    let r = r.expect("preflight");
    assert!(r.status().is_success(), "{}", r.status());
    assert_eq!(allowed_origin(&r), Some("https://app.example"));
    let headers = r.headers()[header::ACCESS_CONTROL_ALLOW_HEADERS]
        .to_str()
        .expect("allow-headers");
    for h in ["authorization", "content-type", "x-request-timeout"] {
        assert!(headers.contains(h), "{h} not in {headers}");
    }

    let r = app.clone().oneshot(preflight("https://evil.example")).await;
    assert_eq!(allowed_origin(&r.expect("preflight")), None);

    // A real request from an allowed origin carries the header, even when refused.
    let get = Request::get("/v1/models")
        .header(header::ORIGIN, "https://app.example")
        .body(Body::empty())
        .expect("request");
    let r = app.oneshot(get).await.expect("GET");
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(allowed_origin(&r), Some("https://app.example"));
}

#[tokio::test]
async fn star_allows_any_origin_and_none_sends_no_headers() {
    let r = router(&["*"])
        .oneshot(preflight("https://any.example"))
        .await;
    assert_eq!(allowed_origin(&r.expect("preflight")), Some("*"));
    let r = router(&[]).oneshot(preflight("https://any.example")).await;
    assert_eq!(allowed_origin(&r.expect("preflight")), None);
}
