//! A tree ensemble's raw scores over a fixed grid of one input, row after row: what a hazard
//! model's survival curve is (the grid being its interval inputs), read at every placement.
//!
//! Why not [`TreeEnsemble::predict_raw_grid`]: its walk forks at every split on the grid's input
//! (the default hazard model has 8.5 of them in each tree of 30 splits), so a curve is a few
//! thousand dependent node loads whose next address is known only once the last one arrived, and
//! an allocator that moved through a million VMs since the last curve misses the cache on them.
//!
//! [`GridScorer`] decides every split of every tree instead, without a walk, in the manner of
//! QuickScorer (Lucchese et al., SIGIR 2015): number each tree's leaves from left to right; a
//! split that sends the row right rules out the leaves of its left subtree, and the leaf the row
//! reaches is the leftmost leaf that no split ruled out. A tree's leaves fit in a mask of 32 or 64
//! bits, so each split is one comparison and one AND, on nodes read in order (the prefetcher sees
//! the stream, and no load waits on another). The splits on the grid's input are decided once,
//! when the scorer is built, into one mask per tree and grid value; a row's curve is then, per
//! tree, the AND of its splits' masks and, per grid value, the lowest bit left with the grid
//! value's mask. The leaves are those the walk reaches, and each grid value's sum adds them in
//! model order, so the scores are the same, bit for bit.
//!
//! The nodes are read cold at every placement (the allocator's own data evicts them between two),
//! so they are small: a split compares the rank of the row's value among its feature's thresholds
//! (all trees' splits on the feature, sorted) with the rank of its own threshold, 16 bits each,
//! which decides as the values would: for sorted distinct thresholds `t` and a value `x` that is
//! not NaN, `x <= t[k]` exactly when fewer than `k + 1` thresholds are below `x`. With its mask a
//! split is 8 bytes (16 past 32 leaves), a third of the ensemble's node.

use super::{Node, TreeEnsemble, FLAG_CATEGORICAL, FLAG_MISSING_LEFT, FLAG_ZERO_IS_MISSING, K_ZERO_THRESHOLD};
use std::ops::BitAnd;

/// Features of a row read on the stack (twice each); wider models use the heap.
const STACK_FEATURES: usize = 64;

/// [`TreeEnsemble::predict_raw_grid`] for one fixed input and grid, many rows: see the module.
#[derive(Debug, Clone)]
pub struct GridScorer {
    grid_len: usize,
    /// The model's width: a row's values past its end read as missing.
    features: usize,
    /// Per feature, the thresholds of the splits on it (not on the grid's input), ascending and
    /// distinct: `cuts[cut_ranges[f].0..cut_ranges[f].1]`.
    cuts: Vec<f64>,
    cut_ranges: Vec<(u32, u32)>,
    /// Per tree, in model order: where its splits end in the layout's nodes (they start where the
    /// previous tree's end) and where its leaves start in `leaves`.
    trees: Vec<(u32, u32)>,
    layout: Layout,
    /// Per tree, its leaves' values from left to right.
    leaves: Vec<f64>,
}

/// The splits and grid masks, with masks as wide as the largest tree needs.
#[derive(Debug, Clone)]
enum Layout {
    Narrow(Masks<u32>),
    Wide(Masks<u64>),
}

#[derive(Debug, Clone)]
struct Masks<M> {
    /// Every split not on the grid's input, tree after tree.
    nodes: Vec<MaskNode<M>>,
    /// Per tree, one mask per grid value: the leaves its splits on the grid's input leave.
    grid_masks: Vec<M>,
}

/// A numerical split read as the mask of the leaves it leaves when the row goes right.
#[derive(Debug, Clone, Copy)]
struct MaskNode<M> {
    /// Its threshold's rank among its feature's cuts: the row goes left when its value's rank is
    /// at most this.
    rank: u16,
    /// Which rank of the read row the split compares ([`GridScorer::read`]): `2 * feature`, plus
    /// one when a missing value goes left.
    column: u16,
    /// Every leaf but those of the split's left subtree.
    right_mask: M,
}

/// A set of a tree's leaves, by their numbers from the left.
trait LeafMask: Copy + BitAnd<Output = Self> {
    const ALL: Self;
    /// The low bits of a mask of at most as many leaves as the type holds.
    fn from_u64(mask: u64) -> Self;
    /// All leaves when `sign` is -1 (the row goes left: that rules nothing out), else (0)
    /// `right_mask`.
    fn unless(sign: i32, right_mask: Self) -> Self;
    fn first(self) -> usize;
}

impl LeafMask for u32 {
    const ALL: u32 = u32::MAX;
    fn from_u64(mask: u64) -> u32 {
        mask as u32
    }
    #[inline(always)]
    fn unless(sign: i32, right_mask: u32) -> u32 {
        right_mask | sign as u32
    }
    #[inline(always)]
    fn first(self) -> usize {
        self.trailing_zeros() as usize
    }
}

impl LeafMask for u64 {
    const ALL: u64 = u64::MAX;
    fn from_u64(mask: u64) -> u64 {
        mask
    }
    #[inline(always)]
    fn unless(sign: i32, right_mask: u64) -> u64 {
        right_mask | i64::from(sign) as u64
    }
    #[inline(always)]
    fn first(self) -> usize {
        self.trailing_zeros() as usize
    }
}

/// A split as first read, before thresholds become ranks.
struct Split {
    threshold: f64,
    feature: usize,
    column: u16,
    right_mask: u64,
}

impl GridScorer {
    /// The scorer of `ensemble` with input `feature` set to each value of `grid`. `None` when the
    /// ensemble is not one it can score, and [`TreeEnsemble::predict_raw_grid`] must serve: more
    /// than one output, a tree of more than 64 leaves, a split off the grid's input that is
    /// categorical, reads zero as missing, compares with NaN or sends a missing value right
    /// past +inf (those need more than one comparison), or more than 65,534 distinct thresholds
    /// on a feature or 32,767 features.
    pub fn new(ensemble: &TreeEnsemble, feature: usize, grid: &[f64]) -> Option<GridScorer> {
        if ensemble.num_outputs != 1 {
            return None;
        }
        let mut trees = Vec::with_capacity(ensemble.roots.len());
        let mut splits = Vec::new();
        let mut grid_masks: Vec<u64> = Vec::with_capacity(ensemble.roots.len() * grid.len());
        let mut leaves = Vec::new();
        let mut widest = 0;
        for &root in &ensemble.roots {
            let leaves_start = leaves.len();
            let tree_masks = grid_masks.len();
            grid_masks.resize(tree_masks + grid.len(), u64::MAX);
            // Depth first, left before right: leaves are numbered from left to right, and the
            // leaves of a split's left subtree are those numbered while it is visited.
            let mut stack = vec![Visit::Enter(root)];
            while let Some(visit) = stack.pop() {
                match visit {
                    Visit::Enter(node) if node < 0 => leaves.push(*ensemble.leaf_values.get(!node as usize)?),
                    Visit::Enter(node) => {
                        let n = ensemble.nodes.get(node as usize)?;
                        stack.push(Visit::Right(node as usize, leaves.len() - leaves_start));
                        stack.push(Visit::Enter(n.children[1]));
                    }
                    Visit::Right(node, first) => {
                        let n = &ensemble.nodes[node];
                        let right_mask = !left_leaves(first, leaves.len() - leaves_start)?;
                        if n.feature as usize == feature {
                            for (mask, &value) in grid_masks[tree_masks..].iter_mut().zip(grid) {
                                if !n.goes_left(value, &ensemble.cat_ranges, &ensemble.cat_bits) {
                                    *mask &= right_mask;
                                }
                            }
                        } else {
                            let (feature, column) = (n.feature as usize, column(n)?);
                            splits.push(Split { threshold: n.threshold, feature, column, right_mask });
                        }
                        stack.push(Visit::Enter(n.children[0]));
                    }
                }
            }
            widest = widest.max(leaves.len() - leaves_start);
            if widest > 64 {
                return None;
            }
            trees.push((u32::try_from(splits.len()).ok()?, u32::try_from(leaves_start).ok()?));
        }

        let features = ensemble.num_features;
        let mut by_feature: Vec<Vec<f64>> = vec![Vec::new(); features];
        for split in &splits {
            by_feature.get_mut(split.feature)?.push(split.threshold);
        }
        let (mut cuts, mut cut_ranges) = (Vec::new(), Vec::with_capacity(features));
        for mut thresholds in by_feature {
            // Distinct as comparisons see them (0.0 and -0.0 are one cut).
            thresholds.sort_by(f64::total_cmp);
            thresholds.dedup_by(|a, b| a == b);
            if thresholds.len() >= usize::from(u16::MAX) {
                return None;
            }
            let start = u32::try_from(cuts.len()).ok()?;
            cuts.extend(thresholds);
            cut_ranges.push((start, u32::try_from(cuts.len()).ok()?));
        }
        let rank = |split: &Split| -> u16 {
            let (start, end) = cut_ranges[split.feature];
            // The threshold is one of the cuts: its rank is the number below it (< 65,535).
            cuts[start as usize..end as usize].partition_point(|&t| t < split.threshold) as u16
        };
        fn masks<M: LeafMask>(splits: &[Split], grid_masks: &[u64], rank: impl Fn(&Split) -> u16) -> Masks<M> {
            Masks {
                nodes: splits
                    .iter()
                    .map(|s| MaskNode { rank: rank(s), column: s.column, right_mask: M::from_u64(s.right_mask) })
                    .collect(),
                grid_masks: grid_masks.iter().map(|&m| M::from_u64(m)).collect(),
            }
        }
        let layout = if widest <= 32 {
            Layout::Narrow(masks(&splits, &grid_masks, rank))
        } else {
            Layout::Wide(masks(&splits, &grid_masks, rank))
        };
        Some(GridScorer { grid_len: grid.len(), features, cuts, cut_ranges, trees, layout, leaves })
    }

    /// The number of grid values (and of scores a row gets).
    pub fn grid_len(&self) -> usize {
        self.grid_len
    }

    /// The raw scores of `row` with input `feature` at each grid value, into `out`: what
    /// [`TreeEnsemble::predict_raw_grid`] gives, bit for bit. Features past the row's end read as
    /// missing; the row's value of the grid's input (if it has one) is not read.
    ///
    /// # Panics
    ///
    /// If `out.len()` is not the grid's length.
    pub fn predict_raw(&self, row: &[f64], out: &mut [f64]) {
        assert_eq!(out.len(), self.grid_len, "one output per grid value");
        let mut stack = [0u16; 2 * STACK_FEATURES];
        let mut heap = Vec::new();
        let ranks = match stack.get_mut(..2 * self.features) {
            Some(ranks) => ranks,
            None => {
                heap.resize(2 * self.features, 0);
                &mut heap[..]
            }
        };
        self.read(row, ranks);
        self.predict_ranked(ranks, out);
    }

    /// What of `row` the scorer reads, into `ranks`: rows with the same ranks get the same scores,
    /// bit for bit ([`GridScorer::predict_ranked`]).
    pub fn read_ranks(&self, row: &[f64], ranks: &mut Vec<u16>) {
        ranks.clear();
        ranks.resize(2 * self.features, 0);
        self.read(row, ranks);
    }

    /// [`GridScorer::predict_raw`] of a row read by [`GridScorer::read_ranks`].
    ///
    /// # Panics
    ///
    /// If `out.len()` is not the grid's length or `ranks` is not of this scorer's width.
    pub fn predict_ranked(&self, ranks: &[u16], out: &mut [f64]) {
        assert_eq!(out.len(), self.grid_len, "one output per grid value");
        assert_eq!(ranks.len(), 2 * self.features, "two ranks per feature");
        out.fill(0.0);
        match &self.layout {
            Layout::Narrow(masks) => self.add_trees(masks, ranks, out),
            Layout::Wide(masks) => self.add_trees(masks, ranks, out),
        }
    }

    /// Adds each tree's leaf for each grid value to the value's score, trees in model order.
    fn add_trees<M: LeafMask>(&self, masks: &Masks<M>, ranks: &[u16], out: &mut [f64]) {
        let per_tree = self.grid_len.max(1);
        for t in 0..self.trees.len() {
            let mut reach = M::ALL;
            for node in &masks.nodes[self.node_range(t)] {
                // Left when the value's rank is at most the threshold's, the difference then
                // negative and its sign all ones. Arithmetic on purpose: written as a comparison,
                // the compiler branched on it, and half the rows go either way.
                let sign = (i32::from(ranks[usize::from(node.column)]) - i32::from(node.rank) - 1) >> 31;
                reach = reach & M::unless(sign, node.right_mask);
            }
            let leaves = &self.leaves[self.leaf_range(t)];
            let grid_masks = &masks.grid_masks[t * per_tree..(t + 1) * per_tree];
            for (sum, &mask) in out.iter_mut().zip(grid_masks) {
                // Never empty: the leaf the row reaches is ruled out by no split.
                *sum += leaves[(reach & mask).first()];
            }
        }
    }

    /// Where tree `t`'s splits are in the layout's nodes.
    fn node_range(&self, t: usize) -> std::ops::Range<usize> {
        let start = t.checked_sub(1).map_or(0, |before| self.trees[before].0 as usize);
        start..self.trees[t].0 as usize
    }

    /// Where tree `t`'s leaves are in `leaves`.
    fn leaf_range(&self, t: usize) -> std::ops::Range<usize> {
        let end = self.trees.get(t + 1).map_or(self.leaves.len(), |next| next.1 as usize);
        self.trees[t].1 as usize..end
    }

    /// Reads `row` into `ranks` (two a feature): each value as [`Node::goes_left`] reads it (the
    /// zero band as `0.0`), ranked among its feature's cuts (how many are below it). A missing
    /// value (NaN, or past the row's end) ranks as +inf in a feature's first column and as -inf in
    /// its second, so that one comparison sends it to the split's default side (no split the
    /// scorer holds compares with +inf and sends a missing value right).
    fn read(&self, row: &[f64], ranks: &mut [u16]) {
        for (f, (pair, &(start, end))) in ranks.chunks_exact_mut(2).zip(&self.cut_ranges).enumerate() {
            let cuts = &self.cuts[start as usize..end as usize];
            // Fewer than 65,535 cuts a feature: every rank fits.
            let rank = |value: f64| cuts.partition_point(|&t| t < value) as u16;
            let raw = row.get(f).copied().unwrap_or(f64::NAN);
            let value = if raw.abs() <= K_ZERO_THRESHOLD { 0.0 } else { raw };
            if value.is_nan() {
                pair[0] = rank(f64::INFINITY);
                pair[1] = 0;
            } else {
                pair[0] = rank(value);
                pair[1] = pair[0];
            }
        }
    }
}

/// A step of the depth-first numbering of a tree's leaves.
enum Visit {
    /// Visit a node or leaf (`!leaf` when negative).
    Enter(i32),
    /// The left subtree of split `.0` is done; its leaves are numbered from `.1` up to now.
    Right(usize, usize),
}

/// The mask of leaves `first..end` of a tree; `None` past 64 leaves.
fn left_leaves(first: usize, end: usize) -> Option<u64> {
    if end > 64 || first >= end {
        return None;
    }
    let below_end = if end == 64 { u64::MAX } else { (1u64 << end) - 1 };
    Some(below_end & !((1u64 << first) - 1))
}

/// The read row's column a split compares ([`MaskNode::column`]); `None` for a split one
/// comparison does not decide.
fn column(n: &Node) -> Option<u16> {
    let missing_left = n.flags & FLAG_MISSING_LEFT != 0;
    let plain = n.flags & (FLAG_CATEGORICAL | FLAG_ZERO_IS_MISSING) == 0
        && !n.threshold.is_nan()
        && (missing_left || n.threshold < f64::INFINITY);
    if !plain {
        return None;
    }
    u16::try_from(n.feature).ok()?.checked_mul(2)?.checked_add(u16::from(missing_left))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gbdt::tests::next_up;
    use proptest::prelude::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;
    use std::path::Path;

    /// Values every decision treats apart: missing, the zero band and its edges.
    const SPECIAL: [f64; 6] = [f64::NAN, 0.0, 1e-40, -1e-40, K_ZERO_THRESHOLD, -K_ZERO_THRESHOLD];

    /// The scorer's scores and the grid walk's, bit for bit, and the grid walk's and each row's.
    fn assert_scores_equal(ensemble: &TreeEnsemble, scorer: &GridScorer, row: &[f64], feature: usize, grid: &[f64]) {
        let mut fast = vec![f64::NAN; grid.len()];
        let mut walked = vec![f64::NAN; grid.len()];
        scorer.predict_raw(row, &mut fast);
        let mut with_grid = row.to_vec();
        if with_grid.len() <= feature {
            // The walk reads features past the row's end as missing, as the scorer does.
            with_grid.resize(feature + 1, f64::NAN);
        }
        ensemble.predict_raw_grid(&with_grid, feature, grid, &mut walked);
        let mut one = [0.0];
        for (j, (&got, &want)) in fast.iter().zip(&walked).enumerate() {
            assert_eq!(got.to_bits(), want.to_bits(), "grid value {j} of {row:?}: {got} against {want}");
            with_grid[feature] = grid[j];
            ensemble.predict_raw_into(&with_grid, &mut one);
            assert_eq!(got.to_bits(), one[0].to_bits(), "grid value {j} of {row:?} alone");
        }
    }

    fn hazard_model() -> TreeEnsemble {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/default/survival_hazard.lgbm.txt");
        let text = std::fs::read_to_string(&path).expect("the default bundle's hazard model");
        TreeEnsemble::from_lightgbm_text(&text).expect("it parses")
    }

    /// A row of `width` values, each a split's threshold, one step above it, a special value or
    /// a value in the feature's range, as `picks` choose.
    fn row_from(ensemble: &TreeEnsemble, picks: &[(u8, u32, f64)], width: usize) -> Vec<f64> {
        picks
            .iter()
            .take(width)
            .enumerate()
            .map(|(f, &(kind, index, uniform))| {
                let thresholds = ensemble.splits.get(f).map_or(&[][..], |s| &s.thresholds[..]);
                let threshold = thresholds.get(index as usize % thresholds.len().max(1)).copied();
                match (kind % 4, threshold) {
                    (0, Some(t)) => t,
                    (1, Some(t)) => next_up(t),
                    (2, _) => SPECIAL[index as usize % SPECIAL.len()],
                    _ => match (thresholds.first(), thresholds.last()) {
                        (Some(&lo), Some(&hi)) => lo - 1.0 + uniform * (hi - lo + 2.0),
                        _ => uniform,
                    },
                }
            })
            .collect()
    }

    proptest! {
        /// The default bundle's hazard model: the scorer's curve is the grid walk's, bit for bit,
        /// on rows whose values sit on, just above and between its thresholds, missing or in the
        /// zero band, of the full width and shorter (the rest missing).
        #[test]
        fn hazard_model_scores_as_the_walk(
            picks in proptest::collection::vec((any::<u8>(), any::<u32>(), 0.0..1.0f64), 16),
            short in 0usize..4,
        ) {
            let ensemble = hazard_model();
            let feature = ensemble.num_features() - 1;
            let grid: Vec<f64> = (0..22).map(|j| j as f64).collect();
            let scorer = GridScorer::new(&ensemble, feature, &grid).expect("the hazard model is one it scores");
            let width = if short == 0 { feature - 3 } else { feature };
            assert_scores_equal(&ensemble, &scorer, &row_from(&ensemble, &picks, width), feature, &grid);
        }

        /// Random ensembles (shapes of 1 to 64 leaves, every numerical missing type the scorer
        /// takes off the grid's input, zero read as missing on it): the same scores as the walk.
        #[test]
        fn random_ensembles_score_as_the_walk(seed in any::<u64>()) {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let features = rng.random_range(1..5usize);
            let feature = rng.random_range(0..features);
            let grids: [&[f64]; 4] = [&[0.0, 1.0, 2.0, 3.0], &[-1.0, 1e-40, 0.5, 2.5, 7.0], &[2.0, 0.0, -1.0], &[1.5]];
            let grid = grids[rng.random_range(0..grids.len())];
            let text = random_model(&mut rng, features, feature, true);
            let ensemble = TreeEnsemble::from_lightgbm_text(&text).expect("a random model parses");
            let scorer = GridScorer::new(&ensemble, feature, grid).expect("only splits it scores");
            for _ in 0..20 {
                let picks: Vec<(u8, u32, f64)> = (0..features).map(|_| (rng.random(), rng.random(), rng.random())).collect();
                let width = rng.random_range(0..=features);
                assert_scores_equal(&ensemble, &scorer, &row_from(&ensemble, &picks, width), feature, grid);
            }
        }
    }

    /// Splits one comparison does not decide, off the grid's input, and trees past 64 leaves
    /// leave the ensemble to the walk; on the grid's input any split is decided when built.
    #[test]
    fn what_the_scorer_declines() {
        let tree = |feature: usize, decision_type: u8, threshold: &str| {
            format!(
                "tree\nversion=v4\nnum_class=1\nnum_tree_per_iteration=1\nmax_feature_idx=1\nobjective=regression\n\n\
                 Tree=0\nnum_leaves=2\nnum_cat=0\nsplit_feature={feature}\nthreshold={threshold}\n\
                 decision_type={decision_type}\nleft_child=-1\nright_child=-2\nleaf_value=1 2\n\nend of trees\n"
            )
        };
        let scorer =
            |text: String| GridScorer::new(&TreeEnsemble::from_lightgbm_text(&text).expect("parses"), 1, &[0.0]);
        // Missing type zero, then a missing value sent right of +inf.
        assert!(scorer(tree(0, 6, "0.5")).is_none());
        assert!(scorer(tree(0, 8, "inf")).is_none());
        assert!(scorer(tree(0, 10, "inf")).is_some());
        assert!(scorer(tree(1, 6, "0.5")).is_some());
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        for (leaves, scored) in [(64, true), (65, false)] {
            let text = random_model_of(&mut rng, 2, 1, false, &[leaves]);
            let ensemble = TreeEnsemble::from_lightgbm_text(&text).expect("parses");
            assert_eq!(GridScorer::new(&ensemble, 1, &[0.0, 1.0]).is_some(), scored, "{leaves} leaves");
        }
        // Masks of 32 bits up to 32 leaves a tree, else 64.
        for (sizes, narrow) in [(&[1, 32, 5][..], true), (&[1, 33, 5][..], false)] {
            let text = random_model_of(&mut rng, 2, 1, false, sizes);
            let ensemble = TreeEnsemble::from_lightgbm_text(&text).expect("parses");
            let scorer = GridScorer::new(&ensemble, 1, &[0.0, 1.0]).expect("scored");
            assert_eq!(matches!(scorer.layout, Layout::Narrow(_)), narrow, "{sizes:?}");
        }
        assert!(matches!(GridScorer::new(&hazard_model(), 16, &[0.0]).map(|s| s.layout), Some(Layout::Narrow(_))));
    }

    /// A LightGBM text model of random trees on `features` inputs: see [`random_model_of`].
    fn random_model(rng: &mut ChaCha8Rng, features: usize, grid_feature: usize, zero_missing_on_grid: bool) -> String {
        let sizes: Vec<usize> = (0..rng.random_range(1..6)).map(|_| rng.random_range(1..=64)).collect();
        random_model_of(rng, features, grid_feature, zero_missing_on_grid, &sizes)
    }

    /// Trees of `sizes` leaves, each grown by splitting a random leaf, on thresholds near the
    /// grids' values, 0 and the zero band's edge, with missing types none and NaN and either
    /// default side (and zero as missing on `grid_feature` when asked).
    fn random_model_of(
        rng: &mut ChaCha8Rng,
        features: usize,
        grid_feature: usize,
        zero_missing_on_grid: bool,
        sizes: &[usize],
    ) -> String {
        const THRESHOLDS: [f64; 9] = [-1.5, -0.5, 0.0, K_ZERO_THRESHOLD, 0.5, 1.0, 1.5, 2.5, 3.0];
        let mut text = format!(
            "tree\nversion=v4\nnum_class=1\nnum_tree_per_iteration=1\nmax_feature_idx={}\nobjective=regression\n\n",
            features - 1
        );
        for (t, &leaves) in sizes.iter().enumerate() {
            // children[node] = [left, right]: a node index, or !leaf.
            let mut children: Vec<[i32; 2]> = Vec::new();
            if leaves > 1 {
                children.push([!0, !1]);
            }
            for leaf in 2..leaves as i32 {
                let slots: Vec<(usize, usize)> = (0..children.len())
                    .flat_map(|n| [(n, 0), (n, 1)])
                    .filter(|&(n, side)| children[n][side] < 0)
                    .collect();
                let (n, side) = slots[rng.random_range(0..slots.len())];
                children.push([children[n][side], !leaf]);
                children[n][side] = children.len() as i32 - 1;
            }
            let mut split_feature = Vec::new();
            let mut threshold = Vec::new();
            let mut decision_type = Vec::new();
            for _ in &children {
                let f = rng.random_range(0..features);
                split_feature.push(f.to_string());
                threshold.push(format!("{:?}", THRESHOLDS[rng.random_range(0..THRESHOLDS.len())]));
                let missing = match rng.random_range(0..3) {
                    2 if zero_missing_on_grid && f == grid_feature => 4,
                    0 => 0,
                    _ => 8,
                };
                decision_type.push((missing | if rng.random() { 2 } else { 0 }).to_string());
            }
            let join = |values: Vec<String>| values.join(" ");
            let child = |side: usize| join(children.iter().map(|c| c[side].to_string()).collect());
            let leaf_values = join((0..leaves).map(|_| format!("{:?}", rng.random_range(-1.0..1.0))).collect());
            text += &format!(
                "Tree={t}\nnum_leaves={leaves}\nnum_cat=0\nsplit_feature={}\nthreshold={}\ndecision_type={}\n\
                 left_child={}\nright_child={}\nleaf_value={leaf_values}\n\n",
                join(split_feature),
                join(threshold),
                join(decision_type),
                child(0),
                child(1),
            );
        }
        text + "end of trees\n"
    }
}
