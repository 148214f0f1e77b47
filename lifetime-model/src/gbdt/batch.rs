//! The layout for many rows at a time ([`TreeEnsemble::predict_rows`]): every leaf a node leading
//! to itself, eight rows walking a tree in lockstep over a feature-major block.

use super::*;

/// The ensemble for many rows at a time: every leaf is a node that leads to itself (its value in
/// `threshold`), so a walk of a tree's depth in steps ends on the row's leaf whatever its path, and
/// rows walk a tree in lockstep without a branch on whether each has arrived.
#[derive(Debug, Clone)]
pub(super) struct Batch {
    /// Internal nodes (the indices of [`TreeEnsemble::nodes`]), then one node per leaf (leaf `i`
    /// at `leaf_base + i`).
    nodes: Vec<BatchNode>,
    /// Per tree, in model order: its root and the number of steps to its deepest leaf.
    pub(super) trees: Vec<(u32, u32)>,
    /// The first leaf node: every node before it is a split.
    leaf_base: u32,
    /// No split reads zero as missing, none compares with NaN and none sending a missing value
    /// right compares with +inf: a block then holds each feature twice, a missing value read as
    /// +inf in the first copy and as -inf in the second, and a split reads the copy that sends
    /// a missing value its way, so that `value <= threshold` alone decides it.
    pub(super) plain: bool,
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
    pub(super) fn new(nodes: &[Node], leaf_values: &[f64], roots: &[i32]) -> Option<Batch> {
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
    pub(super) fn add_trees(&self, block: &[f64], sums: &mut [f64]) {
        if self.plain {
            self.add_trees_with::<true>(block, sums);
        } else {
            self.add_trees_with::<false>(block, sums);
        }
    }

    /// Reads `row` into row `r` of `block` ([`Batch::add_trees`]'s), each value as the evaluator
    /// reads it: the zero band as `0.0`, a feature past the row's end (left as it was) and NaN
    /// missing, in a [`Batch::plain`] layout +inf in a feature's first copy and -inf in its second.
    pub(super) fn read_row(&self, row: &[f64], r: usize, features: usize, block: &mut [f64]) {
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
    pub(super) fn empty_block(&self, features: usize) -> Vec<f64> {
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
