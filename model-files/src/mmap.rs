//! Read-only memory maps of model files.

use std::path::Path;

use memmap2::Mmap;

use crate::FormatError;

/// Maps a whole file read-only.
#[allow(unsafe_code)]
pub(crate) fn map_file(path: &Path) -> Result<Mmap, FormatError> {
    let file = std::fs::File::open(path).map_err(|e| FormatError::io(path, e))?;
    // SAFETY: the map is read-only and private to this process. Model files are not expected
    // to change while they are served; if another process truncates one anyway, reads of the
    // lost pages fault (SIGBUS) rather than return wrong data, which is the documented
    // limitation of every mmap-based loader (safetensors, llama.cpp).
    unsafe { Mmap::map(&file) }.map_err(|e| FormatError::io(path, e))
}
