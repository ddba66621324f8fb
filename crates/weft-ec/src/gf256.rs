//! GF(2^8) with the polynomial x^8 + x^4 + x^3 + x^2 + 1 (0x11d) and the
//! generator 2, as RAID-6 uses it: log and exponent tables built at
//! compile time, a product by any constant as a 256-byte table, and the
//! product by 2 of eight bytes at once in a `u64` (what encoding Q needs).

/// The field's reducing polynomial, without its x^8 term.
const POLY: u8 = 0x1d;

/// `EXP[i]` = 2^i, for i in 0..510 (twice over, so that a sum of two logs
/// needs no reduction).
const EXP: [u8; 510] = exponents();
/// `LOG[x]` = i such that 2^i = x (`LOG[0]` is unused).
const LOG: [u8; 256] = logarithms();

const fn exponents() -> [u8; 510] {
    let mut table = [0u8; 510];
    let mut value: u8 = 1;
    let mut i = 0;
    while i < 510 {
        table[i] = value;
        value = times_two(value);
        i += 1;
    }
    table
}

const fn logarithms() -> [u8; 256] {
    let mut table = [0u8; 256];
    let mut i = 0;
    while i < 255 {
        table[EXP[i] as usize] = i as u8;
        i += 1;
    }
    table
}

/// `x` times 2.
const fn times_two(x: u8) -> u8 {
    (x << 1) ^ if x & 0x80 != 0 { POLY } else { 0 }
}

/// `a` times `b`.
pub(crate) fn mul(a: u8, b: u8) -> u8 {
    if a == 0 || b == 0 {
        return 0;
    }
    EXP[LOG[a as usize] as usize + LOG[b as usize] as usize]
}

/// 2 to the power `n`.
pub(crate) fn pow2(n: usize) -> u8 {
    EXP[n % 255]
}

/// The inverse of `x` (not 0).
pub(crate) fn inverse(x: u8) -> u8 {
    assert_ne!(x, 0, "0 has no inverse");
    EXP[255 - LOG[x as usize] as usize]
}

/// The products of every byte by `c`.
pub(crate) fn table(c: u8) -> [u8; 256] {
    let mut table = [0u8; 256];
    for (x, product) in table.iter_mut().enumerate() {
        *product = mul(x as u8, c);
    }
    table
}

/// Each of the eight bytes of `x` times 2: shifted left, and reduced
/// where a byte's top bit fell off (0x01 in those bytes, times 0x1d,
/// carries into no other byte).
pub(crate) fn times_two_u64(x: u64) -> u64 {
    let high = x & 0x8080_8080_8080_8080;
    ((x << 1) & 0xfefe_fefe_fefe_fefe) ^ ((high >> 7) * POLY as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Multiplication done the long way (shift and add), apart from the tables.
    fn slow_mul(mut a: u8, mut b: u8) -> u8 {
        let mut product = 0;
        while b != 0 {
            if b & 1 != 0 {
                product ^= a;
            }
            a = times_two(a);
            b >>= 1;
        }
        product
    }

    #[test]
    fn the_tables_multiply_as_the_long_way_and_inverses_invert() {
        for a in 0..=255u8 {
            for b in 0..=255u8 {
                assert_eq!(mul(a, b), slow_mul(a, b), "{a} * {b}");
            }
            if a != 0 {
                assert_eq!(mul(a, inverse(a)), 1, "{a}");
                assert_eq!(table(a)[7], mul(7, a));
            }
        }
        // 2 generates the field: its powers take every non-zero value once.
        let mut seen = [false; 256];
        for n in 0..255 {
            assert!(!seen[pow2(n) as usize]);
            seen[pow2(n) as usize] = true;
        }
        assert_eq!(pow2(255), 1);
    }

    #[test]
    fn eight_bytes_at_once_are_each_doubled() {
        let bytes = [0x00, 0x01, 0x7f, 0x80, 0x81, 0xfe, 0xff, 0x53];
        let doubled = times_two_u64(u64::from_le_bytes(bytes)).to_le_bytes();
        for (x, y) in bytes.iter().zip(doubled) {
            assert_eq!(y, times_two(*x), "{x:#x}");
        }
    }
}
