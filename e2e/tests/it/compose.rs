//! Keeps `docker-compose.yml` consistent with the native stack (`scripts/stack.sh`, which runs the
//! binaries with `configs/*.toml`): the same ports, the same config files, the same routes between
//! the services, the environment the binaries really read, health checks on `/readyz` and the start
//! order. Docker is not needed: the compose file is parsed as YAML, the configs as TOML, and the
//! binaries' sources are searched for the environment variables they read.
//!
//! Every failure names the file and field on each side of the disagreement. The last test breaks the
//! inputs on purpose (a port changed in one place only, ...) and checks that the checks notice.

use serde::Deserialize;
use serde_yaml_ng::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Component, Path, PathBuf};

const COMPOSE_FILE: &str = "docker-compose.yml";
/// The services of the stack; each runs the binary of the same name with `configs/<name>.toml`.
const SERVICES: [&str; 3] = ["inference-server", "allocator", "control-service"];

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("e2e has a parent directory").to_path_buf()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

// ---------------------------------------------------------------------------------------------
// The compose file, as far as these checks read it (short and long syntaxes both accepted).

#[derive(Debug, Deserialize)]
struct ComposeFile {
    #[serde(default)]
    services: BTreeMap<String, RawService>,
    /// Top-level named volumes (`name:` with an empty body is null).
    #[serde(default)]
    volumes: BTreeMap<String, Option<Value>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RawService {
    /// A published image (the optional monitoring services), which brings its own default command.
    image: Option<String>,
    command: Option<StringOrList>,
    ports: Vec<Value>,
    environment: Option<Value>,
    volumes: Vec<Value>,
    healthcheck: Option<RawHealthcheck>,
    depends_on: Option<Value>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum StringOrList {
    String(String),
    List(Vec<String>),
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RawHealthcheck {
    test: Option<StringOrList>,
    disable: bool,
}

#[derive(Debug)]
struct PortMapping {
    text: String,
    published: Option<u16>,
    target: u16,
}

#[derive(Debug, PartialEq)]
enum MountKind {
    /// A host path, resolved against the compose file's directory.
    Bind(PathBuf),
    Named(String),
    Anonymous,
}

#[derive(Debug)]
struct Mount {
    text: String,
    kind: MountKind,
    target: String,
}

/// One compose service, normalised.
#[derive(Debug, Default)]
struct Service {
    name: String,
    /// `command` in exec form.
    argv: Vec<String>,
    /// `--flag value` and `--flag=value` of the command, by flag.
    flags: BTreeMap<String, Vec<String>>,
    ports: Vec<PortMapping>,
    /// Variable -> value as written (`None`: passed through without a value).
    environment: BTreeMap<String, Option<String>>,
    mounts: Vec<Mount>,
    /// `healthcheck.test`, in exec form (`CMD-SHELL` strings are split on whitespace).
    healthcheck: Option<Vec<String>>,
    /// Service -> condition (`None`: the list form, i.e. `service_started`).
    depends_on: BTreeMap<String, Option<String>>,
}

impl Service {
    fn field(&self, field: &str) -> String {
        format!("{COMPOSE_FILE} services.{}.{field}", self.name)
    }

    /// The single value of a flag of the command, or a problem naming the field.
    fn flag(&self, flag: &str) -> Result<&str, String> {
        match self.flags.get(flag).map(Vec::as_slice) {
            Some([value]) => Ok(value),
            Some(values) => Err(format!("{}: {flag} is given {} times", self.field("command"), values.len())),
            None => Err(format!("{}: {flag} is missing", self.field("command"))),
        }
    }

    /// The binary the service runs (`command[0]`, without a directory).
    fn binary(&self) -> &str {
        self.argv.first().map(|b| b.rsplit('/').next().unwrap_or(b)).unwrap_or("")
    }

    /// The mount whose target contains `path` (the longest such target: the most specific mount).
    fn mount_of(&self, path: &str) -> Option<&Mount> {
        self.mounts
            .iter()
            .filter(|m| Path::new(path).starts_with(Path::new(&m.target)))
            .max_by_key(|m| Path::new(&m.target).components().count())
    }
}

fn scalar_text(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// `text` with each `${NAME:-default}` (or `${NAME-default}`) replaced by its default: the value
/// when the variable is unset, as the checks read the file. A variable without a default is refused.
fn with_defaults(text: &str) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let end = rest[start..].find('}').ok_or_else(|| format!("'{text}' has an unclosed ${{"))? + start;
        let inner = &rest[start + 2..end];
        let (_, default) = inner
            .split_once(":-")
            .or_else(|| inner.split_once('-'))
            .ok_or_else(|| format!("'{text}': ${{{inner}}} has no default"))?;
        out.push_str(default);
        rest = &rest[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

fn parse_port(value: &Value) -> Result<PortMapping, String> {
    let number = |text: &str| text.parse::<u16>().map_err(|_| format!("'{text}' is not a single port"));
    if let Value::Mapping(long) = value {
        let get = |key: &str| long.get(key).and_then(scalar_text).map(|v| with_defaults(&v)).transpose();
        let target = number(&get("target")?.ok_or("the long syntax needs target")?)?;
        let published = get("published")?.map(|p| number(&p)).transpose()?;
        return Ok(PortMapping { text: format!("{long:?}"), published, target });
    }
    let text = scalar_text(value).ok_or_else(|| format!("unreadable port entry {value:?}"))?;
    // A host port that the environment may move (`${LAVA_CONTROL_PORT:-8080}`) is read by its default.
    let unset = with_defaults(&text)?;
    let without_protocol = unset.split('/').next().unwrap_or(&unset);
    // [[host_ip:]published:]target, where host_ip may itself hold colons (IPv6 in brackets).
    let mut parts = without_protocol.rsplitn(3, ':');
    let target = number(parts.next().unwrap_or(""))?;
    let published = parts.next().map(number).transpose()?;
    Ok(PortMapping { text, published, target })
}

fn parse_mount(value: &Value, base: &Path) -> Result<Mount, String> {
    let (source, target, text) = match value {
        Value::Mapping(long) => {
            let get = |key: &str| long.get(key).and_then(scalar_text);
            let target = get("target").ok_or("the long syntax needs target")?;
            (get("source"), target, format!("{long:?}"))
        }
        _ => {
            let text = scalar_text(value).ok_or_else(|| format!("unreadable volume entry {value:?}"))?;
            let parts: Vec<&str> = text.split(':').collect();
            match parts.as_slice() {
                [target] => (None, target.to_string(), text.clone()),
                [source, target] | [source, target, _] => (Some(source.to_string()), target.to_string(), text.clone()),
                _ => return Err(format!("'{text}' is not SOURCE:TARGET[:MODE]")),
            }
        }
    };
    let kind = match source {
        None => MountKind::Anonymous,
        Some(s) if s.starts_with('.') || s.starts_with('/') || s.starts_with('~') => {
            MountKind::Bind(normalize(&base.join(s)))
        }
        Some(s) => MountKind::Named(s),
    };
    Ok(Mount { text, kind, target })
}

/// `a/./b/../c` -> `a/c`, without touching the filesystem.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

fn parse_flags(args: &[String]) -> BTreeMap<String, Vec<String>> {
    let mut flags: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut i = 0;
    while i < args.len() {
        let arg = &args[i];
        i += 1;
        if !arg.starts_with("--") {
            continue;
        }
        let (flag, value) = match arg.split_once('=') {
            Some((flag, value)) => (flag.to_string(), value.to_string()),
            None if i < args.len() && !args[i].starts_with("--") => {
                i += 1;
                (arg.clone(), args[i - 1].clone())
            }
            None => (arg.clone(), String::new()),
        };
        flags.entry(flag).or_default().push(value);
    }
    flags
}

/// Normalises one raw service; what cannot be read becomes a problem.
fn normalize_service(name: &str, raw: &RawService, base: &Path, problems: &mut Vec<String>) -> Service {
    let mut service = Service { name: name.to_string(), ..Service::default() };
    match &raw.command {
        Some(StringOrList::List(argv)) => service.argv = argv.clone(),
        Some(StringOrList::String(_)) => problems.push(format!(
            "{}: write the command as a list (exec form), so its flags can be checked and no shell sits between \
             Docker's SIGTERM and the service",
            service.field("command")
        )),
        None if raw.image.is_some() => {} // the published image's own command
        None => problems.push(format!("{}: missing (the image has no default command)", service.field("command"))),
    }
    service.flags = parse_flags(service.argv.get(1..).unwrap_or_default());
    for (i, port) in raw.ports.iter().enumerate() {
        match parse_port(port) {
            Ok(port) => service.ports.push(port),
            Err(e) => problems.push(format!("{}[{i}]: {e}", service.field("ports"))),
        }
    }
    for (i, volume) in raw.volumes.iter().enumerate() {
        match parse_mount(volume, base) {
            Ok(mount) => service.mounts.push(mount),
            Err(e) => problems.push(format!("{}[{i}]: {e}", service.field("volumes"))),
        }
    }
    match &raw.environment {
        None => {}
        Some(Value::Mapping(map)) => {
            for (key, value) in map {
                let key = scalar_text(key).unwrap_or_default();
                service.environment.insert(key, scalar_text(value));
            }
        }
        Some(Value::Sequence(list)) => {
            for entry in list {
                let entry = scalar_text(entry).unwrap_or_default();
                let (key, value) = match entry.split_once('=') {
                    Some((key, value)) => (key.to_string(), Some(value.to_string())),
                    None => (entry, None),
                };
                service.environment.insert(key, value);
            }
        }
        Some(other) => problems.push(format!("{}: unreadable {other:?}", service.field("environment"))),
    }
    if let Some(health) = &raw.healthcheck {
        if !health.disable {
            service.healthcheck = match &health.test {
                Some(StringOrList::List(test)) if test.first().map(String::as_str) == Some("CMD-SHELL") => {
                    Some(test[1..].iter().flat_map(|s| s.split_whitespace().map(str::to_string)).collect())
                }
                Some(StringOrList::List(test)) => Some(test.clone()),
                Some(StringOrList::String(shell)) => Some(shell.split_whitespace().map(str::to_string).collect()),
                None => None,
            };
        }
    }
    match &raw.depends_on {
        None => {}
        Some(Value::Sequence(list)) => {
            for entry in list {
                service.depends_on.insert(scalar_text(entry).unwrap_or_default(), None);
            }
        }
        Some(Value::Mapping(map)) => {
            for (key, value) in map {
                let condition = value.get("condition").and_then(scalar_text);
                service.depends_on.insert(scalar_text(key).unwrap_or_default(), condition);
            }
        }
        Some(other) => problems.push(format!("{}: unreadable {other:?}", service.field("depends_on"))),
    }
    service
}

// ---------------------------------------------------------------------------------------------
// The native side: configs/<service>.toml and what the binaries read from the environment.

struct NativeConfig {
    /// Relative to the repository, e.g. `configs/allocator.toml`.
    path: String,
    table: toml::Table,
    listen: SocketAddr,
}

fn parse_native(path: &str, text: &str) -> Result<NativeConfig, String> {
    let table: toml::Table = text.parse().map_err(|e| format!("{path}: not valid TOML: {e}"))?;
    let listen = table
        .get("listen")
        .and_then(toml::Value::as_str)
        .ok_or_else(|| format!("{path}: no top-level listen = \"host:port\""))?;
    let listen = listen.parse().map_err(|e| format!("{path} listen = \"{listen}\": {e}"))?;
    Ok(NativeConfig { path: path.to_string(), table, listen })
}

impl NativeConfig {
    fn listen_field(&self) -> String {
        format!("{} listen = \"{}\"", self.path, self.listen)
    }
}

/// The variables passed to `std::env::var`/`var_os` as string literals in `source`.
fn env_reads(source: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for call in ["env::var(\"", "env::var_os(\"", "token_from_env(\""] {
        for (at, _) in source.match_indices(call) {
            let rest = &source[at + call.len()..];
            if let Some(end) = rest.find('"') {
                names.insert(rest[..end].to_string());
                // `service_common::auth::token_from_env` also reads the variable's `_FILE` twin.
                if call.starts_with("token_from_env") {
                    names.insert(format!("{}_FILE", &rest[..end]));
                }
            }
        }
    }
    names
}

/// What each service binary reads from its environment: its own `src/bin/<name>.rs` and the
/// program it runs (its crate's `src/cli.rs`, when its `main` only builds the registry and calls
/// `cli::main`), plus what `service-common` reads on its behalf (`RUST_LOG` through tracing's `EnvFilter` in
/// `init_tracing`, and any `std::env::var` there).
fn binary_env_reads(root: &Path, binary: &str) -> Result<(String, BTreeSet<String>), String> {
    let crates = std::fs::read_dir(root).map_err(|e| format!("listing {}: {e}", root.display()))?;
    let source_path = crates
        .filter_map(Result::ok)
        .map(|entry| entry.path().join("src/bin").join(format!("{binary}.rs")))
        .find(|path| path.is_file())
        .ok_or_else(|| format!("no */src/bin/{binary}.rs in {}", root.display()))?;
    let mut source = read(&source_path);
    let program = source_path.parent().and_then(Path::parent).map(|src| src.join("cli.rs"));
    if let Some(program) = program.filter(|path| path.is_file() && source.contains("cli::main")) {
        source.push_str(&read(&program));
    }
    let mut names = env_reads(&source);
    let common = root.join("service-common/src");
    for entry in std::fs::read_dir(&common).map_err(|e| format!("listing {}: {e}", common.display()))? {
        let path = entry.map_err(|e| e.to_string())?.path();
        if path.extension().is_some_and(|ext| ext == "rs") {
            let text = read(&path);
            names.extend(env_reads(&text));
            if source.contains("init_tracing") && text.contains("fn init_tracing") && text.contains("from_default_env")
            {
                names.insert("RUST_LOG".to_string());
            }
        }
    }
    let relative = source_path.strip_prefix(root).unwrap_or(&source_path).display().to_string();
    Ok((relative, names))
}

// ---------------------------------------------------------------------------------------------
// Everything the checks compare.

struct Stack {
    root: PathBuf,
    services: BTreeMap<String, Service>,
    named_volumes: BTreeSet<String>,
    native: BTreeMap<String, NativeConfig>,
    dockerfile: String,
    /// Problems found while reading; every check reports them.
    read_problems: Vec<String>,
}

impl Stack {
    fn load() -> Stack {
        let root = repo_root();
        let configs = SERVICES.iter().map(|s| (s.to_string(), read(&root.join(format!("configs/{s}.toml"))))).collect();
        Stack::parse(&root, &read(&root.join(COMPOSE_FILE)), &configs, &read(&root.join("Dockerfile")))
    }

    fn parse(root: &Path, compose: &str, configs: &BTreeMap<String, String>, dockerfile: &str) -> Stack {
        let mut problems = Vec::new();
        let mut value: Value =
            serde_yaml_ng::from_str(compose).unwrap_or_else(|e| panic!("{COMPOSE_FILE}: not valid YAML: {e}"));
        value.apply_merge().unwrap_or_else(|e| panic!("{COMPOSE_FILE}: bad merge key (<<): {e}"));
        let file: ComposeFile = serde_yaml_ng::from_value(value)
            .unwrap_or_else(|e| panic!("{COMPOSE_FILE}: not a compose file these checks can read: {e}"));
        let services = file
            .services
            .iter()
            .map(|(name, raw)| (name.clone(), normalize_service(name, raw, root, &mut problems)))
            .collect();
        let mut native = BTreeMap::new();
        for (service, text) in configs {
            match parse_native(&format!("configs/{service}.toml"), text) {
                Ok(config) => {
                    native.insert(service.clone(), config);
                }
                Err(e) => problems.push(e),
            }
        }
        Stack {
            root: root.to_path_buf(),
            services,
            named_volumes: file.volumes.into_keys().collect(),
            native,
            dockerfile: dockerfile.to_string(),
            read_problems: problems,
        }
    }

    /// The compose service and native config of each stack service; missing ones are problems.
    fn pairs(&self, problems: &mut Vec<String>) -> Vec<(&Service, &NativeConfig)> {
        let mut pairs = Vec::new();
        for name in SERVICES {
            match (self.services.get(name), self.native.get(name)) {
                (Some(service), Some(native)) => pairs.push((service, native)),
                (None, _) => problems.push(format!("{COMPOSE_FILE} services: no service '{name}'")),
                (_, None) => {} // unreadable config: already a read problem
            }
        }
        pairs
    }

    /// The native config of the service a compose service name refers to, when it runs `binary`.
    fn target_service(&self, name: &str, binary: &str) -> Option<(&Service, &NativeConfig)> {
        let service = self.services.get(name)?;
        (service.binary() == binary).then_some(())?;
        Some((service, self.native.get(binary)?))
    }
}

/// Runs one group of checks and fails with every problem found, read problems included.
fn assert_consistent(check: fn(&Stack, &mut Vec<String>)) {
    let stack = Stack::load();
    let problems = run(&stack, check);
    if !problems.is_empty() {
        let mut message = format!("{COMPOSE_FILE}, configs/ and the binaries disagree:\n");
        for problem in &problems {
            let _ = writeln!(message, "  - {problem}");
        }
        panic!("{message}");
    }
}

fn run(stack: &Stack, check: fn(&Stack, &mut Vec<String>)) -> Vec<String> {
    let mut problems = stack.read_problems.clone();
    check(stack, &mut problems);
    problems
}

/// `http://host:port[/path]` -> (host, port, path).
fn parse_http_url(url: &str) -> Result<(String, u16, String), String> {
    let rest = url.strip_prefix("http://").ok_or_else(|| format!("'{url}' is not an http:// URL"))?;
    let (authority, path) = match rest.find('/') {
        Some(at) => (&rest[..at], &rest[at..]),
        None => (rest, ""),
    };
    let (host, port) = authority.rsplit_once(':').ok_or_else(|| format!("'{url}' has no explicit port"))?;
    let port = port.parse().map_err(|_| format!("'{url}' has no valid port"))?;
    Ok((host.to_string(), port, path.to_string()))
}

// ---------------------------------------------------------------------------------------------
// The checks.

/// Each service's published port and `--listen` port equal the port of its native `listen`, and it
/// listens on every interface of its container (loopback there is unreachable from the others).
fn check_ports(stack: &Stack, problems: &mut Vec<String>) {
    for (service, native) in stack.pairs(problems) {
        let port = native.listen.port();
        match service.ports.as_slice() {
            [mapping] => {
                if mapping.target != port {
                    problems.push(format!(
                        "{} maps container port {} ({}), but {} has port {port}",
                        service.field("ports"),
                        mapping.target,
                        mapping.text,
                        native.listen_field()
                    ));
                }
                if mapping.published != Some(port) {
                    let published = mapping.published.map_or("no fixed host port".to_string(), |p| p.to_string());
                    problems.push(format!(
                        "{} publishes {published} ({}), but {} has port {port}: the stack must answer on the \
                         same port natively and in containers",
                        service.field("ports"),
                        mapping.text,
                        native.listen_field()
                    ));
                }
            }
            ports => problems.push(format!(
                "{}: expected exactly one published port (that of {}), found {}",
                service.field("ports"),
                native.listen_field(),
                ports.len()
            )),
        }
        match service.flag("--listen") {
            Ok(listen) => match listen.parse::<SocketAddr>() {
                Ok(addr) => {
                    if addr.port() != port {
                        problems.push(format!(
                            "{} --listen {listen} has port {}, but {} has port {port}",
                            service.field("command"),
                            addr.port(),
                            native.listen_field()
                        ));
                    }
                    if !addr.ip().is_unspecified() {
                        problems.push(format!(
                            "{} --listen {listen}: listen on 0.0.0.0 inside the container, else neither the \
                             published port nor the other services reach it",
                            service.field("command")
                        ));
                    }
                }
                Err(e) => problems.push(format!("{} --listen {listen}: {e}", service.field("command"))),
            },
            Err(e) => problems.push(e),
        }
    }
}

/// Each service runs its own binary with `--config` pointing, through a bind mount, at
/// `configs/<service>.toml`.
fn check_config_files(stack: &Stack, problems: &mut Vec<String>) {
    for (service, native) in stack.pairs(problems) {
        if service.binary() != service.name {
            problems.push(format!(
                "{}[0] runs '{}', expected the binary '{}' (configs/{}.toml is its config)",
                service.field("command"),
                service.binary(),
                service.name,
                service.name
            ));
        }
        let config = match service.flag("--config") {
            Ok(config) => config,
            Err(e) => {
                problems.push(e);
                continue;
            }
        };
        let Some(mount) = service.mount_of(config) else {
            problems.push(format!(
                "{} --config {config}: no entry of {} mounts the directory holding it; bind-mount ./configs \
                 there so the container reads the checked-in {}",
                service.field("command"),
                service.field("volumes"),
                native.path
            ));
            continue;
        };
        let MountKind::Bind(source) = &mount.kind else {
            problems.push(format!(
                "{} --config {config} is on the volume '{}', not on a bind mount of ./configs",
                service.field("command"),
                mount.text
            ));
            continue;
        };
        let relative = Path::new(config).strip_prefix(&mount.target).unwrap_or(Path::new(""));
        let host = source.join(relative);
        let expected = stack.root.join(&native.path);
        if host != expected {
            problems.push(format!(
                "{} --config {config} is {} on the host (through '{}'), but the service's config is {}",
                service.field("command"),
                host.strip_prefix(&stack.root).unwrap_or(&host).display(),
                mount.text,
                native.path
            ));
        } else if !host.is_file() {
            problems.push(format!("{} --config {config}: {} does not exist", service.field("command"), native.path));
        }
    }
}

/// The control service routes every zone of its native config to an allocator service, and
/// predictions to an inference-server service, each at that service's native port; natively, its
/// config points at the native ports of the other two.
fn check_routes(stack: &Stack, problems: &mut Vec<String>) {
    let Some(control) = stack.services.get("control-service") else {
        problems.push(format!("{COMPOSE_FILE} services: no service 'control-service'"));
        return;
    };
    let Some(control_native) = stack.native.get("control-service") else { return };
    let zones_field = format!("{} [zones]", control_native.path);
    let native_zones: BTreeMap<String, String> = control_native
        .table
        .get("zones")
        .and_then(toml::Value::as_table)
        .map(|zones| {
            zones
                .iter()
                .map(|(zone, body)| {
                    let url = body.get("allocator").and_then(toml::Value::as_str).unwrap_or("");
                    (zone.clone(), url.to_string())
                })
                .collect()
        })
        .unwrap_or_default();
    if native_zones.is_empty() {
        problems.push(format!("{zones_field}: no zone"));
    }

    // Natively: configs/control-service.toml -> the loopback ports of configs/allocator.toml and
    // configs/inference-server.toml (what scripts/stack.sh runs).
    if let Some(allocator) = stack.native.get("allocator") {
        for (zone, url) in &native_zones {
            match parse_http_url(url) {
                Ok((_, port, _)) if port == allocator.listen.port() => {}
                Ok((_, port, _)) => problems.push(format!(
                    "{} [zones.{zone}] allocator = \"{url}\" has port {port}, but {} has port {}",
                    control_native.path,
                    allocator.listen_field(),
                    allocator.listen.port()
                )),
                Err(e) => problems.push(format!("{} [zones.{zone}] allocator: {e}", control_native.path)),
            }
        }
    }
    if let Some(inference) = stack.native.get("inference-server") {
        let servers = control_native
            .table
            .get("inference")
            .and_then(|t| t.get("servers"))
            .and_then(toml::Value::as_array)
            .cloned()
            .unwrap_or_default();
        for server in servers {
            let url = server.as_str().unwrap_or("");
            match parse_http_url(url) {
                Ok((_, port, _)) if port == inference.listen.port() => {}
                Ok((_, port, _)) => problems.push(format!(
                    "{} [inference] servers: \"{url}\" has port {port}, but {} has port {}",
                    control_native.path,
                    inference.listen_field(),
                    inference.listen.port()
                )),
                Err(e) => problems.push(format!("{} [inference] servers: {e}", control_native.path)),
            }
        }
    }

    // In compose: --zone NAME=URL for exactly the native zones, each at an allocator service that
    // serves that zone.
    let mut compose_zones = BTreeSet::new();
    for value in control.flags.get("--zone").map(Vec::as_slice).unwrap_or_default() {
        let field = format!("{} --zone {value}", control.field("command"));
        let Some((zone, url)) = value.split_once('=') else {
            problems.push(format!("{field}: expected NAME=URL"));
            continue;
        };
        if !compose_zones.insert(zone.to_string()) {
            problems.push(format!("{field}: zone '{zone}' is given twice"));
        }
        if !native_zones.contains_key(zone) {
            problems.push(format!("{field}: {zones_field} has no zone '{zone}'"));
        }
        let (host, port, _) = match parse_http_url(url) {
            Ok(parts) => parts,
            Err(e) => {
                problems.push(format!("{field}: {e}"));
                continue;
            }
        };
        let Some((allocator, allocator_native)) = stack.target_service(&host, "allocator") else {
            problems.push(format!(
                "{field}: '{host}' is not a service of {COMPOSE_FILE} that runs the allocator (the service name is \
                 its host name)"
            ));
            continue;
        };
        if port != allocator_native.listen.port() {
            problems.push(format!(
                "{field}: port {port}, but {} has port {}",
                allocator_native.listen_field(),
                allocator_native.listen.port()
            ));
        }
        let served = served_zones(stack, allocator_native);
        if !served.contains(zone) {
            problems.push(format!(
                "{field}: the allocator of services.{} ({}) serves {:?}, not '{zone}'",
                allocator.name, allocator_native.path, served
            ));
        }
    }
    for zone in native_zones.keys().filter(|zone| !compose_zones.contains(*zone)) {
        problems.push(format!(
            "{}: no --zone {zone}=... for [zones.{zone}] of {}",
            control.field("command"),
            control_native.path
        ));
    }

    let servers = control.flags.get("--inference-server").map(Vec::as_slice).unwrap_or_default();
    if servers.is_empty() {
        problems.push(format!(
            "{}: no --inference-server, so the container would call the loopback address of {}",
            control.field("command"),
            control_native.path
        ));
    }
    for url in servers {
        let field = format!("{} --inference-server {url}", control.field("command"));
        match parse_http_url(url) {
            Ok((host, port, _)) => match stack.target_service(&host, "inference-server") {
                Some((_, native)) if port == native.listen.port() => {}
                Some((_, native)) => problems.push(format!(
                    "{field}: port {port}, but {} has port {}",
                    native.listen_field(),
                    native.listen.port()
                )),
                None => problems.push(format!(
                    "{field}: '{host}' is not a service of {COMPOSE_FILE} that runs the inference server"
                )),
            },
            Err(e) => problems.push(format!("{field}: {e}")),
        }
    }
}

/// The zones an allocator config serves: `[generate] zone` (default `zone-1`) or the zones of its
/// `inventory_file`.
fn served_zones(stack: &Stack, allocator: &NativeConfig) -> BTreeSet<String> {
    if let Some(generate) = allocator.table.get("generate") {
        let zone = generate.get("zone").and_then(toml::Value::as_str).unwrap_or("zone-1");
        return BTreeSet::from([zone.to_string()]);
    }
    let Some(file) = allocator.table.get("inventory_file").and_then(toml::Value::as_str) else {
        return BTreeSet::new();
    };
    let Ok(inventory) = std::fs::read_to_string(stack.root.join(file)) else { return BTreeSet::new() };
    let inventory: toml::Table = inventory.parse().unwrap_or_default();
    inventory
        .get("zones")
        .and_then(toml::Value::as_array)
        .map(|zones| zones.iter().filter_map(|z| z.get("id")?.as_str().map(str::to_string)).collect())
        .unwrap_or_default()
}

/// `./models` is mounted at the inference server's `--models-dir`; the allocator's `--store` is on
/// a named volume declared at the top level.
fn check_volumes(stack: &Stack, problems: &mut Vec<String>) {
    if let Some(inference) = stack.services.get("inference-server") {
        match inference.flag("--models-dir") {
            Ok(dir) => {
                let models = stack.root.join("models");
                let mounted = inference
                    .mounts
                    .iter()
                    .any(|m| Path::new(&m.target) == Path::new(dir) && m.kind == MountKind::Bind(models.clone()));
                if !mounted {
                    problems.push(format!(
                        "{} --models-dir {dir}: {} has no ./models:{dir}, so bundles rolled out into ./models \
                         would not reach the server",
                        inference.field("command"),
                        inference.field("volumes")
                    ));
                }
            }
            Err(e) => problems.push(e),
        }
    }
    if let Some(allocator) = stack.services.get("allocator") {
        match allocator.flag("--store") {
            Ok(store) => match allocator.mount_of(store).map(|m| &m.kind) {
                Some(MountKind::Named(volume)) if stack.named_volumes.contains(volume) => {}
                Some(MountKind::Named(volume)) => problems.push(format!(
                    "{} --store {store} is on the volume '{volume}', which the top-level volumes of {COMPOSE_FILE} \
                     do not declare",
                    allocator.field("command")
                )),
                _ => problems.push(format!(
                    "{} --store {store}: not on a named volume of {}, so the allocator's durable state would die \
                     with its container",
                    allocator.field("command"),
                    allocator.field("volumes")
                )),
            },
            Err(e) => problems.push(e),
        }
    }
}

/// Every variable in a service's environment is one its binary reads, and every admin token its
/// binary reads is passed through from the host (never written into the file).
fn check_environment(stack: &Stack, problems: &mut Vec<String>) {
    for (service, _) in stack.pairs(problems) {
        let (source, reads) = match binary_env_reads(&stack.root, service.binary()) {
            Ok(found) => found,
            Err(e) => {
                problems.push(format!("{}: {e}", service.field("command")));
                continue;
            }
        };
        for name in service.environment.keys().filter(|name| !reads.contains(*name)) {
            problems.push(format!(
                "{}.{name}: the {} binary never reads it ({source} and service-common read {:?})",
                service.field("environment"),
                service.binary(),
                reads
            ));
        }
        for token in reads.iter().filter(|name| name.ends_with("_TOKEN")) {
            match service.environment.get(token) {
                None => problems.push(format!(
                    "{}: {source} reads {token}, but it is not passed; add {token}: ${{{token}:-}}",
                    service.field("environment")
                )),
                Some(Some(value)) if value.starts_with(&format!("${{{token}")) => {}
                Some(Some(_)) => problems.push(format!(
                    "{}.{token}: pass it through from the host as ${{{token}:-}}; a secret does not belong in \
                     {COMPOSE_FILE}",
                    service.field("environment")
                )),
                Some(None) => {} // the list form `- NAME`: passed through from the host
            }
        }
    }
}

/// Health checks ask `/readyz` on the service's own port, with a tool the image has.
fn check_healthchecks(stack: &Stack, problems: &mut Vec<String>) {
    let runtime_stage = stack.dockerfile.rsplit_once("\nFROM ").map_or("", |(_, last)| last);
    for (service, native) in stack.pairs(problems) {
        let Some(test) = &service.healthcheck else {
            problems.push(format!("{}: missing (depends_on: service_healthy needs one)", service.field("healthcheck")));
            continue;
        };
        let field = service.field("healthcheck.test");
        let urls: Vec<&String> = test.iter().filter(|arg| arg.contains("http://")).collect();
        match urls.as_slice() {
            [url] => match parse_http_url(url.trim_matches(['\'', '"'])) {
                Ok((host, port, path)) => {
                    if port != native.listen.port() {
                        problems.push(format!(
                            "{field} asks port {port}, but {} has port {}",
                            native.listen_field(),
                            native.listen.port()
                        ));
                    }
                    if path != "/readyz" {
                        problems.push(format!("{field} asks {path}, expected /readyz (ready, not merely alive)"));
                    }
                    if host != "127.0.0.1" && host != "localhost" {
                        problems.push(format!("{field} asks {host}; the check runs inside the container: 127.0.0.1"));
                    }
                }
                Err(e) => problems.push(format!("{field}: {e}")),
            },
            urls => problems.push(format!("{field}: expected one http:// URL, found {}", urls.len())),
        }
        let tool = match test.first().map(String::as_str) {
            Some("CMD") => test.get(1),
            _ => test.first(),
        };
        if let Some(tool) = tool {
            if !runtime_stage.split(|c: char| c.is_whitespace()).any(|word| word == tool) {
                problems
                    .push(format!("{field} runs '{tool}', which the last stage of the Dockerfile does not install"));
            }
        }
    }
}

/// The control service starts once both other services are healthy.
fn check_depends_on(stack: &Stack, problems: &mut Vec<String>) {
    let Some(control) = stack.services.get("control-service") else {
        problems.push(format!("{COMPOSE_FILE} services: no service 'control-service'"));
        return;
    };
    for dependency in ["inference-server", "allocator"] {
        match control.depends_on.get(dependency) {
            Some(Some(condition)) if condition == "service_healthy" => {}
            Some(condition) => problems.push(format!(
                "{}.{dependency}: condition {}, expected service_healthy (ready, not merely started)",
                control.field("depends_on"),
                condition.as_deref().unwrap_or("service_started (list form)")
            )),
            None => problems.push(format!(
                "{}: does not list {dependency} with condition service_healthy",
                control.field("depends_on")
            )),
        }
    }
}

/// Credentials on: every service token file a binary reads (its own, and the control service's two
/// for its upstreams) is the one generated file, mounted from the volume that holds it, so the
/// control service presents exactly the token the allocator and the inference server require.
fn check_service_token(stack: &Stack, problems: &mut Vec<String>) {
    let mut paths = BTreeSet::new();
    for (service, _) in stack.pairs(problems) {
        // Secure by default: a service with open routes refuses 0.0.0.0 without --insecure-open.
        // The control service's checked-in config has no API keys (its port is published on the
        // host's loopback only); the other two are closed by the token and must stay so.
        match (service.binary(), service.flags.contains_key("--insecure-open")) {
            ("control-service", false) => problems.push(format!(
                "{}: no --insecure-open, so the control service (no [auth] keys in its config) refuses to listen \
                 on 0.0.0.0",
                service.field("command")
            )),
            ("allocator" | "inference-server", true) => problems.push(format!(
                "{}: --insecure-open, but the service token closes its routes; drop the flag",
                service.field("command")
            )),
            _ => {}
        }
        let Ok((source, reads)) = binary_env_reads(&stack.root, service.binary()) else { continue };
        let files: Vec<&String> =
            reads.iter().filter(|name| name.ends_with("SERVICE_TOKEN_FILE") && !name.contains("PREVIOUS")).collect();
        if files.is_empty() {
            problems.push(format!("{source}: reads no *_SERVICE_TOKEN_FILE; the stack must run with credentials on"));
        }
        for name in files {
            match service.environment.get(name.as_str()) {
                Some(Some(path)) => {
                    let directory = Path::new(path).parent().map(|p| p.display().to_string()).unwrap_or_default();
                    if !service.mounts.iter().any(|mount| mount.target == directory) {
                        problems.push(format!(
                            "{}.{name}: `{path}`, but nothing is mounted at {directory}",
                            service.field("environment")
                        ));
                    }
                    paths.insert(path.clone());
                }
                _ => problems.push(format!(
                    "{}: {name} is not set: the service would run without the stack's service token",
                    service.field("environment")
                )),
            }
        }
    }
    if paths.len() > 1 {
        problems.push(format!("{COMPOSE_FILE}: the services read different service token files: {paths:?}"));
    }
}

const ALL_CHECKS: [fn(&Stack, &mut Vec<String>); 8] = [
    check_ports,
    check_config_files,
    check_routes,
    check_volumes,
    check_environment,
    check_healthchecks,
    check_depends_on,
    check_service_token,
];

/// The two-agent option over the base file (`docker compose -f docker-compose.yml -f
/// docker-compose.agents.yml`), which overrides services by name.
const AGENTS_FILE: &str = "docker-compose.agents.yml";

/// The option's checks: both agents on one PostgreSQL store of the `postgres` service, started once
/// it is healthy, listening where configs/allocator.toml says; the control service routes zone-1 to
/// both; the second agent is published on a port of its own and checked like the first.
fn check_agents_option(base: &Stack, text: &str, problems: &mut Vec<String>) {
    let mut value: Value =
        serde_yaml_ng::from_str(text).unwrap_or_else(|e| panic!("{AGENTS_FILE}: not valid YAML: {e}"));
    value.apply_merge().unwrap_or_else(|e| panic!("{AGENTS_FILE}: bad merge key (<<): {e}"));
    let file: ComposeFile = serde_yaml_ng::from_value(value)
        .unwrap_or_else(|e| panic!("{AGENTS_FILE}: not a compose file these checks can read: {e}"));
    let healthy = Some("service_healthy".to_owned());
    match file.services.get("postgres").and_then(|p| p.healthcheck.as_ref()).and_then(|h| h.test.as_ref()) {
        Some(StringOrList::List(test)) if test.iter().any(|t| t == "pg_isready") => {}
        _ => problems.push(format!("{AGENTS_FILE} services.postgres: no `pg_isready` health check")),
    }
    if !file.volumes.contains_key("postgres-state") {
        problems.push(format!("{AGENTS_FILE} volumes: no `postgres-state` for the database"));
    }
    let Some(native) = base.native.get("allocator") else { return };
    let port = native.listen.port();
    let agents = ["allocator", "allocator-2"];
    let mut stores = BTreeSet::new();
    for name in agents {
        let Some(raw) = file.services.get(name) else {
            problems.push(format!("{AGENTS_FILE} services: no service '{name}'"));
            continue;
        };
        let agent = normalize_service(name, raw, &base.root, problems);
        match agent.flag("--store") {
            Ok(url) if url.starts_with("postgres://") && url.contains("@postgres:5432/") => {
                stores.insert(url.to_owned());
            }
            Ok(url) => {
                problems.push(format!("{AGENTS_FILE} services.{name}: --store `{url}` is not the postgres service"))
            }
            Err(e) => problems.push(format!("{AGENTS_FILE}: {e}")),
        }
        if agent.flag("--listen").ok() != Some(format!("0.0.0.0:{port}").as_str()) {
            problems.push(format!(
                "{AGENTS_FILE} services.{name}: --listen must be 0.0.0.0:{port} ({})",
                native.listen_field()
            ));
        }
        if agent.depends_on.get("postgres") != Some(&healthy) {
            problems.push(format!("{AGENTS_FILE} services.{name}: must wait for postgres to be healthy"));
        }
    }
    if stores.len() > 1 {
        problems.push(format!("{AGENTS_FILE}: the agents have different stores: {stores:?}"));
    }
    if let Some(raw) = file.services.get("allocator-2") {
        let second = normalize_service("allocator-2", raw, &base.root, problems);
        let taken: BTreeSet<u16> =
            base.services.values().flat_map(|s| s.ports.iter().filter_map(|p| p.published)).collect();
        match second.ports.as_slice() {
            [mapping] if mapping.target == port && mapping.published.is_some_and(|p| !taken.contains(&p)) => {}
            other => problems.push(format!(
                "{AGENTS_FILE} services.allocator-2.ports: {other:?}: publish port {port} on a host port the base file does not use"
            )),
        }
        let readyz = format!("http://127.0.0.1:{port}/readyz");
        if !second.healthcheck.as_ref().is_some_and(|test| test.contains(&readyz)) {
            problems.push(format!("{AGENTS_FILE} services.allocator-2.healthcheck: must ask {readyz}"));
        }
        if second.mount_of("/etc/lava/allocator.toml").is_none() {
            problems.push(format!("{AGENTS_FILE} services.allocator-2.volumes: configs/ is not mounted at /etc/lava"));
        }
    }
    let Some(raw) = file.services.get("control-service") else {
        problems.push(format!("{AGENTS_FILE} services: no service 'control-service'"));
        return;
    };
    let control = normalize_service("control-service", raw, &base.root, problems);
    let expected = format!("zone-1={}", agents.map(|a| format!("http://{a}:{port}")).join(","));
    if control.flag("--zone").ok() != Some(expected.as_str()) {
        problems.push(format!("{AGENTS_FILE} services.control-service: --zone must be `{expected}`"));
    }
    if control.depends_on.get("allocator-2") != Some(&healthy) {
        problems.push(format!("{AGENTS_FILE} services.control-service: must wait for allocator-2 to be healthy"));
    }
}

#[test]
fn the_two_agent_option_shares_one_postgres_store_and_the_control_service_routes_to_both() {
    let base = Stack::load();
    let mut problems = Vec::new();
    check_agents_option(&base, &read(&repo_root().join(AGENTS_FILE)), &mut problems);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    // And the check notices a second agent on a store of its own.
    let broken = read(&repo_root().join(AGENTS_FILE)).replacen("@postgres:5432/lava", "@elsewhere:5432/lava", 1);
    let mut problems = Vec::new();
    check_agents_option(&base, &broken, &mut problems);
    assert!(problems.iter().any(|p| p.contains("is not the postgres service")), "{problems:?}");
}

#[test]
fn ports_and_listen_addresses_match_the_native_configs() {
    assert_consistent(check_ports);
}

#[test]
fn each_service_reads_its_checked_in_config() {
    assert_consistent(check_config_files);
}

#[test]
fn control_service_routes_every_zone_and_predictions_to_the_compose_services() {
    assert_consistent(check_routes);
}

#[test]
fn models_are_mounted_and_the_allocator_store_is_on_a_named_volume() {
    assert_consistent(check_volumes);
}

#[test]
fn environment_is_what_the_binaries_read_and_admin_tokens_are_passed() {
    assert_consistent(check_environment);
}

#[test]
fn every_service_reads_the_one_generated_service_token() {
    assert_consistent(check_service_token);
}

#[test]
fn healthchecks_ask_readyz_on_the_service_port() {
    assert_consistent(check_healthchecks);
}

#[test]
fn control_service_waits_for_healthy_backends() {
    assert_consistent(check_depends_on);
}

/// The checks themselves: a change in one place only must be caught, naming both sides.
#[test]
fn checks_catch_a_change_made_in_one_place_only() {
    let root = repo_root();
    let compose = read(&root.join(COMPOSE_FILE));
    let dockerfile = read(&root.join("Dockerfile"));
    let configs: BTreeMap<String, String> =
        SERVICES.iter().map(|s| (s.to_string(), read(&root.join(format!("configs/{s}.toml"))))).collect();
    let problems_with = |compose: &str, configs: &BTreeMap<String, String>| -> Vec<String> {
        let stack = Stack::parse(&root, compose, configs, &dockerfile);
        ALL_CHECKS.iter().flat_map(|check| run(&stack, *check)).collect()
    };
    assert!(
        problems_with(&compose, &configs).is_empty(),
        "the checked-in files must be consistent to start with (see the failures of the other tests)"
    );

    let replace = |text: &str, from: &str, to: &str| -> String {
        assert!(text.contains(from), "the mutation '{from}' -> '{to}' no longer applies; update this test");
        text.replacen(from, to, 1)
    };
    let expect = |problems: Vec<String>, needles: &[&str], what: &str| {
        assert!(
            problems.iter().any(|p| needles.iter().all(|needle| p.contains(needle))),
            "{what}: no problem mentions all of {needles:?}; got {problems:#?}"
        );
    };

    // The published port, in compose only.
    let moved = replace(&compose, "${LAVA_ALLOCATOR_PORT:-8082}:8082", "${LAVA_ALLOCATOR_PORT:-8083}:8082");
    expect(
        problems_with(&moved, &configs),
        &["services.allocator.ports", "configs/allocator.toml listen"],
        "published port's default changed",
    );
    let fixed = replace(&compose, "${LAVA_ALLOCATOR_PORT:-8082}:8082", "8083:8082");
    expect(problems_with(&fixed, &configs), &["services.allocator.ports", "publishes 8083"], "published port changed");
    let unset = replace(&compose, "${LAVA_ALLOCATOR_PORT:-8082}:8082", "${LAVA_ALLOCATOR_PORT}:8082");
    expect(problems_with(&unset, &configs), &["services.allocator.ports", "has no default"], "no default");

    // The allocator's native port, in its config only: compose and the control service's config
    // still say 8082.
    let mut moved = configs.clone();
    moved.insert("allocator".into(), replace(&configs["allocator"], "127.0.0.1:8082", "127.0.0.1:8092"));
    let problems = problems_with(&compose, &moved);
    expect(problems.clone(), &["services.allocator.ports", "configs/allocator.toml listen"], "native port changed");
    expect(problems.clone(), &["services.allocator.command --listen"], "native port changed");
    expect(problems, &["configs/control-service.toml [zones.zone-1]", "configs/allocator.toml"], "native port changed");

    // A zone added to the control service's config but not routed in compose.
    let mut zoned = configs.clone();
    zoned.insert(
        "control-service".into(),
        format!("{}\n[zones.zone-2]\nallocator = \"http://127.0.0.1:8082\"\n", configs["control-service"]),
    );
    expect(problems_with(&compose, &zoned), &["no --zone zone-2=", "configs/control-service.toml"], "zone added");

    // A variable no binary reads, and an admin token written into the file.
    let env = replace(&compose, "RUST_LOG: ${RUST_LOG:-info}", "RUST_LOG: ${RUST_LOG:-info}\n      LOG_LEVEL: debug");
    expect(problems_with(&env, &configs), &["environment.LOG_LEVEL", "never reads it"], "unknown variable");
    let secret = replace(&compose, "${ALLOCATOR_ADMIN_TOKEN:-}", "hunter2");
    expect(problems_with(&secret, &configs), &["environment.ALLOCATOR_ADMIN_TOKEN", "pass it through"], "token");

    // A service that would run without the stack's token.
    let open = replace(&compose, "      ALLOCATOR_SERVICE_TOKEN_FILE: /run/lava-secrets/service-token\n", "");
    expect(problems_with(&open, &configs), &["services.allocator.environment", "ALLOCATOR_SERVICE_TOKEN_FILE"], "open");

    // The control service without --insecure-open would refuse to start on 0.0.0.0.
    let refused = replace(&compose, "      - --insecure-open\n", "");
    expect(problems_with(&refused, &configs), &["services.control-service.command", "--insecure-open"], "insecure");

    // A health check on the wrong port, and a start order that does not wait for health.
    let health = replace(&compose, "http://127.0.0.1:8081/readyz", "http://127.0.0.1:8091/readyz");
    expect(problems_with(&health, &configs), &["services.inference-server.healthcheck.test", "8091"], "health");
    let started =
        replace(&compose, "allocator: { condition: service_healthy }", "allocator: { condition: service_started }");
    expect(problems_with(&started, &configs), &["services.control-service.depends_on.allocator"], "depends_on");
}
