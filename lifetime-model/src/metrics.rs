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
}
