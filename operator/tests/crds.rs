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
