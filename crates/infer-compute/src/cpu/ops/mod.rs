//! Elementwise and attention ops of the decode pipeline, on f32 slices.
