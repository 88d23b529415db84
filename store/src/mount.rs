//! Stores mounted as groups of another: a dataset whose variables live in two stores (inputs
//! from one archive, targets from another on the same time axis) reads them as one hierarchy.
//!
//! A store mounted as `targets` answers every key under `targets/`: its array `tp` is the
//! array `targets/tp` of the [`MountedStore`], whose chunk keys (`targets/tp/c/0/0/0`) route
//! back to it with the prefix taken off. Everything keyed by array path downstream (the pool,
//! the cache directory, batches) sees one store.

use std::path::PathBuf;

use crate::error::StoreError;
use crate::hierarchy::{Hierarchy, open_hierarchy_at};
use crate::store::{AnyStore, Store};

/// A store with others mounted as its top-level groups.
#[derive(Clone, Debug)]
pub struct MountedStore {
    root: AnyStore,
    /// (name, store), in the order mounted; names are distinct and contain no `/`.
    mounts: Vec<(String, AnyStore)>,
}

impl MountedStore {
    /// `root` with nothing mounted (reads exactly as `root` does).
    pub fn new(root: AnyStore) -> Self {
        Self {
            root,
            mounts: Vec::new(),
        }
    }

    /// Mounts `store` as the group `name`: a Zarr node name (not empty, no `/`, not `.` or
    /// `..`, not starting with `__`), distinct from the other mounts. `location` names the
    /// store in errors. Whether the root store already has a node of that name is checked by
    /// [`open_mounted_hierarchy`], which reads the root's metadata.
    pub fn mount(&mut self, name: &str, store: AnyStore, location: &str) -> Result<(), StoreError> {
        let bad = |message: &str| StoreError::BadMount {
            name: name.to_string(),
            location: location.to_string(),
            message: message.to_string(),
        };
        if name.is_empty() || name == "." || name == ".." {
            return Err(bad(
                "a mount's name is the group its arrays appear under; give a name such as \"targets\"",
            ));
        }
        if name.contains('/') {
            return Err(bad(
                "a mount's name is one group name and cannot contain `/`",
            ));
        }
        if name.starts_with("__") {
            return Err(bad(
                "Zarr reserves names starting with `__`; choose another name",
            ));
        }
        if self.mounts.iter().any(|(n, _)| n == name) {
            return Err(bad(
                "another store is already mounted under this name; give each mount its own name",
            ));
        }
        self.mounts.push((name.to_string(), store));
        Ok(())
    }

    /// The store everything not under a mount is read from.
    pub fn root(&self) -> &AnyStore {
        &self.root
    }

    /// The mounted stores by name, in the order mounted.
    pub fn mounts(&self) -> impl Iterator<Item = (&str, &AnyStore)> {
        self.mounts.iter().map(|(n, s)| (n.as_str(), s))
    }

    /// Whether any of the stores is read over a network.
    pub fn is_remote(&self) -> bool {
        self.root.is_remote() || self.mounts.iter().any(|(_, s)| s.is_remote())
    }

    /// The store that holds `key`, and the key within it.
    fn route<'k>(&self, key: &'k str) -> (&AnyStore, &'k str) {
        for (name, store) in &self.mounts {
            if let Some(rest) = key.strip_prefix(name.as_str()) {
                if rest.is_empty() {
                    return (store, "");
                }
                if let Some(rest) = rest.strip_prefix('/') {
                    return (store, rest);
                }
            }
        }
        (&self.root, key)
    }
}

impl Store for MountedStore {
    fn locate(&self, key: &str) -> PathBuf {
        let (store, key) = self.route(key);
        store.locate(key)
    }

    async fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let (store, key) = self.route(key);
        store.get(key).await
    }

    async fn get_into(&self, key: &str, buf: Vec<u8>) -> Result<Option<Vec<u8>>, StoreError> {
        let (store, key) = self.route(key);
        store.get_into(key, buf).await
    }

    async fn get_suffix(&self, key: &str, n: u64) -> Result<Option<(Vec<u8>, u64)>, StoreError> {
        let (store, key) = self.route(key);
        store.get_suffix(key, n).await
    }

    async fn get_ranges(
        &self,
        key: &str,
        ranges: &[std::ops::Range<u64>],
    ) -> Result<Option<Vec<Vec<u8>>>, StoreError> {
        let (store, key) = self.route(key);
        store.get_ranges(key, ranges).await
    }

    async fn exists(&self, key: &str) -> Result<bool, StoreError> {
        let (store, key) = self.route(key);
        store.exists(key).await
    }

    async fn list_dir(&self, prefix: &str) -> Result<Vec<String>, StoreError> {
        let (store, key) = self.route(prefix);
        store.list_dir(key).await
    }

    fn size_of(&self, key: &str) -> Option<u64> {
        let (store, key) = self.route(key);
        store.size_of(key)
    }
}

/// The root store's hierarchy with every mount's arrays under its name (`targets/tp`). A mount
/// whose name is also a node of the root store is refused (its arrays would hide the root's).
/// The result keeps the root's `root` path and `discovery`.
pub async fn open_mounted_hierarchy(store: &MountedStore) -> Result<Hierarchy, StoreError> {
    // The root read alone: through the mounts, a name they shadow would not be seen.
    let mut hierarchy = open_hierarchy_at(&store.root, "").await?;
    for (name, mounted) in &store.mounts {
        let clash = hierarchy
            .arrays
            .keys()
            .find(|p| *p == name || p.starts_with(&format!("{name}/")));
        if let Some(path) = clash {
            return Err(StoreError::BadMount {
                name: name.clone(),
                location: mounted.locate("").display().to_string(),
                message: format!(
                    "{} already has {} `{path}` under that name; choose a name the store does \
                     not use",
                    hierarchy.root.display(),
                    if path == name {
                        "an array"
                    } else {
                        "a group with the array"
                    }
                ),
            });
        }
        if !hierarchy.is_group {
            return Err(StoreError::BadMount {
                name: name.clone(),
                location: mounted.locate("").display().to_string(),
                message: format!(
                    "{} is an array, not a group; stores mount as groups of a group",
                    hierarchy.root.display()
                ),
            });
        }
        let sub = open_hierarchy_at(store, name).await?;
        hierarchy.arrays.extend(sub.arrays);
    }
    Ok(hierarchy)
}
