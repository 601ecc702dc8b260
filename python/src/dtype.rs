//! Element types as Python names them, and the one dispatch from a runtime [`DType`] to the
//! core's generic calls.
//!
//! A type reaches a call in one of two ways: from a host buffer's format character (the
//! `struct` module's letters, as the buffer protocol reports them: `'f'` is f32, `'e'` f16,
//! `'q'` or `'l'` an 8-byte signed integer, ...), or by name through the calls' `dtype=`
//! argument (`"float32"` or `"f32"`, `"bfloat16"` or `"bf16"`, ...). bfloat16 and the two fp8
//! types have no format character, so they only come by name: a buffer of elements of their
//! size (`array('H')` or a NumPy `uint16` array holding bfloat16 bits, `bytearray` or `uint8`
//! holding fp8 bits) passed with `dtype="bfloat16"`, `"float8_e4m3fn"` or `"float8_e5m2"`.
//! Integers are named by
//! their size: the core has 8-, 32- and 64-bit integers (src/element.rs), so `'h'` (16-bit) is
//! refused by name.

use ringreduce::DType;

/// The names `dtype=` accepts, for each type: the core's short name first, then NumPy's and
/// torch's.
const NAMES: [(DType, &[&str]); 12] = [
    (DType::F16, &["f16", "float16", "half"]),
    (DType::BF16, &["bf16", "bfloat16"]),
    (DType::F32, &["f32", "float32", "float"]),
    (DType::F64, &["f64", "float64", "double"]),
    (DType::I8, &["i8", "int8"]),
    (DType::U8, &["u8", "uint8"]),
    (DType::I32, &["i32", "int32"]),
    (DType::U32, &["u32", "uint32"]),
    (DType::I64, &["i64", "int64"]),
    (DType::U64, &["u64", "uint64"]),
    (DType::F8E4M3, &["f8e4m3", "float8_e4m3fn", "float8_e4m3"]),
    (DType::F8E5M2, &["f8e5m2", "float8_e5m2"]),
];

/// The type named `name` (any of [`NAMES`], case-insensitive; a `torch.` prefix is ignored, so
/// `str(torch.float16)` works), or a message listing the names.
pub fn from_name(name: &str) -> Result<DType, String> {
    let wanted = name.trim().to_ascii_lowercase();
    let wanted = wanted.strip_prefix("torch.").unwrap_or(&wanted);
    NAMES
        .iter()
        .find(|(_, names)| names.contains(&wanted))
        .map(|&(dtype, _)| dtype)
        .ok_or_else(|| {
            let known: Vec<&str> = NAMES.iter().map(|(_, names)| names[0]).collect();
            format!(
                "dtype {name:?} is not a ringreduce type: one of {} (or NumPy's names: float32, \
                 bfloat16, int64, ...)",
                known.join(", ")
            )
        })
}

/// The type of a buffer whose format is `format` and whose elements are `itemsize` bytes, or a
/// message saying why it has none.
///
/// `format` is the `struct` module's: an optional byte-order prefix (`@`, `=`, `<` native or
/// little-endian; `>` and `!` big-endian, refused on this little-endian host), then one letter.
/// The element size comes from `itemsize`, so `'l'` is an 8-byte integer where C's `long` is.
pub fn from_format(format: &str, itemsize: usize) -> Result<DType, String> {
    let refuse = |why: &str| Err(format!("a buffer of format {format:?}: {why}"));
    let letter = match format.as_bytes() {
        [b'@' | b'=' | b'<', letter] | [letter] => *letter,
        [b'>' | b'!', _] => return refuse("big-endian elements are not supported"),
        _ => {
            return refuse(
                "only buffers of single numbers are supported (struct letters e f d b B i I l L q Q n N)",
            )
        }
    };
    let (signed, float) = match letter {
        b'b' | b'h' | b'i' | b'l' | b'q' | b'n' => (true, false),
        b'B' | b'H' | b'I' | b'L' | b'Q' | b'N' => (false, false),
        b'e' | b'f' | b'd' => (true, true),
        b'?' => return refuse("booleans have no ringreduce type"),
        _ => return refuse("not a number type ringreduce reduces"),
    };
    match (float, signed, itemsize) {
        (true, _, 2) => Ok(DType::F16),
        (true, _, 4) => Ok(DType::F32),
        (true, _, 8) => Ok(DType::F64),
        (false, true, 1) => Ok(DType::I8),
        (false, false, 1) => Ok(DType::U8),
        (false, true, 4) => Ok(DType::I32),
        (false, false, 4) => Ok(DType::U32),
        (false, true, 8) => Ok(DType::I64),
        (false, false, 8) => Ok(DType::U64),
        (false, _, 2) => refuse(
            "16-bit integers have no ringreduce type (pass dtype=\"bfloat16\" or \"float16\" \
             for 2-byte elements holding those bits)",
        ),
        _ => refuse(&format!("{itemsize}-byte elements have no ringreduce type")),
    }
}
