//! `GET /openapi.json`: the document in `schema/openapi.json`, which describes every route.
//! A test reads the routers' source and fails when a route and the document disagree.

use axum::http::header;
use axum::response::IntoResponse;

pub const DOCUMENT: &str = include_str!("../../schema/openapi.json");

pub async fn document() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/json")], DOCUMENT)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    const METHODS: [&str; 5] = ["get", "post", "put", "delete", "patch"];

    /// (method, path) of every `.route(...)` call in the HTTP sources.
    fn routes_in_source() -> BTreeSet<(String, String)> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/http");
        let mut routes = BTreeSet::new();
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_none_or(|ext| ext != "rs") {
                continue;
            }
            let source = std::fs::read_to_string(&path).unwrap();
            let mut rest = source.as_str();
            while let Some(at) = rest.find(".route(\"") {
                rest = &rest[at + ".route(\"".len()..];
                let end = rest.find('"').unwrap();
                let route = rest[..end].to_string();
                // The call runs to its matching parenthesis (it may span lines).
                let mut depth = 1;
                let mut call_end = 0;
                for (index, c) in rest.char_indices() {
                    match c {
                        '(' => depth += 1,
                        ')' => {
                            depth -= 1;
                            if depth == 0 {
                                call_end = index;
                                break;
                            }
                        }
                        _ => {}
                    }
                }
                let call = &rest[end..call_end];
                for method in METHODS {
                    let needle = format!("{method}(");
                    let mut search = call;
                    while let Some(found) = search.find(&needle) {
                        let before = search[..found].chars().last();
                        if matches!(before, Some('.' | ':' | ' ' | ',' | '\n')) {
                            routes.insert((method.to_string(), route.clone()));
                        }
                        search = &search[found + needle.len()..];
                    }
                }
            }
        }
        routes
    }

    fn routes_in_document() -> BTreeSet<(String, String)> {
        let document: serde_json::Value = serde_json::from_str(DOCUMENT).unwrap();
        let mut routes = BTreeSet::new();
        for (path, operations) in document["paths"].as_object().unwrap() {
            for method in operations.as_object().unwrap().keys() {
                routes.insert((method.clone(), path.clone()));
            }
        }
        routes
    }

    #[test]
    fn every_route_is_described_in_the_openapi_document_and_nothing_else_is() {
        let source = routes_in_source();
        let document = routes_in_document();
        assert!(source.len() > 30, "the route scan found too little: {source:?}");
        let undocumented: Vec<_> = source.difference(&document).collect();
        let unserved: Vec<_> = document.difference(&source).collect();
        assert!(undocumented.is_empty(), "routes missing from schema/openapi.json: {undocumented:?}");
        assert!(unserved.is_empty(), "schema/openapi.json describes routes that do not exist: {unserved:?}");
    }

    #[test]
    fn every_operation_has_a_summary_and_its_path_parameters() {
        let document: serde_json::Value = serde_json::from_str(DOCUMENT).unwrap();
        for (path, operations) in document["paths"].as_object().unwrap() {
            let wanted: BTreeSet<String> = path
                .split('/')
                .filter_map(|part| part.strip_prefix('{')?.strip_suffix('}'))
                .map(str::to_string)
                .collect();
            for (method, operation) in operations.as_object().unwrap() {
                assert!(operation["summary"].as_str().is_some_and(|s| !s.is_empty()), "{method} {path}");
                let declared: BTreeSet<String> = operation["parameters"]
                    .as_array()
                    .map(|parameters| {
                        parameters
                            .iter()
                            .filter(|p| p["in"] == "path")
                            .map(|p| p["name"].as_str().unwrap().to_string())
                            .collect()
                    })
                    .unwrap_or_default();
                assert_eq!(declared, wanted, "{method} {path}");
            }
        }
    }
}
