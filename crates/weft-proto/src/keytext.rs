//! The text forms of keys, as nvme-cli prints them: `DHHC-1` secrets and
//! `NVMeTLSkey-1` PSKs both carry their key and its CRC-32 in base64.

/// CRC-32 (IEEE 802.3, reflected, as zlib), which `DHHC-1` secrets and
/// `NVMeTLSkey-1` keys append.
pub(crate) fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &byte in bytes {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            crc = (crc >> 1) ^ (0xEDB8_8320 & (crc & 1).wrapping_neg());
        }
    }
    !crc
}

/// The standard alphabet (RFC 4648 section 4), padded.
const BASE64_ALPHABET: &[u8; 64] =
    b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

pub(crate) fn base64_encode(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let group = chunk
            .iter()
            .enumerate()
            .fold(0u32, |acc, (i, &b)| acc | u32::from(b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(BASE64_ALPHABET[(group >> (18 - 6 * i)) as usize & 0x3F] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Standard base64 with padding; `None` for anything else.
pub(crate) fn base64_decode(text: &str) -> Option<Vec<u8>> {
    let bytes = text.as_bytes();
    if !bytes.len().is_multiple_of(4) {
        return None;
    }
    let mut out = Vec::with_capacity(bytes.len() / 4 * 3);
    for (index, chunk) in bytes.chunks(4).enumerate() {
        let last = index == bytes.len() / 4 - 1;
        let padding = chunk.iter().rev().take_while(|&&b| b == b'=').count();
        if padding > 2 || (padding > 0 && !last) {
            return None;
        }
        let mut group = 0u32;
        for &byte in &chunk[..4 - padding] {
            let value = BASE64_ALPHABET.iter().position(|&a| a == byte)?;
            group = group << 6 | value as u32;
        }
        group <<= 6 * padding as u32;
        out.extend_from_slice(&group.to_be_bytes()[1..4 - padding]);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32_is_zlibs() {
        // zlib.crc32(b"123456789"), the check value of CRC-32/ISO-HDLC.
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
    }

    #[test]
    fn base64_round_trips_with_padding_and_refuses_anything_else() {
        for text in ["", "Zg==", "Zm8=", "Zm9v", "Zm9vYmFy"] {
            assert_eq!(base64_encode(&base64_decode(text).unwrap()), text);
        }
        assert_eq!(base64_decode("Zm9v").unwrap(), b"foo");
        for bad in ["Zg=", "Z===", "Zg==Zg==", "Zm9*"] {
            assert_eq!(base64_decode(bad), None, "{bad}");
        }
    }
}
