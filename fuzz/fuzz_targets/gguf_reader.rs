//! The GGUF reader on arbitrary bytes: parsing never panics, hangs or
//! allocates beyond the input's size; an accepted file hands out every
//! tensor, prints every value, and survives a rewrite unchanged.

#![no_main]

use infer_model::gguf::{GgufFile, GgufWriter};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(file) = GgufFile::from_bytes(data.to_vec()) else {
        return;
    };
    for (key, value) in file.metadata() {
        let _ = format!("{key} = {value} ({})", value.type_description());
        let _ = file.get_str_array(key);
        let _ = file.get_i32_array(key);
        let _ = file.get_f32_array(key);
        let _ = file.get_u32(key);
    }
    for t in file.tensors() {
        let bytes = file.tensor_data(t);
        assert_eq!(bytes.len(), t.n_bytes, "tensor `{}`", t.name);
        if let Ok(w) = file.tensor_weight(t) {
            assert_eq!(w.data.as_bytes(), bytes);
        }
    }
    // Whatever the reader accepts, the writer writes back, reading that
    // gives the same header, and rewriting it gives the same bytes (files
    // the writer refuses: over-long names, an alignment key of another
    // integer type). Bytes, not values, are compared: a NaN is not equal to
    // itself.
    if let Ok(w) = GgufWriter::from_gguf(&file) {
        let bytes = w.to_bytes().expect("writing to memory");
        let again = GgufFile::from_bytes(bytes.clone()).expect("re-reading a rewrite");
        assert_eq!(again.metadata().len(), file.metadata().len());
        // Offsets may change: the writer packs tensors without the gaps a
        // file may have.
        assert_eq!(again.tensors().len(), file.tensors().len());
        for (a, b) in again.tensors().iter().zip(file.tensors()) {
            assert_eq!((&a.name, &a.dims, a.ty, a.n_bytes), (&b.name, &b.dims, b.ty, b.n_bytes));
            assert!(again.tensor_data(a) == file.tensor_data(b), "tensor `{}` changed in a rewrite", a.name);
        }
        let twice = GgufWriter::from_gguf(&again).expect("rewriting a rewrite").to_bytes().expect("in memory");
        assert!(twice == bytes, "a rewrite of a rewrite differs");
    }
});
