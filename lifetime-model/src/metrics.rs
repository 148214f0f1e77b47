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
    weighted_concordance(predicted, observed, completed, |_| 1.0)
}

/// Uno's concordance index (Uno et al. 2011): Harrell's pairs, each weighted by the inverse
/// square of the probability of still being observed at the shorter lifetime, `1 / G(T_i-)^2`
/// with `G` the Kaplan-Meier curve of the censoring times, and only pairs whose shorter lifetime
/// is below `tau`. Unlike Harrell's, it does not depend on how much censoring the data has (the
/// long-lived VMs, censored most, count as much as they would uncensored). `tau` should stay
/// where `G` is not near zero, e.g. the longest completed lifetime of a trace's bulk.
pub fn uno_c(predicted: &[f64], observed: &[f64], completed: &[bool], tau: f64) -> f64 {
    let censoring_events: Vec<bool> = completed.iter().map(|&c| !c).collect();
    let censoring = KaplanMeier::new(observed, &censoring_events);
    weighted_concordance(predicted, observed, completed, |i| {
        let g = censoring.before(observed[i]);
        if observed[i] < tau && g > 0.0 {
            1.0 / (g * g)
        } else {
            0.0
        }
    })
}

/// Concordance where each comparable pair counts with the weight of its shorter VM.
fn weighted_concordance(predicted: &[f64], observed: &[f64], completed: &[bool], weight: impl Fn(usize) -> f64) -> f64 {
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
    let (mut comparable, mut score) = (0.0f64, 0.0f64);
    let mut start = 0;
    while start < n {
        // One group of equal observed lifetimes: compared with the longer ones only, then added.
        let mut end = start;
        while end < n && observed[by_observed[end]] == observed[by_observed[start]] {
            end += 1;
        }
        let longer = tree.total();
        for &i in by_observed[start..end].iter().filter(|&&i| completed[i]) {
            let w = weight(i);
            if w == 0.0 || longer == 0 {
                continue;
            }
            let below = tree.prefix(rank[i] - 1);
            let equal = tree.prefix(rank[i]) - below;
            let above = longer - below - equal;
            comparable += w * longer as f64;
            score += w * (above as f64 + 0.5 * equal as f64);
        }
        for &i in &by_observed[start..end] {
            tree.add(rank[i]);
        }
        start = end;
    }
    if comparable == 0.0 {
        f64::NAN
    } else {
        score / comparable
    }
}

/// The Kaplan-Meier estimate of a survival curve from observed times and whether each one is an
/// event (`true`) or censored.
#[derive(Clone, Debug, PartialEq)]
pub struct KaplanMeier {
    /// Distinct event times, ascending.
    times: Vec<f64>,
    /// The survival just after each of them.
    survival: Vec<f64>,
}

impl KaplanMeier {
    pub fn new(observed: &[f64], events: &[bool]) -> Self {
        assert_eq!(observed.len(), events.len(), "one entry per subject");
        let mut order: Vec<usize> = (0..observed.len()).collect();
        order.sort_by(|&a, &b| observed[a].total_cmp(&observed[b]));
        let mut at_risk = order.len() as f64;
        let (mut times, mut survival) = (Vec::new(), Vec::new());
        let mut alive = 1.0;
        let mut k = 0;
        while k < order.len() {
            let t = observed[order[k]];
            let (mut deaths, mut leaving) = (0.0, 0.0);
            while k < order.len() && observed[order[k]] == t {
                deaths += f64::from(u8::from(events[order[k]]));
                leaving += 1.0;
                k += 1;
            }
            if deaths > 0.0 {
                alive *= 1.0 - deaths / at_risk;
                times.push(t);
                survival.push(alive);
            }
            at_risk -= leaving;
        }
        KaplanMeier { times, survival }
    }

    /// `S(t)`: the share surviving past `t`.
    pub fn at(&self, t: f64) -> f64 {
        let k = self.times.partition_point(|&e| e <= t);
        if k == 0 {
            1.0
        } else {
            self.survival[k - 1]
        }
    }

    /// `S(t-)`: the share surviving until just before `t`.
    pub fn before(&self, t: f64) -> f64 {
        let k = self.times.partition_point(|&e| e < t);
        if k == 0 {
            1.0
        } else {
            self.survival[k - 1]
        }
    }
}

/// The IPCW Brier score (Graf et al. 1999) of predicted survival probabilities at time `t`:
/// `predicted[i] = P(T_i > t)` as predicted. A VM that ended by `t` counts `S_i(t)^2 / G(T_i)`, one
/// still alive at `t` counts `(1 - S_i(t))^2 / G(t)`, one censored before `t` counts nothing (its
/// weight is carried by the others through `G`, the censoring curve).
pub fn brier_at(predicted: &[f64], observed: &[f64], completed: &[bool], censoring: &KaplanMeier, t: f64) -> f64 {
    let n = predicted.len().max(1) as f64;
    let g_t = censoring.at(t);
    let mut sum = 0.0;
    for ((&p, &time), &done) in predicted.iter().zip(observed).zip(completed) {
        if time <= t && done {
            let g = censoring.before(time);
            if g > 0.0 {
                sum += p * p / g;
            }
        } else if time > t && g_t > 0.0 {
            sum += (1.0 - p) * (1.0 - p) / g_t;
        }
    }
    sum / n
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
    fn kaplan_meier_by_hand() {
        // Times 1 (event), 2 (censored), 3 (event), 3 (event), 4 (censored).
        let km = KaplanMeier::new(&[1.0, 2.0, 3.0, 3.0, 4.0], &[true, false, true, true, false]);
        assert_eq!(km.at(0.5), 1.0);
        assert_eq!(km.at(1.0), 0.8);
        assert_eq!(km.before(1.0), 1.0);
        assert_eq!(km.at(2.5), 0.8);
        // At 3, 3 at risk and 2 die.
        assert!((km.at(3.0) - 0.8 / 3.0).abs() < 1e-12);
        assert!((km.at(10.0) - 0.8 / 3.0).abs() < 1e-12);
    }

    #[test]
    fn uno_c_without_censoring_is_harrell_c() {
        let observed = [1.0, 2.0, 3.0, 4.0, 5.0];
        let predicted = [2.0, 1.0, 3.0, 5.0, 4.0];
        let all = [true; 5];
        assert_eq!(uno_c(&predicted, &observed, &all, f64::INFINITY), harrell_c(&predicted, &observed, &all));
        // Only pairs whose shorter lifetime is below tau: (1,*) and (2,*): 4 + 3 pairs, 6 concordant.
        assert!((uno_c(&predicted, &observed, &all, 2.5) - 6.0 / 7.0).abs() < 1e-12);
    }

    #[test]
    fn uno_c_weights_pairs_by_the_censoring_curve() {
        // Censored at 1.5: G drops to 3/4 after it, so the pairs of VMs ending at 2 and 3 weigh 16/9.
        let observed = [1.0, 1.5, 2.0, 3.0, 4.0];
        let completed = [true, false, true, true, true];
        let predicted = [1.0, 9.0, 3.0, 2.0, 4.0];
        // Shorter 1 (w 1): longer 1.5, 2, 3, 4 -> all concordant (4). Shorter 2 (w 16/9): 3 (discordant),
        // 4 (concordant). Shorter 3 (w 16/9): 4 concordant.
        let w = 16.0 / 9.0;
        let expected = (4.0 + w * 1.0 + w * 1.0) / (4.0 + w * 2.0 + w * 1.0);
        assert!((uno_c(&predicted, &observed, &completed, f64::INFINITY) - expected).abs() < 1e-12);
    }

    #[test]
    fn brier_scores_of_perfect_and_uninformed_predictions() {
        let observed = [1.0, 2.0, 3.0, 4.0];
        let completed = [true; 4];
        let km = KaplanMeier::new(&observed, &[false; 4]);
        // At t = 2.5, two ended and two are alive.
        assert_eq!(brier_at(&[0.0, 0.0, 1.0, 1.0], &observed, &completed, &km, 2.5), 0.0);
        assert_eq!(brier_at(&[0.5; 4], &observed, &completed, &km, 2.5), 0.25);
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
