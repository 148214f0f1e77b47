//! `inference-client`: asks a running inference server about the VMs of a trace and compares its
//! answers with the lifetimes the trace records: a quick check of what a deployment serves.

use anyhow::{bail, Context, Result};
use clap::Parser;
use domain::{FeatureValue, PredictInstance, PredictRequest, PredictResponse};
use lifetime_model::metrics::Scored;
use std::collections::BTreeMap;
use std::path::PathBuf;
use traces::stats::format_duration;
use traces::{TraceSource, VmRecord};

#[derive(Parser)]
#[command(name = "inference-client", version, about = "Query an inference server with the VMs of a trace")]
struct Cli {
    /// The trace (.csv or .csv.gz).
    trace: PathBuf,
    /// Base URL of the inference server.
    #[arg(long, default_value = "http://127.0.0.1:8081")]
    server: String,
    /// Skip VMs that arrived before this trace time (seconds).
    #[arg(long, default_value_t = f64::NEG_INFINITY, allow_negative_numbers = true)]
    from_s: f64,
    /// How many VMs to ask about.
    #[arg(long, default_value_t = 2000)]
    vms: usize,
    /// VMs per request.
    #[arg(long, default_value_t = 64)]
    batch: usize,
    /// How many of the answers to print.
    #[arg(long, default_value_t = 10)]
    show: usize,
    /// Long-lived threshold in hours for the comparison.
    #[arg(long, default_value_t = 2.0)]
    long_threshold_hours: f64,
}

fn instance(record: &VmRecord) -> PredictInstance {
    let mut features = BTreeMap::new();
    let mut os = None;
    for (name, value) in record.extra.iter() {
        if name == "os" {
            os = Some(value.to_owned()).filter(|v| !v.is_empty());
        } else if let Ok(number) = value.parse::<f64>() {
            features.insert(name.to_owned(), FeatureValue::Number(number));
        } else if !value.is_empty() {
            features.insert(name.to_owned(), FeatureValue::Text(value.to_owned()));
        }
    }
    PredictInstance {
        key: Some(record.vm_id.clone()),
        tenant_id: record.tenant_id.clone(),
        vm_type: record.vm_type.clone(),
        cores: record.cores,
        memory_gib: record.memory_gib,
        priority: record.priority,
        os,
        requested_at_s: Some(record.start_s),
        features: features.into(),
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    let cli = Cli::parse();
    if cli.batch == 0 || cli.vms == 0 {
        bail!("--batch and --vms must be at least 1");
    }
    let threshold = cli.long_threshold_hours * 3_600.0;
    let reader = TraceSource::from_path(&cli.trace, None)?.open()?;
    let mut records = Vec::new();
    for record in reader {
        let record = record?;
        // Only VMs whose true lifetime is known.
        let known = record.lifetime_s().is_some();
        if record.start_s >= cli.from_s && known {
            records.push(record);
            if records.len() == cli.vms {
                break;
            }
        }
    }
    if records.is_empty() {
        bail!("no completed VM in {} after t = {} s", cli.trace.display(), cli.from_s);
    }

    // The server's service credential, from the environment (never a flag: command lines are
    // visible to every user of the machine); none for a server in open mode.
    let service_token = service_common::auth::token_from_env("INFERENCE_SERVICE_TOKEN", None)?;
    let mut headers = reqwest::header::HeaderMap::new();
    if let Some(token) = service_token {
        let value = reqwest::header::HeaderValue::from_str(&format!("Bearer {token}"))
            .context("INFERENCE_SERVICE_TOKEN must be printable ASCII")?;
        headers.insert(reqwest::header::AUTHORIZATION, value);
    }
    let client = reqwest::Client::builder().default_headers(headers).build().context("building the HTTP client")?;
    let mut predictions = Vec::with_capacity(records.len());
    let started = std::time::Instant::now();
    for chunk in records.chunks(cli.batch) {
        let request = PredictRequest {
            instances: chunk.iter().map(instance).collect(),
            interval_class: true,
            history: Vec::new(),
        };
        let response = client
            .post(format!("{}/v1/predict", cli.server.trim_end_matches('/')))
            .json(&request)
            .send()
            .await
            .with_context(|| format!("calling {}", cli.server))?;
        if !response.status().is_success() {
            bail!("the server answered {}: {}", response.status(), response.text().await.unwrap_or_default());
        }
        let body: PredictResponse = response.json().await.context("reading the answer")?;
        predictions.extend(body.predictions);
    }
    let elapsed = started.elapsed();

    println!("| VM | type | cores | true lifetime | P(long) | class | interval | expected lifetime | model |");
    println!("|---|---|---:|---:|---:|---|---:|---:|---|");
    for (record, p) in records.iter().zip(&predictions).take(cli.show) {
        println!(
            "| {} | {} | {} | {} | {:.3} | {:?} | {} | {} | {} |",
            record.vm_id,
            record.vm_type,
            record.cores,
            record.lifetime_s().map_or("-".to_owned(), format_duration),
            p.p_long,
            p.class,
            p.interval_class.map_or("-".to_owned(), |c| c.to_string()),
            p.expected_lifetime_s.map_or("-".to_owned(), format_duration),
            p.model_version.as_deref().unwrap_or("-"),
        );
    }
    let scores: Vec<f64> = predictions.iter().map(|p| p.p_long).collect();
    let labels: Vec<bool> = records.iter().map(|r| r.lifetime_s().is_some_and(|l| l >= threshold)).collect();
    let correct =
        predictions.iter().zip(&labels).filter(|(p, &long)| (p.class == domain::LifetimeClass::Long) == long).count();
    let scored = Scored::new(&scores, &labels);
    println!(
        "\n{} VMs in {} requests, {:.1} ms: {:.1}% long-lived, accuracy {:.3}, ROC AUC {:.3}",
        records.len(),
        records.len().div_ceil(cli.batch),
        elapsed.as_secs_f64() * 1e3,
        100.0 * scored.positives() as f64 / scored.len() as f64,
        correct as f64 / records.len() as f64,
        scored.roc_auc()
    );
    Ok(())
}
