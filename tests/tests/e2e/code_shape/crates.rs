//! Crate layering: every workspace crate sits in one of [`LAYERS`] and depends (normal and
//! build dependencies) only on crates of the layers below its own, and its tests
//! (dev-dependencies) on none above it; [`EXCLUDED`] names crates that must stay out of a
//! crate's normal dependency tree, however deep. The dependencies are the members'
//! `Cargo.toml`s as `cargo metadata --no-deps` reads them (`workspace = true` resolved).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::Path;
use std::process::Command;

/// The workspace's crates, bottom layer first.
const LAYERS: &[&[&str]] = &[
    &[
        "tessera-blocks",
        "tessera-params",
        "tessera-telemetry",
        "tessera-text",
    ],
    &["tessera-kernels", "tessera-model-files", "tessera-proto"],
    &["tessera-shard", "tessera-router"],
    &["tessera-launcher", "tessera-bench", "tessera-e2e"],
];

/// Crates that must not be in a crate's normal dependency tree, as (crate, excluded crates).
const EXCLUDED: &[(&str, &[&str])] = &[
    // The router tokenizes and schedules; the model runs in the shards.
    (
        "tessera-router",
        &["tessera-kernels", "tessera-model-files", "tessera-shard"],
    ),
];

/// How a crate depends on another.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Normal,
    Build,
    Dev,
}

/// Each workspace crate's dependencies on workspace crates.
type Manifests = BTreeMap<String, Vec<(String, Kind)>>;

/// One broken layering rule.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Violation {
    /// A crate in no layer.
    Unlayered { krate: String },
    /// A [`LAYERS`] name that is no workspace crate.
    UnknownCrate { name: String },
    /// A dependency that does not point below (dev-dependencies: not above) its crate.
    UpArrow {
        from: String,
        to: String,
        kind: Kind,
    },
    /// An excluded crate in a crate's normal dependency tree, with the path to it.
    Excluded { path: Vec<String> },
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::Unlayered { krate } => write!(f, "{krate} is in no layer of LAYERS"),
            Violation::UnknownCrate { name } => {
                write!(f, "LAYERS names {name}, which is no workspace crate")
            }
            Violation::UpArrow { from, to, kind } => {
                let (kind, place) = match kind {
                    Kind::Normal => ("normal", "below"),
                    Kind::Build => ("build", "below"),
                    Kind::Dev => ("dev", "beside or below"),
                };
                write!(
                    f,
                    "{from} has a {kind} dependency on {to}, which is not in a layer {place} it"
                )
            }
            Violation::Excluded { path } => write!(
                f,
                "{}'s normal dependency tree contains {}: {}",
                path[0],
                path[path.len() - 1],
                path.join(" → ")
            ),
        }
    }
}

/// Each crate's layer (its index in `layers`).
fn layer_of<'a>(layers: &[&[&'a str]]) -> BTreeMap<&'a str, usize> {
    let mut out = BTreeMap::new();
    for (i, layer) in layers.iter().enumerate() {
        for &name in *layer {
            out.insert(name, i);
        }
    }
    out
}

/// The shortest path of normal dependencies from `from` to `to`, if `to` is in its tree.
fn normal_path(manifests: &Manifests, from: &str, to: &str) -> Option<Vec<String>> {
    let mut came_from: BTreeMap<&str, &str> = BTreeMap::new();
    let mut todo = std::collections::VecDeque::from([from]);
    let mut seen = BTreeSet::from([from]);
    while let Some(at) = todo.pop_front() {
        if at == to {
            let mut path = vec![to.to_owned()];
            let mut step = to;
            while let Some(&prev) = came_from.get(step) {
                path.push(prev.to_owned());
                step = prev;
            }
            path.reverse();
            return Some(path);
        }
        let deps = manifests.get(at).into_iter().flatten();
        for (dep, _) in deps.filter(|(_, kind)| *kind == Kind::Normal) {
            if seen.insert(dep) {
                came_from.insert(dep, at);
                todo.push_back(dep);
            }
        }
    }
    None
}

/// The layering rules `manifests` break.
fn check(
    manifests: &Manifests,
    layers: &[&[&str]],
    excluded: &[(&str, &[&str])],
) -> Vec<Violation> {
    let layer = layer_of(layers);
    let mut out: Vec<Violation> = layer
        .keys()
        .filter(|name| !manifests.contains_key(**name))
        .map(|name| Violation::UnknownCrate {
            name: (*name).to_owned(),
        })
        .collect();
    for (krate, deps) in manifests {
        let Some(&own) = layer.get(krate.as_str()) else {
            out.push(Violation::Unlayered {
                krate: krate.clone(),
            });
            continue;
        };
        for (dep, kind) in deps {
            let allowed = match kind {
                Kind::Normal | Kind::Build => own,
                Kind::Dev => own + 1,
            };
            if layer.get(dep.as_str()).is_some_and(|&l| l >= allowed) {
                out.push(Violation::UpArrow {
                    from: krate.clone(),
                    to: dep.clone(),
                    kind: *kind,
                });
            }
        }
    }
    for &(krate, names) in excluded {
        for name in names {
            if let Some(path) = normal_path(manifests, krate, name) {
                out.push(Violation::Excluded { path });
            }
        }
    }
    out.sort();
    out
}

/// The workspace's crates and their dependencies on each other, from `cargo metadata`.
fn workspace_manifests(root: &Path) -> Manifests {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let output = Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(root)
        .output()
        .expect("cargo metadata runs");
    assert!(
        output.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let metadata: serde_json::Value =
        serde_json::from_slice(&output.stdout).expect("cargo metadata prints JSON");
    let packages = metadata["packages"].as_array().expect("a package list");
    let names: BTreeSet<&str> = packages.iter().filter_map(|p| p["name"].as_str()).collect();
    packages
        .iter()
        .map(|p| {
            let deps = p["dependencies"].as_array().into_iter().flatten();
            let local = deps.filter_map(|d| {
                let name = d["name"].as_str().filter(|n| names.contains(n))?;
                let kind = match d["kind"].as_str() {
                    Some("dev") => Kind::Dev,
                    Some("build") => Kind::Build,
                    _ => Kind::Normal,
                };
                Some((name.to_owned(), kind))
            });
            let name = p["name"].as_str().expect("a package name").to_owned();
            (name, local.collect())
        })
        .collect()
}

#[test]
fn crates_depend_only_downwards() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate lives in the workspace");
    let manifests = workspace_manifests(root);
    let arrows = manifests.values().flatten().count();
    assert!(
        manifests.len() >= LAYERS.len() && arrows > manifests.len(),
        "only {} workspace crates and {arrows} dependencies between them found",
        manifests.len()
    );
    let violations = check(&manifests, LAYERS, EXCLUDED);
    let list: Vec<String> = violations.iter().map(ToString::to_string).collect();
    assert!(violations.is_empty(), "{}", list.join("\n"));
}

fn manifests(crates: &[(&str, &[(&str, Kind)])]) -> Manifests {
    crates
        .iter()
        .map(|(name, deps)| {
            let deps = deps.iter().map(|(d, k)| ((*d).to_owned(), *k)).collect();
            ((*name).to_owned(), deps)
        })
        .collect()
}

const MADE_UP_LAYERS: &[&[&str]] = &[&["base"], &["wire"], &["engine", "front"], &["app"]];

#[test]
fn arrows_down_and_tests_beside_pass() {
    let crates = manifests(&[
        ("base", &[]),
        ("wire", &[("base", Kind::Normal)]),
        ("engine", &[("base", Kind::Build), ("front", Kind::Dev)]),
        ("front", &[("wire", Kind::Normal)]),
        ("app", &[("engine", Kind::Normal), ("front", Kind::Normal)]),
    ]);
    assert_eq!(
        check(&crates, MADE_UP_LAYERS, &[("front", &["engine"])]),
        []
    );
}

#[test]
fn arrows_up_or_sideways_and_unplaced_crates_are_found() {
    let crates = manifests(&[
        ("base", &[("wire", Kind::Normal)]),
        ("wire", &[("engine", Kind::Dev)]),
        ("engine", &[]),
        ("front", &[]),
        ("loose", &[]),
    ]);
    let up = |from: &str, to: &str, kind| Violation::UpArrow {
        from: from.into(),
        to: to.into(),
        kind,
    };
    assert_eq!(
        check(&crates, MADE_UP_LAYERS, &[]),
        [
            Violation::Unlayered {
                krate: "loose".into()
            },
            Violation::UnknownCrate { name: "app".into() },
            up("base", "wire", Kind::Normal),
            up("wire", "engine", Kind::Dev),
        ]
    );
}

#[test]
fn an_excluded_crate_is_found_deep_in_the_tree_but_not_through_tests() {
    let crates = manifests(&[
        ("base", &[]),
        ("wire", &[("base", Kind::Normal)]),
        ("engine", &[("wire", Kind::Normal)]),
        ("front", &[("wire", Kind::Normal), ("engine", Kind::Dev)]),
        ("app", &[("front", Kind::Normal)]),
    ]);
    let violations = check(&crates, MADE_UP_LAYERS, &[("app", &["base", "engine"])]);
    assert_eq!(
        violations,
        [Violation::Excluded {
            path: vec!["app".into(), "front".into(), "wire".into(), "base".into()]
        }]
    );
    assert_eq!(
        violations[0].to_string(),
        "app's normal dependency tree contains base: app → front → wire → base"
    );
}
