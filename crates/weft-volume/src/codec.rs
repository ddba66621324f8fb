//! Little-endian encoding of the on-disk structures: a growable writer and a
//! bounded reader that fails (never panics) on short or malformed input, so
//! that whatever a device returns can be decoded safely.

use crate::format::FormatError;

/// Appends little-endian fields to a byte vector.
#[derive(Debug, Default)]
pub struct Encoder {
    bytes: Vec<u8>,
}

impl Encoder {
    /// An empty encoder.
    pub fn new() -> Encoder {
        Encoder::default()
    }

    /// The bytes so far.
    pub fn into_bytes(self) -> Vec<u8> {
        self.bytes
    }

    /// Bytes written so far.
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// Whether nothing was written.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// One byte.
    pub fn u8(&mut self, value: u8) {
        self.bytes.push(value);
    }

    /// A little-endian u16.
    pub fn u16(&mut self, value: u16) {
        self.bytes.extend_from_slice(&value.to_le_bytes());
    }

    /// A little-endian u32.
    pub fn u32(&mut self, value: u32) {
        self.bytes.extend_from_slice(&value.to_le_bytes());
    }

    /// A little-endian u64.
    pub fn u64(&mut self, value: u64) {
        self.bytes.extend_from_slice(&value.to_le_bytes());
    }

    /// Raw bytes.
    pub fn bytes(&mut self, value: &[u8]) {
        self.bytes.extend_from_slice(value);
    }

    /// A string of at most 255 bytes, length first.
    pub fn name(&mut self, value: &str) {
        let len = u8::try_from(value.len()).expect("names are validated to at most 64 bytes");
        self.u8(len);
        self.bytes(value.as_bytes());
    }
}

/// Reads little-endian fields front to back from a slice.
#[derive(Debug)]
pub struct Decoder<'a> {
    bytes: &'a [u8],
    offset: usize,
}

impl<'a> Decoder<'a> {
    /// A decoder at the start of `bytes`.
    pub fn new(bytes: &'a [u8]) -> Decoder<'a> {
        Decoder { bytes, offset: 0 }
    }

    /// Whether every byte was consumed.
    pub fn is_done(&self) -> bool {
        self.offset == self.bytes.len()
    }

    /// The next `len` bytes.
    pub fn take(&mut self, len: usize) -> Result<&'a [u8], FormatError> {
        let end = self
            .offset
            .checked_add(len)
            .filter(|&end| end <= self.bytes.len())
            .ok_or(FormatError::Truncated)?;
        let field = &self.bytes[self.offset..end];
        self.offset = end;
        Ok(field)
    }

    /// A fixed-size array.
    pub fn array<const N: usize>(&mut self) -> Result<[u8; N], FormatError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    /// One byte.
    pub fn u8(&mut self) -> Result<u8, FormatError> {
        Ok(self.take(1)?[0])
    }

    /// A little-endian u16.
    pub fn u16(&mut self) -> Result<u16, FormatError> {
        Ok(u16::from_le_bytes(self.array()?))
    }

    /// A little-endian u32.
    pub fn u32(&mut self) -> Result<u32, FormatError> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    /// A little-endian u64.
    pub fn u64(&mut self) -> Result<u64, FormatError> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    /// A length-prefixed UTF-8 string.
    pub fn name(&mut self) -> Result<String, FormatError> {
        let len = usize::from(self.u8()?);
        let bytes = self.take(len)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| FormatError::Malformed("name is not UTF-8"))
    }

    /// A boolean stored as one byte 0 or 1.
    pub fn flag(&mut self) -> Result<bool, FormatError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(FormatError::Malformed("flag is neither 0 nor 1")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_round_trip_and_short_input_fails() {
        let mut encoder = Encoder::new();
        encoder.u8(7);
        encoder.u16(0x0102);
        encoder.u32(0x0304_0506);
        encoder.u64(u64::MAX - 1);
        encoder.name("db1");
        let bytes = encoder.into_bytes();
        assert_eq!(
            &bytes[..7],
            &[0x07, 0x02, 0x01, 0x06, 0x05, 0x04, 0x03],
            "little-endian"
        );
        let mut decoder = Decoder::new(&bytes);
        assert_eq!(decoder.u8().unwrap(), 7);
        assert_eq!(decoder.u16().unwrap(), 0x0102);
        assert_eq!(decoder.u32().unwrap(), 0x0304_0506);
        assert_eq!(decoder.u64().unwrap(), u64::MAX - 1);
        assert_eq!(decoder.name().unwrap(), "db1");
        assert!(decoder.is_done());
        assert_eq!(decoder.u8(), Err(FormatError::Truncated));
        assert_eq!(
            Decoder::new(&[5, b'a']).name(),
            Err(FormatError::Truncated),
            "a length beyond the input"
        );
    }
}
