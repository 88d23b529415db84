//! Discovering the arrays of a Zarr group (v2 or v3, consolidated or not) or a lone array.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde_json::Value;

use crate::array::ZarrArray;
use crate::error::StoreError;
use crate::store::Store;

/// How deep nested groups are searched when there is no consolidated metadata.
const MAX_GROUP_DEPTH: usize = 8;

/// Metadata documents fetched at once while listing a group without consolidated metadata: on
/// an object store each is a request of tens of milliseconds, so a group of many arrays opened
/// one document at a time took as many round trips.
const METADATA_IN_FLIGHT: usize = 16;

/// The documents at `keys`, fetched `METADATA_IN_FLIGHT` at a time, in order.
async fn get_all_json<S: Store>(
    store: &S,
    keys: &[String],
) -> Result<Vec<Option<Value>>, StoreError> {
    let mut out = Vec::with_capacity(keys.len());
    for batch in keys.chunks(METADATA_IN_FLIGHT) {
        let fetched =
            futures_util::future::join_all(batch.iter().map(|k| get_json(store, k))).await;
        for doc in fetched {
            out.push(doc?);
        }
    }
    Ok(out)
}

/// Every array under a store root, keyed by path (`"t2m"`, `"sub/u10"`; `""` when the root is
/// itself an array).
#[derive(Clone, Debug)]
pub struct Hierarchy {
    /// The store root, for messages.
    pub root: PathBuf,
    /// True when the root is a group, false when it is a single array.
    pub is_group: bool,
    /// The arrays found.
    pub arrays: BTreeMap<String, ZarrArray>,
    /// How the arrays were found: `consolidated`, `listing` or `array`.
    pub discovery: &'static str,
}

impl Hierarchy {
    /// The array at `path`, or an error naming it and listing the arrays there are.
    pub fn array(&self, path: &str) -> Result<&ZarrArray, StoreError> {
        self.arrays
            .get(path)
            .ok_or_else(|| StoreError::UnknownVariable {
                name: path.to_string(),
                group: self.root.clone(),
                available: self.arrays.keys().cloned().collect::<Vec<_>>().join(", "),
            })
    }
}

async fn get_json<S: Store>(store: &S, key: &str) -> Result<Option<Value>, StoreError> {
    let Some(bytes) = store.get(key).await? else {
        return Ok(None);
    };
    let value: Value = serde_json::from_slice(&bytes).map_err(|e| StoreError::BadMetadata {
        path: store.locate(key),
        message: format!("not valid JSON ({e}); the file may be truncated"),
    })?;
    if !value.is_object() {
        return Err(StoreError::BadMetadata {
            path: store.locate(key),
            message: "expected a JSON object".into(),
        });
    }
    Ok(Some(value))
}

fn join(prefix: &str, name: &str) -> String {
    if prefix.is_empty() {
        name.to_string()
    } else {
        format!("{prefix}/{name}")
    }
}

/// Opens the hierarchy at the store root.
pub async fn open_hierarchy<S: Store>(store: &S) -> Result<Hierarchy, StoreError> {
    open_hierarchy_at(store, "").await
}

/// Opens the hierarchy of the group (or array) at `base` in `store` (`""`: the root). Every
/// array's path starts with `base`, so its chunk keys are keys of `store` (how a mounted
/// store's arrays read through the store it is mounted in).
pub async fn open_hierarchy_at<S: Store>(store: &S, base: &str) -> Result<Hierarchy, StoreError> {
    let root = store.locate(base);
    let key = |name: &str| join(base, name);
    let mut arrays = BTreeMap::new();

    if let Some(meta) = get_json(store, &key("zarr.json")).await? {
        match meta.get("node_type").and_then(Value::as_str) {
            Some("array") => {
                arrays.insert(
                    base.to_string(),
                    ZarrArray::from_metadata(base, &meta, None, store.locate(&key("zarr.json")))?,
                );
                return Ok(Hierarchy {
                    root,
                    is_group: false,
                    arrays,
                    discovery: "array",
                });
            }
            Some("group") => {
                if let Some(cons) = meta
                    .get("consolidated_metadata")
                    .filter(|c| !c.is_null())
                    .and_then(|c| c.get("metadata"))
                    .and_then(Value::as_object)
                {
                    for (path, node) in cons {
                        if node.get("node_type").and_then(Value::as_str) == Some("array") {
                            let path = key(path);
                            let a = ZarrArray::from_metadata(
                                &path,
                                node,
                                None,
                                store.locate(&key("zarr.json")),
                            )?;
                            arrays.insert(path, a);
                        }
                    }
                    return Ok(Hierarchy {
                        root,
                        is_group: true,
                        arrays,
                        discovery: "consolidated",
                    });
                }
                list_v3(store, base, 0, &mut arrays).await?;
                return Ok(Hierarchy {
                    root,
                    is_group: true,
                    arrays,
                    discovery: "listing",
                });
            }
            _ => {
                return Err(StoreError::BadMetadata {
                    path: store.locate(&key("zarr.json")),
                    message: "node_type must be \"group\" or \"array\"".into(),
                });
            }
        }
    }

    if let Some(cons) = get_json(store, &key(".zmetadata")).await? {
        let entries = cons
            .get("metadata")
            .and_then(Value::as_object)
            .ok_or_else(|| StoreError::BadMetadata {
                path: store.locate(&key(".zmetadata")),
                message: "no \"metadata\" object".into(),
            })?;
        for (entry, meta) in entries {
            if let Some(path) = entry.strip_suffix(".zarray") {
                let path = path.trim_end_matches('/');
                let attrs = entries.get(&join(path, ".zattrs"));
                let path = key(path).trim_end_matches('/').to_string();
                let a =
                    ZarrArray::from_metadata(&path, meta, attrs, store.locate(&key(".zmetadata")))?;
                arrays.insert(path, a);
            }
        }
        let is_group = !arrays.contains_key(base);
        return Ok(Hierarchy {
            root,
            is_group,
            arrays,
            discovery: "consolidated",
        });
    }

    if get_json(store, &key(".zgroup")).await?.is_some() {
        list_v2(store, base, 0, &mut arrays).await?;
        return Ok(Hierarchy {
            root,
            is_group: true,
            arrays,
            discovery: "listing",
        });
    }

    if let Some(meta) = get_json(store, &key(".zarray")).await? {
        let attrs = get_json(store, &key(".zattrs")).await?;
        arrays.insert(
            base.to_string(),
            ZarrArray::from_metadata(base, &meta, attrs.as_ref(), store.locate(&key(".zarray")))?,
        );
        return Ok(Hierarchy {
            root,
            is_group: false,
            arrays,
            discovery: "array",
        });
    }

    Err(StoreError::NotZarr { path: root })
}

async fn list_v3<S: Store>(
    store: &S,
    prefix: &str,
    depth: usize,
    arrays: &mut BTreeMap<String, ZarrArray>,
) -> Result<(), StoreError> {
    let paths: Vec<String> = store
        .list_dir(prefix)
        .await?
        .iter()
        .map(|name| join(prefix, name))
        .collect();
    let keys: Vec<String> = paths.iter().map(|p| join(p, "zarr.json")).collect();
    let metas = get_all_json(store, &keys).await?;
    for ((path, key), meta) in paths.into_iter().zip(&keys).zip(metas) {
        let Some(meta) = meta else {
            continue;
        };
        match meta.get("node_type").and_then(Value::as_str) {
            Some("array") => {
                let array = ZarrArray::from_metadata(&path, &meta, None, store.locate(key))?;
                arrays.insert(path, array);
            }
            Some("group") if depth < MAX_GROUP_DEPTH => {
                Box::pin(list_v3(store, &path, depth + 1, arrays)).await?
            }
            _ => {}
        }
    }
    Ok(())
}

async fn list_v2<S: Store>(
    store: &S,
    prefix: &str,
    depth: usize,
    arrays: &mut BTreeMap<String, ZarrArray>,
) -> Result<(), StoreError> {
    let paths: Vec<String> = store
        .list_dir(prefix)
        .await?
        .iter()
        .filter(|name| !name.starts_with('.'))
        .map(|name| join(prefix, name))
        .collect();
    // Each entry's `.zarray` and `.zattrs` together (a group's `.zgroup` only when it is not
    // an array).
    let keys: Vec<String> = paths
        .iter()
        .flat_map(|p| [join(p, ".zarray"), join(p, ".zattrs")])
        .collect();
    let docs = get_all_json(store, &keys).await?;
    let mut others = Vec::new();
    for (i, path) in paths.into_iter().enumerate() {
        let key = &keys[2 * i];
        if let Some(meta) = &docs[2 * i] {
            let attrs = docs[2 * i + 1].as_ref();
            let array = ZarrArray::from_metadata(&path, meta, attrs, store.locate(key))?;
            arrays.insert(path, array);
        } else if depth < MAX_GROUP_DEPTH {
            others.push(path);
        }
    }
    // The entries that are not arrays: their `.zgroup` documents together too, then each group
    // listed in turn.
    let groups: Vec<String> = others.iter().map(|p| join(p, ".zgroup")).collect();
    let found = get_all_json(store, &groups).await?;
    for (path, group) in others.iter().zip(found) {
        if group.is_some() {
            Box::pin(list_v2(store, path, depth + 1, arrays)).await?;
        }
    }
    Ok(())
}
