//! A GGUF file's header: its metadata, read by candle-core's parser, and its tensor table, read
//! here, because candle 0.11 refuses the whole file at the first tensor type it does not know and
//! the hub's gpt-oss GGUFs store their experts as MXFP4 (ggml type 39). Such tensors are listed
//! apart ([`Header::mxfp4`]) and decoded by [`crate::numerics::formats::mxfp4_decode_ggml`];
//! every other tensor goes to candle's `TensorInfo` as before.
//!
//! candle parses the metadata of a view of the file that shows a tensor count of 0
//! ([`NoTensors`]), so its checks on strings, arrays and nesting stay in force; the table that
//! follows the metadata is GGUF's plain layout (docs/reference.md §7.1 "Formats").

use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom};

use anyhow::{anyhow, Result};
use candle_core::quantized::gguf_file::{Content, TensorInfo, Value};
use candle_core::quantized::GgmlDType;

/// ggml's type code of MXFP4 (`GGML_TYPE_MXFP4`).
pub const GGML_TYPE_MXFP4: u32 = 39;

/// Bytes of one ggml MXFP4 block of 32 values: an E8M0 scale and 16 bytes of nibbles.
pub const MXFP4_BLOCK_BYTES: usize = 17;

/// ggml's limit on a tensor's rank (`GGML_MAX_DIMS`), as candle checks it.
const MAX_DIMS: u32 = 4;

/// An MXFP4 tensor of the table: its dimensions (Hugging Face order, outermost first) and its
/// offset from the start of the tensor data.
#[derive(Debug, Clone, PartialEq)]
pub struct Mxfp4Tensor {
    pub dims: Vec<usize>,
    pub offset: u64,
}

impl Mxfp4Tensor {
    /// The tensor's size in the file, or None when its dimensions overflow or its rows are not
    /// whole blocks (ggml blocks the innermost dimension).
    pub fn bytes(&self) -> Option<u64> {
        let inner = *self.dims.last()? as u64;
        if !inner.is_multiple_of(32) {
            return None;
        }
        let elems = self
            .dims
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d as u64))?;
        (elems / 32).checked_mul(MXFP4_BLOCK_BYTES as u64)
    }
}

/// The header: candle's `Content` (metadata, and every tensor of a type candle reads) and the
/// MXFP4 tensors by name.
pub struct Header {
    pub content: Content,
    pub mxfp4: HashMap<String, Mxfp4Tensor>,
}

/// Reads the header from the start of `reader`. Errors are plain messages; the caller names the
/// file.
pub fn read_header<R: Read + Seek>(reader: &mut R) -> Result<Header> {
    reader.seek(SeekFrom::Start(0))?;
    let mut head = [0u8; 8];
    reader
        .read_exact(&mut head)
        .map_err(|_| anyhow!("shorter than a GGUF header"))?;
    let version = u32::from_le_bytes(head[4..8].try_into().expect("4 bytes"));
    // GGUF v1 counts in u32, v2 and v3 in u64; candle checks the magic and the version itself.
    let count_bytes = if version == 1 { 4 } else { 8 };
    let tensor_count = read_uint(reader, count_bytes)?;
    reader.seek(SeekFrom::Start(0))?;
    let mut view = NoTensors {
        inner: &mut *reader,
        position: 0,
        count_at: 8..8 + count_bytes as u64,
    };
    let mut content = Content::read(&mut view)
        .map_err(|e| anyhow!("{}", crate::tensor_util::candle_message(&e)))?;
    // candle stops right after the metadata, where the table starts.
    let mut position = view.position;
    let file_size = reader.seek(SeekFrom::End(0))?;
    reader.seek(SeekFrom::Start(position))?;
    let mut mxfp4 = HashMap::new();
    for _ in 0..tensor_count {
        let entry = read_entry(reader, count_bytes, file_size)?;
        position = reader.stream_position()?;
        if entry.ggml_type == GGML_TYPE_MXFP4 {
            let t = Mxfp4Tensor {
                dims: entry.dims,
                offset: entry.offset,
            };
            mxfp4.insert(entry.name, t);
            continue;
        }
        let ggml_dtype = ggml_dtype(entry.ggml_type).ok_or_else(|| {
            anyhow!(
                "tensor '{}' has ggml type {}, which is not read (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, the K-quants and MXFP4 are)",
                entry.name,
                entry.ggml_type
            )
        })?;
        let info = TensorInfo {
            ggml_dtype,
            shape: entry.dims.into(),
            offset: entry.offset,
        };
        content.tensor_infos.insert(entry.name, info);
    }
    // GGUF writes the alignment as a u32; candle took any non-negative integer, and so does this.
    let alignment = match content.metadata.get("general.alignment") {
        None => candle_core::quantized::gguf_file::DEFAULT_ALIGNMENT,
        Some(v) => match v {
            Value::U8(a) => u64::from(*a),
            Value::U16(a) => u64::from(*a),
            Value::U32(a) => u64::from(*a),
            Value::U64(a) => *a,
            Value::I8(a) => u64::try_from(*a).unwrap_or(0),
            Value::I16(a) => u64::try_from(*a).unwrap_or(0),
            Value::I32(a) => u64::try_from(*a).unwrap_or(0),
            Value::I64(a) => u64::try_from(*a).unwrap_or(0),
            _ => 0,
        },
    };
    if alignment == 0 {
        return Err(anyhow!(
            "metadata general.alignment is {:?}, not a positive integer",
            content.metadata.get("general.alignment")
        ));
    }
    content.tensor_data_offset = position.div_ceil(alignment) * alignment;
    Ok(Header { content, mxfp4 })
}

/// One entry of the tensor table.
struct Entry {
    name: String,
    dims: Vec<usize>,
    ggml_type: u32,
    offset: u64,
}

fn read_entry<R: Read + Seek>(reader: &mut R, count_bytes: usize, file_size: u64) -> Result<Entry> {
    let name_len = read_uint(reader, count_bytes)?;
    let here = reader.stream_position()?;
    if name_len > file_size.saturating_sub(here) {
        return Err(anyhow!(
            "a tensor name of {name_len} bytes runs past the end of the file"
        ));
    }
    let mut name = vec![0u8; name_len as usize];
    reader.read_exact(&mut name)?;
    let name = String::from_utf8(name).map_err(|_| anyhow!("a tensor name is not UTF-8"))?;
    let rank = read_uint(reader, 4)? as u32;
    if rank > MAX_DIMS {
        return Err(anyhow!(
            "tensor '{name}' has {rank} dimensions; GGUF allows at most {MAX_DIMS}"
        ));
    }
    let mut dims = (0..rank)
        .map(|_| read_uint(reader, count_bytes).map(|d| d as usize))
        .collect::<Result<Vec<_>>>()?;
    // The table lists the innermost dimension first.
    dims.reverse();
    let ggml_type = read_uint(reader, 4)? as u32;
    let offset = read_uint(reader, 8)?;
    Ok(Entry {
        name,
        dims,
        ggml_type,
        offset,
    })
}

/// A little-endian unsigned integer of `bytes` bytes (4 or 8).
fn read_uint<R: Read>(reader: &mut R, bytes: usize) -> Result<u64> {
    let mut b = [0u8; 8];
    reader
        .read_exact(&mut b[..bytes])
        .map_err(|_| anyhow!("the header ends early: the file is truncated"))?;
    Ok(u64::from_le_bytes(b))
}

/// The ggml types candle reads, by code (ggml.h's `ggml_type`).
fn ggml_dtype(code: u32) -> Option<GgmlDType> {
    Some(match code {
        0 => GgmlDType::F32,
        1 => GgmlDType::F16,
        2 => GgmlDType::Q4_0,
        3 => GgmlDType::Q4_1,
        6 => GgmlDType::Q5_0,
        7 => GgmlDType::Q5_1,
        8 => GgmlDType::Q8_0,
        9 => GgmlDType::Q8_1,
        10 => GgmlDType::Q2K,
        11 => GgmlDType::Q3K,
        12 => GgmlDType::Q4K,
        13 => GgmlDType::Q5K,
        14 => GgmlDType::Q6K,
        15 => GgmlDType::Q8K,
        30 => GgmlDType::BF16,
        _ => return None,
    })
}

/// The file as candle should see it: the header's tensor count (the bytes `count_at`) reads 0,
/// so that candle parses the metadata and stops before the table. It keeps its own position:
/// candle asks for it often, and a `BufReader` asked through `seek` would drop its buffer.
struct NoTensors<'a, R> {
    inner: &'a mut R,
    position: u64,
    count_at: std::ops::Range<u64>,
}

impl<R: Read> Read for NoTensors<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        let start = self.position;
        if start < self.count_at.end {
            for (i, b) in buf[..n].iter_mut().enumerate() {
                if self.count_at.contains(&(start + i as u64)) {
                    *b = 0;
                }
            }
        }
        self.position += n as u64;
        Ok(n)
    }
}

impl<R: Seek> Seek for NoTensors<'_, R> {
    fn seek(&mut self, pos: SeekFrom) -> std::io::Result<u64> {
        self.position = self.inner.seek(pos)?;
        Ok(self.position)
    }

    fn stream_position(&mut self) -> std::io::Result<u64> {
        Ok(self.position)
    }
}

#[cfg(test)]
#[path = "gguf_table_tests.rs"]
pub(crate) mod tests;
