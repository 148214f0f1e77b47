//! `vmtrace`: generate synthetic traces, print statistics of any trace, convert traces to the
//! project's CSV.

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use std::path::PathBuf;
use std::time::Instant;
use traces::azure_sqlite::MachineType;
use traces::csv_format::CsvTraceWriter;
use traces::synthetic::{generate, SyntheticConfig};
use traces::{TraceSource, TraceStatsBuilder, VmRecord};

#[derive(Parser)]
#[command(name = "vmtrace", version, about = "Generate, inspect and convert VM request traces")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate a seeded synthetic trace calibrated to the papers' statistics and write it as CSV.
    Generate(GenerateArgs),
    /// Print statistics of a trace: .csv, .csv.gz, or an Azure packing-trace .sqlite/.db.
    Stats(StatsArgs),
    /// Convert any trace to the project's CSV (.csv or .csv.gz).
    Convert(ConvertArgs),
}

#[derive(Args)]
struct GenerateArgs {
    /// Output file; `.gz` compresses.
    #[arg(long, short)]
    out: PathBuf,
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Days after time 0.
    #[arg(long, default_value_t = 7.0)]
    days: f64,
    /// Days of warm-up before time 0 whose survivors appear with negative starts.
    #[arg(long, default_value_t = 2.0)]
    warmup_days: f64,
    /// Mean tenant requests per hour before the diurnal cycle and bursts.
    #[arg(long, default_value_t = 400.0)]
    requests_per_hour: f64,
    #[arg(long, default_value_t = 1500)]
    tenants: usize,
    /// Keep the true end time of VMs still running at the end instead of leaving it empty.
    #[arg(long)]
    no_censor: bool,
    /// Also print the statistics of the generated trace.
    #[arg(long)]
    stats: bool,
}

#[derive(Args)]
struct MachineArgs {
    /// For .sqlite traces: the `machineId` whose fractional VM sizes to use.
    #[arg(long)]
    machine_id: Option<i64>,
    /// For .sqlite traces: cores of that machine type.
    #[arg(long)]
    machine_cores: Option<f64>,
    /// For .sqlite traces: memory of that machine type in GiB.
    #[arg(long)]
    machine_memory_gib: Option<f64>,
}

impl MachineArgs {
    fn machine(&self) -> Result<Option<MachineType>> {
        match (self.machine_id, self.machine_cores, self.machine_memory_gib) {
            (None, None, None) => Ok(None),
            (Some(machine_id), Some(cores), Some(memory_gib)) => {
                if !(cores.is_finite() && cores > 0.0) {
                    bail!("--machine-cores must be a positive number, got {cores}");
                }
                if !(memory_gib.is_finite() && memory_gib > 0.0) {
                    bail!("--machine-memory-gib must be a positive number, got {memory_gib}");
                }
                Ok(Some(MachineType { machine_id, cores, memory_gib, ssd_gib: 0.0 }))
            }
            _ => bail!("a .sqlite trace needs all of --machine-id, --machine-cores and --machine-memory-gib"),
        }
    }
}

#[derive(Args)]
struct StatsArgs {
    /// The trace file.
    trace: PathBuf,
    #[command(flatten)]
    machine: MachineArgs,
    /// When the trace was cut, in trace seconds (its censoring time); defaults to its latest
    /// start or end time.
    #[arg(long)]
    trace_end_s: Option<f64>,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct ConvertArgs {
    /// The input trace.
    input: PathBuf,
    /// The output CSV; `.gz` compresses.
    #[arg(long, short)]
    out: PathBuf,
    #[command(flatten)]
    machine: MachineArgs,
}

fn main() -> Result<()> {
    match Cli::parse().command {
        Command::Generate(args) => run_generate(args),
        Command::Stats(args) => run_stats(args),
        Command::Convert(args) => run_convert(args),
    }
}

fn counting_spinner(what: &str) -> ProgressBar {
    let bar = ProgressBar::new_spinner();
    bar.set_style(
        ProgressStyle::with_template("{spinner} {msg} {human_pos} VMs ({per_sec}) {elapsed}")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    bar.set_message(what.to_owned());
    bar
}

fn run_generate(args: GenerateArgs) -> Result<()> {
    let config = SyntheticConfig {
        seed: args.seed,
        span_days: args.days,
        warmup_days: args.warmup_days,
        requests_per_hour: args.requests_per_hour,
        tenants: args.tenants,
        censor: !args.no_censor,
    };
    // The library names the setting as the flag does, without its dashes.
    config.validate().map_err(|e| {
        let flag = |name: &str| format!("--{}", name.replace('_', "-"));
        anyhow::anyhow!("{} {}", flag(e.field), e.message.replace("warmup_days", &flag("warmup_days")))
    })?;
    let started = Instant::now();
    let records = generate(&config);
    let names = records.first().map(|r| r.extra.names().to_vec()).unwrap_or_default();
    let bar = ProgressBar::new(records.len() as u64).with_message("writing");
    let mut writer = CsvTraceWriter::create(&args.out, &names)?;
    let mut stats = TraceStatsBuilder::new();
    for record in &records {
        writer.write(record)?;
        stats.push(record);
        bar.inc(1);
    }
    writer.finish()?;
    bar.finish_and_clear();
    println!(
        "wrote {} VMs to {} (seed {}, {} days) in {:.2} s",
        records.len(),
        args.out.display(),
        args.seed,
        args.days,
        started.elapsed().as_secs_f64()
    );
    if args.stats {
        println!("{}", stats.finish());
    }
    Ok(())
}

fn read_all(path: &PathBuf, machine: &MachineArgs, mut each: impl FnMut(&VmRecord) -> Result<()>) -> Result<u64> {
    let source = TraceSource::from_path(path, machine.machine()?)?;
    let mut reader = source.open().with_context(|| format!("opening {}", path.display()))?;
    let bar = counting_spinner("reading");
    for record in reader.by_ref() {
        let record = record.with_context(|| format!("reading {}", path.display()))?;
        each(&record)?;
        bar.inc(1);
    }
    bar.finish_and_clear();
    Ok(reader.skipped())
}

fn run_stats(args: StatsArgs) -> Result<()> {
    if let Some(end) = args.trace_end_s.filter(|end| !end.is_finite()) {
        bail!("--trace-end-s must be a finite number of seconds, got {end}");
    }
    let started = Instant::now();
    let mut stats = TraceStatsBuilder::new().with_trace_end(args.trace_end_s);
    let skipped = read_all(&args.trace, &args.machine, |record| {
        stats.push(record);
        Ok(())
    })?;
    let stats = stats.finish();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&stats)?);
    } else {
        println!("trace               {}", args.trace.display());
        print!("{stats}");
        if skipped > 0 {
            println!("skipped             {skipped} VMs whose type the chosen machine cannot host");
        }
        println!("read in             {:.2} s", started.elapsed().as_secs_f64());
    }
    Ok(())
}

fn run_convert(args: ConvertArgs) -> Result<()> {
    let mut writer: Option<CsvTraceWriter> = None;
    let mut written = 0u64;
    let skipped = read_all(&args.input, &args.machine, |record| {
        let writer = match &mut writer {
            Some(writer) => writer,
            None => writer.insert(CsvTraceWriter::create(&args.out, record.extra.names())?),
        };
        writer.write(record)?;
        written += 1;
        Ok(())
    })?;
    match writer {
        Some(writer) => writer.finish()?,
        None => bail!("{} holds no VMs; nothing written", args.input.display()),
    }
    println!("wrote {written} VMs to {} ({skipped} skipped)", args.out.display());
    Ok(())
}
