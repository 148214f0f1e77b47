//! The architecture's dependency invariants (ARCHITECTURE.md, "Invariants, and what enforces them"), checked on
//! the real dependency graph with `cargo tree`: the libraries that hold domain logic link no HTTP
//! stack, async runtime, database, LightGBM, CLI or plotting crate, and the services link no
//! LightGBM. A dependency added where it does not belong fails here, naming the path that brought
//! it in.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

const HTTP: &[&str] = &["axum", "hyper", "reqwest", "tower", "tower-http"];
const RUNTIME: &[&str] = &["tokio", "async-std", "smol"];
const DATABASE: &[&str] = &["rusqlite", "libsqlite3-sys", "postgres", "tokio-postgres"];
/// LightGBM and what builds its C++.
const LIGHTGBM: &[&str] = &["lightgbm3", "lightgbm3-sys", "cmake", "bindgen"];
/// What only a binary needs: argument parsing, progress bars, plots.
const CLI_AND_PLOTS: &[&str] = &["clap", "indicatif", "plotters"];

fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().expect("e2e sits in the workspace").to_owned()
}

/// Every crate `package` links (normal and build dependencies, its own features only), as `cargo
/// tree` resolves them for a build of that package alone.
fn linked_crates(package: &str, default_features: bool) -> BTreeSet<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let mut command = Command::new(cargo);
    command.current_dir(workspace_root()).args([
        "tree",
        "--locked",
        "-p",
        package,
        "-e",
        "normal,build",
        "--prefix",
        "none",
        "--format",
        "{p}",
    ]);
    if !default_features {
        command.arg("--no-default-features");
    }
    let output = command.output().expect("cargo tree runs");
    assert!(output.status.success(), "cargo tree -p {package}: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

/// The forbidden crates `package` links (the failure message names the `cargo tree -i` that shows how).
fn violations(package: &str, default_features: bool, forbidden: &[&[&str]]) -> Vec<String> {
    let linked = linked_crates(package, default_features);
    forbidden
        .iter()
        .flat_map(|set| set.iter())
        .filter(|name| linked.contains(**name))
        .map(|name| name.to_string())
        .collect()
}

fn assert_clean(package: &str, default_features: bool, forbidden: &[&[&str]]) {
    let found = violations(package, default_features, forbidden);
    let flags = if default_features { "" } else { " --no-default-features" };
    assert!(
        found.is_empty(),
        "{package} links {found:?}, which its layer must not (see how: cargo tree -p {package} -e normal,build{flags} -i {})",
        found[0]
    );
}

#[test]
fn the_domain_libraries_link_no_http_runtime_database_lightgbm_cli_or_plots() {
    let all: &[&[&str]] = &[HTTP, RUNTIME, DATABASE, LIGHTGBM, CLI_AND_PLOTS];
    for package in ["domain", "placement", "lifetime-model"] {
        assert_clean(package, true, all);
    }
    // The trace reader and the simulator as libraries: their CLIs (and the simulator's plots) are
    // default features that an embedder turns off.
    for package in ["traces", "simulator"] {
        assert_clean(package, false, all);
    }
    // With their CLIs on they still link no HTTP, runtime or LightGBM.
    assert_clean("simulator", true, &[HTTP, RUNTIME, LIGHTGBM]);
}

/// The Python package is a layer over the libraries: no HTTP stack or async runtime of its own (its
/// HTTP client is plain Python).
#[test]
fn the_python_package_links_no_http_or_runtime() {
    assert_clean("lifetime-alloc-py", true, &[HTTP, RUNTIME]);
}

#[test]
fn the_services_link_no_lightgbm() {
    for package in ["allocator", "inference-server", "control-service", "replay"] {
        assert_clean(package, true, &[LIGHTGBM]);
    }
}

/// The check can fail: it sees what the crates that do link these crates link.
#[test]
fn the_check_sees_forbidden_crates_where_they_are() {
    assert_eq!(violations("lifetime-train", true, &[LIGHTGBM]), ["lightgbm3", "lightgbm3-sys", "cmake", "bindgen"]);
    let allocator = violations("allocator", true, &[HTTP, RUNTIME, DATABASE]);
    for expected in ["axum", "tokio", "rusqlite", "postgres"] {
        assert!(allocator.iter().any(|c| c == expected), "allocator should link {expected}: {allocator:?}");
    }
    assert_eq!(violations("traces", true, &[CLI_AND_PLOTS]), ["clap", "indicatif"]);
}

/// A module's path in its crate (`store::export` for `src/store/export.rs`, `store` for
/// `src/store/mod.rs` or `src/store.rs`, empty for `lib.rs`).
fn module_path(src: &std::path::Path, file: &std::path::Path) -> Vec<String> {
    let relative = file.strip_prefix(src).expect("under src").with_extension("");
    let mut path: Vec<String> = relative.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect();
    if path.last().is_some_and(|last| last == "mod" || (path.len() == 1 && (last == "lib" || last == "main"))) {
        path.pop();
    }
    path
}

/// The paths a module's code names that may lead to another module of its crate: `crate::a::b`,
/// `super::a`, `self::a` (each item of a `{...}` group its own), as (base, segments).
fn named_paths(code: &str) -> Vec<(&str, Vec<String>)> {
    let mut paths = Vec::new();
    for base in ["crate", "super", "self"] {
        for (at, _) in code.match_indices(base) {
            let before = code[..at].chars().next_back();
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                continue;
            }
            let mut rest = &code[at + base.len()..];
            let mut segments = Vec::new();
            while let Some(after) = rest.strip_prefix("::") {
                if let Some(group) = after.strip_prefix('{') {
                    let group = &group[..group.find('}').unwrap_or(group.len())];
                    for item in group.split(',').map(str::trim).filter(|item| !item.is_empty()) {
                        let mut path = segments.clone();
                        path.extend(item.split("::").map(|s| s.trim().to_owned()));
                        paths.push((base, path));
                    }
                    segments.clear();
                    break;
                }
                let name: String = after.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                if name.is_empty() {
                    break;
                }
                rest = &after[name.len()..];
                segments.push(name);
            }
            if !segments.is_empty() {
                paths.push((base, segments));
            }
        }
    }
    paths
}

/// The modules of the crate whose sources are in `src` (binaries left out), each with the modules
/// its non-test code names: through `crate::`, `super::` and `self::` paths (resolved to the
/// deepest module they reach) and through paths that start with one of its own submodules
/// (`sqlite::open`). A module naming one of its ancestors is not an edge: a parent is the
/// namespace its children share, and every child names it.
fn module_graph(src: &std::path::Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    let mut dirs = vec![src.to_owned()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("src is readable") {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() && path.strip_prefix(src).is_ok_and(|p| p != std::path::Path::new("bin")) {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") && !path.ends_with("tests.rs") {
                // A module's unit tests in a file of their own (`x/tests.rs`) import what they test.
                files.push(path);
            }
        }
    }
    let modules: BTreeMap<Vec<String>, String> = files
        .iter()
        .map(|file| (module_path(src, file), code_of(&std::fs::read_to_string(file).expect("a source file"))))
        .collect();
    let name = |path: &[String]| if path.is_empty() { "crate".to_owned() } else { path.join("::") };
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (module, code) in &modules {
        let mut targets: BTreeSet<Vec<String>> = BTreeSet::new();
        for (base, segments) in named_paths(code) {
            let mut at: Vec<String> = match base {
                "crate" => Vec::new(),
                "super" => module[..module.len().saturating_sub(1)].to_vec(),
                _ => module.clone(),
            };
            for segment in segments {
                if segment == "super" {
                    at.pop();
                    continue;
                }
                let mut deeper = at.clone();
                deeper.push(segment);
                if !modules.contains_key(&deeper) {
                    break;
                }
                at = deeper;
            }
            targets.insert(at);
        }
        for (at, _) in code.match_indices("::") {
            let start = code[..at].rfind(|c: char| !(c.is_alphanumeric() || c == '_')).map_or(0, |i| i + 1);
            if start > 0 && code[..start].ends_with(':') {
                continue;
            }
            let mut child = module.clone();
            child.push(code[start..at].to_owned());
            if modules.contains_key(&child) {
                targets.insert(child);
            }
        }
        let uses = graph.entry(name(module)).or_default();
        for target in targets {
            // Itself, or an ancestor: no edge.
            if !module.starts_with(&target) {
                uses.insert(name(&target));
            }
        }
    }
    graph
}

/// A cycle of the graph, if it has one (depth-first search).
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(start) = path.iter().position(|n| n == node) {
            let mut cycle = path[start..].to_vec();
            cycle.push(node.to_owned());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    graph.keys().find_map(|node| visit(node, graph, &mut Vec::new(), &mut done))
}

/// The workspace's crates with sources (`e2e` has tests only), as paths from the root: the
/// top-level ones and the examples.
fn crates_with_sources() -> Vec<String> {
    let root = workspace_root();
    let mut crates = Vec::new();
    for parent in ["", "examples"] {
        for entry in std::fs::read_dir(root.join(parent)).expect("the workspace") {
            let dir = entry.expect("an entry").path();
            if dir.join("Cargo.toml").is_file() && dir.join("src").is_dir() {
                crates.push(dir.strip_prefix(&root).expect("under the root").display().to_string());
            }
        }
    }
    crates.sort();
    crates
}

#[test]
fn no_import_circles_between_the_modules_of_any_crate() {
    let crates = crates_with_sources();
    assert!(crates.len() >= 12, "the crates were found: {crates:?}");
    for crate_dir in crates {
        let graph = module_graph(&workspace_root().join(&crate_dir).join("src"));
        // An example may be one module; every crate of the system has several.
        let least = if crate_dir.starts_with("examples/") { 1 } else { 3 };
        assert!(graph.len() >= least, "{crate_dir}: modules not found");
        if let Some(cycle) = find_cycle(&graph) {
            panic!("{crate_dir}: an import circle between modules: {}", cycle.join(" -> "));
        }
    }
    let store = module_graph(&workspace_root().join("allocator/src"));
    assert!(store["store"].contains("store::sqlite"), "a parent naming a child is an edge: {:?}", store["store"]);
}

/// The check on a crate of its own with the circle the allocator's store had: the export module
/// dispatching to the backends, which read its types.
#[test]
fn the_circle_check_finds_a_circle_between_sibling_modules() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let src = dir.path().join("src");
    std::fs::create_dir_all(src.join("store")).expect("src/store");
    let files = [
        ("lib.rs", "pub mod store;\n"),
        ("store/mod.rs", "pub mod export;\npub mod sqlite;\npub struct StoreError;\n"),
        ("store/export.rs", "use super::StoreError;\npub struct Sink;\npub fn export() { super::sqlite::export() }\n"),
        ("store/sqlite.rs", "use super::{export::Sink, StoreError};\npub fn export() {}\n"),
    ];
    for (file, text) in files {
        std::fs::write(src.join(file), text).expect("written");
    }
    let graph = module_graph(&src);
    assert_eq!(
        find_cycle(&graph),
        Some(["store::export", "store::sqlite", "store::export"].map(String::from).to_vec())
    );
    // The dispatch moved to the parent, as in the allocator: no circle.
    std::fs::write(src.join("store/export.rs"), "use super::StoreError;\npub struct Sink;\n").expect("written");
    std::fs::write(
        src.join("store/mod.rs"),
        "pub mod export;\npub mod sqlite;\npub struct StoreError;\npub fn export() { sqlite::export() }\n",
    )
    .expect("written");
    assert_eq!(find_cycle(&module_graph(&src)), None);
}

#[test]
fn the_circle_check_finds_a_circle() {
    let graph: BTreeMap<String, BTreeSet<String>> = [("a", "b"), ("b", "c"), ("c", "a"), ("d", "a")]
        .into_iter()
        .map(|(from, to)| (from.to_owned(), BTreeSet::from([to.to_owned()])))
        .collect();
    assert_eq!(find_cycle(&graph), Some(["a", "b", "c", "a"].map(String::from).to_vec()));
    let acyclic: BTreeMap<String, BTreeSet<String>> =
        [("a", "b"), ("b", "c")].into_iter().map(|(f, t)| (f.to_owned(), BTreeSet::from([t.to_owned()]))).collect();
    assert_eq!(find_cycle(&acyclic), None);
}

/// The `.rs` files under `dir` (build output left out), recursively.
fn rust_files(dir: &std::path::Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut dirs = vec![dir.to_owned()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("a readable directory") {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() && !path.ends_with("target") {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    files
}

/// The `#[path = ...]` attributes in `code`, as `line: attribute`.
fn path_includes(code: &str) -> Vec<String> {
    // Spelled apart so that this file does not hold the attribute it looks for.
    let attribute = concat!("#", "[path");
    code.lines()
        .enumerate()
        .filter(|(_, line)| line.trim_start().starts_with(attribute))
        .map(|(at, line)| format!("{}: {}", at + 1, line.trim()))
        .collect()
}

/// Tests and benches share helpers through the `test-support` crate (or a crate's own
/// `tests/support` module), never by including another file by path: an included file compiles
/// in every crate that includes it, with whatever dependencies each one happens to have.
#[test]
fn no_source_file_is_included_by_path() {
    let mut found = Vec::new();
    for crate_dir in std::fs::read_dir(workspace_root()).expect("the workspace").map(|e| e.expect("an entry").path()) {
        if !crate_dir.join("Cargo.toml").is_file() {
            continue;
        }
        for file in rust_files(&crate_dir) {
            let text = std::fs::read_to_string(&file).expect("a source file");
            let relative = file.strip_prefix(workspace_root()).unwrap_or(&file).display().to_string();
            found.extend(path_includes(&text).into_iter().map(|include| format!("{relative}:{include}")));
        }
    }
    assert_eq!(found, Vec::<String>::new(), "files included by path; use the test-support crate");
    let attribute = concat!("#", "[path = \"../../allocator/tests/support/listening.rs\"]");
    assert_eq!(path_includes(&format!("//! doc\n\n{attribute}\nmod listening;\n")), [format!("3: {attribute}")]);
}

/// A source file's code: what comes before its test module, comment lines dropped.
fn code_of(text: &str) -> String {
    let code = text.split("#[cfg(test)]\nmod ").next().unwrap_or_default();
    code.lines().filter(|line| !line.trim_start().starts_with("//")).collect::<Vec<_>>().join("\n")
}

/// The types a file implements `trait` for (`impl TRAIT for TYPE`).
fn implementors(code: &str, r#trait: &str) -> Vec<String> {
    let marker = format!("impl {trait} for ");
    code.match_indices(&marker)
        .map(|(at, _)| {
            code[at + marker.len()..]
                .split(|c: char| !c.is_alphanumeric() && c != '_')
                .next()
                .unwrap_or_default()
                .to_owned()
        })
        .collect()
}

/// What is wrong with the rules' layout under `rules` (a copy of `placement/src/rules/`), given
/// the framework files' code: the framework module (`mod.rs`) holds a rule, a rule file holds
/// other than one rule with its registration, or a framework file names a registered rule.
fn rule_layout_problems(rules: &std::path::Path, framework: &[(String, String)]) -> Vec<String> {
    let mut problems = Vec::new();
    let mut names = Vec::new();
    let mut files: Vec<PathBuf> =
        std::fs::read_dir(rules).expect("rules/").map(|entry| entry.expect("an entry").path()).collect();
    files.sort();
    for path in files {
        let file = path.file_name().unwrap_or_default().to_string_lossy().into_owned();
        let code = code_of(&std::fs::read_to_string(&path).expect("a rule file"));
        let registered = implementors(&code, "RegisteredRule");
        let rules: Vec<String> = [implementors(&code, "ValidatorRule"), implementors(&code, "PreferenceRule")].concat();
        if file == "mod.rs" {
            if !registered.is_empty() || !rules.is_empty() {
                problems.push(format!("rules/mod.rs holds rules: {:?}", [registered, rules].concat()));
            }
            continue;
        }
        if registered.len() != 1 || rules != registered {
            problems.push(format!("rules/{file}: registered {registered:?}, rules {rules:?} (one of each, the same)"));
        }
        names.extend(
            code.split("const NAME: &'static str = \"").skip(1).filter_map(|s| s.split('"').next()).map(str::to_owned),
        );
    }
    for (file, code) in framework {
        for name in &names {
            if code.contains(&format!("\"{name}\"")) {
                problems.push(format!("{file} names the rule `{name}`"));
            }
        }
    }
    problems
}

/// The framework files of `placement`: everything but the rules and the registry.
fn placement_framework() -> Vec<(String, String)> {
    let src = workspace_root().join("placement/src");
    let mut files = Vec::new();
    for dir in [src.clone(), src.join("allocator"), src.join("select"), src.join("consolidation")] {
        for entry in std::fs::read_dir(&dir).expect("placement's sources") {
            let path = entry.expect("an entry").path();
            let name = path.strip_prefix(&src).expect("under src").display().to_string();
            if path.extension().is_some_and(|e| e == "rs") && name != "registry.rs" && name != "lava.rs" {
                files.push((name, code_of(&std::fs::read_to_string(&path).expect("a source file"))));
            }
        }
    }
    files
}

#[test]
fn each_built_in_rule_is_one_file_and_the_framework_names_none() {
    let rules = workspace_root().join("placement/src/rules");
    let framework = placement_framework();
    assert!(framework.iter().any(|(name, _)| name == "policy.rs"), "the framework files were read");
    assert_eq!(rule_layout_problems(&rules, &framework), Vec::<String>::new());
}

#[test]
fn the_rule_layout_check_finds_a_rule_in_the_framework() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let copy = dir.path().join("rules");
    std::fs::create_dir(&copy).expect("rules/");
    for entry in std::fs::read_dir(workspace_root().join("placement/src/rules")).expect("rules/") {
        let path = entry.expect("an entry").path();
        std::fs::copy(&path, copy.join(path.file_name().expect("a name"))).expect("copied");
    }
    // The worked example's rule moved into the framework module, and a framework file naming it.
    let example = std::fs::read_to_string(copy.join("prefer_hardware.rs")).expect("the example rule");
    let mut framework = std::fs::read_to_string(copy.join("mod.rs")).expect("rules/mod.rs");
    framework.insert_str(0, &code_of(&example));
    std::fs::write(copy.join("mod.rs"), framework).expect("written");
    std::fs::write(copy.join("prefer_hardware.rs"), "//! moved\n").expect("written");
    let policy = ("policy.rs".to_owned(), "let first = \"prefer-non-empty\";".to_owned());
    let problems = rule_layout_problems(&copy, &[policy]);
    assert_eq!(problems.len(), 3, "{problems:#?}");
    assert!(problems[0].starts_with("rules/mod.rs holds rules"), "{problems:#?}");
    assert!(problems[1].starts_with("rules/prefer_hardware.rs: registered []"), "{problems:#?}");
    assert_eq!(problems[2], "policy.rs names the rule `prefer-non-empty`");
}

/// What builds a registry of policies, or a placement allocator over the standard one, instead of
/// taking the program's.
const SELF_BUILT: &[&str] = &["Registry::standard(", "Registry::empty(", "Allocator::new("];

/// The places in `src` (a crate's sources) where library code builds a registry or a placement
/// allocator itself ([`SELF_BUILT`]), as `file: what`. A program's `main` may: the files under
/// `src/bin` and those `mains` names. Test modules are not library code.
fn self_built(src: &Path, mains: &[&str]) -> Vec<String> {
    let mut found = Vec::new();
    let mut dirs = vec![src.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("a source directory") {
            let path = entry.expect("an entry").path();
            let name = path.strip_prefix(src).expect("under src").display().to_string();
            if path.is_dir() {
                if name != "bin" && name != "tests" {
                    dirs.push(path);
                }
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs")
                || path.ends_with("tests.rs")
                || mains.contains(&name.as_str())
            {
                continue;
            }
            let code = code_of(&std::fs::read_to_string(&path).expect("a source file"));
            for what in SELF_BUILT {
                // `DurableAllocator::new(` is not `Allocator::new(`.
                let named = code
                    .match_indices(what)
                    .any(|(at, _)| !code[..at].ends_with(|c: char| c.is_alphanumeric() || c == '_'));
                if named {
                    found.push(format!("{name}: {what}"));
                }
            }
        }
    }
    found.sort();
    found
}

#[test]
fn outside_placement_only_a_programs_main_builds_the_registry() {
    let crates = crates_with_sources();
    assert!(crates.iter().any(|c| c.starts_with("examples/")), "the examples were found: {crates:?}");
    for crate_dir in crates.iter().filter(|c| *c != "placement") {
        // The Python module's root is its `main`.
        let mains: &[&str] = if crate_dir == "python" { &["lib.rs"] } else { &["main.rs"] };
        let found = self_built(&workspace_root().join(crate_dir).join("src"), mains);
        assert_eq!(found, Vec::<String>::new(), "{crate_dir}: library code builds its own registry or allocator");
    }
    // The programs do build theirs.
    let mains = ["allocator/src/bin/allocator.rs", "simulator/src/bin/simulate.rs", "python/src/lib.rs"];
    for main in mains {
        let code = std::fs::read_to_string(workspace_root().join(main)).expect("a program's main");
        assert!(code.contains("Registry::standard()"), "{main} builds the registry");
    }
}

#[test]
fn the_composition_root_check_finds_a_library_that_builds_its_own() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let src = dir.path().join("src");
    std::fs::create_dir_all(src.join("bin")).expect("src/bin");
    let files = [
        ("lib.rs", "pub mod engine;\n"),
        ("engine.rs", "pub fn run() { let a = placement::Allocator::new(&spec, &config); }\n"),
        ("bin/main.rs", "fn main() { let registry = placement::Registry::standard(); }\n"),
        (
            "durable.rs",
            "fn open() { DurableAllocator::new(); }\n#[cfg(test)]\nmod tests { fn t() { Registry::standard(); } }\n",
        ),
    ];
    for (file, text) in files {
        std::fs::write(src.join(file), text).expect("written");
    }
    assert_eq!(self_built(&src, &[]), ["engine.rs: Allocator::new("]);
}

/// The files a patch touches, in order (`diff --git a/PATH b/PATH` lines).
fn patched_files(patch: &str) -> Vec<String> {
    patch
        .lines()
        .filter_map(|line| line.strip_prefix("diff --git a/"))
        .filter_map(|rest| rest.split(" b/").next())
        .map(str::to_owned)
        .collect()
}

/// `tests/fixtures/typed-request-field.patch` adds a typed request fact (`accelerator`) and a rule
/// that reads it, with its test (`placement/tests/typed_request_field.rs`): made on this tree,
/// built and tested, then kept as a patch. It must touch three source files beside the rule's own
/// test file, and still apply to the tree as it is (regenerate it when a change moves its context:
/// apply it with `git apply --3way`, run `cargo test --release -p placement --test
/// typed_request_field`, and `git diff` the four files into the fixture).
#[test]
fn a_typed_request_fact_is_three_files_and_the_rule() {
    let root = workspace_root();
    let patch = root.join("e2e/tests/fixtures/typed-request-field.patch");
    let text = std::fs::read_to_string(&patch).expect("the fixture patch");
    let files = patched_files(&text);
    let (tests, sources): (Vec<&String>, Vec<&String>) = files.iter().partition(|file| file.contains("/tests/"));
    assert_eq!(sources, ["domain/src/request.rs", "domain/src/validate.rs", "placement/src/rules/mod.rs"]);
    assert_eq!(tests, ["placement/tests/typed_request_field.rs"], "the rule and its test");
    let check = Command::new("git")
        .args(["apply", "--check", "--verbose"])
        .arg(&patch)
        .current_dir(&root)
        .output()
        .expect("git runs");
    assert!(check.status.success(), "the patch no longer applies:\n{}", String::from_utf8_lossy(&check.stderr));
}

#[test]
fn the_patch_count_reads_the_files_of_a_diff() {
    let patch = "diff --git a/x/src/a.rs b/x/src/a.rs\n--- a/x/src/a.rs\n+++ b/x/src/a.rs\n@@ -1 +1 @@\n-a\n+b\n\
                 diff --git a/x/tests/t.rs b/x/tests/t.rs\nnew file mode 100644\n";
    assert_eq!(patched_files(patch), ["x/src/a.rs", "x/tests/t.rs"]);
}

/// The longest a library or program source file may be: past it a file holds several subjects.
const MOST_LINES: usize = 900;

/// The files under `src` that are too long or open without a `//!` line saying their subject
/// (test modules kept in their own `tests.rs` are tests, not sources).
fn source_file_problems(src: &Path) -> Vec<String> {
    let mut problems = Vec::new();
    for file in rust_files(src) {
        if file.file_name().is_some_and(|name| name == "tests.rs") {
            continue;
        }
        let text = std::fs::read_to_string(&file).expect("a source file");
        let relative = file.strip_prefix(workspace_root()).unwrap_or(&file).display().to_string();
        let lines = text.lines().count();
        if lines > MOST_LINES {
            problems.push(format!("{relative}: {lines} lines (at most {MOST_LINES})"));
        }
        if !text.trim_start().starts_with("//!") {
            problems.push(format!("{relative}: no `//!` line saying its subject"));
        }
    }
    problems.sort();
    problems
}

#[test]
fn every_source_file_is_short_and_says_its_subject() {
    let mut problems = Vec::new();
    for crate_dir in crates_with_sources() {
        problems.extend(source_file_problems(&workspace_root().join(crate_dir).join("src")));
    }
    assert_eq!(problems, Vec::<String>::new());
}

#[test]
fn the_source_file_check_finds_a_long_file_and_one_without_a_subject() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let src = dir.path().join("src");
    std::fs::create_dir_all(src.join("big")).expect("src");
    std::fs::write(src.join("lib.rs"), "//! A library.\nmod big;\n").expect("lib.rs");
    std::fs::write(src.join("big.rs"), format!("//! Many lines.\n{}", "fn f() {}\n".repeat(MOST_LINES)))
        .expect("big.rs");
    std::fs::write(src.join("big/quiet.rs"), "fn g() {}\n").expect("quiet.rs");
    std::fs::write(src.join("big/tests.rs"), "fn t() {}\n".repeat(2 * MOST_LINES)).expect("tests.rs");
    let problems = source_file_problems(&src);
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(problems[0].ends_with(&format!("big.rs: {} lines (at most {MOST_LINES})", MOST_LINES + 1)), "{problems:?}");
    assert!(problems[1].ends_with("big/quiet.rs: no `//!` line saying its subject"), "{problems:?}");
}
