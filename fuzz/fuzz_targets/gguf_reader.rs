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
    // Whatever the reader accepts, the writer writes back, and reading that
    // gives the same header (files the writer refuses: over-long names,
    // an alignment key of another integer type).
    if let Ok(w) = GgufWriter::from_gguf(&file) {
        let again = GgufFile::from_bytes(w.to_bytes().expect("writing to memory")).expect("re-reading a rewrite");
        assert_eq!(again.metadata(), file.metadata());
        assert_eq!(again.tensors().len(), file.tensors().len());
    }
});
