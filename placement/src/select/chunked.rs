//! A sorted sequence kept in chunks of a few hundred entries: what a temporal policy's score
//! groups hold their hosts in, by exit time (`super::TieSet::ByExit`).
//!
//! A group at 100k hosts holds tens of thousands of hosts, and each placement or release moves one
//! of them. In one sorted vector each move shifts half the group in memory, twice; here it shifts
//! at most one chunk, found by a binary search over the chunks' last entries. Those are kept in a
//! vector of their own: read through each chunk's buffer, every step of that search was a cache
//! miss (issue 32). Positions (ranks) are still what the index reads, to count the hosts of a
//! temporal cost and to draw one of them: a rank walks the chunks' lengths, a few hundred
//! additions at most.

/// Entries per chunk at most; a fuller chunk is split in two.
const MAX_CHUNK: usize = 512;

/// A sorted sequence of distinct entries. No chunk is empty.
#[derive(Debug, Clone)]
pub(crate) struct ChunkedSorted<T> {
    chunks: Vec<Vec<T>>,
    /// Each chunk's last entry, by chunk.
    lasts: Vec<T>,
    len: usize,
}

impl<T> Default for ChunkedSorted<T> {
    fn default() -> Self {
        ChunkedSorted { chunks: Vec::new(), lasts: Vec::new(), len: 0 }
    }
}

impl<T: Ord + Copy> ChunkedSorted<T> {
    pub fn len(&self) -> usize {
        self.len
    }

    /// The chunk `entry` belongs in: the first whose last entry is not below it (the last chunk
    /// for an entry above every other). Not called when there is no chunk.
    fn chunk_for(&self, entry: &T) -> usize {
        let at = self.lasts.partition_point(|last| last < entry);
        at.min(self.chunks.len() - 1)
    }

    /// Adds `entry` at its place (an entry already present is not added again).
    pub fn insert(&mut self, entry: T) {
        if self.chunks.is_empty() {
            self.chunks.push(vec![entry]);
            self.lasts.push(entry);
            self.len = 1;
            return;
        }
        let at = self.chunk_for(&entry);
        let chunk = &mut self.chunks[at];
        let Err(pos) = chunk.binary_search(&entry) else { return };
        chunk.insert(pos, entry);
        self.len += 1;
        if pos + 1 == chunk.len() {
            self.lasts[at] = entry;
        }
        if chunk.len() > MAX_CHUNK {
            let tail = chunk.split_off(chunk.len() / 2);
            if let Some(&last) = chunk.last() {
                self.lasts.insert(at, last);
            }
            self.chunks.insert(at + 1, tail);
        }
    }

    /// Removes `entry`; whether it was there.
    pub fn remove(&mut self, entry: &T) -> bool {
        if self.chunks.is_empty() {
            return false;
        }
        let at = self.chunk_for(entry);
        let chunk = &mut self.chunks[at];
        let Ok(pos) = chunk.binary_search(entry) else { return false };
        chunk.remove(pos);
        self.len -= 1;
        match chunk.last() {
            None => {
                self.chunks.remove(at);
                self.lasts.remove(at);
            }
            Some(&last) => self.lasts[at] = last,
        }
        true
    }

    /// The number of leading entries for which `below` holds (`below` must hold for a prefix of
    /// the sequence and fail for the rest, as for `slice::partition_point`).
    pub fn partition_point(&self, mut below: impl FnMut(&T) -> bool) -> usize {
        let at = self.lasts.partition_point(&mut below);
        let before: usize = self.chunks[..at].iter().map(Vec::len).sum();
        before + self.chunks.get(at).map_or(0, |chunk| chunk.partition_point(below))
    }

    /// The entry at `rank` (0 the lowest).
    pub fn get(&self, mut rank: usize) -> Option<T> {
        for chunk in &self.chunks {
            match chunk.get(rank) {
                Some(entry) => return Some(*entry),
                None => rank -= chunk.len(),
            }
        }
        None
    }

    /// Every entry, lowest first (`rev()` for highest first).
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = &T> + '_ {
        self.chunks.iter().flatten()
    }

    /// The entries of ranks `range`, lowest first.
    pub fn range(&self, range: std::ops::Range<usize>) -> impl Iterator<Item = &T> + '_ {
        self.iter().skip(range.start).take(range.len())
    }

    /// Bytes held on the heap.
    pub fn heap_bytes(&self) -> usize {
        self.chunks.capacity() * std::mem::size_of::<Vec<T>>()
            + self.lasts.capacity() * std::mem::size_of::<T>()
            + self.chunks.iter().map(|c| c.capacity() * std::mem::size_of::<T>()).sum::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Any sequence of inserts and removes leaves what a sorted vector would hold, and ranks,
        /// lookups and ranges read it alike.
        #[test]
        fn behaves_as_a_sorted_vector(ops in proptest::collection::vec((any::<bool>(), 0u32..3000), 1..4000)) {
            let mut chunked = ChunkedSorted::default();
            let mut plain: Vec<u32> = Vec::new();
            for (add, value) in ops {
                if add {
                    chunked.insert(value);
                    if let Err(at) = plain.binary_search(&value) {
                        plain.insert(at, value);
                    }
                } else {
                    let present = plain.binary_search(&value).map(|at| plain.remove(at)).is_ok();
                    prop_assert_eq!(chunked.remove(&value), present);
                }
                prop_assert_eq!(chunked.len(), plain.len());
            }
            prop_assert!(chunked.chunks.iter().all(|c| !c.is_empty() && c.len() <= MAX_CHUNK));
            let lasts: Vec<u32> = chunked.chunks.iter().filter_map(|c| c.last().copied()).collect();
            prop_assert_eq!(&chunked.lasts, &lasts);
            prop_assert_eq!(chunked.iter().copied().collect::<Vec<_>>(), plain.clone());
            prop_assert_eq!(chunked.iter().next_back(), plain.last());
            for probe in [0, 1, 700, 1500, 2999, 3000] {
                prop_assert_eq!(chunked.partition_point(|v| *v < probe), plain.partition_point(|v| *v < probe));
            }
            for rank in [0, plain.len() / 3, plain.len().saturating_sub(1), plain.len()] {
                prop_assert_eq!(chunked.get(rank), plain.get(rank).copied());
                let end = (rank + 600).min(plain.len());
                prop_assert_eq!(chunked.range(rank..end).copied().collect::<Vec<_>>(), plain[rank..end].to_vec());
            }
        }
    }
}
