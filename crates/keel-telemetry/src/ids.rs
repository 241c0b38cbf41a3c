//! Trace and span id helpers: validation of W3C ids and deterministic derivation (FNV-1a)
//! of ids for spans whose event carries none, so replaying a log gives the same ids.

fn fnv1a(parts: &[&str], seed: u64) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ seed;
    for part in parts {
        for b in part.bytes().chain(std::iter::once(0xff)) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    if h == 0 { 1 } else { h }
}

fn is_hex_of_len(id: &str, len: usize) -> bool {
    id.len() == len && id.bytes().all(|b| b.is_ascii_hexdigit()) && id.bytes().any(|b| b != b'0')
}

/// A valid, non-zero 32-hex-digit trace id.
pub fn valid_trace_id(id: &str) -> bool {
    is_hex_of_len(id, 32)
}

/// A valid, non-zero 16-hex-digit span id.
pub fn valid_span_id(id: &str) -> bool {
    is_hex_of_len(id, 16)
}

/// A trace id derived from a run id.
pub fn derive_trace_id(run_id: &str) -> String {
    format!("{:016x}{:016x}", fnv1a(&[run_id], 1), fnv1a(&[run_id], 2))
}

/// A span id derived from the trace, run and a salt naming the span.
pub fn derive_span_id(trace_id: &str, run_id: &str, salt: &str) -> String {
    format!("{:016x}", fnv1a(&[trace_id, run_id, salt], 3))
}
