//! `scripts/compose-smoke.sh` never touches an operator's stack (issue 44): it runs as a Compose
//! project of its own, on host ports of its own, and its cleanup (`down -v`) removes its own
//! containers and volumes only.
//!
//! No Docker engine is needed: the script runs against a stand-in `docker` (and `curl`) put first on
//! `PATH`, which keeps the engine's state in files (each project's containers, the volumes named
//! `<project>_<volume>` as Compose names them) and logs every call, resolving the project of a
//! `docker compose` call as Compose does (`-p`, else `COMPOSE_PROJECT_NAME`, else the first file's
//! `name:`). Its `up` creates the project's containers and volumes; the first `curl` fails, so the
//! script stops at its first check of the stack and runs its cleanup, before the canary's training.
//! The operator's project `lifetime-aware-allocation` is seeded with containers and volumes
//! (`..._allocator-state`, `..._service-token`) and must come out as it went in.

use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The operator's project: docker-compose.yml's `name:`.
const STACK: &str = "lifetime-aware-allocation";
/// The smoke's own project by default.
const SMOKE: &str = "lifetime-aware-allocation-smoke";
/// The host ports of the operator's stack (docker-compose.yml and docker-compose.agents.yml).
const STACK_PORTS: [u16; 6] = [8080, 8081, 8082, 8083, 9090, 3000];

const FAKE_DOCKER: &str = r#"#!/usr/bin/env bash
# A stand-in for `docker` (e2e/tests/it/compose_smoke.rs): the engine's state in $FAKE_DOCKER_STATE,
# every call logged to $FAKE_DOCKER_STATE/log.
set -euo pipefail
state=$FAKE_DOCKER_STATE
mkdir -p "$state/containers" "$state/volumes"
log() { echo "$*" >>"$state/log"; }
# The project of a `label=com.docker.compose.project=NAME` filter.
filtered() { local a; for a in "$@"; do case $a in label=com.docker.compose.project=*) echo "${a#*=*=}";; esac; done; }
case "${1:-}" in
    info) log "info"; exit 0 ;;
    ps)
        project=$(filtered "$@")
        log "ps project=$project"
        [ -n "$project" ] || { log "UNEXPECTED ps without a project filter"; exit 1; }
        for c in "$state/containers/$project"/*; do if [ -e "$c" ]; then echo "$project-${c##*/}"; fi; done
        exit 0 ;;
    volume)
        project=$(filtered "$@")
        log "volume $2 project=$project"
        if [ "$2" != ls ] || [ -z "$project" ]; then log "UNEXPECTED docker $*"; exit 1; fi
        for v in "$state/volumes/${project}_"*; do if [ -e "$v" ]; then echo "${v##*/}"; fi; done
        exit 0 ;;
    compose) shift ;;
    *) log "UNEXPECTED docker $*"; exit 1 ;;
esac
files=() project='' via=
while [ $# -gt 0 ]; do
    case $1 in
        -p | --project-name) project=$2 via=-p; shift 2 ;;
        -f | --file) files+=("$2"); shift 2 ;;
        -*) log "UNEXPECTED compose option $1"; exit 1 ;;
        *) break ;;
    esac
done
command=${1:-}
shift || true
if [ "$command" = version ]; then log "compose version"; echo "Docker Compose version v2 (stand-in)"; exit 0; fi
if [ -z "$project" ] && [ -n "${COMPOSE_PROJECT_NAME:-}" ]; then project=$COMPOSE_PROJECT_NAME via=env; fi
if [ -z "$project" ]; then
    project=$(sed -n 's/^name: *//p' "${files[0]:-docker-compose.yml}") via=name
fi
ports="${LAVA_CONTROL_PORT:-},${LAVA_INFERENCE_PORT:-},${LAVA_ALLOCATOR_PORT:-},${LAVA_ALLOCATOR_2_PORT:-},${LAVA_PROMETHEUS_PORT:-},${LAVA_GRAFANA_PORT:-}"
log "compose project=$project via=$via command=$command ports=$ports args=$*"
case $command in
    up)
        mkdir -p "$state/containers/$project"
        for s in service-token inference-server allocator control-service; do echo up >"$state/containers/$project/$s"; done
        for v in allocator-state service-token; do [ -e "$state/volumes/${project}_$v" ] || echo new >"$state/volumes/${project}_$v"; done ;;
    config) echo "{\"name\": \"$project\", \"services\": {}}" ;;
    ps)
        case "$*" in
            *Health*) ;;
            *) for c in "$state/containers/$project"/*; do if [ -e "$c" ]; then echo "${c##*/} Exited (0)"; fi; done ;;
        esac ;;
    run) echo 0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef ;;
    down)
        rm -rf "${state:?}/containers/$project"
        case " $* " in *" -v "*) rm -f "$state/volumes/${project}_"* ;; esac ;;
    logs | stop | start | restart | kill) ;;
    *) log "UNEXPECTED compose command $command"; exit 1 ;;
esac
exit 0
"#;

/// Logs the URLs it is asked for and fails as `curl` does when nothing listens.
const FAKE_CURL: &str = r#"#!/usr/bin/env bash
echo "curl $*" >>"$FAKE_DOCKER_STATE/curl.log"
case " $* " in *" -w "*) printf 000 ;; esac
exit 7
"#;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("e2e has a parent directory").to_path_buf()
}

struct Engine {
    dir: tempfile::TempDir,
}

impl Engine {
    /// A stand-in engine with the operator's stack seeded: `containers` says whether it is up, its
    /// volumes (the allocator's state, the service token) are there either way.
    fn with_operator_stack(containers: bool) -> Engine {
        let engine = Engine { dir: tempfile::tempdir().unwrap() };
        let bin = engine.dir.path().join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        for (name, text) in [("docker", FAKE_DOCKER), ("curl", FAKE_CURL)] {
            let path = bin.join(name);
            std::fs::write(&path, text).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let state = engine.state();
        std::fs::create_dir_all(state.join("volumes")).unwrap();
        for volume in ["allocator-state", "service-token"] {
            std::fs::write(state.join(format!("volumes/{STACK}_{volume}")), format!("the operator's {volume}\n"))
                .unwrap();
        }
        if containers {
            engine.seed_containers(STACK);
        }
        engine
    }

    fn state(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    fn seed_containers(&self, project: &str) {
        let dir = self.state().join("containers").join(project);
        std::fs::create_dir_all(&dir).unwrap();
        for service in ["service-token", "inference-server", "allocator", "control-service"] {
            std::fs::write(dir.join(service), "the operator's\n").unwrap();
        }
    }

    /// A project's containers (`containers/<project>/<service>`) and volumes
    /// (`volumes/<project>_<volume>`), with their contents.
    fn snapshot(&self, project: &str) -> BTreeSet<(String, String)> {
        let mut files = BTreeSet::new();
        let list = |dir: PathBuf| -> Vec<PathBuf> {
            std::fs::read_dir(dir).map(|e| e.map(|e| e.unwrap().path()).collect()).unwrap_or_default()
        };
        let containers = list(self.state().join("containers").join(project));
        let volumes = list(self.state().join("volumes"))
            .into_iter()
            .filter(|v| v.file_name().unwrap().to_str().unwrap().starts_with(&format!("{project}_")));
        for path in containers.into_iter().chain(volumes) {
            let name = path.strip_prefix(self.state()).unwrap().display().to_string();
            files.insert((name, std::fs::read_to_string(&path).unwrap()));
        }
        files
    }

    fn operator(&self) -> BTreeSet<(String, String)> {
        self.snapshot(STACK)
    }

    fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.state().join(name)).unwrap_or_default()
    }

    /// Runs `scripts/compose-smoke.sh args` with the stand-ins first on `PATH` and `env` set.
    fn smoke(&self, args: &[&str], env: &[(&str, &str)]) -> Output {
        let path = format!("{}:{}", self.dir.path().join("bin").display(), std::env::var("PATH").unwrap_or_default());
        let mut command = Command::new("bash");
        command
            .arg(repo_root().join("scripts/compose-smoke.sh"))
            .args(args)
            .env("PATH", path)
            .env("FAKE_DOCKER_STATE", self.state())
            .env("COMPOSE_SMOKE_WORK", self.dir.path().join("work"));
        for variable in [
            "COMPOSE_PROJECT_NAME",
            "COMPOSE_SMOKE_PROJECT",
            "COMPOSE_SMOKE_PORT_OFFSET",
            "KEEP",
            "LAVA_CONTROL_PORT",
            "LAVA_INFERENCE_PORT",
            "LAVA_ALLOCATOR_PORT",
            "LAVA_ALLOCATOR_2_PORT",
            "LAVA_PROMETHEUS_PORT",
            "LAVA_GRAFANA_PORT",
        ] {
            command.env_remove(variable);
        }
        for (variable, value) in env {
            command.env(variable, value);
        }
        command.output().expect("running bash scripts/compose-smoke.sh")
    }
}

fn describe(output: &Output, engine: &Engine) -> String {
    format!(
        "exit {:?}\n--- stdout\n{}\n--- stderr\n{}\n--- docker log\n{}\n--- curl log\n{}",
        output.status.code(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
        engine.log("log"),
        engine.log("curl.log")
    )
}

/// The smoke run beside the operator's stack (up, or down with its volumes kept): it gets past its
/// refusal, starts and removes its own project only, on its own ports, and the operator's
/// containers and volumes come out as they went in.
fn smoke_leaves_the_operator_alone(operator_up: bool, args: &[&str]) {
    let engine = Engine::with_operator_stack(operator_up);
    let before = engine.operator();
    let output = engine.smoke(args, &[]);
    let what = describe(&output, &engine);
    let log = engine.log("log");

    // It ran (the stand-in `curl` stops it at its first check of the stack), not refused.
    assert!(!output.status.success(), "the stand-in curl must stop the smoke: {what}");
    assert!(!String::from_utf8_lossy(&output.stderr).contains("already"), "the smoke refused: {what}");
    let compose: Vec<&str> = log.lines().filter(|l| l.starts_with("compose ") && l != &"compose version").collect();
    let commands = |name: &str| compose.iter().filter(|l| l.contains(&format!(" command={name} "))).count();
    assert_eq!(commands("up"), 1, "one `up`: {what}");
    assert_eq!(commands("down"), 1, "its cleanup's `down -v`: {what}");

    // The operator's project is untouched, the smoke's own is gone (`down -v` ran on it).
    assert_eq!(engine.operator(), before, "the operator's containers or volumes changed: {what}");
    assert!(engine.snapshot(SMOKE).is_empty(), "the smoke left {:?}: {what}", engine.snapshot(SMOKE));

    // Every compose call names the smoke's project with -p; the engine is asked about it only.
    for line in &compose {
        assert!(
            line.starts_with(&format!("compose project={SMOKE} via=-p ")),
            "not the smoke's own project: {line}\n{what}"
        );
    }
    for line in log.lines().filter(|l| l.starts_with("ps ") || l.starts_with("volume ")) {
        assert!(line.ends_with(&format!(" project={SMOKE}")), "asks about another project: {line}\n{what}");
    }
    assert!(!log.contains("UNEXPECTED"), "{what}");

    // Its own host ports, none of the operator's stack's, on every compose call and every curl.
    for line in &compose {
        let ports = line.split(" ports=").nth(1).unwrap().split(' ').next().unwrap();
        let ports: Vec<u16> = ports.split(',').map(|p| p.parse().unwrap_or_else(|_| panic!("{line}"))).collect();
        assert!(ports.iter().all(|p| !STACK_PORTS.contains(p)), "the stack's ports: {line}");
    }
    let curls = engine.log("curl.log");
    assert!(!curls.is_empty(), "{what}");
    for url in curls.split_whitespace().filter(|w| w.contains("127.0.0.1:")) {
        let port: u16 = url.split("127.0.0.1:").nth(1).unwrap().split('/').next().unwrap().parse().unwrap();
        assert!(!STACK_PORTS.contains(&port), "curl to the operator's port: {url}");
    }
}

#[test]
fn the_smoke_runs_beside_an_operators_stack_that_is_up_and_leaves_it_alone() {
    smoke_leaves_the_operator_alone(true, &[]);
}

#[test]
fn the_smoke_leaves_the_volumes_of_an_operators_stack_that_is_down() {
    smoke_leaves_the_operator_alone(false, &[]);
}

#[test]
fn the_two_agent_smoke_leaves_an_operators_stack_alone_too() {
    smoke_leaves_the_operator_alone(true, &["--agents"]);
}

#[test]
fn the_smoke_refuses_the_stacks_own_project_name_and_its_own_leftovers() {
    // COMPOSE_SMOKE_PROJECT set to the operator's project: refused before any compose call.
    let engine = Engine::with_operator_stack(true);
    let before = engine.operator();
    let output = engine.smoke(&[], &[("COMPOSE_SMOKE_PROJECT", STACK)]);
    let what = describe(&output, &engine);
    assert!(!output.status.success(), "{what}");
    assert!(String::from_utf8_lossy(&output.stderr).contains("the stack's own project"), "{what}");
    assert!(engine.log("log").lines().all(|l| l == "compose version" || l == "info"), "{what}");
    assert_eq!(engine.operator(), before, "{what}");

    // The smoke's own project with containers (a KEEP=1 run, say): refused, and left as it is.
    let engine = Engine::with_operator_stack(true);
    engine.seed_containers(SMOKE);
    let before = (engine.operator(), engine.snapshot(SMOKE));
    let output = engine.smoke(&[], &[]);
    let what = describe(&output, &engine);
    assert!(
        String::from_utf8_lossy(&output.stderr).contains(&format!("project {SMOKE} has containers already")),
        "{what}"
    );
    assert!(!engine.log("log").contains(" command="), "no compose call beyond `version`: {what}");
    assert_eq!((engine.operator(), engine.snapshot(SMOKE)), before, "{what}");

    // Another project name, chosen by the operator: used as given.
    let engine = Engine::with_operator_stack(true);
    let output = engine.smoke(&[], &[("COMPOSE_SMOKE_PROJECT", "my-smoke")]);
    let what = describe(&output, &engine);
    let compose: Vec<String> =
        engine.log("log").lines().filter(|l| l.contains(" command=")).map(str::to_owned).collect();
    assert!(!compose.is_empty() && compose.iter().all(|l| l.starts_with("compose project=my-smoke via=-p ")), "{what}");
}

/// Every address the script calls on the host goes through a variable (the smoke's own ports),
/// none is written out as a number.
#[test]
fn the_smokes_host_addresses_are_its_own_ports() {
    let script = std::fs::read_to_string(repo_root().join("scripts/compose-smoke.sh")).unwrap();
    for (i, line) in script.lines().enumerate().filter(|(_, l)| !l.trim_start().starts_with('#')) {
        for (at, _) in line.match_indices("127.0.0.1:") {
            assert!(
                line[at + "127.0.0.1:".len()..].starts_with('$'),
                "scripts/compose-smoke.sh:{}: a fixed host port: {line}",
                i + 1
            );
        }
    }
}
