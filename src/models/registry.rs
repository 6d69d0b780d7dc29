//! The one list of the decoder families (issue 54): each family's `model_type`s, its GGUF
//! architectures and their readers, and its loader. The only file that names every §7.7 family;
//! a new family is its own file plus one entry here.

use anyhow::Result;
use candle_core::Device;
use serde_json::Value;

use super::decoder::Decoder;
use super::gguf::GgufFile;
use super::named_tensors::NamedTensors;
use super::weights::Depth;

/// Loads a family model from its parsed config.json and its weights: through layer L for a dump,
/// or whole for the end-to-end forward.
pub type Loader =
    fn(config: &Value, weights: &mut NamedTensors, depth: Depth) -> Result<Box<dyn Decoder>>;

/// One family: the `model_type` values it answers to, and its loader.
pub struct FamilyEntry {
    pub model_types: &'static [&'static str],
    pub load: Loader,
    /// The GGUF `general.architecture` values the family reads, each with its reader (none where
    /// the family has no GGUF route).
    pub gguf: &'static [(&'static str, GgufLoader)],
}

/// Reads a family's GGUF file as the config.json it describes and its tensors under Hugging Face
/// names, for [`Loader`].
pub type GgufLoader = fn(file: GgufFile, device: &Device) -> Result<(Value, NamedTensors)>;

/// The §7.7 families, one line each.
pub const FAMILIES: &[FamilyEntry] = &[
    FamilyEntry {
        model_types: &["gemma2", "gemma3_text", "gemma3"],
        load: super::gemma::load,
        gguf: &[
            ("gemma2", super::gemma_gguf::from_gguf),
            ("gemma3", super::gemma_gguf::from_gguf),
        ],
    },
    FamilyEntry {
        model_types: &["phi3"],
        load: super::phi3::load,
        gguf: &[("phi3", super::phi3::from_gguf)],
    },
    FamilyEntry {
        model_types: &["gpt_oss"],
        load: super::gpt_oss::load,
        gguf: &[("gpt-oss", super::gpt_oss_gguf::from_gguf)],
    },
    FamilyEntry {
        model_types: &["deepseek_v2", "deepseek_v3"],
        load: super::deepseek::load,
        gguf: &[("deepseek2", super::deepseek_gguf::from_gguf)],
    },
];

/// The family entry of a GGUF `general.architecture` and its reader, if a §7.7 family reads it.
pub fn gguf_family_entry(arch: &str) -> Option<(&'static FamilyEntry, GgufLoader)> {
    FAMILIES.iter().find_map(|f| {
        f.gguf
            .iter()
            .find(|(a, _)| *a == arch)
            .map(|&(_, read)| (f, read))
    })
}

/// The family entry of a `model_type`, if it is a §7.7 family.
pub fn family_entry(model_type: &str) -> Option<&'static FamilyEntry> {
    FAMILIES
        .iter()
        .find(|f| f.model_types.contains(&model_type))
}
