//! How a chooser scores one host it could empty.
//!
//! Model-free choosers rank by what the host holds now: fewest VMs ([`fewest_vms`]) or least used
//! ([`least_used`]); every VM moves, in arrival order.
//!
//! Lifetime-aware choosers ([`Scorer`]) read, for each VM, the chances that it is still there `t`
//! from now, `S_i(t)`, on a grid of times up to the horizon, and ask what emptying the host buys
//! per migration it costs:
//!
//! - a VM more likely than not gone within `wait_s` is not moved: the host waits for it;
//! - the others move longest-expected-first (LARS), `max_in_flight` at a time, each
//!   `migration_s` long, so the j-th waits about `floor(j / in_flight) * migration_s` for its turn
//!   and costs a migration only if still there then: expected migrations `sum S_i(wait_j)`;
//! - the host is then empty at `tau` (its migrations done) or when its waiting VMs leave, where by
//!   itself it empties when the last of all its VMs leaves: the expected empty-host time gained
//!   within the horizon is the integral from `tau` of `P(max_all > t) - P(max_waiting > t)`, with
//!   `P(max > t) = 1 - prod (1 - S_i(t))` (VMs independent);
//! - the score is that gain per expected migration, and a host below `min_gain_s` is left alone
//!   (it is likely to empty by itself, or holds VMs that will not).
//!
//! The age chooser reads a model-free distribution of the remaining lifetime from the age alone
//! ([`age_survival`]); the lifetime chooser the model's; the oracle chooser the truth.

use super::ConsolidationConfig;

/// Fewest VMs first, then least used (`used_share` in [0, 1]): higher is better.
pub fn fewest_vms(vms: usize, used_share: f64) -> f64 {
    -(vms as f64) - 0.999 * used_share.clamp(0.0, 1.0)
}

/// Least used first, then fewest VMs: higher is better.
pub fn least_used(vms: usize, used_share: f64) -> f64 {
    -used_share.clamp(0.0, 1.0) - 1e-9 * vms as f64
}

/// The scale of [`age_survival`]: a VM just started is as likely as not to be gone within it.
pub const AGE_SCALE_S: f64 = 600.0;

/// A remaining lifetime read from the age alone: the conditional survival of a Pareto lifetime of
/// shape 1, `P(T > a + t | T > a) = (a + s) / (a + s + t)` with `s` = [`AGE_SCALE_S`]. The median
/// remaining lifetime is the age (plus `s`): the older a VM, the longer it is expected to stay.
pub fn age_survival(age_s: f64, after_s: &[f64], out: &mut [f64]) {
    let a = age_s.max(0.0) + AGE_SCALE_S;
    for (o, &t) in out.iter_mut().zip(after_s) {
        *o = a / (a + t.max(0.0));
    }
}

/// What scoring one host gives.
#[derive(Clone, Debug, PartialEq)]
pub struct HostScore {
    /// Indices (into the VMs given) to migrate, in order.
    pub moves: Vec<usize>,
    /// Indices of the VMs left to exit by themselves.
    pub waiting: Vec<usize>,
    pub expected_migrations: f64,
    pub expected_gain_s: f64,
    /// Gain per expected migration (seconds); negative infinity when nothing would move.
    pub score: f64,
}

/// Scores hosts for the lifetime-aware choosers; holds the time grid and scratch space.
#[derive(Clone, Debug)]
pub struct Scorer {
    /// Times from now, ascending from 0 to the horizon, `wait_s` among them.
    grid: Vec<f64>,
    wait_at: usize,
    in_flight: usize,
    migration_s: f64,
    min_gain_s: f64,
    /// `S_i` at each grid time, VM after VM.
    alive: Vec<f64>,
}

/// The grid's times, up to the horizon: finer in the first hours, where waits and turns fall.
const GRID_S: [f64; 16] = [
    0.0, 600.0, 1200.0, 1800.0, 2700.0, 3600.0, 5400.0, 7200.0, 10_800.0, 14_400.0, 21_600.0, 28_800.0, 43_200.0,
    64_800.0, 86_400.0, 172_800.0,
];

impl Scorer {
    pub fn new(config: &ConsolidationConfig) -> Self {
        let horizon = config.horizon_s;
        let mut grid: Vec<f64> = GRID_S.iter().copied().filter(|&t| t < horizon).collect();
        grid.push(horizon);
        let wait = config.wait_s.min(horizon);
        if !grid.contains(&wait) {
            grid.push(wait);
            grid.sort_by(f64::total_cmp);
        }
        let wait_at = grid.iter().position(|&t| t == wait).unwrap_or(0);
        Scorer {
            grid,
            wait_at,
            in_flight: config.max_in_flight.max(1),
            migration_s: config.migration_s,
            min_gain_s: config.min_gain_s,
            alive: Vec::new(),
        }
    }

    /// The times each VM's survival is read at.
    pub fn grid(&self) -> &[f64] {
        &self.grid
    }

    /// Scores a host of `vms` VMs; `survival(i, grid, out)` writes VM `i`'s chances of being
    /// alive at each grid time. `None` when emptying it buys less than `min_gain_s` per migration
    /// or moves nothing.
    pub fn score(&mut self, vms: usize, mut survival: impl FnMut(usize, &[f64], &mut [f64])) -> Option<HostScore> {
        let k = self.grid.len();
        self.alive.clear();
        self.alive.resize(vms * k, 0.0);
        for i in 0..vms {
            survival(i, &self.grid, &mut self.alive[i * k..(i + 1) * k]);
        }
        let curve = |i: usize| &self.alive[i * k..(i + 1) * k];
        let (mut moves, mut waiting) = (Vec::new(), Vec::new());
        for i in 0..vms {
            if self.wait_at > 0 && curve(i)[self.wait_at] < 0.5 {
                waiting.push(i);
            } else {
                moves.push(i);
            }
        }
        if moves.is_empty() {
            return None;
        }
        // Longest expected stay first (the area under the curve up to the horizon).
        let area = |i: usize| integrate(&self.grid, curve(i), 0.0);
        let mut keyed: Vec<(f64, usize)> = moves.iter().map(|&i| (area(i), i)).collect();
        keyed.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        moves = keyed.into_iter().map(|(_, i)| i).collect();
        let expected_migrations: f64 = moves
            .iter()
            .enumerate()
            .map(|(j, &i)| at(&self.grid, curve(i), (j / self.in_flight) as f64 * self.migration_s))
            .sum();
        let tau = moves.len().div_ceil(self.in_flight) as f64 * self.migration_s;
        // P(the last of these VMs is still there at each grid time).
        let last_alive = |of: &mut dyn Iterator<Item = usize>, t: usize| -> f64 {
            1.0 - of.fold(1.0, |gone, i| gone * (1.0 - curve(i)[t]))
        };
        let gained: Vec<f64> = (0..k)
            .map(|t| {
                let all = last_alive(&mut (0..vms), t);
                let left = last_alive(&mut waiting.iter().copied(), t);
                (all - left).max(0.0)
            })
            .collect();
        let expected_gain_s = integrate(&self.grid, &gained, tau);
        let score = expected_gain_s / expected_migrations.max(0.5);
        (score >= self.min_gain_s).then_some(HostScore { moves, waiting, expected_migrations, expected_gain_s, score })
    }
}

/// A piecewise-linear function of the grid's times, at `t` (flat past the last).
fn at(grid: &[f64], values: &[f64], t: f64) -> f64 {
    let j = grid.partition_point(|&g| g <= t);
    if j == 0 {
        return values[0];
    }
    if j >= grid.len() {
        return values[grid.len() - 1];
    }
    let (lo, hi) = (grid[j - 1], grid[j]);
    values[j - 1] + (values[j] - values[j - 1]) * (t - lo) / (hi - lo)
}

/// The integral of a piecewise-linear function of the grid's times from `from` to the last time.
fn integrate(grid: &[f64], values: &[f64], from: f64) -> f64 {
    let mut total = 0.0;
    for j in 1..grid.len() {
        let (lo, hi) = (grid[j - 1].max(from), grid[j]);
        if hi <= lo {
            continue;
        }
        total += (hi - lo) * (at(grid, values, lo) + values[j]) / 2.0;
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reprediction::step_survival;

    fn scorer() -> Scorer {
        Scorer::new(&ConsolidationConfig { min_gain_s: 0.0, ..ConsolidationConfig::default() })
    }

    /// Scores a host whose VMs have these certain remaining lifetimes.
    fn certain(scorer: &mut Scorer, remaining_s: &[f64]) -> Option<HostScore> {
        scorer.score(remaining_s.len(), |i, grid, out| step_survival(remaining_s[i], grid, out))
    }

    #[test]
    fn model_free_ranks_order_by_vms_then_use_and_by_use_then_vms() {
        assert!(fewest_vms(1, 0.9) > fewest_vms(2, 0.1));
        assert!(fewest_vms(2, 0.1) > fewest_vms(2, 0.5));
        assert!(fewest_vms(1, 1.0) > fewest_vms(2, 0.0), "a full share never ties the next count");
        assert!(least_used(9, 0.1) > least_used(1, 0.2));
        assert!(least_used(1, 0.2) > least_used(2, 0.2));
    }

    #[test]
    fn the_gain_is_the_time_the_last_vm_would_have_stayed_after_the_moves() {
        let mut s = scorer();
        // One VM that stays 10 h: moved in 20 min, the host gains 10 h - 20 min, one migration.
        let one = certain(&mut s, &[36_000.0]).unwrap();
        assert_eq!((one.moves.clone(), one.waiting.len()), (vec![0], 0));
        assert!((one.expected_migrations - 1.0).abs() < 1e-9);
        assert!((one.expected_gain_s - (36_000.0 - 1200.0)).abs() < 1.0, "{}", one.expected_gain_s);
        // Beyond the horizon, the horizon counts.
        let long = certain(&mut s, &[1e7]).unwrap();
        assert!((long.expected_gain_s - (86_400.0 - 1200.0)).abs() < 1.0, "{}", long.expected_gain_s);
    }

    #[test]
    fn vms_about_to_exit_are_waited_for_and_cost_nothing() {
        let mut s = scorer();
        // 30 min left: waited for. 10 h left: moved. The host empties at 30 min instead of 10 h.
        let host = certain(&mut s, &[1800.0, 36_000.0]).unwrap();
        assert_eq!((host.moves.clone(), host.waiting.clone()), (vec![1], vec![0]));
        assert!((host.expected_migrations - 1.0).abs() < 1e-9);
        // Within a grid step (the steps are read linearly between the grid's times).
        assert!((host.expected_gain_s - (36_000.0 - 1800.0)).abs() < 600.0, "{}", host.expected_gain_s);
        // A host whose VMs all leave within the wait moves nothing: it empties by itself.
        assert_eq!(certain(&mut s, &[600.0, 1800.0]), None);
    }

    #[test]
    fn longest_first_and_a_late_turn_may_find_the_vm_gone() {
        let mut s = Scorer::new(&ConsolidationConfig {
            min_gain_s: 0.0,
            max_in_flight: 1,
            wait_s: 0.0,
            ..ConsolidationConfig::default()
        });
        // In flight one at a time, 20 min each: the second in line waits 20 min, the third 40.
        let host = certain(&mut s, &[1000.0, 50_000.0, 4000.0]).unwrap();
        assert_eq!(host.moves, vec![1, 2, 0], "longest expected stay first");
        // The 1,000 s VM's turn comes at 2,400 s: gone by then, no migration.
        assert!((host.expected_migrations - 2.0).abs() < 1e-9, "{}", host.expected_migrations);
    }

    #[test]
    fn hosts_below_the_least_gain_are_left_alone() {
        let mut s = Scorer::new(&ConsolidationConfig { min_gain_s: 3600.0, wait_s: 0.0, ..Default::default() });
        // Emptied at 20 min instead of 50 min: 30 min gained, below an hour per migration.
        assert_eq!(certain(&mut s, &[3000.0]), None);
        assert!(certain(&mut s, &[30_000.0]).is_some());
    }

    #[test]
    fn age_reads_older_vms_as_staying_longer() {
        let grid = [0.0, 3600.0];
        let (mut young, mut old) = ([0.0; 2], [0.0; 2]);
        age_survival(0.0, &grid, &mut young);
        age_survival(86_400.0, &grid, &mut old);
        assert_eq!((young[0], old[0]), (1.0, 1.0));
        assert!(old[1] > 0.9 && young[1] < 0.2, "{old:?} {young:?}");
        // The median remaining lifetime is the age plus the scale.
        let mut half = [0.0];
        age_survival(3000.0, &[3600.0], &mut half);
        assert!((half[0] - 0.5).abs() < 1e-12);
    }
}
