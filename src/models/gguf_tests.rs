//! gguf.rs's tests: metadata, the llama route's row order, and bad files.

use super::*;

#[test]
fn unpermute_inverts_llama_cpp_permute() {
    // LlamaModel.permute on rows r = h·p + c·p/2 + j (c ∈ {0,1}, j < p/2) stores them at
    // h·p + 2j + c; build that by hand for 2 heads, p = 6, and undo it.
    let (heads, p, cols) = (2usize, 6usize, 3usize);
    let hf: Vec<f32> = (0..heads * p * cols).map(|i| i as f32).collect();
    let mut gg = vec![0f32; hf.len()];
    for h in 0..heads {
        for c in 0..2 {
            for j in 0..p / 2 {
                let src = h * p + c * p / 2 + j;
                let dst = h * p + 2 * j + c;
                gg[dst * cols..(dst + 1) * cols].copy_from_slice(&hf[src * cols..(src + 1) * cols]);
            }
        }
    }
    let t = Tensor::from_vec(gg, (heads * p, cols), &Device::Cpu).unwrap();
    let back: Vec<f32> = unpermute(&t, heads)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap();
    assert_eq!(back, hf);
}

fn tiny() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/decoders/llama_gguf.gguf")
}

#[test]
fn truncated_gguf_is_an_error_naming_the_file_not_a_panic() {
    let bytes = std::fs::read(tiny()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    // The header cut short, then the tensor data cut short.
    for (name, len) in [("head.gguf", 1024), ("body.gguf", bytes.len() / 2)] {
        let path = dir.path().join(name);
        std::fs::write(&path, &bytes[..len]).unwrap();
        let e = load_gguf(&path, 1, &Device::Cpu).unwrap_err();
        assert!(e.downcast_ref::<crate::UsageError>().is_some(), "{e}");
        assert!(e.to_string().contains(name), "{e}");
    }
    let path = dir.path().join("text.gguf");
    std::fs::write(&path, b"not a gguf at all").unwrap();
    assert!(load_gguf(&path, 0, &Device::Cpu)
        .unwrap_err()
        .to_string()
        .contains("text.gguf"));
}

/// The tiny fixture with `patch(bytes, tensor data start, info)` applied to tensor `name`.
fn patched(
    dir: &Path,
    name: &str,
    patch: impl FnOnce(&mut Vec<u8>, usize, &candle_core::quantized::gguf_file::TensorInfo),
) -> std::path::PathBuf {
    let mut bytes = std::fs::read(tiny()).unwrap();
    let content = Content::read(&mut std::io::Cursor::new(&bytes)).expect("the fixture parses");
    let info = &content.tensor_infos[name];
    let start = (content.tensor_data_offset + info.offset) as usize;
    patch(&mut bytes, start, info);
    let path = dir.join(format!("{name}.gguf"));
    std::fs::write(&path, &bytes).unwrap();
    path
}

#[test]
fn a_dimension_no_file_can_hold_is_refused_not_wrapped() {
    let dir = tempfile::tempdir().unwrap();
    let name = "blk.0.attn_norm.weight";
    let path = patched(dir.path(), name, |bytes, _, info| {
        // The tensor table: name (u64 length + bytes), n_dims (u32), dims (u64 each).
        let key = name.as_bytes();
        let at = bytes
            .windows(key.len())
            .position(|w| w == key)
            .expect("the name is in the table");
        let dim0 = at + key.len() + 4;
        let old = u64::from_le_bytes(bytes[dim0..dim0 + 8].try_into().unwrap());
        assert_eq!(old as usize, info.shape.dims()[0]);
        bytes[dim0..dim0 + 8].copy_from_slice(&(1u64 << 63).to_le_bytes());
    });
    let e = load_gguf(&path, 0, &Device::Cpu).unwrap_err();
    assert!(e.downcast_ref::<crate::UsageError>().is_some(), "{e}");
    let m = e.to_string();
    assert!(m.contains(name) && m.contains("corrupt"), "{m}");
}

#[test]
fn a_non_finite_weight_is_named_as_a_corrupt_file() {
    use candle_core::quantized::GgmlDType;
    let dir = tempfile::tempdir().unwrap();
    let name = "blk.0.attn_q.weight";
    let path = patched(dir.path(), name, |bytes, start, info| {
        // The first value (F32, F16) or the first block's f16 scale d (every quantized type).
        let nan: &[u8] = match info.ggml_dtype {
            GgmlDType::F32 => &[0x00, 0x00, 0xC0, 0x7F],
            _ => &[0x00, 0x7E],
        };
        bytes[start..start + nan.len()].copy_from_slice(nan);
    });
    let e = load_gguf(&path, 0, &Device::Cpu).unwrap_err();
    assert!(e.downcast_ref::<crate::UsageError>().is_some(), "{e}");
    let m = e.to_string();
    assert!(
        m.contains(name) && m.contains("NaN at index [0,") && m.contains("corrupt"),
        "{m}"
    );
}

/// The fixture rewritten with `extra` metadata added (every tensor kept).
fn with_metadata(dir: &Path, extra: &[(&str, Value)]) -> std::path::PathBuf {
    let path = dir.join("extra.gguf");
    rewritten(&tiny(), &path, |_| true, extra);
    path
}

/// The GGUF file `src` written to `out` with only the metadata keys `keep` accepts, plus
/// `extra`, and every tensor as stored.
pub(crate) fn rewritten(
    src: &Path,
    out: &Path,
    keep: impl Fn(&str) -> bool,
    extra: &[(&str, Value)],
) {
    rewritten_as(src, out, keep, extra, |_, _| None)
}

/// The GGUF file `src` written to `out` with every tensor `retype` returns another form of
/// (name, stored tensor → Some(new)) in that form.
pub(crate) fn rewritten_with(
    src: &Path,
    out: &Path,
    retype: impl FnMut(
        &str,
        &candle_core::quantized::QTensor,
    ) -> Option<candle_core::quantized::QTensor>,
) {
    rewritten_as(src, out, |_| true, &[], retype)
}

fn rewritten_as(
    src: &Path,
    out: &Path,
    keep: impl Fn(&str) -> bool,
    extra: &[(&str, Value)],
    mut retype: impl FnMut(
        &str,
        &candle_core::quantized::QTensor,
    ) -> Option<candle_core::quantized::QTensor>,
) {
    let mut reader = std::io::BufReader::new(std::fs::File::open(src).unwrap());
    let content = Content::read(&mut reader).unwrap();
    let mut names: Vec<&String> = content.tensor_infos.keys().collect();
    names.sort();
    let tensors: Vec<(String, candle_core::quantized::QTensor)> = names
        .iter()
        .map(|n| {
            let q = content.tensor(&mut reader, n, &Device::Cpu).unwrap();
            (n.to_string(), retype(n, &q).unwrap_or(q))
        })
        .collect();
    let mut meta: Vec<(&str, &Value)> = content
        .metadata
        .iter()
        .filter(|(k, _)| keep(k))
        .map(|(k, v)| (k.as_str(), v))
        .collect();
    meta.sort_by_key(|(k, _)| *k);
    meta.extend(extra.iter().map(|(k, v)| (*k, v)));
    let mut f = std::fs::File::create(out).unwrap();
    let t: Vec<(&str, &candle_core::quantized::QTensor)> =
        tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
    candle_core::quantized::gguf_file::write(&mut f, &meta, &t).unwrap();
}

#[test]
fn f32_metadata_reads_back_as_the_config_decimal() {
    for x in [1e-5, 1e-6, 1.05, 10_000.0, 500_000.0, 0.1] {
        assert_eq!(f32_decimal(x as f32), x);
    }
    // A value with more digits than f32 holds comes back as the f32's own shortest decimal.
    assert_eq!(f32_decimal((0.1f64 / 3.0) as f32), 0.033333335);
}

#[test]
fn partial_rotary_is_refused_and_a_full_rotary_count_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let p = load_gguf(&tiny(), 0, &Device::Cpu).unwrap().0.head_dim;
    let full = with_metadata(
        dir.path(),
        &[("llama.rope.dimension_count", Value::U32(p as u32))],
    );
    assert!(load_gguf(&full, 0, &Device::Cpu).is_ok());
    let half = with_metadata(
        dir.path(),
        &[("llama.rope.dimension_count", Value::U32(p as u32 / 2))],
    );
    let e = load_gguf(&half, 0, &Device::Cpu).unwrap_err();
    assert!(e.downcast_ref::<crate::UsageError>().is_some(), "{e}");
    assert!(
        e.to_string()
            .contains("partial rotary embeddings are not supported"),
        "{e}"
    );
}

/// A truncated file's message is the same on every run (the first tensor cut off in file
/// order, not in hash-map order) and carries no backtrace, even under RUST_BACKTRACE=1.
#[test]
fn the_truncation_message_is_stable_and_free_of_backtraces() {
    let bytes = std::fs::read(tiny()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cut.gguf");
    std::fs::write(&path, &bytes[..bytes.len() * 2 / 3]).unwrap();
    let first = load_gguf(&path, 0, &Device::Cpu).unwrap_err().to_string();
    for _ in 0..5 {
        assert_eq!(
            load_gguf(&path, 0, &Device::Cpu).unwrap_err().to_string(),
            first
        );
    }
    // A header cut inside the metadata: candle's own error, whose backtrace (captured under
    // RUST_BACKTRACE) must not reach the message.
    let e = candle_core::Error::Msg("boom".into()).bt();
    let e = candle_core::Error::WithBacktrace {
        inner: Box::new(e),
        backtrace: Box::new(std::backtrace::Backtrace::force_capture()),
    };
    assert_eq!(crate::tensor_util::candle_message(&e), "boom");
}

#[test]
fn other_architectures_are_refused_by_name() {
    use candle_core::quantized::{gguf_file, QTensor};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gpt2.gguf");
    let t = QTensor::quantize(
        &Tensor::zeros((4, 32), DType::F32, &Device::Cpu).unwrap(),
        candle_core::quantized::GgmlDType::F32,
    )
    .unwrap();
    let mut f = std::fs::File::create(&path).unwrap();
    let arch = gguf_file::Value::String("gpt2".into());
    gguf_file::write(
        &mut f,
        &[("general.architecture", &arch)],
        &[("token_embd.weight", &t)],
    )
    .unwrap();
    drop(f);
    let m = load_gguf(&path, 0, &Device::Cpu).unwrap_err().to_string();
    // The Llama-style path names its own architectures; the families' are named where the
    // registry is read (inputs::decoder's an_unknown_gguf_architecture_names_every_supported_one).
    assert!(
        m.contains("\"gpt2\"") && m.contains("gpt2.gguf") && m.contains("llama, qwen2, qwen3"),
        "{m}"
    );
}

#[test]
fn non_finite_metadata_is_named_not_defaulted() {
    // Issue 57: a NaN or ∞ float in the metadata is refused by key, in the f32 and f64 forms.
    let dir = tempfile::tempdir().unwrap();
    for (key, v) in [
        ("llama.rope.freq_base", Value::F32(f32::NAN)),
        (
            "llama.attention.layer_norm_rms_epsilon",
            Value::F64(f64::INFINITY),
        ),
    ] {
        let path = with_metadata(dir.path(), &[(key, v)]);
        let e = load_gguf(&path, 0, &Device::Cpu).unwrap_err();
        assert!(e.downcast_ref::<crate::UsageError>().is_some(), "{e}");
        let m = e.to_string();
        assert!(m.contains(key) && m.contains("finite"), "{m}");
    }
}
