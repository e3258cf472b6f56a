//! The architecture registry: one entry per supported
//! `general.architecture` value, read by loading ([`super::load_spec`]),
//! chat templates ([`crate::chat::ChatTemplate::from_gguf`]) and `infer synth`
//! ([`crate::synth`]). Adding an architecture is one file in `model/`, one
//! [`Arch`] variant and one [`ArchInfo`] here, and its shapes in
//! `synth/shapes.rs`.
//!
//! GGUF names follow llama.cpp's `llm_arch_from_string` (`src/llama-arch.cpp`).
//! Mistral 7B and Mistral Nemo have no entry of their own: llama.cpp's
//! converter writes them as `llama`, and llama.cpp's `llama` graph applies no
//! sliding window (Mistral 7B v0.1's 4096-token window only matters past 4096
//! tokens; later versions have none), so they load as [`Arch::Llama`] and run
//! as llama.cpp runs them. `mistral3` (YaRN, attention temperature) is not
//! supported.

use infer_compute::pipeline::ModelSpec;

use crate::gguf::GgufFile;
use crate::Result;

/// A supported architecture.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Arch {
    /// Gemma 3 (`gemma3`).
    Gemma3,
    /// Gemma 2 (`gemma2`).
    Gemma2,
    /// Llama 2/3, SmolLM, Mistral (`llama`).
    Llama,
    /// Qwen 2 / 2.5 (`qwen2`).
    Qwen2,
    /// Qwen 3, dense (`qwen3`).
    Qwen3,
    /// Phi-3 / Phi-3.5 / Phi-4 mini (`phi3`).
    Phi3,
}

/// The default chat template family of an architecture: what
/// [`crate::chat::ChatTemplate::from_gguf`] renders when a GGUF carries no
/// `tokenizer.chat_template`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChatFormat {
    /// Gemma's turns (`<start_of_turn>user … <end_of_turn>`, the model's
    /// role called `model`).
    Gemma,
    /// ChatML (`<|im_start|>role … <|im_end|>`): Qwen's own format, and the
    /// default of the others (real Llama 3 and Phi-3 GGUFs carry their
    /// template).
    ChatMl,
}

/// What the crate knows about one architecture.
#[derive(Clone, Copy, Debug)]
pub struct ArchInfo {
    /// The `general.architecture` value.
    pub name: &'static str,
    /// Builds the pipeline description (hyper-parameters validated, tensors
    /// checked against them).
    pub load: fn(&GgufFile) -> Result<ModelSpec>,
    /// Its default chat template family.
    pub chat: ChatFormat,
    /// The sizes `infer synth` writes (`synth::SynthShape::preset`).
    pub synth_sizes: &'static [&'static str],
}

impl Arch {
    /// Every supported architecture.
    pub const ALL: [Arch; 6] = [Arch::Gemma3, Arch::Gemma2, Arch::Llama, Arch::Qwen2, Arch::Qwen3, Arch::Phi3];

    /// The registry entry.
    pub fn info(self) -> &'static ArchInfo {
        static GEMMA3: ArchInfo = ArchInfo {
            name: "gemma3",
            load: super::gemma3::load,
            chat: ChatFormat::Gemma,
            synth_sizes: &["270m", "1b", "4b", "12b", "tiny"],
        };
        static GEMMA2: ArchInfo = ArchInfo {
            name: "gemma2",
            load: super::gemma2::load,
            chat: ChatFormat::Gemma,
            synth_sizes: &["2b", "tiny"],
        };
        static LLAMA: ArchInfo = ArchInfo {
            name: "llama",
            load: super::llama::load,
            chat: ChatFormat::ChatMl,
            synth_sizes: &["1b", "8b", "mistral-7b", "tiny"],
        };
        static QWEN2: ArchInfo = ArchInfo {
            name: "qwen2",
            load: super::qwen2::load,
            chat: ChatFormat::ChatMl,
            synth_sizes: &["0.5b", "tiny"],
        };
        static QWEN3: ArchInfo = ArchInfo {
            name: "qwen3",
            load: super::qwen3::load,
            chat: ChatFormat::ChatMl,
            synth_sizes: &["0.6b", "tiny"],
        };
        static PHI3: ArchInfo = ArchInfo {
            name: "phi3",
            load: super::phi3::load,
            chat: ChatFormat::ChatMl,
            synth_sizes: &["mini", "tiny"],
        };
        match self {
            Arch::Gemma3 => &GEMMA3,
            Arch::Gemma2 => &GEMMA2,
            Arch::Llama => &LLAMA,
            Arch::Qwen2 => &QWEN2,
            Arch::Qwen3 => &QWEN3,
            Arch::Phi3 => &PHI3,
        }
    }

    /// The GGUF architecture name (`"gemma3"`).
    pub fn name(self) -> &'static str {
        self.info().name
    }

    /// The architecture of a `general.architecture` value (exact, as
    /// llama.cpp matches it).
    pub fn from_gguf_name(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|a| a.name() == s)
    }

    /// Parses a name given by a user (case-insensitive).
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|a| a.name().eq_ignore_ascii_case(s))
    }

    /// The preset sizes `infer synth` knows for this architecture.
    pub fn sizes(self) -> &'static [&'static str] {
        self.info().synth_sizes
    }

    /// The names of every supported architecture.
    pub fn names() -> Vec<&'static str> {
        Self::ALL.iter().map(|a| a.name()).collect()
    }
}

impl std::fmt::Display for Arch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
