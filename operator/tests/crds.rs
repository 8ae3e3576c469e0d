//! The CRDs checked in under `crds/` are exactly what the Rust types generate.

use std::path::Path;

#[test]
fn checked_in_crds_match_the_types() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../crds");
    let mut expected = basalt_operator::crd::crd_files().unwrap();
    expected.sort();
    let mut found: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".yaml"))
        .collect();
    found.sort();
    let names: Vec<String> = expected.iter().map(|(n, _)| n.clone()).collect();
    assert_eq!(
        found, names,
        "crds/ holds other files than the types generate"
    );
    for (name, yaml) in expected {
        let on_disk = std::fs::read_to_string(dir.join(&name)).unwrap();
        assert!(
            on_disk == yaml,
            "crds/{name} is out of date: run `cargo run --release -p basalt-operator -- crd --out crds`"
        );
    }
}

/// No enum of a schema lists `null`: schemars does so for an optional enum, and an API server
/// then refuses the whole CRD (1.20 says "per-version schemas may not all be set to identical
/// values"), which the OpenAPI validation of e2e/check-manifests does not notice.
#[test]
fn no_enum_lists_null() {
    fn walk(v: &serde_json::Value, path: &str, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(m) => {
                if let Some(serde_json::Value::Array(values)) = m.get("enum")
                    && values.iter().any(|x| x.is_null())
                {
                    out.push(path.to_string());
                }
                for (k, x) in m {
                    walk(x, &format!("{path}.{k}"), out);
                }
            }
            serde_json::Value::Array(a) => {
                for (i, x) in a.iter().enumerate() {
                    walk(x, &format!("{path}[{i}]"), out);
                }
            }
            _ => {}
        }
    }
    let mut found = vec![];
    for (name, yaml) in basalt_operator::crd::crd_files().unwrap() {
        let doc: serde_json::Value = serde_norway::from_str(&yaml).unwrap();
        walk(&doc, &name, &mut found);
    }
    assert!(found.is_empty(), "enums listing null: {found:?}");
}
