//! HKDF (RFC 5869) over the hash functions DH-HMAC-CHAP already names, and
//! TLS 1.3's HKDF-Expand-Label (RFC 8446 section 7.1).

use crate::auth::{Digest, HashFunction};

/// HKDF-Extract: `salt` empty means a string of zeroes as long as the hash.
pub(crate) fn extract(hash: HashFunction, salt: &[u8], ikm: &[u8]) -> Digest {
    let zeroes = [0u8; 64];
    let salt = if salt.is_empty() {
        &zeroes[..hash.output_len()]
    } else {
        salt
    };
    hash.hmac(salt, &[ikm])
}

/// HKDF-Expand of `prk` with the concatenation of `info` into `out`
/// (at most 255 times the hash's length).
pub(crate) fn expand(hash: HashFunction, prk: &[u8], info: &[&[u8]], out: &mut [u8]) {
    assert!(
        out.len() <= 255 * hash.output_len(),
        "HKDF-Expand output too long"
    );
    let mut previous: Option<Digest> = None;
    for (index, block) in out.chunks_mut(hash.output_len()).enumerate() {
        let counter = [index as u8 + 1];
        let mut parts: Vec<&[u8]> = Vec::with_capacity(info.len() + 2);
        if let Some(previous) = &previous {
            parts.push(previous.as_ref());
        }
        parts.extend_from_slice(info);
        parts.push(&counter);
        let t = hash.hmac(prk, &parts);
        block.copy_from_slice(&t.as_ref()[..block.len()]);
        previous = Some(t);
    }
}

/// HKDF-Expand-Label(secret, label, context, out.len()) as RFC 8446
/// section 7.1 defines it ("tls13 " prefixed to the label).
pub(crate) fn expand_label(
    hash: HashFunction,
    secret: &[u8],
    label: &[u8],
    context: &[u8],
    out: &mut [u8],
) {
    let length = (out.len() as u16).to_be_bytes();
    let label_len = [(6 + label.len()) as u8];
    let context_len = [context.len() as u8];
    let info: [&[u8]; 6] = [&length, &label_len, b"tls13 ", label, &context_len, context];
    expand(hash, secret, &info, out);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(text: &str) -> Vec<u8> {
        (0..text.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap())
            .collect()
    }

    /// RFC 5869 appendix A.1 (SHA-256, 42 bytes: two blocks).
    #[test]
    fn rfc5869_test_case_1() {
        let ikm = hex("0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b");
        let salt = hex("000102030405060708090a0b0c");
        let info = hex("f0f1f2f3f4f5f6f7f8f9");
        let prk = extract(HashFunction::Sha256, &salt, &ikm);
        assert_eq!(
            prk.as_ref(),
            hex("077709362c2e32df0ddc3f0dc47bba6390b6c73bb50f9c3122ec844ad7c2b3e5")
        );
        let mut okm = [0u8; 42];
        expand(HashFunction::Sha256, prk.as_ref(), &[&info], &mut okm);
        assert_eq!(
            okm.to_vec(),
            hex("3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf34007208d5b887185865")
        );
    }

    /// RFC 8448 section 3: the early secret of a handshake without a PSK
    /// and its "derived" secret (Derive-Secret with the empty transcript).
    #[test]
    fn rfc8448_early_and_derived_secrets() {
        let early = extract(HashFunction::Sha256, &[], &[0u8; 32]);
        assert_eq!(
            early.as_ref(),
            hex("33ad0a1c607ec03b09e6cd9893680ce210adf300aa1f2660e1b22e10f170f92a")
        );
        let empty_hash = hex("e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
        let mut derived = [0u8; 32];
        expand_label(
            HashFunction::Sha256,
            early.as_ref(),
            b"derived",
            &empty_hash,
            &mut derived,
        );
        assert_eq!(
            derived.to_vec(),
            hex("6f2615a108c702c5678f54fc9dbab69716c076189c48250cebeac3576c3611ba")
        );
    }
}
