//! `lifetime-train`: trains the lifetime models on a trace and writes a model bundle with its
//! evaluation report (Markdown, JSON in the manifest, SVG plots).
//!
//! `lifetime-train --seal DIR` instead (re)writes the SHA-256 checksums of an existing bundle into its
//! manifest, after checking that it loads: for a bundle changed by hand, or written before checksums.

use anyhow::{bail, Context, Result};
use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};
use lifetime_model::bundle::{seal, LoadLimits};
use lifetime_model::features::FeatureGroup;
use lifetime_train::train::{train_bundle, FeatureChoice, Progress, ServedReading, TrainConfig, TrainData};
use std::path::PathBuf;
use std::time::{Duration, Instant};
use traces::{TraceSource, VmRecord};

#[derive(Parser)]
#[command(name = "lifetime-train", version, about = "Train lifetime models on a trace and write a model bundle")]
struct Cli {
    /// Seal the existing bundle in DIR: write the checksums of its files into its manifest (after
    /// checking that it loads) and train nothing. For bundles changed by hand; the trainer seals
    /// the bundles it writes.
    #[arg(long, value_name = "DIR", conflicts_with_all = ["train", "out", "eval"])]
    seal: Option<PathBuf>,
    /// Training trace (.csv, .csv.gz). Without --eval, its later part evaluates (see --train-fraction).
    #[arg(long, required_unless_present = "seal")]
    train: Option<PathBuf>,
    /// A later trace to evaluate on (for example the test split of the same source).
    #[arg(long)]
    eval: Option<PathBuf>,
    /// Bundle directory to write.
    #[arg(long, short, required_unless_present = "seal")]
    out: Option<PathBuf>,
    #[arg(long, default_value = "lifetime")]
    name: String,
    /// Bundle version; defaults to the name plus the current Unix time.
    #[arg(long)]
    version: Option<String>,
    /// Share of the training trace's time span used for training when --eval is not given.
    #[arg(long, default_value_t = 0.7)]
    train_fraction: f64,
    /// A VM is long-lived when it lives at least this many hours.
    #[arg(long, default_value_t = 2.0)]
    long_threshold_hours: f64,
    /// Lifetime-interval cut-offs in minutes, ascending, comma-separated (default 15 x 2^i, i = 0..9).
    #[arg(long, value_delimiter = ',')]
    class_cutoffs_minutes: Option<Vec<f64>>,
    /// When the traces were cut (censoring time), in trace seconds; defaults to the latest timestamp.
    #[arg(long)]
    trace_end_s: Option<f64>,
    /// Most boosting rounds; each model's rounds are chosen on the validation split, up to this.
    #[arg(long, default_value_t = 300)]
    iterations: usize,
    /// Share of the training period, at its end, that validates the choices of feature groups and
    /// rounds (the models are then refitted on the whole training period).
    #[arg(long, default_value_t = 0.25)]
    validation_fraction: f64,
    /// Validation rounds without improvement after which a model stops.
    #[arg(long, default_value_t = 50)]
    early_stopping_rounds: usize,
    /// Fewest rounds of a refitted model.
    #[arg(long, default_value_t = 10)]
    min_rounds: usize,
    /// Feature groups to drop, comma-separated (weekday, tenant, job), or `none` to keep them all; without
    /// it the groups are chosen on the validation split.
    #[arg(long, value_delimiter = ',', value_name = "GROUPS")]
    drop: Option<Vec<String>>,
    /// Leaves per tree.
    #[arg(long, default_value_t = 63)]
    num_leaves: usize,
    /// At most this many VMs are expanded into remaining-lifetime examples.
    #[arg(long, default_value_t = 150_000)]
    max_remaining_vms: usize,
    /// About this many person-period rows per lifetime interval at most train the survival model
    /// (the crowded early intervals are sampled and weighted; the late ones are kept whole).
    #[arg(long, default_value_t = 50_000)]
    max_hazard_rows_per_interval: usize,
    /// What the bundle serves of its lifetime distribution: `auto` (the default: the candidate that
    /// orders the validation split's long-lived VMs' exits best), `median`, `quantile:Q`,
    /// `mean:SECONDS` (the expected lifetime truncated there) or `geomean`. The simulator can read
    /// it otherwise.
    #[arg(long, default_value = "auto", value_name = "READING")]
    survival_reading: ServedReading,
    /// Upper edges of the survival model's lifetime intervals in minutes, comma-separated and
    /// ascending (default: 5 minutes to 28 days, finer where most VMs end).
    #[arg(long, value_delimiter = ',', value_name = "MINUTES", conflicts_with = "no_survival")]
    survival_edges_minutes: Option<Vec<f64>>,
    /// Train no survival model (the bundle then serves the remaining-lifetime regression, as
    /// bundles did before it).
    #[arg(long)]
    no_survival: bool,
    #[arg(long, default_value_t = 2)]
    threads: usize,
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// Deal the training trace's lifetimes out at random with this seed before training (the
    /// evaluation part of a time split too): a deliberately bad bundle, for testing the quality
    /// gate and canaries. Never for a bundle meant to serve.
    #[arg(long, value_name = "SEED")]
    shuffle_labels: Option<u64>,
}

struct Stages(ProgressBar);

impl Progress for Stages {
    fn stage(&self, name: &str) {
        self.0.inc(1);
        self.0.set_message(name.to_owned());
    }
}

fn load(path: &PathBuf) -> Result<Vec<VmRecord>> {
    let reader = TraceSource::from_path(path, None)?.open()?;
    reader.collect::<Result<Vec<_>, _>>().with_context(|| format!("reading {}", path.display()))
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    if let Some(dir) = &cli.seal {
        let manifest = seal(dir, &LoadLimits::default()).with_context(|| format!("sealing {}", dir.display()))?;
        println!("sealed bundle {} (version {}) in {}", manifest.name, manifest.version, dir.display());
        for (file, checksum) in &manifest.checksums {
            println!("  sha256 {checksum}  {file}");
        }
        return Ok(());
    }
    // clap enforces both without --seal.
    let (Some(train_path), Some(out)) = (cli.train.clone(), cli.out.clone()) else {
        bail!("--train and --out are required (or --seal DIR)");
    };
    if !(cli.long_threshold_hours.is_finite() && cli.long_threshold_hours > 0.0) {
        bail!("--long-threshold-hours must be a positive number, got {}", cli.long_threshold_hours);
    }
    let defaults = TrainConfig::default();
    let class_cutoffs_s = match &cli.class_cutoffs_minutes {
        Some(minutes) => {
            if minutes.iter().any(|m| !(m.is_finite() && *m > 0.0)) || minutes.windows(2).any(|w| w[0] >= w[1]) {
                bail!("--class-cutoffs-minutes must be positive and ascending, got {minutes:?}");
            }
            minutes.iter().map(|m| m * 60.0).collect()
        }
        None => defaults.class_cutoffs_s.clone(),
    };
    let features = match &cli.drop {
        None => FeatureChoice::Auto,
        Some(names) if names.iter().all(|n| n.trim().eq_ignore_ascii_case("none")) => FeatureChoice::Drop(Vec::new()),
        Some(names) => FeatureChoice::Drop(
            names
                .iter()
                .map(|n| n.parse::<FeatureGroup>())
                .collect::<Result<_, _>>()
                .with_context(|| "--drop takes `none` or a comma-separated list of weekday, tenant, job")?,
        ),
    };
    let started = Instant::now();
    let mut train = load(&train_path)?;
    if let Some(seed) = cli.shuffle_labels {
        eprintln!("warning: --shuffle-labels: the labels no longer follow the features; this bundle is bad on purpose");
        lifetime_model::dataset::shuffle_lifetimes(&mut train, seed);
    }
    let eval = cli.eval.as_ref().map(load).transpose()?;
    let source = match &cli.eval {
        Some(eval) => format!("train {} / evaluate {}", train_path.display(), eval.display()),
        None => format!(
            "{} (time split {:.0}% / {:.0}%)",
            train_path.display(),
            cli.train_fraction * 100.0,
            (1.0 - cli.train_fraction) * 100.0
        ),
    };
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let config = TrainConfig {
        version: cli.version.clone().unwrap_or_else(|| format!("{}-{now}", cli.name)),
        name: cli.name.clone(),
        long_threshold_s: cli.long_threshold_hours * 3_600.0,
        class_cutoffs_s,
        train_fraction: cli.train_fraction,
        iterations: cli.iterations,
        validation_fraction: cli.validation_fraction,
        early_stopping_rounds: cli.early_stopping_rounds,
        min_rounds: cli.min_rounds,
        features,
        num_leaves: cli.num_leaves,
        max_remaining_vms: cli.max_remaining_vms,
        max_hazard_rows_per_interval: cli.max_hazard_rows_per_interval,
        survival_edges_s: match (&cli.survival_edges_minutes, cli.no_survival) {
            (_, true) => Vec::new(),
            (Some(minutes), false) => minutes.iter().map(|m| m * 60.0).collect(),
            (None, false) => defaults.survival_edges_s.clone(),
        },
        survival_reading: cli.survival_reading,
        threads: cli.threads,
        seed: cli.seed,
        ..defaults
    };

    let bar = ProgressBar::no_length();
    bar.set_style(
        ProgressStyle::with_template("{spinner} [{pos}] {msg} ({elapsed})")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    bar.enable_steady_tick(Duration::from_millis(200));
    let manifest = train_bundle(
        TrainData { source, train, eval, trace_end_s: cli.trace_end_s },
        &config,
        &out,
        &Stages(bar.clone()),
    )?;
    bar.finish_and_clear();

    let (report, warning) =
        lifetime_train::plots::write_report(&manifest, &out).with_context(|| "writing evaluation.md")?;
    if let Some(warning) = warning {
        eprintln!("warning: {warning}");
    }
    println!("bundle {} (version {}) written to {}", manifest.name, manifest.version, out.display());
    println!(
        "trained on {} VMs before t = {:.0} s, evaluated on {} VMs after, in {:.1} s\n",
        manifest.training.training_vms,
        manifest.training.cutoff_s,
        manifest.training.evaluation_vms,
        started.elapsed().as_secs_f64()
    );
    println!("{report}");
    println!("plots: {} and {}", out.join("roc.svg").display(), out.join("reprediction.svg").display());
    Ok(())
}
