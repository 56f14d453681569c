//! Metadata of every type, its numeric helpers, and tensor alignment.

use super::*;

fn every_type_metadata() -> Vec<(&'static str, MetadataValue)> {
    vec![
        ("t.u8", V::U8(250)),
        ("t.i8", V::I8(-7)),
        ("t.u16", V::U16(65000)),
        ("t.i16", V::I16(-30000)),
        ("t.u32", V::U32(4_000_000_000)),
        ("t.i32", V::I32(-2_000_000_000)),
        ("t.u64", V::U64(u64::MAX)),
        ("t.i64", V::I64(i64::MIN)),
        ("t.f32", V::F32(1.5)),
        ("t.f64", V::F64(-2.25e100)),
        ("t.true", V::Bool(true)),
        ("t.false", V::Bool(false)),
        ("t.string", V::String("héllo ✓".into())),
        ("t.empty_string", V::String(String::new())),
        ("t.empty_array", V::Array(vec![])),
        (
            "t.strings",
            V::Array(vec![V::String("a".into()), V::String("bc".into())]),
        ),
        (
            "t.nested",
            V::Array(vec![
                V::Array(vec![V::I32(1), V::I32(2)]),
                V::Array(vec![V::I32(3)]),
            ]),
        ),
    ]
}

#[test]
fn reads_every_metadata_type_in_v2_and_v3() {
    for version in [2, 3] {
        let mut w = Writer::new();
        w.version = version;
        for (k, v) in every_type_metadata() {
            w = w.kv(k, v);
        }
        let (bytes, _) = w.bytes();
        let file = open_bytes(&bytes).expect("valid file");
        assert_eq!(file.version(), version);
        for (k, v) in every_type_metadata() {
            assert_eq!(file.metadata(k), Some(&v), "{k} (v{version})");
        }
        assert_eq!(file.metadata("t.missing"), None);
        assert_eq!(file.metadata_entries().count(), every_type_metadata().len());
        assert!(file.tensors().is_empty());
    }
}

#[test]
fn metadata_helpers_convert_between_numeric_types() {
    assert_eq!(V::U8(3).as_u64(), Some(3));
    assert_eq!(V::I32(-1).as_u64(), None);
    assert_eq!(V::I32(-1).as_i64(), Some(-1));
    assert_eq!(V::U64(u64::MAX).as_i64(), None);
    assert_eq!(V::F32(0.5).as_f64(), Some(0.5));
    assert_eq!(V::U32(7).as_f64(), Some(7.0));
    assert_eq!(V::String("x".into()).as_f64(), None);
    assert_eq!(V::String("x".into()).as_str(), Some("x"));
    assert_eq!(V::Bool(true).as_bool(), Some(true));
    assert_eq!(V::Array(vec![V::U8(1)]).as_array().map(<[_]>::len), Some(1));
    assert_eq!(V::U8(1).as_array(), None);
}

#[test]
fn tensors_respect_default_and_custom_alignment() {
    for alignment in [None, Some(64u32), Some(1)] {
        let mut w = Writer::new().kv("general.architecture", V::String("llama".into()));
        if let Some(a) = alignment {
            w = w.kv("general.alignment", V::U32(a));
            w.alignment = a as usize;
        }
        let a: Vec<f32> = (0..5).map(|i| i as f32).collect();
        let b: Vec<f32> = (0..6).map(|i| -(i as f32)).collect();
        let w = w.f32_tensor("a", &[5], &a).f32_tensor("b", &[3, 2], &b);
        let (bytes, layout) = w.bytes();
        let file = open_bytes(&bytes).expect("valid file");
        let expected = alignment.map_or(32, |a| a as usize);
        assert_eq!(file.alignment(), expected);
        assert_eq!(file.data_offset(), layout.data_start);
        assert_eq!(file.data_offset() % expected, 0);
        for t in file.tensors() {
            assert_eq!((t.start - file.data_offset()) % expected, 0, "{}", t.name);
        }
        assert_eq!(file.load_gguf_f32("a").unwrap(), a);
        assert_eq!(file.load_gguf_f32("b").unwrap(), b);
        assert_eq!(file.tensor_info("b").unwrap().dims, [3, 2]);
    }
}
