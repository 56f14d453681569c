//! Stacking matrices row-wise: in their common format, or as a stack of parts.

use super::{Data, WeightMatrix};

impl WeightMatrix {
    /// The matrices' rows stacked (their widths must agree): in their common format, or as a
    /// stack of the parts, each in its own format, when their formats differ (or any is
    /// already repacked for int8). A product with a stack multiplies each part in turn.
    pub fn concat_rows(parts: Vec<WeightMatrix>) -> WeightMatrix {
        let cols = parts.first().map_or(0, |p| p.cols);
        assert!(
            parts.iter().all(|p| p.cols == cols),
            "stacked matrices must have equal widths"
        );
        let rows = parts.iter().map(|p| p.rows).sum();
        let format = parts.first().map(|p| p.format());
        if parts.len() == 1 {
            return parts.into_iter().next().expect("one part");
        }
        if !parts.iter().all(|p| {
            Some(p.format()) == format && !matches!(p.data, Data::Packed(_) | Data::Stack(_))
        }) {
            let flat = parts
                .into_iter()
                .flat_map(|p| match p.data {
                    Data::Stack(inner) => inner,
                    _ => vec![p],
                })
                .collect();
            return WeightMatrix {
                rows,
                cols,
                data: Data::Stack(flat),
            };
        }
        let mut it = parts.into_iter().map(|p| p.data);
        // Appends the rest's storage to the first's; every part has the first's variant.
        macro_rules! stack {
            ($($variant:ident),*) => {
                match it.next() {
                    $(Some(Data::$variant(mut v)) => {
                        for d in it {
                            if let Data::$variant(w) = d {
                                v.extend(w);
                            }
                        }
                        Data::$variant(v)
                    })*
                    Some(Data::Packed(_) | Data::Stack(_)) => {
                        unreachable!("repacked matrices and stacks are stacked as parts")
                    }
                    None => Data::F32(Vec::new()),
                }
            };
        }
        let data = stack!(
            F32, Bf16, F16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4K, Q5K, Q6K, Q2K, Q3K, IQ4NL, IQ4XS,
            MXFP4
        );
        WeightMatrix { rows, cols, data }
    }
}
