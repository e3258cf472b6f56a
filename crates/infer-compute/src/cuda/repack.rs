//! Repacking of GGUF rows into the layouts the `mv_*r` kernels read
//! (`kernels/quant.cuh`, "Repacked rows"), done once when a model is
//! prepared. Blocks of Q4_0 (18 bytes), Q5_0 (22), Q8_0 (34) and Q6_K (210)
//! are only 2-byte aligned inside a row, so their quants would be read two
//! bytes at a time; split into planes (all quants, then high bits, then
//! scales), each chunk's quants become aligned 16-byte loads. The bytes
//! are the same, reordered; rows are padded to a multiple of 16 bytes.

use crate::GgmlType;

/// Whether `ty` has a repacked kernel.
pub(crate) fn has_repacked(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 | GgmlType::Q6_K)
}

/// Row stride of a repacked row of `row_bytes` GGUF bytes.
pub(crate) fn repacked_stride(row_bytes: usize) -> usize {
    row_bytes.div_ceil(16) * 16
}

/// Repacks `rows` GGUF rows of `row_bytes` bytes each (`data`), or `None`
/// for types without a repacked layout.
pub(crate) fn repack(ty: GgmlType, rows: usize, row_bytes: usize, data: &[u8]) -> Option<Vec<u8>> {
    if !has_repacked(ty) || data.len() != rows * row_bytes {
        return None;
    }
    let ts = ty.type_size();
    let nb = row_bytes / ts;
    let stride = repacked_stride(row_bytes);
    let mut out = vec![0u8; rows * stride];
    for (src, dst) in data.chunks_exact(row_bytes).zip(out.chunks_exact_mut(stride)) {
        for (b, blk) in src.chunks_exact(ts).enumerate() {
            match ty {
                GgmlType::Q8_0 => {
                    // d(2) qs(32) -> qs planes, then d.
                    dst[32 * b..32 * b + 32].copy_from_slice(&blk[2..34]);
                    dst[32 * nb + 2 * b..32 * nb + 2 * b + 2].copy_from_slice(&blk[0..2]);
                }
                GgmlType::Q4_0 => {
                    // d(2) qs(16).
                    dst[16 * b..16 * b + 16].copy_from_slice(&blk[2..18]);
                    dst[16 * nb + 2 * b..16 * nb + 2 * b + 2].copy_from_slice(&blk[0..2]);
                }
                GgmlType::Q5_0 => {
                    // d(2) qh(4) qs(16) -> qs, qh, d planes.
                    dst[16 * b..16 * b + 16].copy_from_slice(&blk[6..22]);
                    dst[16 * nb + 4 * b..16 * nb + 4 * b + 4].copy_from_slice(&blk[2..6]);
                    dst[20 * nb + 2 * b..20 * nb + 2 * b + 2].copy_from_slice(&blk[0..2]);
                }
                GgmlType::Q6_K => {
                    // ql(128) qh(64) scales(16) d(2) -> 208-byte blocks, then d.
                    dst[208 * b..208 * b + 208].copy_from_slice(&blk[0..208]);
                    dst[208 * nb + 2 * b..208 * nb + 2 * b + 2].copy_from_slice(&blk[208..210]);
                }
                _ => return None,
            }
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repack_moves_every_byte_once() {
        for ty in [GgmlType::Q4_0, GgmlType::Q5_0, GgmlType::Q8_0, GgmlType::Q6_K] {
            let cols = 3 * ty.block_size();
            let rb = ty.row_bytes(cols).unwrap();
            let rows = 2;
            let data: Vec<u8> = (0..rows * rb).map(|i| (i * 7 + 3) as u8).collect();
            let out = repack(ty, rows, rb, &data).unwrap();
            let stride = repacked_stride(rb);
            assert_eq!(out.len(), rows * stride);
            for r in 0..rows {
                let mut a = data[r * rb..(r + 1) * rb].to_vec();
                let mut b = out[r * stride..r * stride + rb].to_vec();
                a.sort_unstable();
                b.sort_unstable();
                assert_eq!(a, b, "{ty}: row {r} is not a permutation");
                assert!(out[r * stride + rb..(r + 1) * stride].iter().all(|&x| x == 0));
            }
        }
    }
}
