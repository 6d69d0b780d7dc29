//! The tensor table read here, on GGUF files written byte by byte: what candle reads is read as
//! candle reads it, MXFP4 tensors decode to their closed-form values, and bad tables are refused
//! naming the tensor.

use super::super::gguf::GgufFile;
use super::*;

/// A GGUF v3 file: `meta` as (key, type code, value bytes), then the tensors as (name, dims
/// innermost first, ggml type, data); offsets and the data's 32-byte alignment as the writers lay
/// them out.
pub(crate) fn gguf(
    meta: &[(&str, u32, Vec<u8>)],
    tensors: &[(&str, &[u64], u32, Vec<u8>)],
) -> Vec<u8> {
    let mut b: Vec<u8> = b"GGUF".to_vec();
    b.extend(3u32.to_le_bytes());
    b.extend((tensors.len() as u64).to_le_bytes());
    b.extend((meta.len() as u64).to_le_bytes());
    let string = |b: &mut Vec<u8>, s: &str| {
        b.extend((s.len() as u64).to_le_bytes());
        b.extend(s.as_bytes());
    };
    for (key, ty, value) in meta {
        string(&mut b, key);
        b.extend(ty.to_le_bytes());
        b.extend(value);
    }
    let mut offset = 0u64;
    let mut data = Vec::new();
    for (name, dims, ty, bytes) in tensors {
        string(&mut b, name);
        b.extend((dims.len() as u32).to_le_bytes());
        dims.iter().for_each(|d| b.extend(d.to_le_bytes()));
        b.extend(ty.to_le_bytes());
        b.extend(offset.to_le_bytes());
        data.extend(bytes);
        while !data.len().is_multiple_of(32) {
            data.push(0);
        }
        offset = data.len() as u64;
    }
    while !b.len().is_multiple_of(32) {
        b.push(0);
    }
    b.extend(data);
    b
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Two MXFP4 blocks, a row of [2, 32]: row 0 scale 2^−2 with value 0 = 1.0·¼ and value 16 =
/// 6.0·¼; row 1 scale 2^3 with value 15 = −1.5·8 and value 31 = −0.5·8.
fn mxfp4_rows() -> Vec<u8> {
    let mut b = vec![0u8; 34];
    b[0] = 125;
    b[1] = 0x72;
    b[17] = 130;
    b[33] = 0x9B;
    b
}

/// The metadata candle reads (a string, an array of strings, an f32 and a u32), then an MXFP4
/// tensor between two F32 ones.
fn sample_meta() -> Vec<(&'static str, u32, Vec<u8>)> {
    let mut names = 8u32.to_le_bytes().to_vec();
    names.extend(2u64.to_le_bytes());
    for s in ["<s>", "word"] {
        names.extend((s.len() as u64).to_le_bytes());
        names.extend(s.as_bytes());
    }
    let mut arch = (7u64).to_le_bytes().to_vec();
    arch.extend(b"gpt-oss");
    vec![
        ("general.architecture", 8, arch),
        ("tokenizer.ggml.tokens", 9, names),
        (
            "gpt-oss.rope.freq_base",
            6,
            150000f32.to_le_bytes().to_vec(),
        ),
        ("gpt-oss.block_count", 4, 1u32.to_le_bytes().to_vec()),
    ]
}

fn open(bytes: &[u8]) -> (tempfile::TempDir, Result<GgufFile>) {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("t.gguf");
    std::fs::write(&path, bytes).unwrap();
    let f = GgufFile::open(&path);
    (tmp, f)
}

fn values(f: &mut GgufFile, name: &str) -> (Vec<usize>, Vec<f32>) {
    let t = f.dequantized(name).unwrap();
    (
        t.dims().to_vec(),
        t.flatten_all().unwrap().to_vec1().unwrap(),
    )
}

#[test]
fn mxfp4_tensors_are_read_beside_candles_types() {
    let before: Vec<f32> = (0..3).map(|i| i as f32 - 0.5).collect();
    let after = [7.25f32, -1e-3];
    let bytes = gguf(
        &sample_meta(),
        &[
            ("a.weight", &[3], 0, f32_bytes(&before)),
            (
                "blk.0.ffn_up_exps.weight",
                &[32, 2],
                GGML_TYPE_MXFP4,
                mxfp4_rows(),
            ),
            ("b.weight", &[2, 1], 0, f32_bytes(&after)),
        ],
    );
    let (_tmp, f) = open(&bytes);
    let mut f = f.unwrap();
    assert_eq!(f.architecture().unwrap(), "gpt-oss");
    assert_eq!(f.meta_usize("gpt-oss.block_count").unwrap(), Some(1));
    assert_eq!(
        f.meta_f64("gpt-oss.rope.freq_base").unwrap(),
        Some(150000.0)
    );
    assert_eq!(values(&mut f, "a.weight"), (vec![3], before));
    assert_eq!(values(&mut f, "b.weight"), (vec![1, 2], after.to_vec()));
    let name = "blk.0.ffn_up_exps.weight";
    assert!(f.has_tensor(name));
    assert_eq!(f.tensor_dims(name), Some(vec![2, 32]));
    let (dims, v) = values(&mut f, name);
    assert_eq!(dims, vec![2, 32]);
    let mut want = vec![0f32; 64];
    (want[0], want[16], want[32 + 15], want[63]) = (0.25, 1.5, -12.0, -4.0);
    assert_eq!(v, want);
}

/// The table as candle read it before (a GGUF without MXFP4): the same metadata, tensor infos
/// and data offset, on the project's fixture and, where `../shared/data` is there (`.ci/run`),
/// on SmolLM2's Q4_1 GGUF (a 49k-token vocabulary in its metadata, quantized tensors).
#[test]
fn a_file_without_mxfp4_reads_as_candle_reads_it() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let shared =
        root.join("../shared/data/SmolLM2-135M-Instruct-Q4_1/SmolLM2-135M-Instruct.Q4_1.gguf");
    let fixture = root.join("fixtures/families/gpt_oss/model.gguf");
    for path in [fixture, shared].into_iter().filter(|p| p.is_file()) {
        same_header_as_candle(&path);
    }
}

fn same_header_as_candle(path: &std::path::Path) {
    let mut r = std::io::BufReader::new(std::fs::File::open(path).unwrap());
    let ours = read_header(&mut r).unwrap();
    r.seek(SeekFrom::Start(0)).unwrap();
    let theirs = Content::read(&mut r).unwrap();
    assert!(ours.mxfp4.is_empty());
    assert_eq!(ours.content.tensor_data_offset, theirs.tensor_data_offset);
    assert_eq!(ours.content.tensor_infos.len(), theirs.tensor_infos.len());
    for (name, t) in &theirs.tensor_infos {
        let o = &ours.content.tensor_infos[name];
        assert_eq!(
            (o.ggml_dtype, o.shape.dims(), o.offset),
            (t.ggml_dtype, t.shape.dims(), t.offset),
            "{name}"
        );
    }
    let keys = |c: &Content| {
        let mut k: Vec<(String, String)> = c
            .metadata
            .iter()
            .map(|(k, v)| (k.clone(), format!("{v:?}")))
            .collect();
        k.sort();
        k
    };
    assert_eq!(keys(&ours.content), keys(&theirs));
}

#[test]
fn bad_tables_are_refused_naming_the_tensor() {
    let meta = sample_meta();
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (
            gguf(&meta, &[("x.weight", &[32], 40, vec![0; 32])]),
            "tensor 'x.weight' has ggml type 40",
        ),
        (
            gguf(
                &meta,
                &[("x.weight", &[16, 2], GGML_TYPE_MXFP4, vec![0; 34])],
            ),
            "tensor x.weight declares dimensions [2, 16] of MXFP4",
        ),
        (
            gguf(
                &meta,
                &[("x.weight", &[32, 4], GGML_TYPE_MXFP4, mxfp4_rows())],
            ),
            "truncated: tensor x.weight",
        ),
        (
            gguf(&meta, &[("x.weight", &[1, 1, 1, 1, 1], 0, vec![0; 4])]),
            "tensor 'x.weight' has 5 dimensions",
        ),
    ];
    for (bytes, want) in cases {
        let (_tmp, f) = open(&bytes);
        let e = f.err().expect("refused");
        let m = format!("{e:#}");
        assert!(e.downcast_ref::<crate::UsageError>().is_some(), "{m}");
        assert!(m.contains(want), "want '{want}' in: {m}");
    }
    // A NaN scale (E8M0 255) is refused when the tensor is read, naming it.
    let mut rows = mxfp4_rows();
    rows[17] = 255;
    let bytes = gguf(&meta, &[("x.weight", &[32, 2], GGML_TYPE_MXFP4, rows)]);
    let (_tmp, f) = open(&bytes);
    let m = format!("{:#}", f.unwrap().dequantized("x.weight").unwrap_err());
    assert!(
        m.contains("tensor 'x.weight' (MXFP4): scale 1 is E8M0 code 255"),
        "{m}"
    );
}
