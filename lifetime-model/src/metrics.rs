//! Classification metrics of the evaluation report: ROC AUC, average precision, F1, precision at a
//! given recall, confusion matrix, and the ROC curve for plotting.

use serde::{Deserialize, Serialize};

/// Scores with their true labels, sorted by descending score once.
pub struct Scored {
    /// (score, is_positive), highest score first.
    points: Vec<(f64, bool)>,
    positives: usize,
}

/// Counts at one decision threshold (score >= threshold means "positive").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Confusion {
    pub true_positive: u64,
    pub false_positive: u64,
    pub true_negative: u64,
    pub false_negative: u64,
}

impl Confusion {
    pub fn from_pairs(pairs: impl IntoIterator<Item = (bool, bool)>) -> Self {
        let mut c = Confusion::default();
        for (predicted, actual) in pairs {
            match (predicted, actual) {
                (true, true) => c.true_positive += 1,
                (true, false) => c.false_positive += 1,
                (false, false) => c.true_negative += 1,
                (false, true) => c.false_negative += 1,
            }
        }
        c
    }

    pub fn precision(&self) -> f64 {
        ratio(self.true_positive, self.true_positive + self.false_positive)
    }

    pub fn recall(&self) -> f64 {
        ratio(self.true_positive, self.true_positive + self.false_negative)
    }

    pub fn f1(&self) -> f64 {
        let (p, r) = (self.precision(), self.recall());
        if p + r > 0.0 {
            2.0 * p * r / (p + r)
        } else {
            0.0
        }
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

impl Scored {
    pub fn new(scores: &[f64], labels: &[bool]) -> Self {
        let mut points: Vec<(f64, bool)> = scores.iter().copied().zip(labels.iter().copied()).collect();
        points.sort_by(|a, b| b.0.total_cmp(&a.0));
        let positives = points.iter().filter(|p| p.1).count();
        Scored { points, positives }
    }

    pub fn len(&self) -> usize {
        self.points.len()
    }

    pub fn is_empty(&self) -> bool {
        self.points.is_empty()
    }

    pub fn positives(&self) -> usize {
        self.positives
    }

    /// (threshold, true positives, false positives) after each group of tied scores.
    fn steps(&self) -> Vec<(f64, usize, usize)> {
        let mut steps = Vec::new();
        let (mut tp, mut fp, mut i) = (0, 0, 0);
        while i < self.points.len() {
            let score = self.points[i].0;
            while i < self.points.len() && self.points[i].0 == score {
                if self.points[i].1 {
                    tp += 1;
                } else {
                    fp += 1;
                }
                i += 1;
            }
            steps.push((score, tp, fp));
        }
        steps
    }

    /// Area under the ROC curve (ties count half); NaN without both classes.
    pub fn roc_auc(&self) -> f64 {
        let negatives = self.points.len() - self.positives;
        if self.positives == 0 || negatives == 0 {
            return f64::NAN;
        }
        let (mut area, mut prev_tp, mut prev_fp) = (0.0, 0usize, 0usize);
        for (_, tp, fp) in self.steps() {
            area += (fp - prev_fp) as f64 * (tp + prev_tp) as f64 / 2.0;
            prev_tp = tp;
            prev_fp = fp;
        }
        area / (self.positives as f64 * negatives as f64)
    }

    /// Average precision: precision averaged over the positives, in score order.
    pub fn average_precision(&self) -> f64 {
        if self.positives == 0 {
            return f64::NAN;
        }
        let (mut sum, mut prev_tp) = (0.0, 0usize);
        for (_, tp, fp) in self.steps() {
            sum += (tp - prev_tp) as f64 * tp as f64 / (tp + fp) as f64;
            prev_tp = tp;
        }
        sum / self.positives as f64
    }

    /// Highest precision among thresholds that reach at least `recall`.
    pub fn precision_at_recall(&self, recall: f64) -> f64 {
        if self.positives == 0 {
            return f64::NAN;
        }
        self.steps()
            .into_iter()
            .filter(|&(_, tp, _)| tp as f64 / self.positives as f64 >= recall)
            .map(|(_, tp, fp)| tp as f64 / (tp + fp) as f64)
            .fold(0.0, f64::max)
    }

    pub fn confusion_at(&self, threshold: f64) -> Confusion {
        Confusion::from_pairs(self.points.iter().map(|&(s, actual)| (s >= threshold, actual)))
    }

    /// The threshold with the best F1, and that F1.
    pub fn best_f1_threshold(&self) -> (f64, f64) {
        let negatives = self.points.len() - self.positives;
        let mut best = (0.5, 0.0);
        for (threshold, tp, fp) in self.steps() {
            let c = Confusion {
                true_positive: tp as u64,
                false_positive: fp as u64,
                false_negative: (self.positives - tp) as u64,
                true_negative: (negatives - fp) as u64,
            };
            if c.f1() > best.1 {
                best = (threshold, c.f1());
            }
        }
        best
    }

    /// ROC curve as (false positive rate, true positive rate), thinned to at most `max_points`.
    pub fn roc_curve(&self, max_points: usize) -> Vec<(f64, f64)> {
        let negatives = (self.points.len() - self.positives).max(1) as f64;
        let positives = self.positives.max(1) as f64;
        let steps = self.steps();
        let stride = steps.len().div_ceil(max_points.max(1)).max(1);
        let mut curve = vec![(0.0, 0.0)];
        curve.extend(steps.iter().step_by(stride).map(|&(_, tp, fp)| (fp as f64 / negatives, tp as f64 / positives)));
        curve.push((1.0, 1.0));
        curve
    }
}

/// Harrell's concordance index of `predicted` lifetimes against `observed` ones, censoring-aware.
///
/// A pair is comparable when the shorter observed lifetime is a completed one (`completed[i]`):
/// only then is it known which VM lived longer. Equal observed lifetimes are not comparable. A
/// comparable pair is concordant when the VM that lived shorter is predicted shorter; ties in
/// prediction count one half. NaN when no pair is comparable (NaN predictions must not occur).
///
/// O(n log n) (a Fenwick tree over prediction ranks, filled from the longest observed lifetime
/// down), because held-out sets have hundreds of thousands of VMs and the pairs run in billions.
pub fn harrell_c(predicted: &[f64], observed: &[f64], completed: &[bool]) -> f64 {
    assert!(predicted.len() == observed.len() && observed.len() == completed.len(), "one entry per VM");
    let n = predicted.len();
    // Dense ranks of the predictions, 1-based for the Fenwick tree.
    let mut by_prediction: Vec<usize> = (0..n).collect();
    by_prediction.sort_by(|&a, &b| predicted[a].total_cmp(&predicted[b]));
    let mut rank = vec![0usize; n];
    let mut ranks = 0;
    for (k, &i) in by_prediction.iter().enumerate() {
        if k == 0 || predicted[i] != predicted[by_prediction[k - 1]] {
            ranks += 1;
        }
        rank[i] = ranks;
    }
    let mut tree = Fenwick::new(ranks);
    let mut by_observed: Vec<usize> = (0..n).collect();
    by_observed.sort_by(|&a, &b| observed[b].total_cmp(&observed[a]));
    let (mut comparable, mut score) = (0u64, 0.0f64);
    let mut start = 0;
    while start < n {
        // One group of equal observed lifetimes: compared with the longer ones only, then added.
        let mut end = start;
        while end < n && observed[by_observed[end]] == observed[by_observed[start]] {
            end += 1;
        }
        let longer = tree.total();
        for &i in by_observed[start..end].iter().filter(|&&i| completed[i]) {
            let below = tree.prefix(rank[i] - 1);
            let equal = tree.prefix(rank[i]) - below;
            let above = longer - below - equal;
            comparable += longer;
            score += above as f64 + 0.5 * equal as f64;
        }
        for &i in &by_observed[start..end] {
            tree.add(rank[i]);
        }
        start = end;
    }
    if comparable == 0 {
        f64::NAN
    } else {
        score / comparable as f64
    }
}

/// Counts by 1-based rank with prefix sums in O(log n).
struct Fenwick {
    counts: Vec<u64>,
    total: u64,
}

impl Fenwick {
    fn new(size: usize) -> Self {
        Fenwick { counts: vec![0; size + 1], total: 0 }
    }

    fn add(&mut self, rank: usize) {
        self.total += 1;
        let mut i = rank;
        while i < self.counts.len() {
            self.counts[i] += 1;
            i += i & i.wrapping_neg();
        }
    }

    /// Entries with rank `<= rank`.
    fn prefix(&self, rank: usize) -> u64 {
        let (mut i, mut sum) = (rank, 0);
        while i > 0 {
            sum += self.counts[i];
            i -= i & i.wrapping_neg();
        }
        sum
    }

    fn total(&self) -> u64 {
        self.total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn perfect_random_and_inverted_rankings() {
        let labels = [true, true, false, false];
        assert_eq!(Scored::new(&[0.9, 0.8, 0.2, 0.1], &labels).roc_auc(), 1.0);
        assert_eq!(Scored::new(&[0.1, 0.2, 0.8, 0.9], &labels).roc_auc(), 0.0);
        assert_eq!(Scored::new(&[0.5, 0.5, 0.5, 0.5], &labels).roc_auc(), 0.5);
    }

    #[test]
    fn matches_hand_computed_values() {
        // Ranking: +, -, +, -, - : the first positive outranks 3 negatives, the second 2, so
        // AUC = 5 / (2 * 3); AP = (1/1 + 2/3) / 2.
        let scored = Scored::new(&[0.9, 0.8, 0.7, 0.6, 0.5], &[true, false, true, false, false]);
        assert!((scored.roc_auc() - 5.0 / 6.0).abs() < 1e-12);
        assert!((scored.average_precision() - (1.0 + 2.0 / 3.0) / 2.0).abs() < 1e-12);
        assert!((scored.precision_at_recall(1.0) - 2.0 / 3.0).abs() < 1e-12);
        assert_eq!(scored.precision_at_recall(0.5), 1.0);
        let c = scored.confusion_at(0.7);
        assert_eq!((c.true_positive, c.false_positive, c.true_negative, c.false_negative), (2, 1, 2, 0));
        assert!((c.f1() - 0.8).abs() < 1e-12);
        assert_eq!(scored.best_f1_threshold(), (0.7, c.f1()));
    }

    /// Straightforward O(n^2) Harrell's C, the definition the fast one must match.
    fn harrell_c_pairs(predicted: &[f64], observed: &[f64], completed: &[bool]) -> f64 {
        let (mut comparable, mut score) = (0u64, 0.0);
        for i in 0..predicted.len() {
            for j in 0..predicted.len() {
                if completed[i] && observed[i] < observed[j] {
                    comparable += 1;
                    score += if predicted[i] < predicted[j] {
                        1.0
                    } else if predicted[i] == predicted[j] {
                        0.5
                    } else {
                        0.0
                    };
                }
            }
        }
        score / comparable as f64
    }

    #[test]
    fn harrell_c_by_hand_with_censoring_and_ties() {
        // Perfect and inverted orderings, all completed.
        let observed = [1.0, 2.0, 3.0, 4.0];
        let all = [true; 4];
        assert_eq!(harrell_c(&[10.0, 20.0, 30.0, 40.0], &observed, &all), 1.0);
        assert_eq!(harrell_c(&[40.0, 30.0, 20.0, 10.0], &observed, &all), 0.0);
        assert_eq!(harrell_c(&[5.0; 4], &observed, &all), 0.5);

        // VM b is censored at 2: pairs (b, c) and (b, d) are not comparable (b may outlive them),
        // but (a, b) is (a ended before b was last seen). Comparable: ab ac ad cd = 4 pairs.
        // Predictions: a 1, b 0.5, c 3, d 3 -> ab discordant, ac ad concordant, cd tied.
        let completed = [true, false, true, true];
        let predicted = [1.0, 0.5, 3.0, 3.0];
        assert_eq!(harrell_c(&predicted, &observed, &completed), (0.0 + 1.0 + 1.0 + 0.5) / 4.0);

        // Equal observed lifetimes are never compared; a censored shortest VM compares with nothing.
        assert!(harrell_c(&[1.0, 2.0], &[5.0, 5.0], &[true, true]).is_nan());
        assert!(harrell_c(&[1.0, 2.0], &[1.0, 5.0], &[false, true]).is_nan());
        assert!(harrell_c(&[], &[], &[]).is_nan());
    }

    #[test]
    fn harrell_c_matches_the_pairwise_definition() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        for _ in 0..200 {
            let n = rng.random_range(2..40);
            // Few distinct values, so ties in both prediction and observation are common.
            let predicted: Vec<f64> = (0..n).map(|_| f64::from(rng.random_range(0..6u8))).collect();
            let observed: Vec<f64> = (0..n).map(|_| f64::from(rng.random_range(0..8u8))).collect();
            let completed: Vec<bool> = (0..n).map(|_| rng.random_bool(0.6)).collect();
            let fast = harrell_c(&predicted, &observed, &completed);
            let slow = harrell_c_pairs(&predicted, &observed, &completed);
            assert!(
                fast == slow || (fast.is_nan() && slow.is_nan()) || (fast - slow).abs() < 1e-12,
                "{fast} vs {slow}"
            );
        }
    }
}
