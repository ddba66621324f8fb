//! Little-endian codec primitives shared by every wire structure.
//!
//! `Reader` reads fields front to back from a bounded slice and fails (never
//! panics) when the input is short; `Writer` fills a fixed-size output buffer
//! at explicit offsets, asserting that every field lies inside it (an encoder
//! writing out of bounds is a programming error, not an operating one).

use thiserror::Error;

/// The input ended before a field could be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[error("input too short: needed {needed} more bytes at offset {offset}")]
pub struct Truncated {
    /// Offset of the field that did not fit.
    pub offset: usize,
    /// Bytes missing for that field.
    pub needed: usize,
}

/// Sequential little-endian reader over a borrowed slice.
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    bytes: &'a [u8],
    offset: usize,
}

impl<'a> Reader<'a> {
    /// A reader positioned at the start of `bytes`.
    pub fn new(bytes: &'a [u8]) -> Self {
        Reader { bytes, offset: 0 }
    }

    /// Bytes consumed so far.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Takes the next `len` bytes.
    pub fn take(&mut self, len: usize) -> Result<&'a [u8], Truncated> {
        let remaining = self.bytes.len() - self.offset;
        if len > remaining {
            return Err(Truncated {
                offset: self.offset,
                needed: len - remaining,
            });
        }
        let field = &self.bytes[self.offset..self.offset + len];
        self.offset += len;
        Ok(field)
    }

    /// Skips `len` reserved bytes.
    pub fn skip(&mut self, len: usize) -> Result<(), Truncated> {
        self.take(len).map(|_| ())
    }

    /// Reads a fixed-size array.
    pub fn array<const N: usize>(&mut self) -> Result<[u8; N], Truncated> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    /// Reads one byte.
    pub fn u8(&mut self) -> Result<u8, Truncated> {
        Ok(self.array::<1>()?[0])
    }

    /// Reads a little-endian u16.
    pub fn u16(&mut self) -> Result<u16, Truncated> {
        Ok(u16::from_le_bytes(self.array()?))
    }

    /// Reads a little-endian u32.
    pub fn u32(&mut self) -> Result<u32, Truncated> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    /// Reads a little-endian u64.
    pub fn u64(&mut self) -> Result<u64, Truncated> {
        Ok(u64::from_le_bytes(self.array()?))
    }
}

/// Writes little-endian fields at explicit offsets of a caller-provided buffer.
#[derive(Debug)]
pub struct Writer<'a> {
    bytes: &'a mut [u8],
}

impl<'a> Writer<'a> {
    /// Wraps `bytes`; the caller decides whether to zero it first.
    pub fn new(bytes: &'a mut [u8]) -> Self {
        Writer { bytes }
    }

    /// Copies `field` to `offset`.
    pub fn bytes(&mut self, offset: usize, field: &[u8]) -> &mut Self {
        assert!(
            offset + field.len() <= self.bytes.len(),
            "field at {offset} overruns {}",
            self.bytes.len()
        );
        self.bytes[offset..offset + field.len()].copy_from_slice(field);
        self
    }

    /// Writes one byte.
    pub fn u8(&mut self, offset: usize, value: u8) -> &mut Self {
        self.bytes(offset, &[value])
    }

    /// Writes a little-endian u16.
    pub fn u16(&mut self, offset: usize, value: u16) -> &mut Self {
        self.bytes(offset, &value.to_le_bytes())
    }

    /// Writes a little-endian u32.
    pub fn u32(&mut self, offset: usize, value: u32) -> &mut Self {
        self.bytes(offset, &value.to_le_bytes())
    }

    /// Writes a little-endian u64.
    pub fn u64(&mut self, offset: usize, value: u64) -> &mut Self {
        self.bytes(offset, &value.to_le_bytes())
    }

    /// Writes `text` as a fixed-width ASCII field padded with `pad` (NVMe
    /// identify strings pad with spaces, NQN fields with NULs). Text longer
    /// than the field is truncated.
    pub fn ascii(&mut self, offset: usize, width: usize, text: &str, pad: u8) -> &mut Self {
        let text = text.as_bytes();
        let used = text.len().min(width);
        self.bytes(offset, &text[..used]);
        for i in used..width {
            self.bytes[offset + i] = pad;
        }
        self
    }
}

/// Decodes hex text (whitespace ignored) into bytes; used by tests and wire vectors.
pub fn hex(text: &str) -> Vec<u8> {
    let digits: Vec<u8> = text.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
    assert!(digits.len().is_multiple_of(2), "odd number of hex digits");
    digits
        .chunks(2)
        .map(|pair| {
            let text = std::str::from_utf8(pair).expect("hex is ASCII");
            u8::from_str_radix(text, 16).expect("valid hex digit")
        })
        .collect()
}

/// Reads a NUL- or space-padded ASCII field as a string, trimming the padding.
pub fn ascii_field(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end])
        .trim_end()
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reader_reads_little_endian_and_reports_truncation() {
        let bytes = hex("01 0203 04050607 08090a0b0c0d0e0f");
        let mut reader = Reader::new(&bytes);
        assert_eq!(reader.u8(), Ok(0x01));
        assert_eq!(reader.u16(), Ok(0x0302));
        assert_eq!(reader.u32(), Ok(0x0706_0504));
        assert_eq!(reader.u64(), Ok(0x0f0e_0d0c_0b0a_0908));
        assert_eq!(
            reader.u8(),
            Err(Truncated {
                offset: 15,
                needed: 1
            })
        );
    }

    #[test]
    fn writer_pads_ascii_fields() {
        let mut buf = [0xffu8; 8];
        Writer::new(&mut buf).ascii(1, 6, "weft", b' ');
        assert_eq!(&buf, b"\xffweft  \xff");
        assert_eq!(ascii_field(b"weft  \0\0"), "weft");
    }

    #[test]
    #[should_panic(expected = "overruns")]
    fn writer_asserts_bounds() {
        let mut buf = [0u8; 4];
        Writer::new(&mut buf).u32(1, 7);
    }
}
