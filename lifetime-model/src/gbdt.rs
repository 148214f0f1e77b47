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

mod grid;

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

/// The ensemble for many rows at a time: every leaf is a node that leads to itself (its value in
/// `threshold`), so a walk of a tree's depth in steps ends on the row's leaf whatever its path, and
/// rows walk a tree in lockstep without a branch on whether each has arrived.
#[derive(Debug, Clone)]
struct Batch {
    /// Internal nodes (the indices of [`TreeEnsemble::nodes`]), then one node per leaf (leaf `i`
    /// at `leaf_base + i`).
    nodes: Vec<BatchNode>,
    /// Per tree, in model order: its root and the number of steps to its deepest leaf.
    trees: Vec<(u32, u32)>,
    /// The first leaf node: every node before it is a split.
    leaf_base: u32,
    /// No split reads zero as missing, none compares with NaN and none sending a missing value
    /// right compares with +inf: a block then holds each feature twice, a missing value read as
    /// +inf in the first copy and as -inf in the second, and a split reads the copy that sends
    /// a missing value its way, so that `value <= threshold` alone decides it.
    plain: bool,
}

/// A numerical split, or a leaf, of [`Batch`] (24 bytes).
#[derive(Debug, Clone, Copy)]
struct BatchNode {
    /// The split's threshold; a leaf's value.
    threshold: f64,
    /// Right child, then left child (a leaf: itself twice).
    children: [u32; 2],
    /// Where the split's feature starts in a block: `feature * BLOCK_ROWS`, or, in a
    /// [`Batch::plain`] layout, `(2 * feature + missing_left) * BLOCK_ROWS`.
    offset: u32,
    /// [`FLAG_MISSING_LEFT`] and [`FLAG_ZERO_IS_MISSING`] of the split.
    flags: u8,
}

impl BatchNode {
    /// The child for `v`, the node's feature value already read as the evaluator reads it (the
    /// zero band is `0.0`): [`Node::goes_left`] for a numerical split, without a branch.
    /// `PLAIN`: the layout is [`Batch::plain`] (`v` is never NaN, and the comparison decides).
    #[inline(always)]
    fn next<const PLAIN: bool>(&self, v: f64) -> u32 {
        if PLAIN {
            return self.children[usize::from(v <= self.threshold)];
        }
        let missing = v.is_nan() | ((v == 0.0) & (self.flags & FLAG_ZERO_IS_MISSING != 0));
        let left = (missing & (self.flags & FLAG_MISSING_LEFT != 0)) | (!missing & (v <= self.threshold));
        self.children[usize::from(left)]
    }
}

impl Batch {
    /// The batch layout of `nodes`, `leaf_values` and `roots`; `None` if a split is categorical.
    fn new(nodes: &[Node], leaf_values: &[f64], roots: &[i32]) -> Option<Batch> {
        if nodes.iter().any(|node| node.flags & FLAG_CATEGORICAL != 0) {
            return None;
        }
        let leaf_base = nodes.len();
        // The builder keeps every index below i32::MAX.
        let index = |child: i32| if child >= 0 { child as u32 } else { (leaf_base + !child as usize) as u32 };
        let plain = nodes.iter().all(|node| {
            let missing_left = node.flags & FLAG_MISSING_LEFT != 0;
            node.flags & FLAG_ZERO_IS_MISSING == 0
                && !node.threshold.is_nan()
                && (missing_left || node.threshold < f64::INFINITY)
        });
        // A model of more than u32::MAX / (2 * BLOCK_ROWS) features predicts row by row.
        let offset = |node: &Node| -> Option<u32> {
            let column = if plain {
                node.feature.checked_mul(2)? + u32::from(node.flags & FLAG_MISSING_LEFT != 0)
            } else {
                node.feature
            };
            column.checked_mul(BLOCK_ROWS as u32)
        };
        let mut batch: Vec<BatchNode> = nodes
            .iter()
            .map(|node| {
                Some(BatchNode {
                    threshold: node.threshold,
                    children: node.children.map(index),
                    offset: offset(node)?,
                    flags: node.flags,
                })
            })
            .collect::<Option<_>>()?;
        batch.extend(leaf_values.iter().enumerate().map(|(i, &value)| {
            let this = (leaf_base + i) as u32;
            BatchNode { threshold: value, children: [this, this], offset: 0, flags: 0 }
        }));
        let trees = roots
            .iter()
            .map(|&root| {
                // Depth of the deepest leaf: the builder checked that every node is reached once.
                let mut depth = 0;
                let mut stack = vec![(root, 0u32)];
                while let Some((node, d)) = stack.pop() {
                    if node < 0 {
                        depth = depth.max(d);
                    } else {
                        for child in nodes[node as usize].children {
                            stack.push((child, d + 1));
                        }
                    }
                }
                (index(root), depth)
            })
            .collect();
        Some(Batch { nodes: batch, trees, leaf_base: leaf_base as u32, plain })
    }

    /// Adds each tree's leaf for each of the first `rows` rows of `block` to the row's sum in
    /// `sums`, trees in model order. `block` is feature-major, [`BLOCK_ROWS`] values a feature (row
    /// `r`'s feature `f` at `f * BLOCK_ROWS + r`), read as the evaluator reads them: one base
    /// address serves every lane.
    fn add_trees(&self, block: &[f64], sums: &mut [f64]) {
        if self.plain {
            self.add_trees_with::<true>(block, sums);
        } else {
            self.add_trees_with::<false>(block, sums);
        }
    }

    /// Reads `row` into row `r` of `block` ([`Batch::add_trees`]'s), each value as the evaluator
    /// reads it: the zero band as `0.0`, a feature past the row's end (left as it was) and NaN
    /// missing, in a [`Batch::plain`] layout +inf in a feature's first copy and -inf in its second.
    fn read_row(&self, row: &[f64], r: usize, features: usize, block: &mut [f64]) {
        for (f, &raw) in row.iter().take(features).enumerate() {
            // The C API stores only |v| > kZeroThreshold (or NaN) in its dense buffer.
            let value = if raw.abs() <= K_ZERO_THRESHOLD { 0.0 } else { raw };
            if self.plain {
                let missing = value.is_nan();
                block[2 * f * BLOCK_ROWS + r] = if missing { f64::INFINITY } else { value };
                block[(2 * f + 1) * BLOCK_ROWS + r] = if missing { f64::NEG_INFINITY } else { value };
            } else {
                block[f * BLOCK_ROWS + r] = value;
            }
        }
    }

    /// A block for `features` features, each missing in every row.
    fn empty_block(&self, features: usize) -> Vec<f64> {
        if self.plain {
            let missing = [f64::INFINITY, f64::NEG_INFINITY];
            (0..features * 2 * BLOCK_ROWS).map(|i| missing[i / BLOCK_ROWS % 2]).collect()
        } else {
            vec![f64::NAN; features * BLOCK_ROWS]
        }
    }

    fn add_trees_with<const PLAIN: bool>(&self, block: &[f64], sums: &mut [f64]) {
        let rows = sums.len();
        let groups = rows / ROW_LANES;
        for &(root, depth) in &self.trees {
            for (group, sums) in sums.chunks_exact_mut(ROW_LANES).enumerate() {
                let first = group * ROW_LANES;
                let mut node = [root; ROW_LANES];
                for _ in 0..depth {
                    for (lane, n) in node.iter_mut().enumerate() {
                        let split = &self.nodes[*n as usize];
                        *n = split.next::<PLAIN>(block[split.offset as usize + first + lane]);
                    }
                    // Every lane on a leaf (leaves come after all splits): the rest would stay.
                    if node.iter().fold(u32::MAX, |min, &n| min.min(n)) >= self.leaf_base {
                        break;
                    }
                }
                for (sum, n) in sums.iter_mut().zip(node) {
                    *sum += self.nodes[n as usize].threshold;
                }
            }
            for (row, sum) in sums.iter_mut().enumerate().skip(groups * ROW_LANES) {
                let mut n = root;
                for _ in 0..depth {
                    let split = &self.nodes[n as usize];
                    n = split.next::<PLAIN>(block[split.offset as usize + row]);
                }
                *sum += self.nodes[n as usize].threshold;
            }
        }
    }
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
    /// Parses a model in LightGBM's text format (`Booster::save_string()` / `Booster::save_file()`).
    ///
    /// The header, every tree and the `end of trees` marker are validated; everything after the
    /// marker (`feature_importances:`, `parameters:`, `pandas_categorical`) is ignored. A corrupt or
    /// truncated model yields an error naming the tree and key at fault, never a panic.
    pub fn from_lightgbm_text(text: &str) -> Result<TreeEnsemble, GbdtError> {
        let mut lines = text.lines().enumerate().peekable();

        // Header: `key=value` lines (or bare keys such as `tree`, `average_output`) up to the first tree.
        let mut header: HashMap<&str, &str> = HashMap::new();
        while let Some(&(_, line)) = lines.peek() {
            if line.starts_with("Tree=") || line == "end of trees" {
                break;
            }
            lines.next();
            if line.is_empty() {
                continue;
            }
            let (key, value) = line.split_once('=').unwrap_or((line, ""));
            header.insert(key, value);
        }

        let num_class = header_int(&header, "num_class")?;
        if num_class < 1 {
            return Err(bad_header("num_class", &num_class.to_string(), "must be at least 1"));
        }
        let per_iteration = match header.get("num_tree_per_iteration") {
            Some(_) => header_int(&header, "num_tree_per_iteration")?,
            None => num_class,
        };
        if per_iteration < 1 {
            return Err(bad_header("num_tree_per_iteration", &per_iteration.to_string(), "must be at least 1"));
        }
        let max_feature_idx = header_int(&header, "max_feature_idx")?;
        if max_feature_idx < 0 || max_feature_idx >= i64::from(u32::MAX) {
            return Err(bad_header("max_feature_idx", &max_feature_idx.to_string(), "out of range"));
        }
        let num_features = (max_feature_idx + 1) as usize;
        let num_outputs = per_iteration as usize;
        let transform = parse_objective(header.get("objective").copied(), num_class, per_iteration)?;
        let average_output = header.contains_key("average_output");

        // Trees.
        let mut builder = Builder::default();
        let mut ended = false;
        while let Some((line_idx, line)) = lines.next() {
            if line.is_empty() {
                continue;
            }
            if line == "end of trees" {
                ended = true;
                break;
            }
            let tree = builder.roots.len();
            let Some(index) = line.strip_prefix("Tree=") else {
                return Err(GbdtError::Syntax {
                    line: line_idx + 1,
                    reason: format!("expected `Tree={tree}` or `end of trees`, found `{}`", quote(line)),
                });
            };
            if index.parse::<usize>().ok() != Some(tree) {
                return Err(GbdtError::Syntax {
                    line: line_idx + 1,
                    reason: format!("expected `Tree={tree}`, found `{}`", quote(line)),
                });
            }
            let mut fields: HashMap<&str, &str> = HashMap::new();
            while let Some(&(field_idx, field)) = lines.peek() {
                if field.is_empty() || field.starts_with("Tree=") || field == "end of trees" {
                    break;
                }
                lines.next();
                let Some((key, value)) = field.split_once('=') else {
                    return Err(GbdtError::Syntax {
                        line: field_idx + 1,
                        reason: format!("tree {tree}: expected `key=value`, found `{}`", quote(field)),
                    });
                };
                if fields.insert(key, value).is_some() {
                    return Err(GbdtError::BadTreeValue {
                        tree,
                        key: key.to_owned(),
                        reason: "key appears twice".to_owned(),
                    });
                }
            }
            builder.add_tree(tree, &fields, num_features)?;
        }
        if !ended {
            return Err(GbdtError::Truncated {
                reason: format!("no `end of trees` line after {} tree(s)", builder.roots.len()),
            });
        }

        let num_trees = builder.roots.len();
        if num_trees == 0 {
            return Err(GbdtError::InvalidModel { reason: "the model contains no trees".to_owned() });
        }
        if num_trees % num_outputs != 0 {
            return Err(GbdtError::InvalidModel {
                reason: format!("{num_trees} trees is not a multiple of num_tree_per_iteration={num_outputs}"),
            });
        }
        if let Some(sizes) = header.get("tree_sizes") {
            let declared = sizes.split_ascii_whitespace().count();
            if declared != num_trees {
                return Err(GbdtError::Truncated {
                    reason: format!("tree_sizes declares {declared} trees but {num_trees} were found"),
                });
            }
        }

        let splits = feature_splits(&builder.nodes, num_features);
        let batch = Batch::new(&builder.nodes, &builder.leaf_values, &builder.roots);
        Ok(TreeEnsemble {
            splits,
            batch,
            nodes: builder.nodes,
            leaf_values: builder.leaf_values,
            cat_ranges: builder.cat_ranges,
            cat_bits: builder.cat_bits,
            roots: builder.roots,
            num_features,
            num_outputs,
            num_iterations: num_trees / num_outputs,
            average_output,
            transform,
        })
    }

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

/// Maps the `objective=` line to an output transform (LightGBM's `ParseObjectiveAlias` +
/// `CreateObjectiveFunction(const std::string&)` + `ConvertOutput`).
fn parse_objective(line: Option<&str>, num_class: i64, per_iteration: i64) -> Result<OutputTransform, GbdtError> {
    let Some(line) = line else {
        // No objective line: LightGBM applies no conversion (custom objective).
        return Ok(OutputTransform::Identity);
    };
    let mut tokens = line.split_ascii_whitespace();
    let name = tokens.next().unwrap_or("");
    let params: Vec<&str> = tokens.collect();
    let param = |key: &str| params.iter().find_map(|p| p.split_once(':').filter(|(k, _)| *k == key).map(|(_, v)| v));
    let has_sqrt = params.contains(&"sqrt");
    let single_output = |transform: OutputTransform| {
        if num_class == 1 && per_iteration == 1 {
            Ok(transform)
        } else {
            Err(GbdtError::InvalidModel {
                reason: format!(
                    "objective `{}` needs num_class=1 and num_tree_per_iteration=1, found {num_class} and {per_iteration}",
                    quote(line)
                ),
            })
        }
    };
    let canonical = match name {
        "regression"
        | "regression_l2"
        | "mean_squared_error"
        | "mse"
        | "l2"
        | "l2_root"
        | "root_mean_squared_error"
        | "rmse" => "regression",
        "regression_l1" | "mean_absolute_error" | "l1" | "mae" => "regression_l1",
        "multiclass" | "softmax" => "multiclass",
        "xentropy" | "cross_entropy" => "cross_entropy",
        "xentlambda" | "cross_entropy_lambda" => "cross_entropy_lambda",
        "mean_absolute_percentage_error" | "mape" => "mape",
        "none" | "null" | "custom" | "na" => "custom",
        other => other,
    };
    match canonical {
        // RegressionL2loss::ConvertOutput, inherited by L1, quantile, fair and MAPE.
        "regression" | "regression_l1" | "quantile" | "fair" | "mape" => {
            single_output(if has_sqrt { OutputTransform::SignedSquare } else { OutputTransform::Identity })
        }
        // Huber disables `sqrt` in its constructor.
        "huber" => single_output(OutputTransform::Identity),
        "poisson" | "gamma" | "tweedie" => single_output(OutputTransform::Exp),
        "binary" => {
            let Some(value) = param("sigmoid") else {
                return Err(bad_header("objective", line, "binary objective without `sigmoid:<value>`"));
            };
            let scale: f64 = value
                .parse()
                .map_err(|_| bad_header("objective", line, &format!("`{}` is not a number", quote(value))))?;
            if !(scale > 0.0 && scale.is_finite()) {
                return Err(bad_header("objective", line, "sigmoid must be a positive finite number"));
            }
            single_output(OutputTransform::Sigmoid { scale })
        }
        "cross_entropy" => single_output(OutputTransform::Sigmoid { scale: 1.0 }),
        "cross_entropy_lambda" => single_output(OutputTransform::Log1pExp),
        "multiclass" => {
            let Some(value) = param("num_class") else {
                return Err(bad_header("objective", line, "multiclass objective without `num_class:<K>`"));
            };
            let k: i64 = value
                .parse()
                .map_err(|_| bad_header("objective", line, &format!("`{}` is not an integer", quote(value))))?;
            if k < 2 || k != num_class || k != per_iteration {
                return Err(GbdtError::InvalidModel {
                    reason: format!(
                        "objective `{}` disagrees with num_class={num_class} / num_tree_per_iteration={per_iteration}",
                        quote(line)
                    ),
                });
            }
            Ok(OutputTransform::Softmax)
        }
        "custom" => Ok(OutputTransform::Identity),
        _ => Err(GbdtError::UnsupportedObjective { objective: quote(line) }),
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

/// Accumulates the flattened trees.
#[derive(Default)]
struct Builder {
    nodes: Vec<Node>,
    leaf_values: Vec<f64>,
    cat_ranges: Vec<(u32, u32)>,
    cat_bits: Vec<u32>,
    roots: Vec<i32>,
}

impl Builder {
    /// Validates one tree (LightGBM's `Tree::Tree(const char*, size_t*)`) and appends it.
    fn add_tree(&mut self, tree: usize, fields: &HashMap<&str, &str>, num_features: usize) -> Result<(), GbdtError> {
        let fields = TreeFields { tree, fields };
        if let Some(is_linear) = fields.get("is_linear") {
            let linear: i64 = parse_scalar(tree, "is_linear", is_linear)?;
            if linear != 0 {
                return Err(GbdtError::LinearTree { tree });
            }
        }
        let num_leaves: i64 = parse_scalar(tree, "num_leaves", fields.require("num_leaves")?)?;
        if num_leaves < 1 || num_leaves > i64::from(i32::MAX) {
            return Err(fields.bad("num_leaves", format!("{num_leaves} is out of range")));
        }
        let num_leaves = num_leaves as usize;
        let num_cat: i64 = parse_scalar(tree, "num_cat", fields.require("num_cat")?)?;
        if num_cat < 0 || num_cat > i64::from(i32::MAX) {
            return Err(fields.bad("num_cat", format!("{num_cat} is out of range")));
        }
        let num_cat = num_cat as usize;
        let leaf_values: Vec<f64> = fields.array("leaf_value", Some(num_leaves))?;

        let leaf_base = self.leaf_values.len();
        let node_base = self.nodes.len();
        if leaf_base + num_leaves > i32::MAX as usize || node_base + num_leaves > i32::MAX as usize {
            return Err(GbdtError::InvalidModel { reason: "the model has too many nodes".to_owned() });
        }
        if num_leaves == 1 {
            self.leaf_values.extend_from_slice(&leaf_values);
            self.roots.push(!(leaf_base as i32));
            return Ok(());
        }

        let num_nodes = num_leaves - 1;
        let split_feature: Vec<u32> = fields.array("split_feature", Some(num_nodes))?;
        let threshold: Vec<f64> = fields.array("threshold", Some(num_nodes))?;
        let decision_type: Vec<i8> = match fields.get("decision_type") {
            Some(_) => fields.array("decision_type", Some(num_nodes))?,
            None => vec![0; num_nodes],
        };
        let left_child: Vec<i32> = fields.array("left_child", Some(num_nodes))?;
        let right_child: Vec<i32> = fields.array("right_child", Some(num_nodes))?;

        let cat_slot_base = self.cat_ranges.len();
        let mut cat_ranges = Vec::with_capacity(num_cat);
        let mut cat_threshold = Vec::new();
        if num_cat > 0 {
            let boundaries: Vec<u32> = fields.array("cat_boundaries", Some(num_cat + 1))?;
            cat_threshold = fields.array::<u32>("cat_threshold", None)?;
            if boundaries.first() != Some(&0) {
                return Err(fields.bad("cat_boundaries", "must start at 0".to_owned()));
            }
            for pair in boundaries.windows(2) {
                if pair[1] < pair[0] {
                    return Err(fields.bad("cat_boundaries", "must be non-decreasing".to_owned()));
                }
                let Ok(start) = u32::try_from(self.cat_bits.len() + pair[0] as usize) else {
                    return Err(GbdtError::InvalidModel { reason: "too many categorical thresholds".to_owned() });
                };
                cat_ranges.push((start, pair[1] - pair[0]));
            }
            if boundaries.last().map(|&b| b as usize) != Some(cat_threshold.len()) {
                return Err(fields.bad(
                    "cat_boundaries",
                    format!("last boundary must equal the {} values of cat_threshold", cat_threshold.len()),
                ));
            }
        }

        let mut nodes = Vec::with_capacity(num_nodes);
        for i in 0..num_nodes {
            let feature = split_feature[i];
            if feature as usize >= num_features {
                return Err(fields.bad(
                    "split_feature",
                    format!("node {i} splits on feature {feature} but the model has {num_features} features"),
                ));
            }
            let dt = decision_type[i];
            if !(0..=15).contains(&dt) {
                return Err(fields.bad("decision_type", format!("node {i}: {dt} is not a valid decision type")));
            }
            let default_left = dt & 2 != 0;
            let (flags, node_threshold) = if dt & 1 != 0 {
                let t = threshold[i];
                if !(t >= 0.0 && t.fract() == 0.0 && (t as usize) < num_cat) {
                    return Err(fields.bad(
                        "threshold",
                        format!("categorical node {i} refers to category set {t} but num_cat={num_cat}"),
                    ));
                }
                (FLAG_CATEGORICAL, (cat_slot_base + t as usize) as f64)
            } else {
                let t = threshold[i];
                let (missing_left, zero_is_missing) = match (dt >> 2) & 3 {
                    // Missing type none: NaN reads as 0.0 and is compared like any value.
                    0 => (0.0 <= t, false),
                    // Missing type zero: zero, and NaN (which reads as 0.0), take the default side.
                    1 => (default_left, true),
                    // Missing type NaN: NaN takes the default side; zero is compared.
                    2 => (default_left, false),
                    _ => return Err(fields.bad("decision_type", format!("node {i}: {dt} has an unknown missing type"))),
                };
                let flags = if missing_left { FLAG_MISSING_LEFT } else { 0 }
                    | if zero_is_missing { FLAG_ZERO_IS_MISSING } else { 0 };
                (flags, t)
            };
            nodes.push(Node { threshold: node_threshold, children: [0, 0], feature, flags });
        }

        // Structure: from the root, every node and every leaf must be reached exactly once. This rules
        // out cycles and dangling children, so evaluation always terminates within bounds.
        let mut node_seen = vec![false; num_nodes];
        let mut leaf_seen = vec![false; num_leaves];
        let mut stack = vec![0usize];
        node_seen[0] = true;
        let mut map_child = |node: usize, child: i32, stack: &mut Vec<usize>| -> Result<i32, GbdtError> {
            if child >= 0 {
                let c = child as usize;
                if c >= num_nodes {
                    return Err(structure(
                        tree,
                        format!("node {node} has child node {c} but there are {num_nodes} nodes"),
                    ));
                }
                if std::mem::replace(&mut node_seen[c], true) {
                    return Err(structure(tree, format!("node {c} is reached twice")));
                }
                stack.push(c);
                Ok((node_base + c) as i32)
            } else {
                let leaf = !child as usize;
                if leaf >= num_leaves {
                    return Err(structure(
                        tree,
                        format!("node {node} has child leaf {leaf} but there are {num_leaves} leaves"),
                    ));
                }
                if std::mem::replace(&mut leaf_seen[leaf], true) {
                    return Err(structure(tree, format!("leaf {leaf} is reached twice")));
                }
                Ok(!((leaf_base + leaf) as i32))
            }
        };
        while let Some(i) = stack.pop() {
            let left = map_child(i, left_child[i], &mut stack)?;
            let right = map_child(i, right_child[i], &mut stack)?;
            nodes[i].children = [right, left];
        }
        if let Some(i) = node_seen.iter().position(|&seen| !seen) {
            return Err(structure(tree, format!("node {i} is unreachable from the root")));
        }
        if let Some(i) = leaf_seen.iter().position(|&seen| !seen) {
            return Err(structure(tree, format!("leaf {i} is unreachable from the root")));
        }

        self.nodes.extend_from_slice(&nodes);
        self.leaf_values.extend_from_slice(&leaf_values);
        self.cat_ranges.extend_from_slice(&cat_ranges);
        self.cat_bits.extend_from_slice(&cat_threshold);
        self.roots.push(node_base as i32);
        Ok(())
    }
}

/// The `key=value` fields of one tree, with error helpers naming the tree.
struct TreeFields<'a, 'b> {
    tree: usize,
    fields: &'b HashMap<&'a str, &'a str>,
}

impl TreeFields<'_, '_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.fields.get(key).copied()
    }

    fn require(&self, key: &'static str) -> Result<&str, GbdtError> {
        self.get(key).ok_or(GbdtError::MissingTreeKey { tree: self.tree, key })
    }

    fn bad(&self, key: &str, reason: String) -> GbdtError {
        GbdtError::BadTreeValue { tree: self.tree, key: key.to_owned(), reason }
    }

    /// A space-separated array, of exactly `len` values when given.
    fn array<T: FromStr>(&self, key: &'static str, len: Option<usize>) -> Result<Vec<T>, GbdtError> {
        let text = self.require(key)?;
        // No capacity from `len`: it comes from the (untrusted) model text.
        let mut values = Vec::new();
        for (i, token) in text.split_ascii_whitespace().enumerate() {
            match token.parse::<T>() {
                Ok(v) => values.push(v),
                Err(_) => {
                    return Err(
                        self.bad(key, format!("value #{i} `{}` is not a valid {}", quote(token), type_name::<T>()))
                    )
                }
            }
        }
        if let Some(len) = len {
            if values.len() != len {
                return Err(self.bad(key, format!("expected {len} values, found {}", values.len())));
            }
        }
        Ok(values)
    }
}

fn parse_scalar<T: FromStr>(tree: usize, key: &str, text: &str) -> Result<T, GbdtError> {
    text.trim().parse::<T>().map_err(|_| GbdtError::BadTreeValue {
        tree,
        key: key.to_owned(),
        reason: format!("`{}` is not a valid {}", quote(text), type_name::<T>()),
    })
}

fn header_int(header: &HashMap<&str, &str>, key: &'static str) -> Result<i64, GbdtError> {
    let value = header.get(key).ok_or(GbdtError::MissingHeaderKey { key })?;
    value.trim().parse::<i64>().map_err(|_| bad_header(key, value, "not an integer"))
}

fn bad_header(key: &str, value: &str, reason: &str) -> GbdtError {
    GbdtError::BadHeaderValue { key: key.to_owned(), value: quote(value), reason: reason.to_owned() }
}

fn structure(tree: usize, reason: String) -> GbdtError {
    GbdtError::BadTreeStructure { tree, reason }
}

/// A human name for the parsed number types.
fn type_name<T>() -> TypeName {
    TypeName(std::any::type_name::<T>())
}

struct TypeName(&'static str);

impl fmt::Display for TypeName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            "f64" => f.write_str("number"),
            "u32" => f.write_str("non-negative integer"),
            other => write!(f, "integer ({other})"),
        }
    }
}

/// `text`, shortened to at most `MAX_QUOTE` characters for error messages.
fn quote(text: &str) -> String {
    match text.char_indices().nth(MAX_QUOTE) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None => text.to_owned(),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The next value towards +infinity of a finite `x` (`f64::next_up` is younger than the MSRV).
    pub(crate) fn next_up(x: f64) -> f64 {
        if x == 0.0 {
            f64::from_bits(1)
        } else if x > 0.0 {
            f64::from_bits(x.to_bits() + 1)
        } else {
            f64::from_bits(x.to_bits() - 1)
        }
    }

    fn next_down(x: f64) -> f64 {
        -next_up(-x)
    }
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// Four trees on three features, binary objective with sigmoid:2.
    ///
    /// - Tree 0: node 0 = `f0 <= 0.5`, decision_type 10 (numerical, default left, missing NaN):
    ///   left leaf 0 (0.1), right node 1. Node 1 = `f1 <= -1.5`, decision_type 6 (numerical, default
    ///   left, missing zero): left leaf 1 (0.2), right leaf 2 (0.3).
    /// - Tree 1: categorical on f2, category set {0, 1, 3, 33} (words 11 = 0b1011 and 2 = 0b10):
    ///   in the set -> leaf 0 (1.0), else leaf 1 (-1.0).
    /// - Tree 2: a single leaf (0.25).
    /// - Tree 3: `f1 <= -0.5`, decision_type 0 (missing none, NaN reads 0.0): 0.01 / 0.02.
    const MODEL: &str = "tree
version=v4
num_class=1
num_tree_per_iteration=1
label_index=0
max_feature_idx=2
objective=binary sigmoid:2
feature_names=f0 f1 f2
feature_infos=[0:1] [-3:3] 0:1:3:33
tree_sizes=400 300 200 250

Tree=0
num_leaves=3
num_cat=0
split_feature=0 1
split_gain=10 5
threshold=0.5 -1.5
decision_type=10 6
left_child=-1 -2
right_child=1 -3
leaf_value=0.1 0.2 0.3
leaf_weight=1 1 1
leaf_count=10 10 10
internal_value=0 0
internal_weight=2 1
internal_count=30 20
is_linear=0
shrinkage=1


Tree=1
num_leaves=2
num_cat=1
split_feature=2
split_gain=3
threshold=0
decision_type=1
left_child=-1
right_child=-2
leaf_value=1 -1
leaf_weight=1 1
leaf_count=5 5
internal_value=0
internal_weight=2
internal_count=10
cat_boundaries=0 2
cat_threshold=11 2
is_linear=0
shrinkage=0.1


Tree=2
num_leaves=1
num_cat=0
split_feature=
split_gain=
threshold=
decision_type=
left_child=
right_child=
leaf_value=0.25
leaf_weight=
leaf_count=
internal_value=
internal_weight=
internal_count=
is_linear=0
shrinkage=1


Tree=3
num_leaves=2
num_cat=0
split_feature=1
split_gain=1
threshold=-0.5
decision_type=0
left_child=-1
right_child=-2
leaf_value=0.01 0.02
is_linear=0
shrinkage=1


end of trees

feature_importances:
f1=2
f0=1
f2=1

parameters:
[boosting: gbdt]
[objective: binary]
end of parameters

pandas_categorical:null
";

    fn model() -> TreeEnsemble {
        TreeEnsemble::from_lightgbm_text(MODEL).expect("hand-written model parses")
    }

    fn sigmoid2(raw: f64) -> f64 {
        1.0 / (1.0 + (-2.0 * raw).exp())
    }

    #[test]
    fn ensemble_is_send_sync_clone() {
        fn assert_traits<T: Send + Sync + Clone + fmt::Debug + 'static>() {}
        assert_traits::<TreeEnsemble>();
    }

    #[test]
    fn header_is_read() {
        let m = model();
        assert_eq!(m.num_features(), 3);
        assert_eq!(m.num_outputs(), 1);
        assert_eq!(m.num_trees(), 4);
        assert_eq!(m.output_transform(), OutputTransform::Sigmoid { scale: 2.0 });
    }

    #[test]
    fn hand_computed_predictions() {
        let nan = f64::NAN;
        let inf = f64::INFINITY;
        // (row, [tree 0, tree 1, tree 2, tree 3] leaf values worked out by hand)
        let cases: Vec<(Vec<f64>, [f64; 4])> = vec![
            // f0 <= 0.5 left; category 1 in set; f1 = 0 > -0.5.
            (vec![0.3, 0.0, 1.0], [0.1, 1.0, 0.25, 0.02]),
            // Threshold is inclusive.
            (vec![0.5, 2.0, 1.0], [0.1, 1.0, 0.25, 0.02]),
            // NaN with missing type NaN takes the default (left) side.
            (vec![nan, 5.0, 3.0], [0.1, 1.0, 0.25, 0.02]),
            // f1 NaN: missing type zero reads 0.0 -> default left; missing type none reads 0.0 -> right.
            (vec![0.7, nan, 2.0], [0.2, -1.0, 0.25, 0.02]),
            (vec![0.7, 2.0, 33.0], [0.3, 1.0, 0.25, 0.02]),
            // Non-zero below threshold; category 33.9 truncates to 33.
            (vec![0.7, -2.0, 33.9], [0.2, 1.0, 0.25, 0.01]),
            // |1e-36| <= kZeroThreshold is zero: default left; negative category -> right.
            (vec![0.7, 1e-36, -1.0], [0.2, -1.0, 0.25, 0.02]),
            // Categorical NaN, huge, beyond the bitset, absent (32) -> right.
            (vec![0.7, 2.0, nan], [0.3, -1.0, 0.25, 0.02]),
            (vec![0.7, 2.0, 1e10], [0.3, -1.0, 0.25, 0.02]),
            (vec![0.7, 2.0, 64.0], [0.3, -1.0, 0.25, 0.02]),
            (vec![0.7, 2.0, 32.0], [0.3, -1.0, 0.25, 0.02]),
            // -0.5 truncates toward zero to category 0, which is in the set.
            (vec![0.7, 2.0, -0.5], [0.3, 1.0, 0.25, 0.02]),
            (vec![inf, -inf, inf], [0.2, -1.0, 0.25, 0.01]),
            // Short rows: absent features read NaN.
            (vec![0.7], [0.2, -1.0, 0.25, 0.02]),
            (vec![], [0.1, -1.0, 0.25, 0.02]),
            // Extra values are ignored.
            (vec![0.3, 0.0, 1.0, 99.0, 98.0], [0.1, 1.0, 0.25, 0.02]),
        ];
        let m = model();
        for (row, leaves) in cases {
            let raw = leaves[0] + leaves[1] + leaves[2] + leaves[3];
            let mut out = [f64::NAN];
            m.predict_raw_into(&row, &mut out);
            assert!((out[0] - raw).abs() < 1e-12, "raw of {row:?}: {} != {raw}", out[0]);
            m.predict_into(&row, &mut out);
            assert!((out[0] - sigmoid2(raw)).abs() < 1e-12, "probability of {row:?}");
            assert_eq!(m.predict(&row), out[0]);
            // Tree by tree, as the trainer reads validation curves.
            for (tree, leaf) in leaves.iter().enumerate() {
                assert_eq!(m.tree_value(tree, &row), *leaf, "tree {tree} of {row:?}");
            }
            assert_eq!(m.output_transform().apply(raw), sigmoid2(raw));
        }
    }

    #[test]
    fn constant_ranges_are_the_cuts_of_the_feature() {
        let m = model();
        let band =
            |r: Option<ConstantRange>| r.is_some_and(|r| r.contains(-K_ZERO_THRESHOLD) && r.up_to == K_ZERO_THRESHOLD);
        // f0 is cut at 0.5; f1 at -1.5 and -0.5; f2 is categorical.
        assert_eq!(m.constant_range(0, 0.3), Some(ConstantRange { above: K_ZERO_THRESHOLD, up_to: 0.5 }));
        assert_eq!(m.constant_range(0, 0.5), Some(ConstantRange { above: K_ZERO_THRESHOLD, up_to: 0.5 }));
        assert_eq!(m.constant_range(0, 0.7), Some(ConstantRange { above: 0.5, up_to: f64::INFINITY }));
        assert_eq!(m.constant_range(1, -1.0), Some(ConstantRange { above: -1.5, up_to: -0.5 }));
        assert_eq!(m.constant_range(1, -9.0), Some(ConstantRange { above: f64::NEG_INFINITY, up_to: -1.5 }));
        assert_eq!(
            m.constant_range(1, -0.1),
            Some(ConstantRange { above: -0.5, up_to: BELOW_ZERO_BAND }),
            "the zero band is not part of its neighbours"
        );
        assert!(
            band(m.constant_range(1, 0.0)) && band(m.constant_range(1, -1e-36)) && band(m.constant_range(0, 1e-35))
        );
        assert_eq!(m.constant_range(2, 1.0), None, "categorical");
        assert_eq!(m.constant_range(0, f64::NAN), None, "missing");
        assert_eq!(m.constant_range(3, 1.0), None, "no such feature");
    }

    #[test]
    fn predictions_are_constant_over_constant_ranges() {
        let m = model();
        let k = K_ZERO_THRESHOLD;
        let mut values = vec![0.0, -0.0, k, -k, next_up(k), next_down(-k), 1e-36, -1e-36, 1e300, -1e300, f64::INFINITY];
        for t in [0.5f64, -1.5, -0.5] {
            values.extend([t, next_up(t), next_down(t), t + 0.25, t - 0.25]);
        }
        let others = [0.3, 0.7, f64::NAN, 0.0, -2.0, 1.0, 33.0, 5.0];
        for feature in 0..2 {
            for &value in &values {
                let range = m.constant_range(feature, value).expect("numerical feature");
                assert!(range.contains(value), "feature {feature}: {value} in {range:?}");
                for &other in values.iter().filter(|&&w| range.contains(w)) {
                    for base in others.windows(3) {
                        let (mut at, mut moved) = (base.to_vec(), base.to_vec());
                        at[feature] = value;
                        moved[feature] = other;
                        assert_eq!(m.predict(&at).to_bits(), m.predict(&moved).to_bits(), "{at:?} vs {moved:?}");
                    }
                }
            }
        }
    }

    /// `predict_raw_grid` over `grid` gives, bit for bit, the raw score of each row alone, for
    /// several bases and either feature varying.
    fn grid_equals_one_row_at_a_time(grid: &[f64]) {
        let m = model();
        let mut out = vec![f64::NAN; grid.len()];
        let mut one = [0.0];
        for base in [[0.3, 0.7], [f64::NAN, 0.0], [-2.0, 1.0], [33.0, 5.0]] {
            for feature in 0..2 {
                m.predict_raw_grid(&base, feature, grid, &mut out);
                for (&value, &got) in grid.iter().zip(&out) {
                    let mut row = base;
                    row[feature] = value;
                    m.predict_raw_into(&row, &mut one);
                    assert_eq!(got.to_bits(), one[0].to_bits(), "{row:?}");
                }
            }
        }
    }

    #[test]
    fn many_rows_predict_as_each_row_alone() {
        // Rows of every kind the decisions treat apart (NaN, zero band, categories, out of range),
        // in numbers of rows that leave every remainder of a lockstep group and of a block.
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let values = [f64::NAN, 0.0, 1e-40, -1e-40, 0.5, -1.5, -0.5, 1.0, 3.0, 33.0, 34.0, -2.0, 2.5];
        let m = model();
        for rows in [0, 1, 7, 8, 9, 63, 64, 65, 200] {
            for width in [2, 3, 5] {
                let matrix: Vec<f64> = (0..rows * width).map(|_| values[rng.random_range(0..values.len())]).collect();
                let mut out = vec![f64::NAN; rows];
                m.predict_rows(&matrix, width, &mut out);
                for (row, got) in matrix.chunks_exact(width).zip(&out) {
                    assert_eq!(got.to_bits(), m.predict(row).to_bits(), "{row:?}");
                }
            }
        }
    }

    /// A model of `trees` random numerical trees on `features` features (every missing type, both
    /// default sides, thresholds at and around zero and LightGBM's zero threshold), in LightGBM's
    /// text format.
    fn random_numerical_model(
        rng: &mut ChaCha8Rng,
        trees: usize,
        features: usize,
        decision_types: &[i8],
        extreme: bool,
    ) -> String {
        let mut thresholds =
            vec![0.0, K_ZERO_THRESHOLD, -K_ZERO_THRESHOLD, 1.0000000180025095e-35, 0.5, -1.5, 1.0, 3.0, -0.5, 1e300];
        if extreme {
            thresholds.extend([f64::INFINITY, f64::NEG_INFINITY]);
        }
        let mut text = format!(
            "tree\nversion=v4\nnum_class=1\nnum_tree_per_iteration=1\nlabel_index=0\nmax_feature_idx={}\nobjective=binary sigmoid:1\n\n",
            features - 1
        );
        for tree in 0..trees {
            let leaves = 1 + rng.random_range(0..40usize);
            text.push_str(&format!("Tree={tree}\nnum_leaves={leaves}\nnum_cat=0\n"));
            if leaves > 1 {
                // Split a random leaf until there are `leaves`: node 0 starts with leaves 0 and 1;
                // `slots` are where the leaves hang (node, on its left).
                let (mut left, mut right) = (vec![!0i32], vec![!1i32]);
                let mut slots = vec![(0usize, true), (0, false)];
                for leaf in 2..leaves as i32 {
                    let slot = rng.random_range(0..slots.len());
                    let (node, on_left) = slots[slot];
                    let new = left.len();
                    let side = if on_left { &mut left } else { &mut right };
                    let old = std::mem::replace(&mut side[node], new as i32);
                    left.push(old);
                    right.push(!leaf);
                    slots[slot] = (new, true);
                    slots.push((new, false));
                }
                let nodes = left.len();
                let join = |values: Vec<String>| values.join(" ");
                text.push_str(&format!(
                    "split_feature={}\nthreshold={}\ndecision_type={}\nleft_child={}\nright_child={}\n",
                    join((0..nodes).map(|_| rng.random_range(0..features).to_string()).collect()),
                    join(
                        (0..nodes)
                            .map(|_| format!("{:?}", thresholds[rng.random_range(0..thresholds.len())]))
                            .collect()
                    ),
                    join(
                        (0..nodes)
                            .map(|_| decision_types[rng.random_range(0..decision_types.len())].to_string())
                            .collect()
                    ),
                    join(left.iter().map(i32::to_string).collect()),
                    join(right.iter().map(i32::to_string).collect()),
                ));
            }
            let values: Vec<String> = (0..leaves).map(|_| format!("{:?}", rng.random_range(-1.0..1.0f64))).collect();
            text.push_str(&format!("leaf_value={}\n\n", values.join(" ")));
        }
        text.push_str("end of trees\n");
        text
    }

    #[test]
    fn many_rows_predict_as_each_row_alone_through_the_batch_layout() {
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        let values = [
            f64::NAN,
            0.0,
            -0.0,
            1e-40,
            -1e-40,
            K_ZERO_THRESHOLD,
            0.5,
            -1.5,
            -0.5,
            1.0,
            3.0,
            2.5,
            f64::INFINITY,
            f64::NEG_INFINITY,
        ];
        // Every missing type (zero as missing: the general layout), missing types none and NaN
        // (the plain layout), and those with infinite thresholds (general again when a split that
        // sends a missing value right compares with +inf; plain when every split sends it left).
        let kinds: [(&[i8], bool, Option<bool>); 4] = [
            (&[0, 2, 4, 6, 8, 10], false, Some(false)),
            (&[0, 2, 8, 10], false, Some(true)),
            (&[0, 2, 8, 10], true, None),
            (&[2, 10], true, Some(true)),
        ];
        for ((decision_types, extreme, plain), features) in kinds.into_iter().zip([1, 3, 6, 4]) {
            let text = random_numerical_model(&mut rng, 30, features, decision_types, extreme);
            let m = TreeEnsemble::from_lightgbm_text(&text).unwrap();
            let batch = m.batch.as_ref().expect("a numerical model has the batch layout");
            if let Some(plain) = plain {
                assert_eq!(batch.plain, plain, "{decision_types:?} {extreme}");
            }
            let cut = m.truncated(17);
            // Rows narrower than the model (the rest missing), as wide, and wider.
            for width in [features.saturating_sub(1).max(1), features, features + 2] {
                for rows in [0, 1, 7, 8, 9, 63, 64, 65, 130] {
                    let matrix: Vec<f64> =
                        (0..rows * width).map(|_| values[rng.random_range(0..values.len())]).collect();
                    for model in [&m, &cut] {
                        let mut out = vec![f64::NAN; rows];
                        model.predict_rows(&matrix, width, &mut out);
                        for (row, got) in matrix.chunks_exact(width).zip(&out) {
                            assert_eq!(got.to_bits(), model.predict(row).to_bits(), "{row:?}");
                        }
                    }
                }
            }
        }
        assert!(model().batch.is_none(), "a categorical split: rows one at a time");
    }

    #[test]
    fn grid_predictions_equal_one_row_at_a_time() {
        let k = K_ZERO_THRESHOLD;
        let mut grid = vec![0.0, -0.0, k, -k, next_up(k), next_down(-k), 1e-36, 1e300, -1e300, f64::NAN, f64::INFINITY];
        for t in [0.5f64, -1.5, -0.5] {
            grid.extend([t, next_up(t), next_down(t), t + 0.25, t - 0.25]);
        }
        // More than one 64-value chunk.
        grid.extend((0..60).map(|i| f64::from(i) * 0.1 - 3.0));
        grid_equals_one_row_at_a_time(&grid);
    }

    #[test]
    fn ascending_grids_are_parted_as_prefixes_with_the_same_numbers() {
        let k = K_ZERO_THRESHOLD;
        let mut grid = vec![-3.0, -1.5, next_down(-0.5), -0.5, -k, 0.0, k, next_up(k), 0.5, next_up(0.5), 1.0, 17.0];
        grid.extend((0..70).map(|i| 20.0 + f64::from(i)));
        grid_equals_one_row_at_a_time(&grid);
    }

    #[test]
    fn multiclass_softmax_interleaves_trees() {
        let mut text = String::from(
            "tree\nnum_class=3\nnum_tree_per_iteration=3\nlabel_index=0\nmax_feature_idx=0\n\
             objective=multiclass num_class:3\n\n",
        );
        for (i, v) in [1.0, 2.0, 3.0, 0.5, 0.5, 0.5].iter().enumerate() {
            text.push_str(&format!("Tree={i}\nnum_leaves=1\nnum_cat=0\nleaf_value={v}\nshrinkage=1\n\n"));
        }
        text.push_str("end of trees\n");
        let m = TreeEnsemble::from_lightgbm_text(&text).unwrap();
        assert_eq!(m.num_outputs(), 3);
        let mut raw = [0.0; 3];
        m.predict_raw_into(&[0.0], &mut raw);
        assert_eq!(raw, [1.5, 2.5, 3.5]);
        let mut p = [0.0; 3];
        m.predict_into(&[0.0], &mut p);
        let z: f64 = [-2.0f64, -1.0, 0.0].iter().map(|x| x.exp()).sum();
        for (k, x) in [-2.0f64, -1.0, 0.0].iter().enumerate() {
            assert!((p[k] - x.exp() / z).abs() < 1e-15);
        }
    }

    fn single_leaf_model(objective: &str, extra_header: &str, leaves: &[f64]) -> String {
        let mut text = format!(
            "tree\nnum_class=1\nnum_tree_per_iteration=1\nlabel_index=0\nmax_feature_idx=0\n{objective}\n{extra_header}\n"
        );
        for (i, v) in leaves.iter().enumerate() {
            text.push_str(&format!("Tree={i}\nnum_leaves=1\nnum_cat=0\nleaf_value={v}\n\n"));
        }
        text.push_str("end of trees\n");
        text
    }

    #[test]
    fn average_output_divides_only_the_transformed_prediction() {
        let text = single_leaf_model("objective=regression", "average_output", &[1.0, 3.0]);
        let m = TreeEnsemble::from_lightgbm_text(&text).unwrap();
        assert_eq!(m.predict(&[0.0]), 2.0);
        let mut raw = [0.0];
        m.predict_raw_into(&[0.0], &mut raw);
        assert_eq!(raw[0], 4.0, "LightGBM's raw score is not averaged");
    }

    #[test]
    fn regression_transforms() {
        let cases = [
            ("objective=regression", OutputTransform::Identity, -1.5),
            ("objective=regression sqrt", OutputTransform::SignedSquare, -2.25),
            ("objective=huber", OutputTransform::Identity, -1.5),
            ("objective=poisson", OutputTransform::Exp, (-1.5f64).exp()),
            ("objective=cross_entropy_lambda", OutputTransform::Log1pExp, (-1.5f64).exp().ln_1p()),
            ("", OutputTransform::Identity, -1.5),
        ];
        for (objective, transform, expected) in cases {
            let m = TreeEnsemble::from_lightgbm_text(&single_leaf_model(objective, "", &[-1.0, -0.5])).unwrap();
            assert_eq!(m.output_transform(), transform, "{objective}");
            assert_eq!(m.predict(&[]), expected, "{objective}");
        }
    }

    #[test]
    fn unsupported_objectives_are_named() {
        for objective in ["multiclassova num_class:3 sigmoid:1", "lambdarank", "rank_xendcg", "frobnicate"] {
            let text = MODEL.replace("objective=binary sigmoid:2", &format!("objective={objective}"));
            let err = TreeEnsemble::from_lightgbm_text(&text).unwrap_err();
            assert!(matches!(err, GbdtError::UnsupportedObjective { .. }), "{objective}: {err:?}");
            assert!(err.to_string().contains(objective), "{err}");
        }
        let err = TreeEnsemble::from_lightgbm_text(&MODEL.replace("sigmoid:2", "sigmoid:x")).unwrap_err();
        assert!(matches!(err, GbdtError::BadHeaderValue { .. }), "{err:?}");
    }

    #[test]
    fn truncated_text_is_an_error_at_every_cut() {
        let end = MODEL.find("end of trees").unwrap() + "end of trees".len();
        for cut in 0..end {
            if !MODEL.is_char_boundary(cut) {
                continue;
            }
            assert!(TreeEnsemble::from_lightgbm_text(&MODEL[..cut]).is_err(), "prefix of {cut} bytes parsed");
        }
        let err = TreeEnsemble::from_lightgbm_text(&MODEL[..MODEL.find("Tree=2").unwrap()]).unwrap_err();
        assert!(matches!(err, GbdtError::Truncated { .. }), "{err:?}");
        assert!(TreeEnsemble::from_lightgbm_text(&MODEL[..end]).is_ok());
    }

    fn expect_tree_error(text: &str, tree: usize, key: &str) {
        match TreeEnsemble::from_lightgbm_text(text) {
            Err(GbdtError::BadTreeValue { tree: t, key: k, reason }) => {
                assert_eq!((t, k.as_str()), (tree, key), "{reason}");
            }
            other => panic!("expected a bad value for tree {tree} key {key}, got {other:?}"),
        }
    }

    #[test]
    fn bad_numbers_name_tree_and_key() {
        expect_tree_error(&MODEL.replace("threshold=-0.5", "threshold=-0.5x"), 3, "threshold");
        expect_tree_error(&MODEL.replace("leaf_value=1 -1", "leaf_value=1 abc"), 1, "leaf_value");
        expect_tree_error(&MODEL.replace("leaf_value=1 -1", "leaf_value=1"), 1, "leaf_value");
        expect_tree_error(&MODEL.replace("left_child=-1 -2", "left_child=-1 2.5"), 0, "left_child");
        expect_tree_error(&MODEL.replace("decision_type=10 6", "decision_type=10 14"), 0, "decision_type");
        expect_tree_error(&MODEL.replace("split_feature=0 1", "split_feature=0 3"), 0, "split_feature");
        expect_tree_error(&MODEL.replace("cat_threshold=11 2", "cat_threshold=11"), 1, "cat_boundaries");
        expect_tree_error(
            &MODEL.replace("split_feature=2\nsplit_gain=3\nthreshold=0", "split_feature=2\nsplit_gain=3\nthreshold=1"),
            1,
            "threshold",
        );
        let err = TreeEnsemble::from_lightgbm_text(&MODEL.replace("num_class=1", "num_class=one")).unwrap_err();
        assert!(matches!(&err, GbdtError::BadHeaderValue { key, .. } if key == "num_class"), "{err:?}");
        assert!(err.to_string().contains("num_class"));
    }

    #[test]
    fn missing_keys_and_linear_trees_are_errors() {
        let err = TreeEnsemble::from_lightgbm_text(&MODEL.replace("leaf_value=0.25\n", "")).unwrap_err();
        assert_eq!(err, GbdtError::MissingTreeKey { tree: 2, key: "leaf_value" });
        let err = TreeEnsemble::from_lightgbm_text(&MODEL.replace("max_feature_idx=2\n", "")).unwrap_err();
        assert_eq!(err, GbdtError::MissingHeaderKey { key: "max_feature_idx" });
        let linear = MODEL.replacen("is_linear=0", "is_linear=1", 2);
        let err = TreeEnsemble::from_lightgbm_text(&linear).unwrap_err();
        assert_eq!(err, GbdtError::LinearTree { tree: 0 });
        assert!(err.to_string().contains("linear trees are not supported"));
        let err = TreeEnsemble::from_lightgbm_text(&MODEL.replace("Tree=2", "Tree=7")).unwrap_err();
        assert!(matches!(err, GbdtError::Syntax { .. }), "{err:?}");
        let err =
            TreeEnsemble::from_lightgbm_text(&MODEL.replace("tree_sizes=400 300 200 250", "tree_sizes=1 2 3 4 5"))
                .unwrap_err();
        assert!(matches!(err, GbdtError::Truncated { .. }), "{err:?}");
    }

    #[test]
    fn malformed_structures_are_errors() {
        for (from, to) in [
            ("right_child=1 -3", "right_child=1 -4"),  // leaf out of range
            ("right_child=1 -3", "right_child=1 0"),   // cycle back to the root
            ("right_child=1 -3", "right_child=1 1"),   // node 1 is its own child
            ("right_child=1 -3", "right_child=-3 -3"), // node 1 unreachable
            ("left_child=-1 -2", "left_child=-2 -2"),  // leaf 1 twice
        ] {
            let err = TreeEnsemble::from_lightgbm_text(&MODEL.replace(from, to)).unwrap_err();
            assert!(matches!(err, GbdtError::BadTreeStructure { tree: 0, .. }), "{to}: {err:?}");
        }
    }

    /// Random byte-level corruption never panics: it parses (and then predicts) or errors.
    #[test]
    fn corruption_never_panics() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let alphabet = b"0123456789-.e =\nTxn";
        for _ in 0..3000 {
            let mut bytes = MODEL.as_bytes().to_vec();
            for _ in 0..rng.random_range(1..4) {
                let at = rng.random_range(0..bytes.len());
                match rng.random_range(0..3) {
                    0 => bytes[at] = alphabet[rng.random_range(0..alphabet.len())],
                    1 => {
                        bytes.remove(at);
                    }
                    _ => bytes.insert(at, alphabet[rng.random_range(0..alphabet.len())]),
                }
            }
            let Ok(text) = String::from_utf8(bytes) else { continue };
            if let Ok(m) = TreeEnsemble::from_lightgbm_text(&text) {
                let mut out = vec![0.0; m.num_outputs()];
                for row in [&[0.3, 0.0, 1.0][..], &[f64::NAN; 3], &[], &[1e300, -1e300, 7.0]] {
                    m.predict_into(row, &mut out);
                }
            }
        }
    }
}
