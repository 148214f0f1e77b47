//! The evaluator's tests: hand-computed predictions, parity of every layout with one row at a
//! time, and model text that is refused without a panic.

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
    assert!(band(m.constant_range(1, 0.0)) && band(m.constant_range(1, -1e-36)) && band(m.constant_range(0, 1e-35)));
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
                join((0..nodes).map(|_| format!("{:?}", thresholds[rng.random_range(0..thresholds.len())])).collect()),
                join(
                    (0..nodes).map(|_| decision_types[rng.random_range(0..decision_types.len())].to_string()).collect()
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
                let matrix: Vec<f64> = (0..rows * width).map(|_| values[rng.random_range(0..values.len())]).collect();
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
    let err = TreeEnsemble::from_lightgbm_text(&MODEL.replace("tree_sizes=400 300 200 250", "tree_sizes=1 2 3 4 5"))
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
