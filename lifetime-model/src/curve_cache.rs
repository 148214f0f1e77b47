//! Survival curves remembered by what the hazard model reads of their rows.
//!
//! A row's curve is the hazard model's raw scores over the intervals, and the grid scorer
//! ([`crate::gbdt::grid::GridScorer`]) reads a row only as its values' ranks among the model's
//! split thresholds: two rows with the same ranks reach the same leaves in every tree, so their
//! curves are the same, bit for bit. VMs of one deployment (the same tenant, type and size, asked
//! for together) have the same ranks, and so do VMs whose features differ only between two
//! thresholds; the allocator computes a curve for every VM it places, so it keeps the recent
//! ones by their ranks and computes a curve only for ranks it has not seen lately.
//!
//! The cache holds two generations of [`CURVE_CACHE_GENERATION`] curves: a curve is looked up in
//! the recent one, then in the older (and moved to the recent); when the recent one is full it
//! becomes the older and the one before is dropped. So what it holds is bounded, and a curve
//! in use stays.

use std::collections::HashMap;

/// Curves a generation holds (each about 300 bytes with its key, for the default bundle).
pub const CURVE_CACHE_GENERATION: usize = 4_096;

/// Recent survival curves by their rows' ranks; see the module. One cache belongs to one model:
/// a cache used with another model gives that model's curves only after [`CurveCache::clear`].
#[derive(Debug, Default)]
pub struct CurveCache {
    recent: HashMap<Box<[u16]>, Box<[f64]>>,
    older: HashMap<Box<[u16]>, Box<[f64]>>,
    /// The ranks of the row being looked up (kept to save an allocation a lookup).
    pub(crate) ranks: Vec<u16>,
    /// Curves answered from the cache.
    pub hits: u64,
    /// Curves computed (and remembered).
    pub misses: u64,
}

impl CurveCache {
    /// Forgets every curve (the model changed).
    pub fn clear(&mut self) {
        self.recent.clear();
        self.older.clear();
    }

    /// The curve of the row whose ranks are in `self.ranks`, computed by `compute` into a buffer
    /// when not remembered.
    pub(crate) fn get_or_compute(&mut self, compute: impl FnOnce(&[u16]) -> Vec<f64>) -> Vec<f64> {
        if let Some(curve) = self.recent.get(self.ranks.as_slice()) {
            self.hits += 1;
            return curve.to_vec();
        }
        let curve = match self.older.remove_entry(self.ranks.as_slice()) {
            Some((key, curve)) => {
                self.hits += 1;
                let values = curve.to_vec();
                self.remember(key, curve);
                return values;
            }
            None => compute(&self.ranks),
        };
        self.misses += 1;
        self.remember(self.ranks.clone().into_boxed_slice(), curve.clone().into_boxed_slice());
        curve
    }

    fn remember(&mut self, key: Box<[u16]>, curve: Box<[f64]>) {
        if self.recent.len() >= CURVE_CACHE_GENERATION {
            self.older = std::mem::take(&mut self.recent);
        }
        self.recent.insert(key, curve);
    }

    /// Bytes the remembered curves hold on the heap (keys, curves and the maps' slots).
    pub fn heap_bytes(&self) -> usize {
        let held = |map: &HashMap<Box<[u16]>, Box<[f64]>>| -> usize {
            map.iter().map(|(key, curve)| std::mem::size_of_val(&**key) + std::mem::size_of_val(&**curve)).sum()
        };
        let slots = (self.recent.capacity() + self.older.capacity())
            * (std::mem::size_of::<Box<[u16]>>() + std::mem::size_of::<Box<[f64]>>() + 1);
        held(&self.recent) + held(&self.older) + slots + self.ranks.capacity() * 2
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The curve of ranks `[key]` as `get_or_compute` would compute it, counting computations.
    fn curve(cache: &mut CurveCache, key: u16, computed: &mut u32) -> Vec<f64> {
        cache.ranks = vec![key];
        cache.get_or_compute(|ranks| {
            *computed += 1;
            vec![f64::from(ranks[0]); 3]
        })
    }

    #[test]
    fn holds_at_most_two_generations_and_keeps_what_is_in_use() {
        let mut cache = CurveCache::default();
        let mut computed = 0;
        let keys = 3 * CURVE_CACHE_GENERATION as u16;
        for key in 0..keys {
            assert_eq!(curve(&mut cache, key, &mut computed), vec![f64::from(key); 3]);
            // Key 0 is asked for all along: it stays however many others pass.
            assert_eq!(curve(&mut cache, 0, &mut computed), vec![0.0; 3]);
            assert!(cache.recent.len() + cache.older.len() <= 2 * CURVE_CACHE_GENERATION);
        }
        assert_eq!(computed, u32::from(keys), "each key computed once, key 0 never again");
        assert_eq!((cache.hits, cache.misses), (u64::from(keys), u64::from(keys)));
        // The first keys but 0 were dropped with their generation.
        curve(&mut cache, 1, &mut computed);
        assert_eq!(computed, u32::from(keys) + 1);
        assert!(cache.heap_bytes() > 0);
        cache.clear();
        curve(&mut cache, 0, &mut computed);
        assert_eq!(computed, u32::from(keys) + 2, "cleared with the model");
    }
}
