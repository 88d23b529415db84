//! Discovering the arrays of a Zarr group (v2 or v3, consolidated or not) or a lone array.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde_json::Value;

use crate::array::ZarrArray;
use crate::error::StoreError;
use crate::store::Store;

/// How deep nested groups are searched when there is no consolidated metadata.
const MAX_GROUP_DEPTH: usize = 8;

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
    let root = store.locate("");
    let mut arrays = BTreeMap::new();

    if let Some(meta) = get_json(store, "zarr.json").await? {
        match meta.get("node_type").and_then(Value::as_str) {
            Some("array") => {
                arrays.insert(
                    String::new(),
                    ZarrArray::from_metadata("", &meta, None, store.locate("zarr.json"))?,
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
                            let a = ZarrArray::from_metadata(
                                path,
                                node,
                                None,
                                store.locate("zarr.json"),
                            )?;
                            arrays.insert(path.clone(), a);
                        }
                    }
                    return Ok(Hierarchy {
                        root,
                        is_group: true,
                        arrays,
                        discovery: "consolidated",
                    });
                }
                list_v3(store, "", 0, &mut arrays).await?;
                return Ok(Hierarchy {
                    root,
                    is_group: true,
                    arrays,
                    discovery: "listing",
                });
            }
            _ => {
                return Err(StoreError::BadMetadata {
                    path: store.locate("zarr.json"),
                    message: "node_type must be \"group\" or \"array\"".into(),
                });
            }
        }
    }

    if let Some(cons) = get_json(store, ".zmetadata").await? {
        let entries = cons
            .get("metadata")
            .and_then(Value::as_object)
            .ok_or_else(|| StoreError::BadMetadata {
                path: store.locate(".zmetadata"),
                message: "no \"metadata\" object".into(),
            })?;
        for (key, meta) in entries {
            if let Some(path) = key.strip_suffix(".zarray") {
                let path = path.trim_end_matches('/');
                let attrs = entries.get(&join(path, ".zattrs"));
                let a = ZarrArray::from_metadata(path, meta, attrs, store.locate(".zmetadata"))?;
                arrays.insert(path.to_string(), a);
            }
        }
        let is_group = !arrays.contains_key("");
        return Ok(Hierarchy {
            root,
            is_group,
            arrays,
            discovery: "consolidated",
        });
    }

    if get_json(store, ".zgroup").await?.is_some() {
        list_v2(store, "", 0, &mut arrays).await?;
        return Ok(Hierarchy {
            root,
            is_group: true,
            arrays,
            discovery: "listing",
        });
    }

    if let Some(meta) = get_json(store, ".zarray").await? {
        let attrs = get_json(store, ".zattrs").await?;
        arrays.insert(
            String::new(),
            ZarrArray::from_metadata("", &meta, attrs.as_ref(), store.locate(".zarray"))?,
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
    for name in store.list_dir(prefix).await? {
        let path = join(prefix, &name);
        let key = join(&path, "zarr.json");
        let Some(meta) = get_json(store, &key).await? else {
            continue;
        };
        match meta.get("node_type").and_then(Value::as_str) {
            Some("array") => {
                arrays.insert(
                    path.clone(),
                    ZarrArray::from_metadata(&path, &meta, None, store.locate(&key))?,
                );
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
    for name in store.list_dir(prefix).await? {
        if name.starts_with('.') {
            continue;
        }
        let path = join(prefix, &name);
        let key = join(&path, ".zarray");
        if let Some(meta) = get_json(store, &key).await? {
            let attrs = get_json(store, &join(&path, ".zattrs")).await?;
            arrays.insert(
                path.clone(),
                ZarrArray::from_metadata(&path, &meta, attrs.as_ref(), store.locate(&key))?,
            );
        } else if depth < MAX_GROUP_DEPTH
            && get_json(store, &join(&path, ".zgroup")).await?.is_some()
        {
            Box::pin(list_v2(store, &path, depth + 1, arrays)).await?;
        }
    }
    Ok(())
}
