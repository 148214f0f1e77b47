//! Reading LightGBM's text model format into a [`TreeEnsemble`]: the header, every tree's
//! arrays checked, and errors that name the tree and key at fault.

use super::*;

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
