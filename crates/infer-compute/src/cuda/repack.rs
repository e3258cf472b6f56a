//! Repacking of GGUF rows into the layouts the `mv_*r` kernels read
//! (`kernels/quant.cuh`, "Repacked rows"), done once when a model is
//! prepared. Blocks of Q4_0 (18 bytes), Q5_0 (22), Q8_0 (34) and Q6_K (210)
//! are only 2-byte aligned inside a row, so their quants would be read two
//! bytes at a time; split into planes (all quants, then high bits, then
//! scales), each chunk's quants become aligned 16-byte loads. The k-quants
//! spread one 32-value chunk over bytes shared with other chunks (Q4_K's
//! 32 quant bytes hold two chunks as low and high nibbles; Q6_K's low
//! nibbles are shared by two chunks and its high bits by four), which
//! several lanes would each load; their chunks are regrouped so that each
//! has bytes of its own. The values are the same, rearranged; rows are
//! padded to a multiple of 16 bytes.

use crate::{GgmlType, QuantWeight};

/// `w` in the repacked layout and its row stride, when repacking is
/// `enabled` (`CudaOptions::repack`; off keeps GGUF rows everywhere, to
/// compare the two layouts) and `w`'s type has a repacked layout.
pub(crate) fn repack_weight(w: &QuantWeight, enabled: bool) -> Option<(Vec<u8>, usize)> {
    if !enabled {
        return None;
    }
    let rb = w.row_bytes();
    repack(w.ty, w.rows, rb, w.data.as_bytes()).map(|bytes| (bytes, repacked_stride(rb)))
}

/// Whether `ty` has a repacked kernel.
pub(crate) fn has_repacked(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 | GgmlType::Q4_K | GgmlType::Q6_K)
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
                GgmlType::Q4_K => {
                    // d(2) dmin(2) scales(12) qs(128) -> per chunk j of the
                    // super-block 16 bytes (byte l = v[l] | v[l + 16] << 4,
                    // where v[l] = qs[32 (j / 2) + l] >> 4 (j % 2) & 15),
                    // all chunks of the row first; then the 16 header bytes.
                    for j in 0..8 {
                        let (qs, sh) = (&blk[16 + 32 * (j / 2)..16 + 32 * (j / 2) + 32], 4 * (j % 2));
                        let o = 16 * (8 * b + j);
                        for l in 0..16 {
                            dst[o + l] = ((qs[l] >> sh) & 15) | (((qs[l + 16] >> sh) & 15) << 4);
                        }
                    }
                    dst[128 * nb + 16 * b..128 * nb + 16 * b + 16].copy_from_slice(&blk[0..16]);
                }
                GgmlType::Q6_K => {
                    // ql(128) qh(64) scales(16) d(2) -> per chunk c = 8b + j
                    // (see TQ6_KR): low nibbles at 16c, high bits at
                    // 16 nc + 8c, the two scales at 24 nc + 2c; d at 26 nc + 2b.
                    let nc = 8 * nb;
                    for j in 0..8 {
                        let (h, sub) = (j / 4, j % 4);
                        // u[l]: value l of the chunk plus 32 (6 bits).
                        let u: [u8; 32] = std::array::from_fn(|l| {
                            let lo = (blk[64 * h + 32 * (sub % 2) + l] >> (4 * (sub / 2))) & 15;
                            let hi = (blk[128 + 32 * h + l] >> (2 * sub)) & 3;
                            lo | (hi << 4)
                        });
                        let c = 8 * b + j;
                        for l in 0..16 {
                            dst[16 * c + l] = (u[l] & 15) | ((u[l + 16] & 15) << 4);
                        }
                        for half in 0..2 {
                            for k in 0..4 {
                                dst[16 * nc + 8 * c + 4 * half + k] =
                                    (0..4).fold(0u8, |acc, i| acc | ((u[16 * half + 4 * i + k] >> 4) << (2 * i)));
                            }
                        }
                        dst[24 * nc + 2 * c..24 * nc + 2 * c + 2].copy_from_slice(&blk[192 + 2 * j..194 + 2 * j]);
                    }
                    dst[26 * nc + 2 * b..26 * nc + 2 * b + 2].copy_from_slice(&blk[208..210]);
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
        // The k-quants regroup bits, so their bytes are not a permutation;
        // see the test below.
        for ty in [GgmlType::Q4_0, GgmlType::Q5_0, GgmlType::Q8_0] {
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

    /// Value k of chunk c of a repacked row, decoded as `TQ4_KR` and
    /// `TQ6_KR` in quant.cuh do (nc chunks per row).
    fn repacked_value(ty: GgmlType, row: &[u8], nc: usize, c: usize, k: usize) -> f32 {
        let f16 = |b: &[u8]| half::f16::from_le_bytes([b[0], b[1]]).to_f32();
        let nib = |byte: u8| if k < 16 { byte & 15 } else { byte >> 4 };
        let q = nib(row[16 * c + k % 16]);
        match ty {
            GgmlType::Q4_K => {
                let h = &row[16 * nc + 16 * (c / 8)..16 * nc + 16 * (c / 8) + 16];
                let packed: &[u8; 12] = h[4..16].try_into().expect("12 scale bytes");
                let (sc, m) = crate::quant::k_common::get_scale_min_k4(c % 8, packed);
                f16(&h[0..2]) * sc as f32 * q as f32 - f16(&h[2..4]) * m as f32
            }
            GgmlType::Q6_K => {
                let (half, i, b) = (k / 16, (k % 16) / 4, k % 4);
                let hi = (row[16 * nc + 8 * c + 4 * half + b] >> (2 * i)) & 3;
                let sc = row[24 * nc + 2 * c + half] as i8;
                let d = f16(&row[26 * nc + 2 * (c / 8)..]);
                d * sc as f32 * ((q | (hi << 4)) as i32 - 32) as f32
            }
            _ => unreachable!("only the k-quant layouts are decoded here"),
        }
    }

    #[test]
    fn repacked_k_quants_decode_to_the_gguf_values() {
        use crate::quant::{dequantize_row, quantize_row};
        for ty in [GgmlType::Q4_K, GgmlType::Q6_K] {
            let (rows, cols) = (3, 3 * 256);
            let rb = ty.row_bytes(cols).unwrap();
            let mut data = vec![0u8; rows * rb];
            for r in 0..rows {
                let x: Vec<f32> = (0..cols).map(|i| ((i * 7919 + r * 104_729) % 1000) as f32 / 500.0 - 1.0).collect();
                quantize_row(ty, &x, &mut data[r * rb..(r + 1) * rb]).unwrap();
            }
            let out = repack(ty, rows, rb, &data).unwrap();
            let stride = repacked_stride(rb);
            let nc = cols / 32;
            for r in 0..rows {
                let mut want = vec![0f32; cols];
                dequantize_row(ty, &data[r * rb..(r + 1) * rb], &mut want).unwrap();
                let row = &out[r * stride..(r + 1) * stride];
                for (i, &w) in want.iter().enumerate() {
                    let got = repacked_value(ty, row, nc, i / 32, i % 32);
                    assert!((got - w).abs() <= 1e-6 * w.abs().max(1.0), "{ty} row {r} value {i}: {got} vs {w}");
                }
            }
        }
    }
}
