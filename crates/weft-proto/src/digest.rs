//! CRC32C header and data digests (NVMe/TCP 1.0, section 3.6.2.3: CRC-32C, Castagnoli).

/// CRC32C of `bytes`.
pub fn crc32c(bytes: &[u8]) -> u32 {
    crc32c::crc32c(bytes)
}

/// Continues a CRC32C over more bytes (`crc` is the value so far; 0 to start).
pub fn crc32c_append(crc: u32, bytes: &[u8]) -> u32 {
    crc32c::crc32c_append(crc, bytes)
}

#[cfg(test)]
mod tests {
    #[test]
    fn known_vector() {
        // RFC 3720 B.4: 32 bytes of zeros.
        assert_eq!(super::crc32c(&[0u8; 32]), 0x8a91_36aa);
        assert_eq!(
            super::crc32c_append(super::crc32c(b"1234"), b"56789"),
            super::crc32c(b"123456789")
        );
        assert_eq!(super::crc32c(b"123456789"), 0xe306_9283);
    }
}
