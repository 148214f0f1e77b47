//! The `simulate` command line: replays a trace through the allocator's policies offline and
//! reports packing density, empty hosts, stranding, rejections, the filtering factor, LARS
//! migrations and speed. The program's `main` builds the [`Registry`] of policies and calls
//! [`main`]; a program with policies of its own registers them there.
//!
//! ```text
//! simulate run --trace trace.csv.gz --hosts 5000 --policy la-binary --prediction oracle --out result.json
//! simulate run --synthetic --auto-hosts --headroom 0.3 --policy nilas --prediction model
//! simulate run --config run.toml --seed 7          # flags override the file
//! simulate run --synthetic --print-config > run.toml
//! simulate compare configs/experiments/perfect.toml --trace trace.csv.gz --hosts 5000 --out-dir eval/perfect
//! simulate agents --synthetic --auto-hosts --policy nilas --prediction oracle --agents 1,2,4,8 --lags 1,8,n-1 \
//!     --seeds 1,2,3 --out-dir eval/agents
//! ```
//!
//! Every run's JSON result carries its full configuration (`config`), so it can be re-run with
//! `--config` (the result's `config` section as TOML).

use crate::agents::sweep::{self, SweepSpec};
use crate::agents::{Assignment, Avoidance, Lag, OnFailure, RetryMode};
use crate::compare::{self, Comparison, Experiment};
use crate::engine::{self, DrainPlan, SimConfig};
use crate::plot::{self, Series};
use crate::predict::PredictionSourceConfig;
use crate::workload::{Inventory, MachineSpec, SyntheticSpec, TraceSpec, Workload};
use anyhow::{anyhow, bail, Context, Result};
use clap::builder::PossibleValuesParser;
use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use placement::defrag::MigrationOrder;
use placement::rules::Buckets;
use placement::{Engine, Registry, TieBreak};
use std::io::IsTerminal;
use std::path::PathBuf;

mod summary;

#[derive(Parser)]
#[command(version, about = "Trace-replay simulator of the lifetime-aware allocation policies")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Replay one trace under one policy and prediction source.
    Run(Box<RunArgs>),
    /// Run an experiment (configs/experiments/*.toml): its policies by its predictions, in
    /// parallel, on one workload; write results.json, summary.md and SVG plots.
    Compare(Box<CompareArgs>),
    /// Replay one trace through N allocation agents of one zone sharing one store, whose views of
    /// it lag behind: conflicts, retries, failed allocations and the packing density lost against
    /// one agent, for every number of agents by lag by seed; writes results.json, summary.md and
    /// agents.svg with --out-dir.
    Agents(Box<AgentsArgs>),
    /// Plot several `simulate agents` results in one figure: `LABEL=DIR/results.json`...
    AgentsPlot(AgentsPlotArgs),
}

#[derive(Args)]
struct AgentsPlotArgs {
    /// The sweeps, each as LABEL=PATH of its results.json.
    #[arg(required = true)]
    sweeps: Vec<String>,
    /// The SVG to write.
    #[arg(long)]
    out: PathBuf,
    #[arg(long, default_value = "Allocation agents on one store")]
    title: String,
}

#[derive(Args)]
struct AgentsArgs {
    /// Numbers of agents (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16,32,64")]
    agents: Vec<usize>,
    /// How far each agent's view lags when it decides (comma-separated): a number of the store's
    /// latest commits it has not seen (`8`), seconds of trace time (`30s`), or `n-1` (N - 1
    /// commits: every other agent commits once while one decides, a saturated zone).
    #[arg(long, value_delimiter = ',', default_value = "n-1")]
    lags: Vec<String>,
    /// Seeds (comma-separated; default: --seed): tie-breaking, and the draw of agents with
    /// --assign random.
    #[arg(long, value_delimiter = ',')]
    seeds: Vec<u64>,
    /// Which agent an arrival goes to: in turn, or drawn with the seed.
    #[arg(long, value_parser = PossibleValuesParser::new(Assignment::NAMES), default_value = "round-robin")]
    assign: String,
    /// Attempts of one VM at one agent before it answers 503 (the allocator's 5).
    #[arg(long, default_value_t = 5)]
    attempts: u32,
    /// Conflict avoidance (Protean s5.3): `off`, or `top=16,share=on` (the allocator's: with other
    /// agents, each takes the best of its own share of the hosts among the top 16), or
    /// `top=16,share=off,window=50,gain=10` (Protean's: a random draw among the top hosts with
    /// gain x the refused share of the last commit attempts as probability).
    #[arg(long, default_value = "top=16,share=on")]
    avoidance: String,
    /// When a refused VM is decided again: `immediate` (at once, on an up-to-date view, as the
    /// real agent does) or `after-lag` (one lag later, on the lagging view: cascades).
    #[arg(long, value_parser = PossibleValuesParser::new(RetryMode::NAMES), default_value = "immediate")]
    retry: String,
    /// After a 503: `resubmit` (to the next agent, one lag later, as the control service fails
    /// over) or `drop` (the VM never runs).
    #[arg(long, value_parser = PossibleValuesParser::new(OnFailure::NAMES), default_value = "resubmit")]
    on_failure: String,
    /// Runs at a time (default: the machine's cores).
    #[arg(long)]
    jobs: Option<usize>,
    /// Where results.json, summary.md and agents.svg go (default: the table on stdout only).
    #[arg(long)]
    out_dir: Option<PathBuf>,
    /// The plot's and table's title.
    #[arg(long)]
    title: Option<String>,
    /// The workload, inventory, policy and predictions of every run.
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Args)]
struct CompareArgs {
    /// The experiment file (TOML: base, policies, predictions, variants, baseline).
    experiment: PathBuf,
    /// Where results.json, summary.md and the plots go.
    #[arg(long)]
    out_dir: PathBuf,
    /// The model bundle of every `model` prediction of the experiment.
    #[arg(long)]
    model: Option<PathBuf>,
    /// Runs at a time (default: the machine's cores).
    #[arg(long)]
    jobs: Option<usize>,
    /// Repeat every run with each of these seeds (comma-separated), over the experiment's `seeds`.
    #[arg(long, value_delimiter = ',')]
    seeds: Vec<u64>,
    /// The workload, inventory and other settings of every run, over the experiment's `base`
    /// (the policy and prediction flags are the experiment's to set).
    #[command(flatten)]
    run: RunArgs,
}

/// A value the library names in kebab-case (`TieBreak`, `Engine`), read as its serde name.
fn by_name<T: serde::de::DeserializeOwned>(name: &str) -> Result<T, serde_json::Error> {
    serde_json::from_value(serde_json::Value::String(name.to_owned()))
}

#[derive(Args)]
struct RunArgs {
    /// A run configuration (TOML, the `config` section of a result); the flags below override it.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Print the run's configuration as TOML and exit (a starting point for --config).
    #[arg(long)]
    print_config: bool,

    /// Trace file: .csv, .csv.gz, or an Azure packing-trace .sqlite (with --machine-id). Given
    /// several times, the CSV files are replayed as one timeline (an earlier period warming the
    /// inventory up for a later one; see --measure-from-s).
    #[arg(long, conflicts_with = "synthetic")]
    trace: Vec<PathBuf>,
    /// For .sqlite traces: the machineId whose fractional VM sizes to use; the machine's size is
    /// the host's (--host-cores, --host-memory-gib).
    #[arg(long)]
    machine_id: Option<i64>,
    /// Use the seeded synthetic generator instead of a trace file.
    #[arg(long)]
    synthetic: bool,
    /// Synthetic trace: its own seed (default 42; independent of --seed so that runs with different
    /// seeds see the same trace).
    #[arg(long)]
    synthetic_seed: Option<u64>,
    /// Synthetic trace: days after time 0.
    #[arg(long)]
    synthetic_days: Option<f64>,
    /// Synthetic trace: days of arrivals before 0 (the VMs still running at 0 are the warm-up).
    #[arg(long)]
    synthetic_warmup_days: Option<f64>,
    /// Synthetic trace: mean tenant requests per hour.
    #[arg(long)]
    synthetic_requests_per_hour: Option<f64>,
    /// Synthetic trace: number of tenants.
    #[arg(long)]
    synthetic_tenants: Option<usize>,

    /// Window start in trace seconds (default: the first start, or 0 when VMs run before 0).
    #[arg(long, allow_negative_numbers = true)]
    from_s: Option<f64>,
    /// Window length in trace seconds (default: up to the last start).
    #[arg(long)]
    duration_s: Option<f64>,
    /// At most this many VMs starting in the window (the earliest); the warm-up comes on top.
    #[arg(long, visible_alias = "synthetic-vms")]
    max_vms: Option<usize>,

    /// Placement policy: one of the registry's presets (a policy of your own rules goes in --config).
    #[arg(long, id = POLICY)]
    policy: Option<String>,
    /// Best-fit buckets: a number, or `exact` (no quantization).
    #[arg(long)]
    buckets: Option<String>,
    /// Lifetime at which a VM is long-lived (DPBFR, LA-binary, noisy precision/recall), seconds.
    #[arg(long)]
    long_threshold_s: Option<f64>,
    /// Prediction source: oracle, binned-oracle (the trace's recorded lifetime bins), none, model,
    /// model:BUNDLE_DIR, accuracy:A (paper 002 G.1),
    /// pr:PRECISION,RECALL (paper 003 B.6, on the long class).
    #[arg(long)]
    prediction: Option<String>,
    /// The model's tenant history starts from the bundle's feature store (its training period's
    /// tenants), as the inference server's does, instead of empty.
    #[arg(long)]
    bundle_history: bool,
    /// Share of VMs whose prediction is replaced by the short-lived fallback, in [0, 1].
    #[arg(long)]
    fallback_fraction: Option<f64>,
    /// How often NILAS and LAVA refresh hosts' exit times from repredictions, seconds (0: only on
    /// arrivals and exits).
    #[arg(long)]
    refresh_interval_s: Option<f64>,

    /// Exactly this many hosts.
    #[arg(long, conflicts_with = "auto_hosts")]
    hosts: Option<usize>,
    /// As many hosts as the window's peak demand needs, plus --headroom.
    #[arg(long)]
    auto_hosts: bool,
    /// With --auto-hosts: extra share of hosts over the peak demand (0.25 = 25% more).
    #[arg(long, requires = "auto_hosts")]
    headroom: Option<f64>,
    /// Cores per host.
    #[arg(long)]
    host_cores: Option<f64>,
    /// Memory per host, GiB.
    #[arg(long)]
    host_memory_gib: Option<f64>,
    /// Hosts per rack.
    #[arg(long)]
    hosts_per_rack: Option<usize>,

    /// How ties between equally good hosts are broken.
    #[arg(long, value_parser = PossibleValuesParser::new(TieBreak::NAMES))]
    tie_break: Option<String>,
    /// Host selection engine (full-scan is the slow reference).
    #[arg(long, value_parser = PossibleValuesParser::new(Engine::NAMES))]
    engine: Option<String>,
    /// Seed of tie-breaking and of every random draw of the predictions.
    #[arg(long)]
    seed: Option<u64>,

    /// Seconds between metric samples.
    #[arg(long)]
    sample_interval_s: Option<f64>,
    /// Seconds after the window start left out of the averages.
    #[arg(long)]
    warmup_s: Option<f64>,
    /// Trace time from which the averages count (the start of the test period of a timeline).
    #[arg(long)]
    measure_from_s: Option<f64>,
    /// Inflation stranding at every n-th sample (0: never).
    #[arg(long)]
    inflation_every: Option<u32>,
    /// LARS drains: `every=SECONDS[,hosts=N][,pick=fewest-vms|rolling][,order=lars|arrival][,in-flight=3][,migration-s=1200][,first=SECONDS]`,
    /// or `off`.
    #[arg(long)]
    drains: Option<String>,
    /// Consolidation under a migration budget:
    /// `budget=MIGRATIONS_PER_HOST_DAY,chooser=fewest-vms|least-used|age|age-batches|lifetime|oracle[,every=SECONDS][,in-flight=N]`
    /// (more: `empty-below=PCT`, `migration=SECONDS`, `max-waste=P`, `candidates=N`), or `off`.
    #[arg(long)]
    consolidation: Option<String>,
    /// Keep every VM's host in the result.
    #[arg(long)]
    record_placements: bool,
    /// Also measure the realized prediction quality over a sliding window of this many outcomes
    /// (the allocator's is 5000), read at every metric sample: how far a quality gate's figures move.
    #[arg(long)]
    quality_window: Option<usize>,

    /// Write the full result (configuration included) as JSON here.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Write an SVG of packing density and empty hosts over time here.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
}

/// The id of `--policy`, whose choices are the registry's presets.
const POLICY: &str = "policy";

/// Runs the command line's subcommand, every policy's rules and presets looked up in `registry`.
pub fn main(registry: Registry) -> Result<()> {
    let presets = registry.preset_names();
    let policies = |arg: clap::Arg| arg.value_parser(PossibleValuesParser::new(presets.iter().copied()));
    let command = Cli::command()
        .mut_subcommand("run", |run| run.mut_arg(POLICY, policies))
        .mut_subcommand("compare", |compare| compare.mut_arg(POLICY, policies))
        .mut_subcommand("agents", |agents| agents.mut_arg(POLICY, policies));
    let cli = Cli::from_arg_matches(&command.get_matches()).unwrap_or_else(|error| error.exit());
    match cli.command {
        Command::Run(args) => run(*args, &registry),
        Command::Compare(args) => compare(*args, &registry),
        Command::Agents(args) => agents(*args, &registry),
        Command::AgentsPlot(args) => agents_plot(args),
    }
}

fn agents_plot(args: AgentsPlotArgs) -> Result<()> {
    let mut sweeps = Vec::new();
    for item in &args.sweeps {
        let Some((label, path)) = item.split_once('=') else {
            bail!("`{item}` is not LABEL=PATH (e.g. avoidance=docs/evaluation/azure/agents/results.json)");
        };
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?;
        let sweep: sweep::Sweep = serde_json::from_str(&text)
            .with_context(|| format!("{path}: not the results.json of `simulate agents`"))?;
        sweeps.push((label.to_owned(), sweep));
    }
    let named: Vec<(&str, &sweep::Sweep)> = sweeps.iter().map(|(label, sweep)| (label.as_str(), sweep)).collect();
    sweep::plot_many(&named, &args.title, &args.out).with_context(|| format!("writing {}", args.out.display()))?;
    println!("wrote {}", args.out.display());
    Ok(())
}

fn agents(args: AgentsArgs, registry: &Registry) -> Result<()> {
    let run = &args.run;
    if run.out.is_some() || run.plot.is_some() || run.record_placements || run.print_config {
        bail!("--out, --plot, --record-placements and --print-config belong to `simulate run`; `simulate agents` writes into --out-dir");
    }
    let base = build_config(run)?;
    if base.drains.is_some() || base.consolidation.is_some() {
        bail!("--drains, --consolidation: migrations are not simulated with several agents");
    }
    let lags = args
        .lags
        .iter()
        .map(|text| text.parse::<Lag>().map_err(|e| anyhow!("--lags: {e}")))
        .collect::<Result<Vec<_>>>()?;
    let spec = SweepSpec {
        agents: args.agents.clone(),
        lags,
        seeds: if args.seeds.is_empty() { vec![base.seed] } else { args.seeds.clone() },
        assignment: by_name(&args.assign).with_context(|| format!("--assign {}", args.assign))?,
        max_attempts: args.attempts,
        avoidance: parse_avoidance(&args.avoidance)?,
        on_failure: by_name(&args.on_failure).with_context(|| format!("--on-failure {}", args.on_failure))?,
        retry: by_name(&args.retry).with_context(|| format!("--retry {}", args.retry))?,
    };
    spec.validate().map_err(|e| anyhow!("{e}"))?;
    let workload = Workload::load(&base.workload).context("loading the workload")?;
    let plan = spec.plan();
    let per_run = (workload.vms.len() + workload.exits_in_window()) as u64;
    let jobs = args.jobs.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let title = args.title.clone().unwrap_or_else(|| {
        format!("Allocation agents on one store: {} / {}", base.policy.kind, base.prediction.label())
    });
    eprintln!("{title}: {} runs, {} at a time, {} VMs each", plan.len(), jobs, workload.vms.len());
    let bar = progress_bar(run.quiet, per_run * plan.len() as u64);
    let result = sweep::run_sweep(&title, &workload, &base, &spec, registry, jobs, &|events| bar.inc(events))
        .context("running the agents")?;
    bar.finish_and_clear();
    print!("{}", sweep::markdown(&result));
    if let Some(dir) = &args.out_dir {
        for path in sweep::write_outputs(&result, dir).map_err(|e| anyhow!("writing the outputs: {e}"))? {
            println!("wrote {}", path.display());
        }
    }
    Ok(())
}

fn compare(args: CompareArgs, registry: &Registry) -> Result<()> {
    let text = std::fs::read_to_string(&args.experiment)
        .with_context(|| format!("reading the experiment {}", args.experiment.display()))?;
    let mut experiment = Experiment::from_toml(&text).with_context(|| format!("{}", args.experiment.display()))?;
    if args.run.policy.is_some() || args.run.prediction.is_some() || args.run.config.is_some() {
        bail!("--policy, --prediction and --config belong to `simulate run`; an experiment sets its policies and predictions in its file");
    }
    experiment.base = apply_flags(experiment.base.clone(), &args.run)?;
    if !args.seeds.is_empty() {
        experiment.seeds.clone_from(&args.seeds);
    }
    if let Some(model) = &args.model {
        for variant in &mut experiment.predictions {
            if let PredictionSourceConfig::Model { bundle, .. } | PredictionSourceConfig::Hybrid { bundle, .. } =
                &mut variant.prediction.source
            {
                bundle.clone_from(model);
            }
        }
    }
    let plan = experiment.plan(registry).with_context(|| format!("{}", args.experiment.display()))?;
    let workload = Workload::load(&experiment.base.workload).context("loading the workload")?;
    let per_run = (workload.vms.len() + workload.exits_in_window()) as u64;
    let jobs = args.jobs.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    eprintln!("{}: {} runs, {} at a time, {} VMs each", experiment.name, plan.len(), jobs, workload.vms.len());
    let bar = progress_bar(args.run.quiet, per_run * plan.len() as u64);
    let runs = compare::run_all(&workload, plan, registry, jobs, &|events| bar.inc(events))
        .context("running the experiment")?;
    bar.finish_and_clear();
    let comparison = Comparison::new(experiment, runs);
    print!("{}", compare::markdown(&comparison));
    for path in compare::write_outputs(&comparison, &args.out_dir).context("writing the outputs")? {
        println!("wrote {}", path.display());
    }
    Ok(())
}

/// A progress bar over `total` events on a terminal, hidden otherwise or with `--quiet`.
fn progress_bar(quiet: bool, total: u64) -> ProgressBar {
    let bar = if quiet || !std::io::stderr().is_terminal() {
        ProgressBar::hidden()
    } else {
        ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr())
    };
    bar.set_style(
        ProgressStyle::with_template(
            "{elapsed_precise} [{bar:40}] {human_pos}/{human_len} events ({per_sec}, eta {eta})",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar
}

fn run(args: RunArgs, registry: &Registry) -> Result<()> {
    let config = build_config(&args)?;
    if args.print_config {
        print!("{}", toml::to_string(&config).context("writing the configuration as TOML")?);
        return Ok(());
    }
    let workload = Workload::load(&config.workload).context("loading the workload")?;
    let total = (workload.vms.len() + workload.exits_in_window()) as u64;
    let bar = progress_bar(args.quiet, total);
    let result = engine::run(&workload, &config, registry, |done| bar.set_position(done)).context("simulating")?;
    bar.finish_and_clear();
    summary::print_summary(&result);
    if let Some(path) = &args.out {
        let json = serde_json::to_string_pretty(&result).context("encoding the result")?;
        std::fs::write(path, json).with_context(|| format!("writing --out {}", path.display()))?;
        println!("result written to {}", path.display());
    }
    if let Some(path) = &args.plot {
        let hours = |m: &crate::metrics::InstantMetrics| (m.time_s - result.workload.from_s) / 3600.0;
        let series = [
            Series::new(
                "packing density %",
                result.series.iter().map(|m| (hours(m), 100.0 * m.packing_density)).collect(),
            ),
            Series::new("empty hosts %", result.series.iter().map(|m| (hours(m), m.empty_hosts_pct)).collect()),
            Series::new(
                "offline bound packing density %",
                result.series.iter().map(|m| (hours(m), 100.0 * m.bound.packing_density)).collect(),
            ),
        ];
        let title = format!("{} / {}", result.final_stats.policy, result.prediction.source);
        plot::time_series_svg(path, &title, "%", &series)
            .with_context(|| format!("writing --plot {}", path.display()))?;
        println!("plot written to {}", path.display());
    }
    Ok(())
}

/// The configuration: the --config file (or the defaults), then every flag given.
fn build_config(args: &RunArgs) -> Result<SimConfig> {
    let config = match &args.config {
        Some(path) => {
            let text = std::fs::read_to_string(path).with_context(|| format!("reading --config {}", path.display()))?;
            toml::from_str::<SimConfig>(&text)
                .with_context(|| format!("--config {}: not a valid run configuration", path.display()))?
        }
        None => SimConfig::default(),
    };
    apply_flags(config, args)
}

/// `config` with every flag given applied over it.
fn apply_flags(mut config: SimConfig, args: &RunArgs) -> Result<SimConfig> {
    let host_cores = args.host_cores.unwrap_or(inventory_parts(&config.inventory).0);
    let host_memory_gib = args.host_memory_gib.unwrap_or(inventory_parts(&config.inventory).1);

    if args.trace.len() > 1 {
        if args.machine_id.is_some() {
            bail!(
                "--machine-id applies to one .sqlite --trace; a timeline of several --trace files takes CSV files only"
            );
        }
        for path in &args.trace {
            let name = path.to_string_lossy().to_ascii_lowercase();
            if name.ends_with(".sqlite") || name.ends_with(".db") {
                bail!("--trace {}: a timeline of several --trace files takes CSV files only", path.display());
            }
        }
        config.workload.trace = TraceSpec::Timeline { paths: args.trace.clone() };
    } else if let Some(path) = args.trace.first() {
        let machine = args.machine_id.map(|machine_id| MachineSpec {
            machine_id,
            cores: host_cores,
            memory_gib: host_memory_gib,
        });
        let is_sqlite = {
            let name = path.to_string_lossy().to_ascii_lowercase();
            name.ends_with(".sqlite") || name.ends_with(".db")
        };
        if is_sqlite && machine.is_none() {
            bail!("--trace {}: a .sqlite trace needs --machine-id (its VM sizes are fractions of that machine type, whose size is --host-cores and --host-memory-gib)", path.display());
        }
        config.workload.trace = TraceSpec::File { path: path.clone(), machine };
    } else if args.machine_id.is_some() {
        bail!("--machine-id only applies to a .sqlite --trace");
    }
    let synthetic_flags = args.synthetic_seed.is_some()
        || args.synthetic_days.is_some()
        || args.synthetic_warmup_days.is_some()
        || args.synthetic_requests_per_hour.is_some()
        || args.synthetic_tenants.is_some();
    if args.synthetic || synthetic_flags {
        if !args.trace.is_empty() {
            bail!("--synthetic-* flags describe the synthetic trace; leave out --trace to use it");
        }
        let mut spec = match &config.workload.trace {
            TraceSpec::Synthetic(spec) => spec.clone(),
            _ => SyntheticSpec::default(),
        };
        if let Some(v) = args.synthetic_seed {
            spec.seed = v;
        }
        if let Some(v) = args.synthetic_days {
            spec.days = positive("--synthetic-days", v)?;
        }
        if let Some(v) = args.synthetic_warmup_days {
            spec.warmup_days = non_negative("--synthetic-warmup-days", v)?;
        }
        if let Some(v) = args.synthetic_requests_per_hour {
            spec.requests_per_hour = positive("--synthetic-requests-per-hour", v)?;
        }
        if let Some(v) = args.synthetic_tenants {
            if v == 0 {
                bail!("--synthetic-tenants must be at least 1");
            }
            spec.tenants = v;
        }
        config.workload.trace = TraceSpec::Synthetic(spec);
    } else if args.trace.is_empty() && args.config.is_none() {
        bail!("no workload: give --trace PATH, --synthetic, or --config with a [workload] section");
    }
    if args.from_s.is_some() {
        config.workload.from_s = args.from_s;
    }
    if let Some(d) = args.duration_s {
        config.workload.duration_s = Some(positive("--duration-s", d)?);
    }
    if let Some(n) = args.max_vms {
        if n == 0 {
            bail!("--max-vms must be at least 1 (leave it out for no cap)");
        }
        config.workload.max_vms = Some(n);
    }

    // Inventory.
    let hosts_per_rack = args.hosts_per_rack.unwrap_or(inventory_parts(&config.inventory).2);
    if hosts_per_rack == 0 {
        bail!("--hosts-per-rack must be at least 1");
    }
    positive("--host-cores", host_cores)?;
    positive("--host-memory-gib", host_memory_gib)?;
    let fixed_hosts = match &config.inventory {
        Inventory::Fixed { hosts, .. } if !args.auto_hosts => Some(*hosts),
        _ => None,
    };
    config.inventory = match (args.hosts.or(fixed_hosts), &config.inventory) {
        (Some(0), _) => bail!("--hosts must be at least 1 (or use --auto-hosts to size the inventory to the trace)"),
        (Some(hosts), _) => Inventory::Fixed { hosts, cores: host_cores, memory_gib: host_memory_gib, hosts_per_rack },
        (None, previous) => {
            let default_headroom = match previous {
                Inventory::Auto { headroom, .. } => *headroom,
                Inventory::Fixed { .. } => 0.25,
            };
            let headroom = non_negative("--headroom", args.headroom.unwrap_or(default_headroom))?;
            Inventory::Auto { cores: host_cores, memory_gib: host_memory_gib, headroom, hosts_per_rack }
        }
    };

    // Policy.
    if let Some(p) = &args.policy {
        config.policy.kind = p.clone();
    }
    if let Some(b) = &args.buckets {
        config.policy.buckets = parse_buckets(b)?;
    }
    if let Some(t) = args.long_threshold_s {
        config.policy.long_threshold_s = positive("--long-threshold-s", t)?;
    }
    if let Some(p) = &args.prediction {
        config.prediction.source = parse_prediction(p)?;
    }
    if args.bundle_history {
        config.prediction.bundle_history = true;
    }
    if let Some(f) = args.fallback_fraction {
        if !(0.0..=1.0).contains(&f) {
            bail!("--fallback-fraction must be in [0, 1], got {f}");
        }
        config.prediction.fallback_fraction = f;
    }
    if let Some(r) = args.refresh_interval_s {
        config.reprediction.refresh_interval_s = non_negative("--refresh-interval-s", r)?;
    }
    if let Some(t) = &args.tie_break {
        config.tie_break = by_name(t).with_context(|| format!("--tie-break {t}"))?;
    }
    if let Some(e) = &args.engine {
        config.engine = by_name(e).with_context(|| format!("--engine {e}"))?;
    }
    if let Some(s) = args.seed {
        config.seed = s;
    }
    if let Some(s) = args.sample_interval_s {
        config.sample_interval_s = positive("--sample-interval-s", s)?;
    }
    if let Some(w) = args.warmup_s {
        config.warmup_s = non_negative("--warmup-s", w)?;
    }
    if let Some(t) = args.measure_from_s {
        if !t.is_finite() {
            bail!("--measure-from-s must be a finite trace time in seconds, got {t}");
        }
        config.measure_from_s = Some(t);
    }
    if let Some(n) = args.inflation_every {
        config.inflation_every = n;
    }
    if let Some(d) = &args.drains {
        config.drains = parse_drains(d)?;
    }
    if let Some(c) = &args.consolidation {
        config.consolidation = placement::consolidation::parse_flag(c).map_err(|e| anyhow!("--consolidation: {e}"))?;
    }
    if args.record_placements {
        config.record_placements = true;
    }
    if let Some(window) = args.quality_window {
        config.quality_window = Some(window);
    }
    config.validate().map_err(|e| anyhow!("{e}"))?;
    Ok(config)
}

fn inventory_parts(inventory: &Inventory) -> (f64, f64, usize) {
    match *inventory {
        Inventory::Fixed { cores, memory_gib, hosts_per_rack, .. }
        | Inventory::Auto { cores, memory_gib, hosts_per_rack, .. } => (cores, memory_gib, hosts_per_rack),
    }
}

fn positive(flag: &str, value: f64) -> Result<f64> {
    if value.is_finite() && value > 0.0 {
        Ok(value)
    } else {
        bail!("{flag} must be a number > 0, got {value}")
    }
}

fn non_negative(flag: &str, value: f64) -> Result<f64> {
    if value.is_finite() && value >= 0.0 {
        Ok(value)
    } else {
        bail!("{flag} must be a number >= 0, got {value}")
    }
}

fn parse_buckets(text: &str) -> Result<Buckets> {
    if text.eq_ignore_ascii_case("exact") {
        return Ok(Buckets::Exact);
    }
    match text.parse::<u32>() {
        Ok(k) if k > 0 => Ok(Buckets::Quantized(k)),
        _ => bail!("--buckets must be a whole number >= 1 or `exact`, got `{text}`"),
    }
}

/// `oracle`, `binned-oracle`, `none`, `model[:DIR]`, `accuracy:A`, `pr:P,R`, as the library reads them.
fn parse_prediction(text: &str) -> Result<PredictionSourceConfig> {
    PredictionSourceConfig::parse(text).map_err(|message| anyhow!("--prediction {message}"))
}

/// `off`, or `top=N,window=N,gain=X,share=on|off` (any of them).
fn parse_avoidance(text: &str) -> Result<Option<Avoidance>> {
    if text.trim() == "off" {
        return Ok(None);
    }
    let mut avoidance = Avoidance::default();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let Some((key, value)) = part.split_once('=') else {
            bail!("--avoidance: `{part}` is not KEY=VALUE (e.g. top=16,window=50,gain=10), or use `off`");
        };
        let whole = || -> Result<usize> {
            value
                .parse()
                .ok()
                .filter(|&n| n > 0)
                .ok_or_else(|| anyhow!("--avoidance {key} must be a whole number >= 1"))
        };
        match key {
            "top" => avoidance.top = whole()?,
            "window" => avoidance.window = whole()?,
            "gain" => {
                avoidance.gain = non_negative(
                    "--avoidance gain",
                    value.parse().map_err(|_| anyhow!("--avoidance gain=`{value}` is not a number"))?,
                )?
            }
            "share" => {
                avoidance.share = match value {
                    "on" => true,
                    "off" => false,
                    _ => bail!("--avoidance share=`{value}`: use on or off"),
                }
            }
            _ => bail!("--avoidance: unknown key `{key}` (top, window, gain, share)"),
        }
    }
    Ok(Some(avoidance))
}

/// `off`, or `every=S[,hosts=N][,pick=fewest-vms|rolling][,order=lars|arrival][,in-flight=K][,migration-s=S][,first=S]`.
fn parse_drains(text: &str) -> Result<Option<DrainPlan>> {
    if text == "off" {
        return Ok(None);
    }
    let mut plan = DrainPlan::default();
    let mut every = false;
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let Some((key, value)) = part.split_once('=') else {
            bail!("--drains: `{part}` is not KEY=VALUE (e.g. every=86400,hosts=10,order=lars)");
        };
        let number = || -> Result<f64> {
            value.parse::<f64>().map_err(|_| anyhow!("--drains: {key}=`{value}` is not a number"))
        };
        match key {
            "every" => {
                plan.every_s = positive("--drains every", number()?)?;
                every = true;
            }
            "first" => plan.first_after_s = Some(non_negative("--drains first", number()?)?),
            "hosts" => {
                plan.hosts_per_drain = value
                    .parse()
                    .ok()
                    .filter(|&n| n > 0)
                    .ok_or_else(|| anyhow!("--drains hosts must be a whole number >= 1"))?
            }
            "in-flight" => {
                plan.max_in_flight =
                    value.parse().ok().filter(|&n| n > 0 && n <= placement::defrag::MAX_IN_FLIGHT).ok_or_else(|| {
                        anyhow!("--drains in-flight must be between 1 and {}", placement::defrag::MAX_IN_FLIGHT)
                    })?
            }
            "migration-s" => plan.migration_s = non_negative("--drains migration-s", number()?)?,
            "pick" => {
                plan.rolling = match value {
                    "rolling" => true,
                    "fewest-vms" => false,
                    _ => bail!(
                        "--drains pick must be `rolling` (hosts in inventory order) or `fewest-vms`, got `{value}`"
                    ),
                }
            }
            "order" => {
                plan.order = match value {
                    "lars" | "longest-remaining-first" => MigrationOrder::LongestRemainingFirst,
                    "arrival" => MigrationOrder::Arrival,
                    _ => bail!("--drains order must be `lars` or `arrival`, got `{value}`"),
                }
            }
            _ => bail!("--drains: unknown key `{key}` (every, first, hosts, pick, order, in-flight, migration-s)"),
        }
    }
    if !every {
        bail!("--drains needs every=SECONDS (e.g. --drains every=86400,hosts=10)");
    }
    Ok(Some(plan))
}
