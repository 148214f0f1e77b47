//! Training examples from a replayed trace: rows and labels per model, the remaining-lifetime
//! model's rows at sampled ages and the hazard model's person-period rows.

use super::*;

/// Feature rows (row-major) with their labels and, when sampled unevenly, their weights.
pub(super) struct Examples {
    pub(super) n_features: usize,
    pub(super) rows: Vec<f64>,
    pub(super) labels: Vec<f32>,
    /// One per row, or none: every row weighs 1.
    pub(super) weights: Vec<f32>,
}

impl Examples {
    pub(super) fn new(n_features: usize) -> Self {
        Examples { n_features, rows: Vec::new(), labels: Vec::new(), weights: Vec::new() }
    }

    pub(super) fn row(&self, i: usize) -> &[f64] {
        &self.rows[i * self.n_features..(i + 1) * self.n_features]
    }

    pub(super) fn weight(&self, i: usize) -> f64 {
        self.weights.get(i).map_or(1.0, |&w| f64::from(w))
    }

    /// The rows as a LightGBM dataset (built against `reference`'s bins when given).
    pub(super) fn dataset(&self, reference: Option<&Dataset>) -> Result<Dataset, TrainError> {
        let n = self.n_features as i32;
        let mut dataset = match reference {
            Some(reference) => Dataset::from_slice_with_reference(&self.rows, &self.labels, n, true, Some(reference))?,
            None => Dataset::from_slice(&self.rows, &self.labels, n, true)?,
        };
        if !self.weights.is_empty() {
            dataset.set_weights(&self.weights)?;
        }
        Ok(dataset)
    }
}

/// The columns `cols` of VM `i`'s row.
pub(super) fn push_row(out: &mut Vec<f64>, replayed: &ReplayedTrace, i: usize, cols: &[usize]) {
    let row = replayed.row(i);
    out.extend(cols.iter().map(|&c| row[c]));
}

/// The labelled VMs of `idx`, with columns `cols`.
pub(super) fn gather(
    replayed: &ReplayedTrace,
    idx: &[usize],
    cols: &[usize],
    label: impl Fn(usize) -> Option<f32>,
) -> Examples {
    let mut examples = Examples::new(cols.len());
    for &i in idx {
        if let Some(y) = label(i) {
            push_row(&mut examples.rows, replayed, i, cols);
            examples.labels.push(y);
        }
    }
    examples
}

/// The examples of `model` from the VMs `idx`, labelled by `label`.
pub(super) fn examples(
    model: Model,
    replayed: &ReplayedTrace,
    idx: &[usize],
    cols: &[usize],
    config: &TrainConfig,
    label: impl Fn(usize) -> ObservedLifetime,
) -> Examples {
    match model {
        Model::Binary => gather(replayed, idx, cols, |i| binary_label(&label(i), config.long_threshold_s)),
        Model::Multiclass => {
            gather(replayed, idx, cols, |i| label(i).interval_class(&config.class_cutoffs_s).map(|c| c as f32))
        }
        Model::Remaining => remaining_examples(replayed, idx, cols, config, label),
        Model::Hazard => hazard_examples(replayed, idx, cols, config, label),
    }
}

pub(super) fn binary_label(observed: &ObservedLifetime, threshold_s: f64) -> Option<f32> {
    observed.at_least(threshold_s).map(|long| f32::from(u8::from(long)))
}

/// Expands VMs into (base row + log10 uptime, log10 capped remaining lifetime) examples. A VM
/// counts when its remaining lifetime at that uptime is known: it ended, or it was still running
/// beyond the cap.
pub(super) fn remaining_examples(
    replayed: &ReplayedTrace,
    idx: &[usize],
    cols: &[usize],
    config: &TrainConfig,
    label: impl Fn(usize) -> ObservedLifetime,
) -> Examples {
    let stride = idx.len().div_ceil(config.max_remaining_vms.max(1)).max(1);
    let mut examples = Examples::new(cols.len() + 1);
    for &i in idx.iter().step_by(stride) {
        let observed = label(i);
        for fraction in UPTIME_FRACTIONS {
            let uptime = fraction * observed.seconds;
            let remaining = observed.seconds - uptime;
            if observed.censored && remaining < config.remaining_cap_s {
                continue;
            }
            push_row(&mut examples.rows, replayed, i, cols);
            examples.rows.push(encode_uptime(uptime));
            examples.labels.push(remaining.clamp(1.0, config.remaining_cap_s).log10() as f32);
        }
    }
    examples
}

/// Expands VMs into person-period rows of the hazard model: base row + interval index, labelled 1
/// for the interval the VM ended in and 0 for each interval it outlived. A censored VM gives only
/// the intervals it outlived (it is never dropped: those rows are what it tells). A VM is
/// followed up to the last edge; past it the model says nothing.
///
/// Early intervals have every VM at risk, late ones only the long-lived few, whose order is what
/// the exit times need. So rows are sampled per interval, not per VM: an interval keeps at most
/// about `max_hazard_rows_per_interval` of its rows, chosen at random (seeded), each weighted by
/// the inverse of its interval's rate so that the likelihood stays the full data's. Every row of
/// the sparse late intervals is kept.
pub(super) fn hazard_examples(
    replayed: &ReplayedTrace,
    idx: &[usize],
    cols: &[usize],
    config: &TrainConfig,
    label: impl Fn(usize) -> ObservedLifetime,
) -> Examples {
    let edges = &config.survival_edges_s;
    // The intervals VM `i` gives a row for, and whether it ended in the last of them.
    let rows_of = |i: usize| -> (usize, bool) {
        let observed = label(i);
        match edges.iter().position(|&upper| observed.seconds < upper) {
            Some(j) if observed.censored => (j, false), // still running inside interval j: no verdict on it
            Some(j) => (j + 1, true),
            None => (edges.len(), false),
        }
    };
    let mut at_risk = vec![0usize; edges.len()];
    for &i in idx {
        for count in &mut at_risk[..rows_of(i).0] {
            *count += 1;
        }
    }
    let cap = config.max_hazard_rows_per_interval.max(1) as f64;
    let rate: Vec<f64> = at_risk.iter().map(|&n| (cap / n.max(1) as f64).min(1.0)).collect();
    let mut examples = Examples::new(cols.len() + 1);
    for &i in idx {
        let (intervals, ended) = rows_of(i);
        for (j, &rate) in rate[..intervals].iter().enumerate() {
            if rate < 1.0 && unit_hash(config.seed, i, j) >= rate {
                continue;
            }
            push_row(&mut examples.rows, replayed, i, cols);
            examples.rows.push(SurvivalSpec::interval_input(j));
            examples.labels.push(if ended && j + 1 == intervals { 1.0 } else { 0.0 });
            examples.weights.push((1.0 / rate) as f32);
        }
    }
    examples
}

/// A number in [0, 1) that depends only on (`seed`, `vm`, `interval`): a reproducible coin.
pub(super) fn unit_hash(seed: u64, vm: usize, interval: usize) -> f64 {
    // splitmix64 of the three, mixed.
    let mut z =
        seed ^ (vm as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (interval as u64).wrapping_mul(0xd1b5_4a32_d192_ed03);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}

/// The number of leading intervals of `edges` in which enough VMs of `labels` were seen at risk
/// (alive at the interval's start and not censored inside it) to estimate a hazard: at least
/// [`MIN_AT_RISK`] and 0.2% of the VMs. Past them the data says next to nothing (the training
/// period is a few days long), and a tree model would extrapolate arbitrarily.
pub(super) fn supported_intervals(labels: impl Iterator<Item = ObservedLifetime>, edges: &[f64]) -> usize {
    let mut at_risk = vec![0usize; edges.len()];
    let mut vms = 0usize;
    for observed in labels {
        vms += 1;
        for (j, &upper) in edges.iter().enumerate() {
            if observed.censored && observed.seconds < upper {
                break;
            }
            at_risk[j] += 1;
            if observed.seconds < upper {
                break;
            }
        }
    }
    let needed = MIN_AT_RISK.max(vms / 500);
    at_risk.iter().take_while(|&&n| n >= needed).count()
}
