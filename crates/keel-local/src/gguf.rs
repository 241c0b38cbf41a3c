//! A bounded first read of a GGUF file's header, before llama.cpp sees it.
//!
//! `local:/path/file.gguf` may come from an agent file someone else wrote, and llama.cpp
//! and llama-cpp-2 trust the metadata further than such a file deserves: a
//! `context_length` of 2^31 or more makes `LlamaModel::n_ctx_train` panic, a string or
//! array length near 2^64 asks for that much memory. This reader walks the header (the
//! metadata and the tensor table, never the weights) with every length checked against a
//! limit before anything is allocated, and refuses a file whose figures are out of range
//! with a message naming the field. Hand-written: the GGUF crates on crates.io read the
//! whole header into memory as the file states it, which is what must not happen here.

use std::fs::File;
use std::io::{BufReader, Read};
use std::path::Path;

/// Metadata entries a header may hold.
const MAX_METADATA: u64 = 1 << 20;
/// Tensors a file may hold (the largest published models have a few thousand).
const MAX_TENSORS: u64 = 1 << 20;
/// Bytes of a metadata key.
const MAX_KEY_BYTES: u64 = 1 << 16;
/// Bytes of one string value (chat templates are tens of kilobytes).
const MAX_STRING_BYTES: u64 = 16 << 20;
/// Elements of one array value (the vocabulary is the longest).
const MAX_ARRAY_ITEMS: u64 = 1 << 24;
/// Training context a model may declare (16,777,216 tokens).
pub const MAX_CONTEXT_LENGTH: u64 = 1 << 24;
/// Tokens a vocabulary may have (the largest in use have about 262,000).
pub const MAX_VOCABULARY: u64 = 1 << 21;
/// Layers a model may declare.
const MAX_BLOCKS: u64 = 1 << 12;
/// Width of the embedding a model may declare.
const MAX_EMBEDDING: u64 = 1 << 20;
/// Dimensions of a tensor (ggml's own limit).
const MAX_DIMS: u32 = 4;

/// What was read, for the checks and their messages.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Header {
    /// GGUF version (2 or 3).
    pub version: u32,
    /// Tensors in the file.
    pub tensors: u64,
    /// `general.architecture`.
    pub architecture: Option<String>,
    /// `<architecture>.context_length`.
    pub context_length: Option<u64>,
    /// Length of `tokenizer.ggml.tokens`.
    pub vocabulary: Option<u64>,
    /// `<architecture>.block_count`.
    pub blocks: Option<u64>,
    /// `<architecture>.embedding_length`.
    pub embedding: Option<u64>,
}

/// Reads a file's header and checks its figures; the error says what is out of range.
pub fn check_file(path: &Path) -> Result<Header, String> {
    let file = File::open(path).map_err(|e| format!("cannot read it ({e})"))?;
    let header = read_header(&mut BufReader::new(file))?;
    check(&header)?;
    Ok(header)
}

/// Checks the figures of a header that was read.
pub fn check(header: &Header) -> Result<(), String> {
    let bound = |what: &str, value: Option<u64>, min: u64, max: u64| match value {
        Some(v) if v < min || v > max => Err(format!(
            "its metadata declares {what} = {v}, outside what Keel accepts ({min} to {max}); \
             the file is corrupt or was crafted to crash the loader"
        )),
        _ => Ok(()),
    };
    bound(
        "the training context length",
        header.context_length,
        1,
        MAX_CONTEXT_LENGTH,
    )?;
    bound(
        "the vocabulary size (tokenizer.ggml.tokens)",
        header.vocabulary,
        1,
        MAX_VOCABULARY,
    )?;
    bound("the block count", header.blocks, 1, MAX_BLOCKS)?;
    bound("the embedding length", header.embedding, 1, MAX_EMBEDDING)?;
    if header.architecture.is_none() {
        return Err("its metadata has no general.architecture".to_string());
    }
    Ok(())
}

/// GGUF value types.
mod kind {
    pub const U8: u32 = 0;
    pub const I8: u32 = 1;
    pub const U16: u32 = 2;
    pub const I16: u32 = 3;
    pub const U32: u32 = 4;
    pub const I32: u32 = 5;
    pub const F32: u32 = 6;
    pub const BOOL: u32 = 7;
    pub const STRING: u32 = 8;
    pub const ARRAY: u32 = 9;
    pub const U64: u32 = 10;
    pub const I64: u32 = 11;
    pub const F64: u32 = 12;
}

fn read_exact<const N: usize>(r: &mut impl Read, what: &str) -> Result<[u8; N], String> {
    let mut buf = [0u8; N];
    r.read_exact(&mut buf)
        .map_err(|e| format!("its header ends early or cannot be read ({what}: {e})"))?;
    Ok(buf)
}

fn u32_of(r: &mut impl Read, what: &str) -> Result<u32, String> {
    read_exact::<4>(r, what).map(u32::from_le_bytes)
}

fn u64_of(r: &mut impl Read, what: &str) -> Result<u64, String> {
    read_exact::<8>(r, what).map(u64::from_le_bytes)
}

/// Reads `len` bytes, `len` already bounded by the caller.
fn bytes_of(r: &mut impl Read, len: u64, what: &str) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    let read = r
        .take(len)
        .read_to_end(&mut out)
        .map_err(|e| format!("cannot read {what} ({e})"))?;
    if read as u64 != len {
        return Err(format!("its header ends inside {what}"));
    }
    Ok(out)
}

/// Skips `len` bytes without keeping them.
fn skip(r: &mut impl Read, len: u64, what: &str) -> Result<(), String> {
    let skipped = std::io::copy(&mut r.take(len), &mut std::io::sink())
        .map_err(|e| format!("cannot read {what} ({e})"))?;
    if skipped != len {
        return Err(format!("its header ends inside {what}"));
    }
    Ok(())
}

fn string_of(r: &mut impl Read, max: u64, what: &str) -> Result<String, String> {
    let len = u64_of(r, what)?;
    if len > max {
        return Err(format!(
            "{what} is {len} bytes long, more than the {max} Keel accepts"
        ));
    }
    let bytes = bytes_of(r, len, what)?;
    String::from_utf8(bytes).map_err(|_| format!("{what} is not UTF-8"))
}

/// A scalar's size in bytes, `None` for strings and arrays.
fn scalar_size(kind: u32) -> Option<u64> {
    match kind {
        kind::U8 | kind::I8 | kind::BOOL => Some(1),
        kind::U16 | kind::I16 => Some(2),
        kind::U32 | kind::I32 | kind::F32 => Some(4),
        kind::U64 | kind::I64 | kind::F64 => Some(8),
        _ => None,
    }
}

/// A value as far as the checks need it.
enum Value {
    Integer(u64),
    Text(String),
    Array(u64),
    Other,
}

fn value_of(r: &mut impl Read, kind: u32, key: &str, nested: bool) -> Result<Value, String> {
    Ok(match kind {
        kind::U8 => Value::Integer(u64::from(
            read_exact::<1>(r, key)?.first().copied().unwrap_or(0),
        )),
        kind::U16 => Value::Integer(u64::from(u16::from_le_bytes(read_exact::<2>(r, key)?))),
        kind::U32 => Value::Integer(u64::from(u32_of(r, key)?)),
        kind::I32 => {
            let v = i32::from_le_bytes(read_exact::<4>(r, key)?);
            // A negative count is out of range whatever the field: saturate to the top.
            Value::Integer(u64::try_from(v).unwrap_or(u64::MAX))
        }
        kind::U64 => Value::Integer(u64_of(r, key)?),
        kind::I64 => {
            let v = i64::from_le_bytes(read_exact::<8>(r, key)?);
            Value::Integer(u64::try_from(v).unwrap_or(u64::MAX))
        }
        kind::STRING => Value::Text(string_of(
            r,
            MAX_STRING_BYTES,
            &format!("the value of {key}"),
        )?),
        kind::ARRAY => {
            if nested {
                return Err(format!(
                    "{key} is an array of arrays, which Keel does not accept"
                ));
            }
            let item = u32_of(r, key)?;
            let len = u64_of(r, key)?;
            if len > MAX_ARRAY_ITEMS {
                return Err(format!(
                    "{key} has {len} items, more than the {MAX_ARRAY_ITEMS} Keel accepts"
                ));
            }
            match (item, scalar_size(item)) {
                (_, Some(size)) => skip(r, len.saturating_mul(size), key)?,
                (kind::STRING, None) => {
                    for _ in 0..len {
                        let n = u64_of(r, key)?;
                        if n > MAX_STRING_BYTES {
                            return Err(format!(
                                "an item of {key} is {n} bytes long, more than Keel accepts"
                            ));
                        }
                        skip(r, n, key)?;
                    }
                }
                (kind::ARRAY, None) => {
                    for _ in 0..len {
                        value_of(r, kind::ARRAY, key, true)?;
                    }
                }
                (other, None) => return Err(format!("{key} holds items of unknown type {other}")),
            }
            Value::Array(len)
        }
        other => match scalar_size(other) {
            Some(size) => {
                skip(r, size, key)?;
                Value::Other
            }
            None => return Err(format!("{key} has unknown type {other}")),
        },
    })
}

/// Reads the header: magic, version, counts, metadata and the tensor table.
pub fn read_header(r: &mut impl Read) -> Result<Header, String> {
    if &read_exact::<4>(r, "magic")? != b"GGUF" {
        return Err("it is not a GGUF file (no GGUF magic bytes)".to_string());
    }
    let mut header = Header {
        version: u32_of(r, "version")?,
        ..Header::default()
    };
    if !(2..=3).contains(&header.version) {
        return Err(format!(
            "it is GGUF version {}; llama.cpp reads versions 2 and 3",
            header.version
        ));
    }
    header.tensors = u64_of(r, "tensor count")?;
    let metadata = u64_of(r, "metadata count")?;
    if header.tensors > MAX_TENSORS {
        return Err(format!(
            "it declares {} tensors, more than the {MAX_TENSORS} Keel accepts",
            header.tensors
        ));
    }
    if metadata > MAX_METADATA {
        return Err(format!(
            "it declares {metadata} metadata entries, more than the {MAX_METADATA} Keel accepts"
        ));
    }
    let mut integers: Vec<(String, u64)> = Vec::new();
    for _ in 0..metadata {
        let key = string_of(r, MAX_KEY_BYTES, "a metadata key")?;
        let kind = u32_of(r, &key)?;
        match value_of(r, kind, &key, false)? {
            Value::Text(text) if key == "general.architecture" => header.architecture = Some(text),
            Value::Array(len) if key == "tokenizer.ggml.tokens" => header.vocabulary = Some(len),
            Value::Integer(v) => integers.push((key, v)),
            _ => {}
        }
    }
    if let Some(arch) = header.architecture.as_deref() {
        let field = |name: &str| {
            let key = format!("{arch}.{name}");
            integers.iter().find(|(k, _)| *k == key).map(|(_, v)| *v)
        };
        header.context_length = field("context_length");
        header.blocks = field("block_count");
        header.embedding = field("embedding_length");
    }
    for _ in 0..header.tensors {
        let name = string_of(r, MAX_KEY_BYTES, "a tensor name")?;
        let dims = u32_of(r, &name)?;
        if dims == 0 || dims > MAX_DIMS {
            return Err(format!(
                "tensor {name} has {dims} dimensions; ggml tensors have 1 to {MAX_DIMS}"
            ));
        }
        let mut elements: u64 = 1;
        for _ in 0..dims {
            let dim = u64_of(r, &name)?;
            elements = elements
                .checked_mul(dim)
                .filter(|&n| n <= i64::MAX as u64)
                .ok_or_else(|| format!("tensor {name} has more elements than fit in 63 bits"))?;
        }
        skip(r, 4 + 8, &name)?; // type and offset: llama.cpp checks them against the file
    }
    Ok(header)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal GGUF header with the given integer metadata and one tensor.
    pub(crate) fn header_bytes(arch: &str, context_length: u64, tokens: u64) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(b"GGUF");
        out.extend_from_slice(&3u32.to_le_bytes());
        out.extend_from_slice(&1u64.to_le_bytes()); // tensors
        out.extend_from_slice(&3u64.to_le_bytes()); // metadata
        let string = |out: &mut Vec<u8>, s: &str| {
            out.extend_from_slice(&(s.len() as u64).to_le_bytes());
            out.extend_from_slice(s.as_bytes());
        };
        string(&mut out, "general.architecture");
        out.extend_from_slice(&kind::STRING.to_le_bytes());
        string(&mut out, arch);
        string(&mut out, &format!("{arch}.context_length"));
        out.extend_from_slice(&kind::U64.to_le_bytes());
        out.extend_from_slice(&context_length.to_le_bytes());
        string(&mut out, "tokenizer.ggml.tokens");
        out.extend_from_slice(&kind::ARRAY.to_le_bytes());
        out.extend_from_slice(&kind::STRING.to_le_bytes());
        out.extend_from_slice(&tokens.to_le_bytes());
        for i in 0..tokens.min(3) {
            string(&mut out, &format!("t{i}"));
        }
        string(&mut out, "token_embd.weight");
        out.extend_from_slice(&2u32.to_le_bytes());
        out.extend_from_slice(&8u64.to_le_bytes());
        out.extend_from_slice(&3u64.to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&0u64.to_le_bytes());
        out
    }

    #[test]
    fn reads_and_checks_a_header() {
        let header = read_header(&mut header_bytes("llama", 2048, 3).as_slice()).unwrap();
        assert_eq!(header.architecture.as_deref(), Some("llama"));
        assert_eq!(header.context_length, Some(2048));
        assert_eq!(header.vocabulary, Some(3));
        check(&header).unwrap();
    }

    #[test]
    fn refuses_absurd_figures_naming_the_field() {
        let header = read_header(&mut header_bytes("llama", 1 << 31, 3).as_slice()).unwrap();
        let error = check(&header).unwrap_err();
        assert!(
            error.contains("training context length = 2147483648"),
            "{error}"
        );
        // A vocabulary length far past the file is refused before anything is allocated.
        let error = read_header(&mut header_bytes("llama", 2048, u64::MAX).as_slice()).unwrap_err();
        assert!(error.contains("tokenizer.ggml.tokens has"), "{error}");
        // A header cut short says so.
        let bytes = header_bytes("llama", 2048, 3);
        let error = read_header(&mut &bytes[..bytes.len() - 5]).unwrap_err();
        assert!(error.contains("ends"), "{error}");
        let error = read_header(&mut b"GGML\0\0\0\0".as_slice()).unwrap_err();
        assert!(error.contains("not a GGUF file"), "{error}");
    }
}
