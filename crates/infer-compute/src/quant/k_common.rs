//! Helpers shared by the k-quant reference quantizers (ggml `make_qx_quants`,
//! `make_qkx2_quants`, `make_q3_quants`, `get_scale_min_k4`, `nearest_int`).
