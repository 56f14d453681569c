//! GGUF files split into parts (`NAME-00001-of-00003.gguf`, as `llama-gguf-split` and the Hub's
//! large GGUF repositories have them): the first part holds the metadata, every part a share
//! of the tensors, and `split.count` / `split.no` say which part a file is.

use std::path::{Path, PathBuf};

/// The paths of all `count` parts of the split that `path` is one part of, first part first;
/// `None` when its name is not `…-NNNNN-of-MMMMM.gguf` with `MMMMM` = `count`.
pub(crate) fn part_paths(path: &Path, count: usize) -> Option<Vec<PathBuf>> {
    let name = path.file_name()?.to_str()?;
    let stem = name.strip_suffix(".gguf")?;
    let (rest, total) = stem.rsplit_once("-of-")?;
    let (prefix, index) = rest.rsplit_once('-')?;
    let digits = |s: &str| s.len() == 5 && s.chars().all(|c| c.is_ascii_digit());
    if !digits(total) || !digits(index) || total.parse::<usize>().ok()? != count {
        return None;
    }
    Some(
        (1..=count)
            .map(|i| path.with_file_name(format!("{prefix}-{i:05}-of-{count:05}.gguf")))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::GgufFile;

    fn split_fixture() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/tiny-qwen3/split")
    }

    #[test]
    fn a_split_file_holds_the_whole_files_tensors() {
        let dir = split_fixture();
        let split = GgufFile::open(&dir.join("model-00001-of-00004.gguf")).unwrap();
        let whole = GgufFile::open(&dir.join("../model.gguf")).unwrap();
        assert_eq!(split.tensors().len(), whole.tensors().len());
        assert!(split.tensors().iter().any(|t| t.part == 3));
        for t in whole.tensors() {
            let info = split.tensor_info(&t.name).unwrap();
            assert_eq!(
                split.tensor_bytes(info),
                whole.tensor_bytes(t),
                "{}",
                t.name
            );
        }
    }

    #[test]
    fn a_split_file_opens_from_its_first_part_with_every_part_present() {
        let dir = split_fixture();
        let err = GgufFile::open(&dir.join("model-00002-of-00004.gguf"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("not the first"), "{err}");
        let partial = tempfile::tempdir().unwrap();
        for i in 1..=3 {
            let name = format!("model-{i:05}-of-00004.gguf");
            std::fs::copy(dir.join(&name), partial.path().join(&name)).unwrap();
        }
        let err = GgufFile::open(&partial.path().join("model-00001-of-00004.gguf"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("model-00004-of-00004.gguf"), "{err}");
    }

    #[test]
    fn parts_are_named_as_llama_cpp_names_them() {
        let parts = part_paths(Path::new("/m/Qwen3-Q8_0-00002-of-00003.gguf"), 3).unwrap();
        assert_eq!(
            parts,
            [
                Path::new("/m/Qwen3-Q8_0-00001-of-00003.gguf"),
                Path::new("/m/Qwen3-Q8_0-00002-of-00003.gguf"),
                Path::new("/m/Qwen3-Q8_0-00003-of-00003.gguf"),
            ]
        );
        assert_eq!(part_paths(Path::new("/m/x-00001-of-00003.gguf"), 2), None);
        assert_eq!(part_paths(Path::new("/m/model.gguf"), 2), None);
        assert_eq!(part_paths(Path::new("/m/x-1-of-3.gguf"), 3), None);
    }
}
