//! In-memory model store: a BTreeMap behind the same `WriteView` the LMDB store implements, so
//! tests can run the real semantics against a reference that is obviously right.

use std::collections::BTreeMap;

use super::{ItemMeta, ItemRef, ReadView, StoreError, WriteView};

#[derive(Debug, Default, Clone)]
pub struct ModelStore {
    items: BTreeMap<Vec<u8>, (ItemMeta, Vec<u8>)>,
    cas: u64,
    flush_at: Option<u64>,
}

impl ModelStore {
    /// Applies a delayed flush whose time has come.
    pub fn advance(&mut self, now_ms: u64) {
        if self.flush_at.is_some_and(|at| at <= now_ms) {
            self.items.clear();
            self.flush_at = None;
        }
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
}

impl ReadView for ModelStore {
    fn get(&self, key: &[u8]) -> Result<Option<ItemRef<'_>>, StoreError> {
        Ok(self
            .items
            .get(key)
            .map(|(meta, value)| ItemRef { meta: *meta, value }))
    }
}

impl WriteView for ModelStore {
    fn put(&mut self, key: &[u8], meta: &ItemMeta, parts: &[&[u8]]) -> Result<(), StoreError> {
        if key.is_empty() || key.len() > super::MAX_KEY {
            return Err(StoreError::BadKey);
        }
        self.items.insert(key.to_vec(), (*meta, parts.concat()));
        Ok(())
    }

    fn delete(&mut self, key: &[u8]) -> Result<bool, StoreError> {
        Ok(self.items.remove(key).is_some())
    }

    fn take(&mut self, key: &[u8]) -> Result<bool, StoreError> {
        self.delete(key)
    }

    fn clear(&mut self) -> Result<(), StoreError> {
        self.items.clear();
        self.flush_at = None;
        Ok(())
    }

    fn schedule_flush(&mut self, at_ms: u64) -> Result<(), StoreError> {
        self.flush_at = Some(at_ms);
        Ok(())
    }

    fn next_cas(&mut self) -> u64 {
        self.cas += 1;
        self.cas
    }
}
