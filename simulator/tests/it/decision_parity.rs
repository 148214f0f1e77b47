//! Decision parity: every published policy places a small checked-in trace exactly as it did when
//! its fingerprint was recorded. A refactoring of the placement core, the rules, the index, the
//! predictions or the repredictions that changes any decision fails here, naming the policy.
//!
//! The trace (`tests/data/parity-trace.csv.gz`): the first 6,000 VMs of `vmtrace generate --days 3
//! --seed 11`, warm-up VMs included (regular and low priority, OS, extra feature columns). Each
//! policy runs with oracle predictions; NILAS and LAVA also with the checked-in default model
//! (`models/default`), whose predictions and in-process repredictions they then read. Lowest-index
//! ties, so the run has no randomness to hide a change.
//!
//! The fingerprints (`tests/data/decision-parity.txt`): per run, the SHA-256 of every VM's host in
//! order, the placed and rejected counts, and the time-averaged packing density and empty hosts.
//! After a change that is *meant* to change decisions, rewrite them with
//! `DECISION_PARITY_UPDATE=1 cargo test --release -p simulator --test it decision_parity::` and say why
//! in the commit.

use placement::{PolicyConfig, Registry, TieBreak};
use sha2::{Digest, Sha256};
use simulator::engine::{run, SimConfig};
use simulator::predict::{PredictionConfig, PredictionSourceConfig};
use simulator::workload::{Inventory, TraceSpec, Workload, WorkloadConfig};
use std::path::PathBuf;

fn here(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// `policy source sha256 placed rejected density empty-hosts` for one run.
fn fingerprint(workload: &Workload, policy: &str, model: bool) -> String {
    let source = if model {
        PredictionSourceConfig::Model { bundle: here("../models/default"), reading: None }
    } else {
        PredictionSourceConfig::Oracle
    };
    let config = SimConfig {
        workload: workload_config(),
        // Peak demand plus 5%: hosts fill and empty, and the policies' choices matter.
        inventory: Inventory::Auto { cores: 48.0, memory_gib: 192.0, headroom: 0.05, hosts_per_rack: 8 },
        policy: PolicyConfig::preset(policy),
        tie_break: TieBreak::LowestIndex,
        prediction: PredictionConfig { source, ..PredictionConfig::default() },
        sample_interval_s: 600.0,
        record_placements: true,
        ..SimConfig::default()
    };
    let result = run(workload, &config, &Registry::standard(), |_| {}).expect("the run completes");
    let mut hash = Sha256::new();
    let placements = result.placements.as_ref().expect("placements recorded");
    for placement in placements {
        hash.update(placement.vm_id.as_bytes());
        hash.update(b" ");
        hash.update(placement.host_id.as_deref().unwrap_or("-").as_bytes());
        hash.update(b"\n");
    }
    let digest: String = hash.finalize().iter().map(|byte| format!("{byte:02x}")).collect();
    format!(
        "{policy} {} {digest} {} {} {:.9} {:.9}",
        if model { "model" } else { "oracle" },
        result.counters.placed,
        result.counters.rejected,
        result.metrics.packing_density,
        result.metrics.empty_hosts_pct,
    )
}

fn workload_config() -> WorkloadConfig {
    WorkloadConfig {
        trace: TraceSpec::File { path: here("tests/data/parity-trace.csv.gz"), machine: None },
        ..WorkloadConfig::default()
    }
}

#[test]
fn every_published_policy_places_the_parity_trace_as_recorded() {
    let workload = Workload::load(&workload_config()).expect("the parity trace loads");
    let runs = [
        ("pbfr", false),
        ("dpbfr", false),
        ("la-binary", false),
        ("la-multiclass", false),
        ("nilas", false),
        ("lava", false),
        ("nilas", true),
        ("lava", true),
    ];
    let actual: Vec<String> = runs.iter().map(|&(policy, model)| fingerprint(&workload, policy, model)).collect();
    let path = here("tests/data/decision-parity.txt");
    if std::env::var_os("DECISION_PARITY_UPDATE").is_some() {
        std::fs::write(&path, actual.join("\n") + "\n").expect("the fingerprints are written");
        return;
    }
    let recorded = std::fs::read_to_string(&path).expect("tests/data/decision-parity.txt");
    let recorded: Vec<&str> = recorded.lines().collect();
    assert_eq!(recorded.len(), actual.len(), "one recorded fingerprint per run");
    for (recorded, actual) in recorded.iter().zip(&actual) {
        assert_eq!(
            recorded, actual,
            "decisions changed (recorded, then now); if meant, rerun with DECISION_PARITY_UPDATE=1"
        );
    }
    // The runs differ from each other: the fingerprints see the policies' decisions.
    let digests: std::collections::BTreeSet<&str> =
        actual.iter().map(|line| line.split(' ').nth(2).unwrap_or_default()).collect();
    assert!(digests.len() >= 6, "the policies should place differently: {actual:#?}");
}
