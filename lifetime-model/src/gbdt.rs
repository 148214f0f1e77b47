//! A native, thread-safe evaluator for LightGBM tree ensembles.
//!
//! This module owns the *serving-side* representation of a trained LightGBM model: [`TreeEnsemble`],
//! parsed from LightGBM's text model format (what `Booster::save_string()` returns and what
//! `Booster::save_file()` writes), and its evaluation.
//!
//! Why it exists: `lightgbm3::Booster` holds raw pointers (it is neither `Send` nor `Sync`) and its fast
//! single-row API shares one mutable `FastConfig`, so a booster cannot be shared by the many threads of
//! an HTTP server or of the simulator. We therefore *train* with LightGBM and *evaluate* the trained
//! ensemble here, in plain Rust: the ensemble is immutable after parsing, `Send + Sync`, lock-free,
//! does not allocate per prediction, and is faster than the C API for single rows.
//!
//! Semantics follow LightGBM exactly (`include/LightGBM/tree.h`, `src/boosting/gbdt_prediction.cpp`,
//! the objectives' `ConvertOutput` and the C API's dense-row conversion in `src/c_api.cpp`):
//!
//! - `decision_type` bit 0 = categorical, bit 1 = default-left, bits 2-3 = missing type
//!   (0 none, 1 zero, 2 NaN).
//! - Input values with `|v| <= kZeroThreshold` (`1e-35f32`) are read as exactly `0.0`, as LightGBM's
//!   C API does when it densifies a row.
//! - Numerical split: NaN becomes `0.0` unless the missing type is NaN; then if (missing type zero and
//!   the value is zero) or (missing type NaN and the value is NaN) the default side is taken, else
//!   `value <= threshold` goes left.
//! - Categorical split: NaN and negative values (after truncation toward zero) go right; otherwise
//!   the integer is looked up in the split's category bitset: found goes left, absent goes right.
//! - Leaf values in the text are already multiplied by the tree's shrinkage (LightGBM's
//!   `Tree::Shrinkage` scales `leaf_value_` in place and `Tree::Predict` returns `leaf_value_`
//!   unchanged), so `shrinkage=` is informational and ignored.
//! - Raw scores are the sum of the trees' outputs, class `k` owning trees `i` with
//!   `i % num_tree_per_iteration == k`. With `average_output` (random-forest mode) the *transformed*
//!   prediction divides the raw score by the number of iterations before the output transform; like
//!   LightGBM's `raw_score` prediction, [`TreeEnsemble::predict_raw_into`] does not.
//!
//! Evaluation: all trees are flattened into one contiguous array of 24-byte nodes (threshold, both
//! children, feature, flags precomputed from `decision_type`) plus one array of leaf values; the
//! numerical decision is branch-free, and trees are walked four at a time in lockstep so that their
//! independent chains of dependent loads overlap. Summation order is LightGBM's (tree order per
//! class), so raw scores are bit-identical to LightGBM's.
//!
//! Many rows at a time ([`TreeEnsemble::predict_rows`], numerical splits only): a second layout in
//! which every leaf is a node leading to itself. A block of rows is read once into a
//! feature-major buffer (zero band already `0.0`), then each tree is walked by eight rows in
//! lockstep, step after step without a branch per row, until all eight stand on leaves (at most
//! the tree's depth): the same decisions and the same sums in the same order as row by row. When
//! no split reads zero as missing (LightGBM's default), the buffer holds each feature twice, a
//! missing value as +inf in one copy and as -inf in the other, and each split reads the copy that
//! sends a missing value its way: one comparison decides.
//!
//! Rows shorter than [`TreeEnsemble::num_features`] are accepted: the missing trailing features are
//! read as NaN (missing). Extra trailing values are ignored. Note that LightGBM's C API, when told to
//! skip its shape check, would read absent features as `0.0` instead.

mod batch;
mod grid;
mod parse;

use batch::Batch;
pub use grid::GridScorer;

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;

/// LightGBM's `kZeroThreshold`: declared as `1e-35f` (a float literal) and stored in a double.
const K_ZERO_THRESHOLD: f64 = 1e-35_f32 as f64;
/// The largest value below the zero band `[-kZeroThreshold, kZeroThreshold]` (`f64::next_down` is
/// younger than the MSRV; one more in the bits of a negative number is one step away from zero).
const BELOW_ZERO_BAND: f64 = f64::from_bits((-K_ZERO_THRESHOLD).to_bits() + 1);

/// Trees walked in lockstep by the evaluator (see `TreeEnsemble::eval_lanes`).
const LANES: usize = 4;

/// Rows walked in lockstep through one tree by [`TreeEnsemble::predict_rows`].
pub const ROW_LANES: usize = 8;

/// Rows [`TreeEnsemble::predict_rows`] walks each tree for before the next tree: their values and
/// sums stay in the first-level cache, and so does the tree.
const BLOCK_ROWS: usize = 128;

/// Longest excerpt of offending model text quoted in an error message.
const MAX_QUOTE: usize = 80;

/// Why a LightGBM text model could not be loaded.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum GbdtError {
    /// A required key of the model header (before the first tree) is absent.
    #[error("model header: missing required key `{key}`")]
    MissingHeaderKey {
        /// The missing key.
        key: &'static str,
    },
    /// A key of the model header has a value that cannot be used.
    #[error("model header: key `{key}` has bad value `{value}`: {reason}")]
    BadHeaderValue {
        /// The offending key.
        key: String,
        /// The offending value (possibly shortened).
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The `objective=` line names an objective this evaluator does not implement.
    #[error(
        "unsupported objective `{objective}`: supported are regression objectives (regression, regression_l1, \
         huber, fair, quantile, mape, poisson, gamma, tweedie), binary, cross_entropy, cross_entropy_lambda, \
         multiclass and custom"
    )]
    UnsupportedObjective {
        /// The objective line as written in the model.
        objective: String,
    },
    /// A line that fits nowhere in the model format.
    #[error("line {line}: {reason}")]
    Syntax {
        /// 1-based line number.
        line: usize,
        /// What was expected.
        reason: String,
    },
    /// A required key of a tree is absent.
    #[error("tree {tree}: missing required key `{key}`")]
    MissingTreeKey {
        /// Index of the tree (its `Tree=` number).
        tree: usize,
        /// The missing key.
        key: &'static str,
    },
    /// A key of a tree has a value that cannot be used.
    #[error("tree {tree}: key `{key}`: {reason}")]
    BadTreeValue {
        /// Index of the tree (its `Tree=` number).
        tree: usize,
        /// The offending key.
        key: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The tree is a linear tree (`is_linear=1`).
    #[error("tree {tree}: linear trees are not supported")]
    LinearTree {
        /// Index of the tree.
        tree: usize,
    },
    /// The split arrays do not describe a binary tree whose nodes and leaves are each reached once.
    #[error("tree {tree}: invalid tree structure: {reason}")]
    BadTreeStructure {
        /// Index of the tree.
        tree: usize,
        /// What is wrong.
        reason: String,
    },
    /// The text ends before the model does.
    #[error("model text is truncated: {reason}")]
    Truncated {
        /// What is missing.
        reason: String,
    },
    /// The model parses but is unusable as a whole.
    #[error("invalid model: {reason}")]
    InvalidModel {
        /// What is wrong.
        reason: String,
    },
}

/// How raw scores are turned into predictions (LightGBM's `ObjectiveFunction::ConvertOutput`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum OutputTransform {
    /// The raw score itself (regression objectives, custom objective, no objective).
    Identity,
    /// `sign(x) * x * x`: regression objectives trained with `reg_sqrt`.
    SignedSquare,
    /// `exp(x)`: poisson, gamma and tweedie regression.
    Exp,
    /// `1 / (1 + exp(-scale * x))`: binary (`sigmoid:scale`) and cross_entropy (scale 1).
    Sigmoid {
        /// The `sigmoid:` parameter of the binary objective.
        scale: f64,
    },
    /// `ln(1 + exp(x))`: cross_entropy_lambda.
    Log1pExp,
    /// Softmax over the per-class raw scores: multiclass.
    Softmax,
}

impl OutputTransform {
    /// The transform of one raw score (the identity for [`OutputTransform::Softmax`], which needs
    /// all classes: see [`TreeEnsemble::predict_into`]).
    pub fn apply(self, raw: f64) -> f64 {
        apply_scalar(self, raw)
    }
}

/// Node flag: categorical split (the threshold is an index into `cat_ranges`).
const FLAG_CATEGORICAL: u8 = 1;
/// Node flag: a missing value goes left. Missing means NaN, or zero when `FLAG_ZERO_IS_MISSING`.
const FLAG_MISSING_LEFT: u8 = 2;
/// Node flag: zero (after the zero-threshold band) is missing, as NaN is (missing type zero).
const FLAG_ZERO_IS_MISSING: u8 = 4;

/// One internal node of the flattened ensemble (24 bytes).
///
/// The three LightGBM missing types reduce to two flags computed at load time:
///
/// | missing type | NaN goes                      | zero goes       | `ZERO_IS_MISSING` | `MISSING_LEFT`   |
/// |--------------|-------------------------------|-----------------|-------------------|------------------|
/// | none         | as 0.0: left iff `0 <= thr`   | `0 <= thr`      | no                | `0.0 <= thr`     |
/// | zero         | as 0.0, so the default side   | default side    | yes               | default-left bit |
/// | NaN          | default side                  | `0 <= thr`      | no                | default-left bit |
///
/// Children are global indices: `>= 0` is a node in `TreeEnsemble::nodes`, `< 0` is the leaf
/// `!child` in `TreeEnsemble::leaf_values`. `children[1]` is the left child, `children[0]` the right
/// one, so that `children[go_left as usize]` selects without a branch.
#[derive(Debug, Clone, Copy)]
struct Node {
    /// Numerical threshold, or, for categorical nodes, the (exact integer) index into `cat_ranges`.
    threshold: f64,
    children: [i32; 2],
    feature: u32,
    flags: u8,
}

/// A LightGBM tree ensemble, parsed from LightGBM's text model format, ready for lock-free
/// evaluation from any number of threads.
#[derive(Debug, Clone)]
pub struct TreeEnsemble {
    /// All internal nodes of all trees.
    nodes: Vec<Node>,
    /// All leaf values of all trees.
    leaf_values: Vec<f64>,
    /// `(start, len)` of each categorical split's bitset in `cat_bits`.
    cat_ranges: Vec<(u32, u32)>,
    /// All category bitsets, 32 categories per word.
    cat_bits: Vec<u32>,
    /// Per tree, in model order: its root (a node index, or `!leaf` for a single-leaf tree).
    roots: Vec<i32>,
    num_features: usize,
    num_outputs: usize,
    num_iterations: usize,
    average_output: bool,
    transform: OutputTransform,
    /// Per feature, the values its numerical splits compare with (for
    /// [`TreeEnsemble::constant_range`]).
    splits: Vec<FeatureSplits>,
    /// The trees laid out for [`TreeEnsemble::predict_rows`]; `None` when a split is categorical
    /// (rows are then predicted one at a time).
    batch: Option<Batch>,
}

/// Where the numerical splits of one feature cut its values, over all trees.
#[derive(Debug, Clone, Default)]
struct FeatureSplits {
    /// The thresholds, ascending and without duplicates or NaN (a NaN threshold sends every value
    /// the same way, so it cuts nothing).
    thresholds: Vec<f64>,
    /// Some node splits on the feature as a category: its decision is not a threshold cut.
    categorical: bool,
}

/// The values `v` of one feature with `above < v <= up_to`: see [`TreeEnsemble::constant_range`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ConstantRange {
    /// Exclusive lower bound.
    pub above: f64,
    /// Inclusive upper bound (a split goes left when `value <= threshold`).
    pub up_to: f64,
}

/// What a grid walk ([`TreeEnsemble::predict_raw_grid`]) carries down the trees.
struct GridWalk<'a> {
    row: &'a [f64],
    feature: usize,
    grid: &'a [f64],
    /// The grid is ascending and finite, so a numerical split parts it as a prefix.
    ascending: bool,
    /// The grid values in LightGBM's zero band, decided one by one.
    zero_band: u64,
}

impl ConstantRange {
    pub fn contains(&self, value: f64) -> bool {
        value > self.above && value <= self.up_to
    }
}

impl Node {
    /// The child to visit for `row` (LightGBM's `Tree::Decision`).
    #[inline(always)]
    fn next(&self, row: &[f64], cat_ranges: &[(u32, u32)], cat_bits: &[u32]) -> i32 {
        let raw = match row.get(self.feature as usize) {
            Some(&v) => v,
            None => f64::NAN,
        };
        self.children[usize::from(self.goes_left(raw, cat_ranges, cat_bits))]
    }

    /// Whether the value `raw` of the node's feature goes left.
    #[inline(always)]
    fn goes_left(&self, raw: f64, cat_ranges: &[(u32, u32)], cat_bits: &[u32]) -> bool {
        // The C API stores only |v| > kZeroThreshold (or NaN) in its dense buffer; the rest read 0.0.
        let is_zero = raw.abs() <= K_ZERO_THRESHOLD;
        let v = if is_zero { 0.0 } else { raw };
        if self.flags & FLAG_CATEGORICAL != 0 {
            categorical_goes_left(v, self.threshold, cat_ranges, cat_bits)
        } else {
            // Branch-free on purpose: this decision is the unpredictable part of tree traversal.
            let missing = v.is_nan() | (is_zero & (self.flags & FLAG_ZERO_IS_MISSING != 0));
            let missing_left = self.flags & FLAG_MISSING_LEFT != 0;
            (missing & missing_left) | (!missing & (v <= self.threshold))
        }
    }
}

/// LightGBM's `Tree::CategoricalDecision` (with `Common::FindInBitset`).
#[inline(always)]
fn categorical_goes_left(v: f64, slot: f64, cat_ranges: &[(u32, u32)], cat_bits: &[u32]) -> bool {
    if v.is_nan() {
        return false;
    }
    // C++ `static_cast<int>` truncates toward zero. Out-of-range values are undefined behaviour in C++
    // (x86 yields INT_MIN, going right); Rust saturates, and i32::MAX is past every bitset: right too.
    let category = v as i32;
    if category < 0 {
        return false;
    }
    let Some(&(start, len)) = cat_ranges.get(slot as usize) else {
        return false;
    };
    let word = (category / 32) as u32;
    if word >= len {
        return false;
    }
    match cat_bits.get(start as usize + word as usize) {
        Some(bits) => (bits >> (category % 32)) & 1 == 1,
        None => false,
    }
}

impl TreeEnsemble {
    /// Number of features the model was trained on (`max_feature_idx + 1`).
    pub fn num_features(&self) -> usize {
        self.num_features
    }

    /// Number of values per prediction: 1 for binary and regression models, K for K-class multiclass.
    pub fn num_outputs(&self) -> usize {
        self.num_outputs
    }

    /// Number of trees in the ensemble (`num_iterations * num_outputs`).
    pub fn num_trees(&self) -> usize {
        self.roots.len()
    }

    /// The ensemble of its first `trees` trees (model order), as LightGBM's prediction with
    /// `num_iteration` would use: a model read at an earlier round.
    pub fn truncated(&self, trees: usize) -> TreeEnsemble {
        let mut cut = self.clone();
        cut.roots.truncate(trees);
        if let Some(batch) = &mut cut.batch {
            batch.trees.truncate(trees);
        }
        cut.num_iterations = cut.roots.len() / cut.num_outputs.max(1);
        cut
    }

    /// How raw scores are turned into predictions, from the model's `objective=` line.
    pub fn output_transform(&self) -> OutputTransform {
        self.transform
    }

    /// An interval of values of `feature`, containing `value`, over which every node that splits on
    /// `feature` takes the branch it takes for `value`. Whatever the row's other features, a row
    /// whose `feature` is anywhere in the interval therefore reaches the same leaves, and gets the
    /// same prediction bit for bit, as with `value`: a caller that varies one input (such as an
    /// uptime) can reuse a prediction until the input leaves the interval.
    ///
    /// The interval follows the evaluator's reading of a value: values within LightGBM's zero band
    /// (`|v| <= kZeroThreshold`) all read as `0.0` and may take a missing value's default side, so
    /// the band is an interval of its own and never part of another. `None` when no such interval
    /// is known: `value` is NaN (missing), the feature has a categorical split, or the model has no
    /// such feature.
    pub fn constant_range(&self, feature: usize, value: f64) -> Option<ConstantRange> {
        let splits = self.splits.get(feature)?;
        if splits.categorical || value.is_nan() {
            return None;
        }
        if value.abs() <= K_ZERO_THRESHOLD {
            return Some(ConstantRange { above: BELOW_ZERO_BAND, up_to: K_ZERO_THRESHOLD });
        }
        // Thresholds below `value` send it right, the others (from `first_above` on) left; every value
        // strictly between the two neighbouring thresholds does the same.
        let first_above = splits.thresholds.partition_point(|&t| t < value);
        let lower = first_above.checked_sub(1).map_or(f64::NEG_INFINITY, |i| splits.thresholds[i]);
        let upper = splits.thresholds.get(first_above).copied().unwrap_or(f64::INFINITY);
        Some(if value > 0.0 {
            ConstantRange { above: lower.max(K_ZERO_THRESHOLD), up_to: upper }
        } else {
            ConstantRange { above: lower, up_to: upper.min(BELOW_ZERO_BAND) }
        })
    }

    /// Raw scores (before the objective's transform) of `row` into `out`, exactly as LightGBM's
    /// `raw_score` prediction: the per-class sums of the trees' outputs (not divided by the number of
    /// iterations in `average_output` mode, like LightGBM).
    ///
    /// Features beyond `row.len()` are read as NaN.
    ///
    /// # Panics
    ///
    /// If `out.len() != self.num_outputs()`.
    pub fn predict_raw_into(&self, row: &[f64], out: &mut [f64]) {
        assert_eq!(out.len(), self.num_outputs, "output slice length must equal num_outputs()");
        if self.num_outputs == 1 {
            out[0] = self.sum_single(row);
            return;
        }
        self.sum_multi(row, out);
    }

    /// Predictions of `row` into `out`: probability (binary), class probabilities (multiclass, via
    /// softmax) or value (regression), exactly as LightGBM's normal prediction.
    ///
    /// Features beyond `row.len()` are read as NaN. Does not allocate.
    ///
    /// # Panics
    ///
    /// If `out.len() != self.num_outputs()`.
    pub fn predict_into(&self, row: &[f64], out: &mut [f64]) {
        self.predict_raw_into(row, out);
        if self.average_output {
            let n = self.num_iterations as f64;
            for v in out.iter_mut() {
                *v /= n;
            }
        }
        match self.transform {
            OutputTransform::Softmax => softmax_in_place(out),
            t => {
                for v in out.iter_mut() {
                    *v = apply_scalar(t, *v);
                }
            }
        }
    }

    /// Prediction of a single-output (binary or regression) model for `row`; see
    /// [`TreeEnsemble::predict_into`].
    ///
    /// # Panics
    ///
    /// If the model has more than one output (multiclass): use [`TreeEnsemble::predict_into`].
    pub fn predict(&self, row: &[f64]) -> f64 {
        assert_eq!(self.num_outputs, 1, "predict() is for single-output models; use predict_into()");
        let mut raw = self.sum_single(row);
        if self.average_output {
            raw /= self.num_iterations as f64;
        }
        apply_scalar(self.transform, raw)
    }

    /// Predictions of a single-output model for many rows, `rows` row-major with `width` values a
    /// row, into `out` (one per row): the same numbers, bit for bit, as [`TreeEnsemble::predict`]
    /// row by row (each row's trees are summed in model order, every split decided as there).
    ///
    /// The rows are taken a block at a time: their values are read once as the evaluator reads
    /// them (the zero band as `0.0`, features past `width` as NaN) into a block of the model's
    /// width, then each tree is walked for the whole block, [`ROW_LANES`] rows in lockstep for the
    /// tree's depth (leaves lead to themselves): the tree's nodes stay in the first-level cache,
    /// the rows' walks overlap and no branch depends on the data. An ensemble with a categorical
    /// split predicts the rows one at a time. One thread: a caller with many rows shares them out
    /// itself.
    ///
    /// # Panics
    ///
    /// If the model has more than one output, `width` is 0 or `rows.len() != width * out.len()`.
    pub fn predict_rows(&self, rows: &[f64], width: usize, out: &mut [f64]) {
        assert_eq!(self.num_outputs, 1, "predict_rows() is for single-output models");
        assert!(width > 0 && rows.len() == width * out.len(), "`rows` must hold `width` values for each output");
        let Some(batch) = &self.batch else {
            for (row, out) in rows.chunks_exact(width).zip(out.iter_mut()) {
                *out = self.predict(row);
            }
            return;
        };
        // At least one value a row: a leaf reads feature 0 (and goes to itself whatever it is).
        // Features past `width` stay NaN (missing) in every row.
        let features = self.num_features.max(1);
        let mut block = batch.empty_block(features);
        for (rows, sums) in rows.chunks(width * BLOCK_ROWS).zip(out.chunks_mut(BLOCK_ROWS)) {
            for (r, row) in rows.chunks_exact(width).enumerate() {
                batch.read_row(row, r, features, &mut block);
            }
            sums.fill(0.0);
            batch.add_trees(&block, sums);
            for sum in sums.iter_mut() {
                if self.average_output {
                    *sum /= self.num_iterations as f64;
                }
                *sum = apply_scalar(self.transform, *sum);
            }
        }
    }

    /// Output of tree `tree` (model order: iteration `tree / num_outputs()`, class
    /// `tree % num_outputs()`) for `row`. Summing trees iteration by iteration gives the raw score
    /// after every boosting round, which is how the trainer reads a validation curve off one model.
    ///
    /// # Panics
    ///
    /// If `tree >= self.num_trees()`.
    pub fn tree_value(&self, tree: usize, row: &[f64]) -> f64 {
        self.eval_tree(self.roots[tree], row)
    }

    /// Raw scores (single-output models) of `row` with its input `feature` set to each value of
    /// `grid` in turn, into `out` (one per grid value): the same numbers, bit for bit, as
    /// [`TreeEnsemble::predict_raw_into`] on each of those rows, for a fraction of the cost. Each tree
    /// is walked once, forking only at the nodes that split on `feature`, where the grid values
    /// part ways. A hazard model reads a whole survival curve this way, its interval index being
    /// the varying input.
    ///
    /// # Panics
    ///
    /// If the model has more than one output, or `out.len() != grid.len()`.
    pub fn predict_raw_grid(&self, row: &[f64], feature: usize, grid: &[f64], out: &mut [f64]) {
        assert_eq!(self.num_outputs, 1, "predict_raw_grid() is for single-output models");
        assert_eq!(out.len(), grid.len(), "one output per grid value");
        out.fill(0.0);
        for (grid, out) in grid.chunks(64).zip(out.chunks_mut(64)) {
            let all = if grid.len() == 64 { u64::MAX } else { (1u64 << grid.len()) - 1 };
            // An ascending grid of finite values splits at a threshold as a prefix, but for the
            // values in LightGBM's zero band, which may read as missing: those are decided alone.
            let ascending = grid.windows(2).all(|w| w[0] < w[1]) && grid.iter().all(|v| v.is_finite());
            let zero_band =
                grid.iter().enumerate().filter(|(_, v)| v.abs() <= K_ZERO_THRESHOLD).fold(0u64, |m, (i, _)| m | 1 << i);
            let walk = GridWalk { row, feature, grid, ascending, zero_band };
            for &root in &self.roots {
                self.walk_grid(&walk, root, all, out);
            }
        }
    }

    /// Adds the leaves that tree node `node` leads the grid values in `mask` to, into `out`.
    fn walk_grid(&self, walk: &GridWalk<'_>, mut node: i32, mask: u64, out: &mut [f64]) {
        while node >= 0 {
            let n = &self.nodes[node as usize];
            if n.feature as usize != walk.feature {
                node = n.next(walk.row, &self.cat_ranges, &self.cat_bits);
                continue;
            }
            let left = mask & self.grid_left(n, walk, mask);
            let right = mask & !left;
            match (left, right) {
                (0, _) => node = n.children[0],
                (_, 0) => node = n.children[1],
                _ => {
                    self.walk_grid(walk, n.children[1], left, out);
                    self.walk_grid(walk, n.children[0], right, out);
                    return;
                }
            }
        }
        let value = self.leaf_values[!node as usize];
        let mut bits = mask;
        while bits != 0 {
            let i = bits.trailing_zeros() as usize;
            bits &= bits - 1;
            out[i] += value;
        }
    }

    /// The grid values of `mask` that node `n` (a split on the grid's feature) sends left.
    fn grid_left(&self, n: &Node, walk: &GridWalk<'_>, mask: u64) -> u64 {
        let decide = |bits: u64| {
            let (mut left, mut bits) = (0u64, bits);
            while bits != 0 {
                let i = bits.trailing_zeros() as usize;
                bits &= bits - 1;
                if n.goes_left(walk.grid[i], &self.cat_ranges, &self.cat_bits) {
                    left |= 1 << i;
                }
            }
            left
        };
        if !walk.ascending || n.flags & FLAG_CATEGORICAL != 0 {
            return decide(mask);
        }
        // Outside the zero band a value goes left exactly when it is at most the threshold.
        let below = walk.grid.partition_point(|&v| v <= n.threshold);
        let prefix = if below >= 64 { u64::MAX } else { (1u64 << below) - 1 };
        (prefix & !walk.zero_band) | decide(mask & walk.zero_band)
    }

    /// Sum of all trees (single-output models), in model order like LightGBM (so bit-identical).
    #[inline]
    fn sum_single(&self, row: &[f64]) -> f64 {
        let mut sum = 0.0;
        let mut groups = self.roots.chunks_exact(LANES);
        for group in &mut groups {
            for value in self.eval_lanes(group, row) {
                sum += value;
            }
        }
        for &root in groups.remainder() {
            sum += self.eval_tree(root, row);
        }
        sum
    }

    /// Per-class sums (multi-output models): tree `i` belongs to class `i % num_outputs`. Each class
    /// accumulates its trees in model order, like LightGBM.
    fn sum_multi(&self, row: &[f64], out: &mut [f64]) {
        out.fill(0.0);
        let k = out.len();
        let mut class = 0;
        let mut groups = self.roots.chunks_exact(LANES);
        for group in &mut groups {
            for value in self.eval_lanes(group, row) {
                out[class] += value;
                class = if class + 1 == k { 0 } else { class + 1 };
            }
        }
        for &root in groups.remainder() {
            out[class] += self.eval_tree(root, row);
            class = if class + 1 == k { 0 } else { class + 1 };
        }
    }

    /// Leaf values of `LANES` trees for `row`, walked in lockstep: each step is a chain of dependent
    /// loads, and walking independent trees together lets the CPU overlap those chains.
    #[inline(always)]
    fn eval_lanes(&self, roots: &[i32], row: &[f64]) -> [f64; LANES] {
        let mut node = [0i32; LANES];
        node.copy_from_slice(roots);
        loop {
            let mut active = false;
            for n in node.iter_mut() {
                if *n >= 0 {
                    *n = self.nodes[*n as usize].next(row, &self.cat_ranges, &self.cat_bits);
                    active = true;
                }
            }
            if !active {
                break;
            }
        }
        node.map(|leaf| self.leaf_values[!leaf as usize])
    }

    #[inline(always)]
    fn eval_tree(&self, root: i32, row: &[f64]) -> f64 {
        let mut node = root;
        while node >= 0 {
            node = self.nodes[node as usize].next(row, &self.cat_ranges, &self.cat_bits);
        }
        self.leaf_values[!node as usize]
    }
}

#[inline]
fn apply_scalar(transform: OutputTransform, x: f64) -> f64 {
    match transform {
        OutputTransform::Identity | OutputTransform::Softmax => x,
        OutputTransform::SignedSquare => {
            let sign = f64::from(u8::from(x > 0.0)) - f64::from(u8::from(x < 0.0));
            sign * x * x
        }
        OutputTransform::Exp => x.exp(),
        OutputTransform::Sigmoid { scale } => 1.0 / (1.0 + (-scale * x).exp()),
        OutputTransform::Log1pExp => x.exp().ln_1p(),
    }
}

/// LightGBM's `Common::Softmax`, in place.
fn softmax_in_place(values: &mut [f64]) {
    let Some(&first) = values.first() else {
        return;
    };
    let max = values.iter().fold(first, |m, &v| if v > m { v } else { m });
    let mut sum = 0.0;
    for v in values.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    for v in values.iter_mut() {
        *v /= sum;
    }
}

/// Each feature's split thresholds over all `nodes` (see [`FeatureSplits`]).
fn feature_splits(nodes: &[Node], num_features: usize) -> Vec<FeatureSplits> {
    let mut splits = vec![FeatureSplits::default(); num_features];
    for node in nodes {
        // Features were checked against `num_features` when the tree was added.
        let Some(feature) = splits.get_mut(node.feature as usize) else { continue };
        if node.flags & FLAG_CATEGORICAL != 0 {
            feature.categorical = true;
        } else if !node.threshold.is_nan() {
            feature.thresholds.push(node.threshold);
        }
    }
    for feature in &mut splits {
        feature.thresholds.sort_unstable_by(f64::total_cmp);
        // -0.0 and 0.0 cut in the same place.
        feature.thresholds.dedup_by(|a, b| a == b);
    }
    splits
}

#[cfg(test)]
pub(crate) mod tests;
