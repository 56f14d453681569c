//! [`SetCache`]: the allowed-token sets of a constraint's recognizer, kept by state.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

/// Allowed sets by state, shared between threads; emptied when full (states repeat within a
/// few tokens, so the recent ones come back at once).
pub(crate) struct SetCache<K> {
    capacity: usize,
    sets: Mutex<HashMap<K, Arc<Vec<u64>>>>,
}

impl<K: std::hash::Hash + Eq + Copy> SetCache<K> {
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            capacity,
            sets: Mutex::new(HashMap::new()),
        }
    }

    /// The set of `state`, or `walk`'s (then kept). The walk runs outside the lock, so
    /// sequences missing at once may both walk; they compute the same set.
    pub(crate) fn get_or_walk(&self, state: K, walk: impl FnOnce() -> Vec<u64>) -> Arc<Vec<u64>> {
        let lock = || self.sets.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(hit) = lock().get(&state) {
            return hit.clone();
        }
        let set = Arc::new(walk());
        let mut sets = lock();
        if sets.len() >= self.capacity {
            sets.clear();
        }
        sets.insert(state, set.clone());
        set
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    #[test]
    fn walks_each_state_once_until_full_then_starts_over() {
        let cache = SetCache::new(2);
        let walks = Cell::new(0);
        let get = |state: u32| {
            cache.get_or_walk(state, || {
                walks.set(walks.get() + 1);
                vec![u64::from(state)]
            })
        };
        assert_eq!(*get(1), [1]);
        assert_eq!(*get(2), [2]);
        assert_eq!(*get(1), [1]);
        assert_eq!(walks.get(), 2, "a kept set is not walked again");
        assert_eq!(*get(3), [3]);
        assert_eq!(walks.get(), 3);
        assert_eq!(*get(1), [1]);
        assert_eq!(walks.get(), 4, "the full cache was emptied for state 3");
    }
}
