//! Features: one schema and one encoding function for training and serving.
//!
//! A [`FeatureSchema`] lists the model's input columns in order. [`FeatureSchema::encode`] turns what
//! is known when a VM is requested ([`RequestFeatures`]) plus its tenant's and its job's past
//! ([`Past`]) into that row, and is the only place that does so. The schema travels in the bundle manifest;
//! its hash guards against serving a model with another encoding.
//!
//! Categorical values become numeric codes ranked by their mean training lifetime (rare categories,
//! fewer than [`MIN_CATEGORY_COUNT`] examples, collapse into "other"; unseen values at serving time
//! map to "other" as well), so that ordinary numeric splits separate short from long categories.

use crate::history::{Past, TenantSummary};
use domain::{Features, PredictInstance, Priority, RequestFacts};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use traces::VmRecord;

/// Version of the encoding rules below; part of the schema hash.
pub const ENCODING_VERSION: u32 = 1;
/// Categories seen fewer times than this in training collapse into "other".
pub const MIN_CATEGORY_COUNT: usize = 10;
/// Most categories kept per feature (the most frequent ones).
pub const MAX_CATEGORIES: usize = 255;
/// The label of the collapsed category.
pub const OTHER: &str = "other";

const DAY: f64 = 86_400.0;
const HOUR: f64 = 3_600.0;

/// What is known about a VM when it is requested.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RequestFeatures {
    pub tenant_id: String,
    pub vm_type: String,
    pub cores: f64,
    pub memory_gib: f64,
    pub priority: Priority,
    /// Request time, on the clock of the training trace (hour of day is `time mod 1 day`; weekday
    /// counts days from time 0).
    pub time_s: f64,
    /// Further request-time columns by name (trace extra columns, or the request's `os` and
    /// `features`).
    pub extra: Vec<(String, String)>,
}

impl RequestFeatures {
    pub fn extra(&self, name: &str) -> Option<&str> {
        self.extra.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
}

impl From<&VmRecord> for RequestFeatures {
    fn from(record: &VmRecord) -> Self {
        RequestFeatures {
            tenant_id: record.tenant_id.clone(),
            vm_type: record.vm_type.clone(),
            cores: record.cores,
            memory_gib: record.memory_gib,
            priority: record.priority,
            time_s: record.start_s,
            extra: record.extra.iter().map(|(n, v)| (n.to_owned(), v.to_owned())).collect(),
        }
    }
}

impl RequestFeatures {
    /// Features of an inference request's instance; `now_s` stands in for a missing request time.
    pub fn from_instance(instance: &PredictInstance, now_s: f64) -> Self {
        let extra = extra_columns(&instance.features, instance.os.as_deref());
        RequestFeatures {
            tenant_id: instance.tenant_id.clone(),
            vm_type: instance.vm_type.clone(),
            cores: instance.cores,
            memory_gib: instance.memory_gib,
            priority: instance.priority,
            time_s: instance.requested_at_s.unwrap_or(now_s),
            extra,
        }
    }

    /// Features of a VM's request facts; `now_s` stands in for a missing request time. The same as
    /// [`RequestFeatures::from_instance`] of [`PredictInstance::of`] the facts, built without the
    /// instance in between (the allocator takes these for every VM it places, issue 32).
    pub fn of(facts: &RequestFacts, now_s: f64) -> Self {
        let details = &facts.details;
        let extra = extra_columns(&details.features, details.os.as_deref());
        RequestFeatures {
            tenant_id: facts.tenant_id.as_str().to_owned(),
            vm_type: facts.vm_type.clone(),
            cores: facts.demand.cores(),
            memory_gib: facts.demand.memory_gib(),
            priority: details.priority,
            time_s: facts.requested_at_s.unwrap_or(now_s),
            extra,
        }
    }
}

/// A request's features and OS as the extra columns of a trace row.
fn extra_columns(features: &Features, os: Option<&str>) -> Vec<(String, String)> {
    let mut extra = Vec::with_capacity(features.len() + usize::from(os.is_some()));
    extra.extend(features.iter().map(|(name, value)| (name.to_owned(), value.to_string())));
    if let Some(os) = os {
        extra.push(("os".to_owned(), os.to_owned()));
    }
    extra
}

/// Where a numeric feature comes from.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "source", content = "column")]
pub enum NumericSource {
    Cores,
    MemoryGib,
    MemoryPerCore,
    LowPriority,
    HourOfDay,
    Weekday,
    /// A numeric extra column; missing or unparsable values are NaN.
    Extra(String),
    TenantVmsInWindow,
    TenantLongKnown,
    TenantLongShare,
    TenantLog10LifetimeP25,
    TenantLog10LifetimeP50,
    TenantLog10LifetimeP75,
    TenantRunning,
    /// A statistic of the job identity's history (the tenant's VMs of the same type).
    Job(HistoryStat),
    /// log10(1 + uptime in seconds): the reprediction input of the remaining-lifetime model.
    Log10Uptime,
}

/// A statistic of a history ([`TenantSummary`]'s fields).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HistoryStat {
    VmsInWindow,
    LongKnown,
    LongShare,
    Log10LifetimeP25,
    Log10LifetimeP50,
    Log10LifetimeP75,
    Running,
}

impl HistoryStat {
    pub const ALL: [HistoryStat; 7] = [
        HistoryStat::VmsInWindow,
        HistoryStat::LongKnown,
        HistoryStat::LongShare,
        HistoryStat::Log10LifetimeP25,
        HistoryStat::Log10LifetimeP50,
        HistoryStat::Log10LifetimeP75,
        HistoryStat::Running,
    ];

    pub fn name(self) -> &'static str {
        match self {
            HistoryStat::VmsInWindow => "vms_in_window",
            HistoryStat::LongKnown => "long_known",
            HistoryStat::LongShare => "long_share",
            HistoryStat::Log10LifetimeP25 => "log10_lifetime_p25",
            HistoryStat::Log10LifetimeP50 => "log10_lifetime_p50",
            HistoryStat::Log10LifetimeP75 => "log10_lifetime_p75",
            HistoryStat::Running => "running",
        }
    }

    pub fn of(self, summary: &TenantSummary) -> f64 {
        match self {
            HistoryStat::VmsInWindow => summary.vms_in_window,
            HistoryStat::LongKnown => summary.long_known,
            HistoryStat::LongShare => summary.long_share,
            HistoryStat::Log10LifetimeP25 => summary.log10_lifetime_p25,
            HistoryStat::Log10LifetimeP50 => summary.log10_lifetime_p50,
            HistoryStat::Log10LifetimeP75 => summary.log10_lifetime_p75,
            HistoryStat::Running => summary.running,
        }
    }
}

/// The uptime input of the remaining-lifetime model: log10(1 + uptime in seconds), a negative (or
/// NaN) uptime read as 0.
pub fn encode_uptime(uptime_s: f64) -> f64 {
    (1.0 + uptime_s.max(0.0)).log10()
}

/// Where a categorical feature comes from.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "source", content = "column")]
pub enum CategoricalSource {
    VmType,
    Extra(String),
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FeatureKind {
    Numeric(NumericSource),
    /// `codes` maps each kept category (and [`OTHER`]) to its numeric code.
    Categorical {
        source: CategoricalSource,
        codes: Vec<(String, f64)>,
    },
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FeatureSpec {
    pub name: String,
    pub kind: FeatureKind,
}

/// The model's input columns, in order, and the history parameters behind the tenant features.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FeatureSchema {
    pub encoding_version: u32,
    pub features: Vec<FeatureSpec>,
    /// Look-back window of the tenant features.
    pub history_window_s: f64,
    /// Lifetime from which a tenant's VM counts as long-lived in the tenant features.
    pub long_threshold_s: f64,
}

/// Groups of features the trainer keeps or drops as a whole, by validation.
///
/// Both can hurt: `weekday` splits learn the level of single days when the training period covers
/// only a few (the evaluation period's weekdays are then unseen or seen once), and on traces whose
/// tenant is a batch of simultaneous requests the tenant features only encode a VM's position in its
/// batch. Whether they help is a property of the trace, so the trainer tries without them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FeatureGroup {
    /// `weekday`.
    Weekday,
    /// The tenant-history features (`tenant_*`).
    Tenant,
    /// The job-identity history features (`job_*`): the tenant's VMs of the same type.
    Job,
}

/// A name that is not a [`FeatureGroup`].
#[derive(Debug, thiserror::Error)]
#[error("unknown feature group `{0}` (known: weekday, tenant, job)")]
pub struct UnknownFeatureGroup(pub String);

impl FeatureGroup {
    pub const ALL: [FeatureGroup; 3] = [FeatureGroup::Weekday, FeatureGroup::Tenant, FeatureGroup::Job];

    pub fn name(self) -> &'static str {
        match self {
            FeatureGroup::Weekday => "weekday",
            FeatureGroup::Tenant => "tenant",
            FeatureGroup::Job => "job",
        }
    }

    /// The group `spec` belongs to; `None` for the features that are always kept.
    pub fn of(spec: &FeatureSpec) -> Option<FeatureGroup> {
        match &spec.kind {
            FeatureKind::Numeric(NumericSource::Weekday) => Some(FeatureGroup::Weekday),
            FeatureKind::Numeric(
                NumericSource::TenantVmsInWindow
                | NumericSource::TenantLongKnown
                | NumericSource::TenantLongShare
                | NumericSource::TenantLog10LifetimeP25
                | NumericSource::TenantLog10LifetimeP50
                | NumericSource::TenantLog10LifetimeP75
                | NumericSource::TenantRunning,
            ) => Some(FeatureGroup::Tenant),
            FeatureKind::Numeric(NumericSource::Job(_)) => Some(FeatureGroup::Job),
            _ => None,
        }
    }
}

impl std::fmt::Display for FeatureGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for FeatureGroup {
    type Err = UnknownFeatureGroup;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        FeatureGroup::ALL
            .into_iter()
            .find(|g| g.name().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| UnknownFeatureGroup(s.to_owned()))
    }
}

/// Per-categorical-feature lookup built once from the schema, for fast encoding.
#[derive(Clone, Debug)]
struct CategoryCodes {
    codes: HashMap<String, f64>,
    other: f64,
}

/// A schema ready to encode rows quickly.
#[derive(Clone, Debug)]
pub struct FeatureEncoder {
    schema: FeatureSchema,
    categories: Vec<Option<CategoryCodes>>,
}

impl FeatureSchema {
    /// A stable hash of everything that determines the encoding.
    pub fn hash(&self) -> String {
        let canonical = serde_json::to_vec(self).unwrap_or_default();
        let digest = Sha256::digest(&canonical);
        digest.iter().take(16).map(|b| format!("{b:02x}")).collect()
    }

    pub fn names(&self) -> Vec<String> {
        self.features.iter().map(|f| f.name.clone()).collect()
    }

    pub fn len(&self) -> usize {
        self.features.len()
    }

    pub fn is_empty(&self) -> bool {
        self.features.is_empty()
    }

    /// The same schema with the uptime input appended (for the remaining-lifetime model).
    pub fn with_uptime(&self) -> FeatureSchema {
        let mut schema = self.clone();
        schema.features.push(FeatureSpec {
            name: "log10_uptime".to_owned(),
            kind: FeatureKind::Numeric(NumericSource::Log10Uptime),
        });
        schema
    }

    /// Positions of the features not in `dropped`, in schema order.
    pub fn kept_indices(&self, dropped: &[FeatureGroup]) -> Vec<usize> {
        (0..self.features.len())
            .filter(|&i| FeatureGroup::of(&self.features[i]).is_none_or(|g| !dropped.contains(&g)))
            .collect()
    }

    /// The same schema without the features of the `dropped` groups. Encoding with it gives the
    /// kept columns of the full schema's row, in the same order.
    pub fn without(&self, dropped: &[FeatureGroup]) -> FeatureSchema {
        let mut schema = self.clone();
        schema.features = self.kept_indices(dropped).into_iter().map(|i| self.features[i].clone()).collect();
        schema
    }

    /// The groups with at least one feature in this schema.
    pub fn groups(&self) -> Vec<FeatureGroup> {
        FeatureGroup::ALL
            .into_iter()
            .filter(|g| self.features.iter().any(|f| FeatureGroup::of(f) == Some(*g)))
            .collect()
    }

    pub fn encoder(&self) -> FeatureEncoder {
        let categories = self
            .features
            .iter()
            .map(|f| match &f.kind {
                FeatureKind::Categorical { codes, .. } => {
                    let map: HashMap<String, f64> = codes.iter().cloned().collect();
                    let other = map.get(OTHER).copied().unwrap_or(f64::NAN);
                    Some(CategoryCodes { codes: map, other })
                }
                FeatureKind::Numeric(_) => None,
            })
            .collect();
        FeatureEncoder { schema: self.clone(), categories }
    }
}

fn parse_number(text: Option<&str>) -> f64 {
    text.and_then(|t| t.trim().parse::<f64>().ok()).filter(|v| v.is_finite()).unwrap_or(f64::NAN)
}

impl FeatureEncoder {
    pub fn schema(&self) -> &FeatureSchema {
        &self.schema
    }

    /// Appends the row of `request` to `out`. `uptime_s` feeds the uptime feature when the schema has
    /// one (0 when not given).
    pub fn encode_into(&self, request: &RequestFeatures, past: &Past, uptime_s: Option<f64>, out: &mut Vec<f64>) {
        let tenant = &past.tenant;
        for (spec, categories) in self.schema.features.iter().zip(&self.categories) {
            let value = match &spec.kind {
                FeatureKind::Numeric(source) => match source {
                    NumericSource::Cores => request.cores,
                    NumericSource::MemoryGib => request.memory_gib,
                    NumericSource::MemoryPerCore => {
                        if request.cores > 0.0 {
                            request.memory_gib / request.cores
                        } else {
                            f64::NAN
                        }
                    }
                    NumericSource::LowPriority => f64::from(u8::from(request.priority == Priority::Low)),
                    NumericSource::HourOfDay => request.time_s.rem_euclid(DAY) / HOUR,
                    NumericSource::Weekday => request.time_s.div_euclid(DAY).rem_euclid(7.0),
                    NumericSource::Extra(column) => parse_number(request.extra(column)),
                    NumericSource::TenantVmsInWindow => tenant.vms_in_window,
                    NumericSource::TenantLongKnown => tenant.long_known,
                    NumericSource::TenantLongShare => tenant.long_share,
                    NumericSource::TenantLog10LifetimeP25 => tenant.log10_lifetime_p25,
                    NumericSource::TenantLog10LifetimeP50 => tenant.log10_lifetime_p50,
                    NumericSource::TenantLog10LifetimeP75 => tenant.log10_lifetime_p75,
                    NumericSource::TenantRunning => tenant.running,
                    NumericSource::Job(stat) => stat.of(&past.job),
                    NumericSource::Log10Uptime => encode_uptime(uptime_s.unwrap_or(0.0)),
                },
                FeatureKind::Categorical { source, .. } => {
                    let text = match source {
                        CategoricalSource::VmType => Some(request.vm_type.as_str()),
                        CategoricalSource::Extra(column) => request.extra(column),
                    };
                    let codes = categories.as_ref().expect("categorical feature has codes");
                    text.and_then(|t| codes.codes.get(t).copied()).unwrap_or(codes.other)
                }
            };
            out.push(value);
        }
    }

    /// One row as a fresh vector.
    pub fn encode(&self, request: &RequestFeatures, past: &Past, uptime_s: Option<f64>) -> Vec<f64> {
        let mut row = Vec::with_capacity(self.schema.len());
        self.encode_into(request, past, uptime_s, &mut row);
        row
    }
}

/// Builds a schema from training rows: decides which extra columns are numeric, categorical or
/// useless, and ranks categories by mean log10 lifetime.
pub struct SchemaBuilder {
    history_window_s: f64,
    long_threshold_s: f64,
    /// Per categorical candidate: category -> (count, sum of log10 lifetime over rows with a known one, rows with one).
    categories: HashMap<CategoricalSource, HashMap<String, (usize, f64, usize)>>,
    /// Extra columns seen, and whether every non-empty value so far parsed as a number.
    extra_numeric: Vec<(String, bool)>,
    tenant_seen: bool,
    vm_type_seen: bool,
}

impl SchemaBuilder {
    pub fn new(history_window_s: f64, long_threshold_s: f64) -> Self {
        SchemaBuilder {
            history_window_s,
            long_threshold_s,
            categories: HashMap::new(),
            extra_numeric: Vec::new(),
            tenant_seen: false,
            vm_type_seen: false,
        }
    }

    /// Observes one training VM and, when known, its log10 lifetime (a lower bound for censored VMs
    /// is fine: it only orders categories).
    pub fn observe(&mut self, request: &RequestFeatures, log10_lifetime: Option<f64>) {
        self.tenant_seen |= !request.tenant_id.is_empty();
        self.vm_type_seen |= !request.vm_type.is_empty();
        let mut count = |source: CategoricalSource, value: &str| {
            let entry = self.categories.entry(source).or_default().entry(value.to_owned()).or_default();
            entry.0 += 1;
            if let Some(l) = log10_lifetime {
                entry.1 += l;
                entry.2 += 1;
            }
        };
        count(CategoricalSource::VmType, &request.vm_type);
        for (name, value) in &request.extra {
            let numeric = value.is_empty() || value.trim().parse::<f64>().is_ok_and(f64::is_finite);
            match self.extra_numeric.iter_mut().find(|(n, _)| n == name) {
                Some((_, all_numeric)) => *all_numeric &= numeric,
                None => self.extra_numeric.push((name.clone(), numeric)),
            }
            count(CategoricalSource::Extra(name.clone()), value);
        }
    }

    pub fn build(self) -> FeatureSchema {
        let numeric = |name: &str, source: NumericSource| FeatureSpec {
            name: name.to_owned(),
            kind: FeatureKind::Numeric(source),
        };
        let mut features = vec![
            numeric("cores", NumericSource::Cores),
            numeric("memory_gib", NumericSource::MemoryGib),
            numeric("memory_per_core", NumericSource::MemoryPerCore),
            numeric("low_priority", NumericSource::LowPriority),
            numeric("hour_of_day", NumericSource::HourOfDay),
            numeric("weekday", NumericSource::Weekday),
        ];
        if let Some(spec) = categorical_spec("vm_type", CategoricalSource::VmType, &self.categories) {
            features.push(spec);
        }
        for (name, all_numeric) in &self.extra_numeric {
            if *all_numeric {
                features.push(numeric(&format!("extra_{name}"), NumericSource::Extra(name.clone())));
            } else if let Some(spec) =
                categorical_spec(&format!("extra_{name}"), CategoricalSource::Extra(name.clone()), &self.categories)
            {
                features.push(spec);
            }
        }
        if self.tenant_seen {
            features.extend([
                numeric("tenant_vms_in_window", NumericSource::TenantVmsInWindow),
                numeric("tenant_long_known", NumericSource::TenantLongKnown),
                numeric("tenant_long_share", NumericSource::TenantLongShare),
                numeric("tenant_log10_lifetime_p25", NumericSource::TenantLog10LifetimeP25),
                numeric("tenant_log10_lifetime_p50", NumericSource::TenantLog10LifetimeP50),
                numeric("tenant_log10_lifetime_p75", NumericSource::TenantLog10LifetimeP75),
                numeric("tenant_running", NumericSource::TenantRunning),
            ]);
        }
        if self.vm_type_seen {
            features.extend(
                HistoryStat::ALL.map(|stat| numeric(&format!("job_{}", stat.name()), NumericSource::Job(stat))),
            );
        }
        FeatureSchema {
            encoding_version: ENCODING_VERSION,
            features,
            history_window_s: self.history_window_s,
            long_threshold_s: self.long_threshold_s,
        }
    }
}

/// The categorical feature of `source`, or `None` when no category is frequent enough to matter.
fn categorical_spec(
    name: &str,
    source: CategoricalSource,
    categories: &HashMap<CategoricalSource, HashMap<String, (usize, f64, usize)>>,
) -> Option<FeatureSpec> {
    let counts = categories.get(&source)?;
    let mut frequent: Vec<(&String, &(usize, f64, usize))> =
        counts.iter().filter(|(_, (n, _, _))| *n >= MIN_CATEGORY_COUNT).collect();
    if frequent.is_empty() {
        return None;
    }
    frequent.sort_by(|a, b| b.1 .0.cmp(&a.1 .0).then_with(|| a.0.cmp(b.0)));
    frequent.truncate(MAX_CATEGORIES);
    let kept: std::collections::HashSet<&String> = frequent.iter().map(|(c, _)| *c).collect();
    let (mut other_sum, mut other_known) = (0.0, 0usize);
    for (category, (_, sum, known)) in counts {
        if !kept.contains(category) {
            other_sum += sum;
            other_known += known;
        }
    }
    let mean = |sum: f64, known: usize| if known > 0 { sum / known as f64 } else { f64::NEG_INFINITY };
    let mut ranked: Vec<(String, f64)> =
        frequent.iter().map(|(c, (_, sum, known))| ((*c).clone(), mean(*sum, *known))).collect();
    ranked.push((OTHER.to_owned(), mean(other_sum, other_known)));
    ranked.sort_by(|a, b| a.1.total_cmp(&b.1).then_with(|| a.0.cmp(&b.0)));
    let codes = ranked.into_iter().enumerate().map(|(code, (category, _))| (category, code as f64)).collect();
    Some(FeatureSpec { name: name.to_owned(), kind: FeatureKind::Categorical { source, codes } })
}

#[cfg(test)]
mod tests {
    use super::*;
    use domain::VmRequest;

    fn request(vm_type: &str, extra: &[(&str, &str)]) -> RequestFeatures {
        RequestFeatures {
            tenant_id: "t".to_owned(),
            vm_type: vm_type.to_owned(),
            cores: 2.0,
            memory_gib: 8.0,
            priority: Priority::Regular,
            time_s: 86_400.0 * 9.0 + 3_600.0 * 13.5,
            extra: extra.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect(),
        }
    }

    fn schema() -> FeatureSchema {
        let mut builder = SchemaBuilder::new(86_400.0, 7_200.0);
        for i in 0..30 {
            // "long" types live ~1e5 s, "short" ~1e2 s; "rare" is seen 3 times.
            builder.observe(&request("long", &[("batch_size", "3"), ("id", &format!("r{i}"))]), Some(5.0));
            builder.observe(&request("short", &[("batch_size", ""), ("id", &format!("s{i}"))]), Some(2.0));
        }
        for _ in 0..3 {
            builder.observe(&request("rare", &[("batch_size", "1"), ("id", "x")]), Some(3.0));
        }
        builder.build()
    }

    #[test]
    fn categories_are_ranked_by_lifetime_and_rare_ones_collapse() {
        let schema = schema();
        let vm_type = schema.features.iter().find(|f| f.name == "vm_type").unwrap();
        let FeatureKind::Categorical { codes, .. } = &vm_type.kind else { panic!("vm_type is categorical") };
        let order: Vec<&str> = codes.iter().map(|(c, _)| c.as_str()).collect();
        assert_eq!(order, ["short", OTHER, "long"]);
        // A numeric extra column stays numeric; an id-like column with no frequent value is dropped.
        assert!(schema.features.iter().any(|f| f.name == "extra_batch_size"));
        assert!(!schema.features.iter().any(|f| f.name == "extra_id"));
    }

    #[test]
    fn encoding_is_the_same_for_training_and_serving_inputs() {
        let schema = schema();
        let encoder = schema.encoder();
        let past = Past::unknown();
        let row = encoder.encode(&request("rare", &[("batch_size", "4")]), &past, None);
        let names = schema.names();
        let get = |name: &str| row[names.iter().position(|n| n == name).unwrap()];
        assert_eq!(get("vm_type"), 1.0); // "other"
        assert_eq!(get("extra_batch_size"), 4.0);
        assert_eq!(get("hour_of_day"), 13.5);
        assert_eq!(get("weekday"), 2.0);
        assert_eq!(get("memory_per_core"), 4.0);
        assert!(get("tenant_long_share").is_nan() && get("job_long_share").is_nan());

        let vm: VmRequest = serde_json::from_value(serde_json::json!({
            "vm_id": "v", "tenant_id": "t", "vm_type": "rare", "demand": {"cores": 2, "memory_gib": 8},
            "requested_at_s": 86_400.0 * 9.0 + 3_600.0 * 13.5, "features": {"batch_size": 4}
        }))
        .unwrap();
        let served = encoder.encode(&RequestFeatures::of(&vm.facts, 0.0), &past, None);
        assert_eq!(format!("{row:?}"), format!("{served:?}"));
    }

    #[test]
    fn features_of_a_request_are_those_of_its_predict_instance() {
        let mut vm: VmRequest = serde_json::from_value(serde_json::json!({
            "vm_id": "v", "tenant_id": "t", "vm_type": "D4", "demand": {"cores": 4, "memory_gib": 16},
            "priority": "low", "os": "linux", "features": {"batch_size": 4.5, "team": "web"}
        }))
        .unwrap();
        let via_instance = |vm: &VmRequest| RequestFeatures::from_instance(&PredictInstance::from_vm(vm), 7.0);
        assert_eq!(RequestFeatures::of(&vm.facts, 7.0), via_instance(&vm), "no request time: now");
        vm.facts.requested_at_s = Some(3.0);
        vm.facts.details.os = None;
        assert_eq!(RequestFeatures::of(&vm.facts, 7.0), via_instance(&vm));
    }

    #[test]
    fn the_hash_changes_with_the_schema() {
        let schema = schema();
        assert_eq!(schema.hash(), schema.clone().hash());
        assert_ne!(schema.hash(), schema.with_uptime().hash());
    }

    #[test]
    fn dropping_groups_keeps_the_other_columns_in_order() {
        let schema = schema();
        assert_eq!(schema.groups(), FeatureGroup::ALL);
        let smaller = schema.without(&[FeatureGroup::Weekday, FeatureGroup::Tenant]);
        assert_eq!(smaller.groups(), [FeatureGroup::Job]);
        assert!(!smaller.names().iter().any(|n| n == "weekday" || n.starts_with("tenant_")));
        assert!(smaller.names().iter().any(|n| n == "hour_of_day"));
        // The smaller schema encodes the kept columns of the full row.
        let past = Past {
            tenant: TenantSummary { vms_in_window: 3.0, running: 1.0, ..TenantSummary::unknown() },
            job: TenantSummary { vms_in_window: 2.0, long_share: 0.5, ..TenantSummary::unknown() },
        };
        let request = request("long", &[("batch_size", "2")]);
        let full = schema.encoder().encode(&request, &past, None);
        let names = schema.names();
        assert_eq!(full[names.iter().position(|n| n == "job_long_share").unwrap()], 0.5);
        assert_eq!(full[names.iter().position(|n| n == "tenant_running").unwrap()], 1.0);
        let kept: Vec<f64> =
            schema.kept_indices(&[FeatureGroup::Weekday, FeatureGroup::Tenant]).into_iter().map(|i| full[i]).collect();
        assert_eq!(format!("{kept:?}"), format!("{:?}", smaller.encoder().encode(&request, &past, None)));
        assert_ne!(schema.hash(), smaller.hash());
        assert_eq!(schema.without(&[]), schema);
    }

    #[test]
    fn feature_groups_parse_by_name() {
        assert_eq!("Weekday".parse::<FeatureGroup>().unwrap(), FeatureGroup::Weekday);
        assert_eq!(" tenant".parse::<FeatureGroup>().unwrap(), FeatureGroup::Tenant);
        assert_eq!("JOB".parse::<FeatureGroup>().unwrap(), FeatureGroup::Job);
        assert!("hour".parse::<FeatureGroup>().is_err());
        assert_eq!(serde_json::to_string(&FeatureGroup::Tenant).unwrap(), "\"tenant\"");
    }
}
