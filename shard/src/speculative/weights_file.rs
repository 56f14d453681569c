//! Where a proposer's weights sit in its directory.

use std::path::{Path, PathBuf};

use tessera_model_files::FormatError;

use crate::EngineError;

/// The safetensors file of draft heads in `dir`: `named`, or the directory's only one.
pub(super) fn heads_file(dir: &Path, named: &str) -> Result<PathBuf, EngineError> {
    let path = dir.join(named);
    if path.exists() {
        return Ok(path);
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| FormatError::io(dir, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    match found.len() {
        1 => Ok(found.remove(0)),
        n => Err(EngineError::Weights {
            path: dir.display().to_string(),
            message: format!(
                "expected {named} (or a single .safetensors file), found {n} safetensors files"
            ),
        }),
    }
}
