//! Every metric that `deploy/` queries (the Grafana dashboard, the Helm chart's autoscaler,
//! the example queries of `deploy/README.md`) is one the router exports, used as its kind
//! allows; and the dashboard takes its Prometheus data source from a variable.

use crate::metrics_support;

use std::collections::BTreeSet;

use metrics_support::root;
use serde_json::Value;
use tessera_router::metric_names::{ALL, Kind};

/// `tessera_*` identifiers in a query.
fn metric_names(query: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = query;
    while let Some(i) = rest.find("tessera_") {
        let before = rest[..i].chars().next_back();
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        if !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            names.push(tail[..end].to_string());
        }
        rest = &tail[end..];
    }
    names
}

/// Checks that `series` is an exported metric, or a `_bucket`/`_sum`/`_count` series of an
/// exported histogram. Returns the problem, if any.
fn check(series: &str) -> Option<String> {
    let kind_of = |name: &str| ALL.iter().find(|m| m.0 == name).map(|m| m.1);
    if kind_of(series).is_some_and(|k| k != Kind::Histogram) {
        return None;
    }
    for suffix in ["_bucket", "_sum", "_count"] {
        if let Some(base) = series.strip_suffix(suffix) {
            return match kind_of(base) {
                Some(Kind::Histogram) => None,
                Some(k) => Some(format!("{series}: {base} is a {k:?}, not a histogram")),
                None => Some(format!("{series}: no metric {base}")),
            };
        }
    }
    Some(match kind_of(series) {
        Some(_) => format!("{series} is a histogram: query its _bucket/_sum/_count"),
        None => format!("{series} is not exported"),
    })
}

/// Every string under a key named `expr`, `query` or `definition`.
fn queries(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(map) => {
            for (k, v) in map {
                match (k.as_str(), v) {
                    ("expr" | "query" | "definition", Value::String(s)) => out.push(s.clone()),
                    _ => queries(v, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| queries(v, out)),
        _ => {}
    }
}

fn dashboard() -> Value {
    let text = std::fs::read_to_string(root().join("deploy/grafana/tessera.json"))
        .expect("deploy/grafana/tessera.json");
    serde_json::from_str(&text).expect("dashboard JSON")
}

#[test]
fn dashboard_queries_only_exported_metrics() {
    let mut exprs = Vec::new();
    queries(&dashboard(), &mut exprs);
    assert!(exprs.len() >= 20, "dashboard queries: {}", exprs.len());
    let used: BTreeSet<String> = exprs.iter().flat_map(|e| metric_names(e)).collect();
    let problems: Vec<String> = used.iter().filter_map(|s| check(s)).collect();
    assert!(problems.is_empty(), "dashboard: {problems:#?}");
    // The panels the issue asks for have their metric.
    for needed in [
        "tessera_time_to_first_token_seconds_bucket",
        "tessera_inter_token_latency_seconds_bucket",
        "tessera_request_duration_seconds_bucket",
        "tessera_request_generated_tokens_sum",
        "tessera_queue_requests",
        "tessera_batch_size_requests_bucket",
        "tessera_kv_blocks_used",
        "tessera_prefix_cache_hit_tokens_total",
        "tessera_request_failure_total",
    ] {
        assert!(used.contains(needed), "dashboard does not chart {needed}");
    }
}

#[test]
fn dashboard_datasource_is_a_variable() {
    let d = dashboard();
    let vars = d["templating"]["list"].as_array().expect("templating");
    let var = vars
        .iter()
        .find(|v| v["type"] == "datasource" && v["query"] == "prometheus")
        .expect("a Prometheus datasource variable");
    let name = var["name"].as_str().expect("variable name");
    let wanted = format!("${{{name}}}");
    let mut uses = 0;
    fn walk(v: &Value, wanted: &str, uses: &mut usize) {
        match v {
            Value::Object(map) => {
                if let Some(ds) = map.get("datasource") {
                    assert_eq!(ds["uid"], wanted, "datasource {ds}");
                    *uses += 1;
                }
                map.values().for_each(|v| walk(v, wanted, uses));
            }
            Value::Array(items) => items.iter().for_each(|v| walk(v, wanted, uses)),
            _ => {}
        }
    }
    walk(&d["panels"], &wanted, &mut uses);
    assert!(uses > 20, "panels and targets use the variable");
}

#[test]
fn helm_chart_and_readme_queries_use_exported_metrics() {
    let mut problems = Vec::new();
    for file in ["deploy/helm/tessera/values.yaml", "deploy/README.md"] {
        let text = std::fs::read_to_string(root().join(file)).expect(file);
        // The README's table names metrics, not series: check only its PromQL examples.
        let text = match file.ends_with(".md") {
            true => text
                .split("```promql")
                .skip(1)
                .filter_map(|b| b.split("```").next())
                .collect::<Vec<_>>()
                .join("\n"),
            false => text,
        };
        let names = metric_names(&text);
        assert!(!names.is_empty(), "{file} names no metric");
        problems.extend(
            names
                .iter()
                .filter_map(|s| check(s))
                .map(|p| format!("{file}: {p}")),
        );
    }
    assert!(problems.is_empty(), "{problems:#?}");
}

#[test]
fn name_extraction() {
    assert_eq!(
        metric_names("sum(rate(tessera_a_total[5m])) / x_tessera_b + tessera_c_bucket{le=\"1\"}"),
        ["tessera_a_total", "tessera_c_bucket"]
    );
    assert_eq!(check("tessera_requests_total"), None);
    assert!(check("tessera_requests_total_sum").is_some());
    assert!(check("tessera_time_to_first_token_seconds").is_some());
    assert_eq!(check("tessera_time_to_first_token_seconds_count"), None);
}
