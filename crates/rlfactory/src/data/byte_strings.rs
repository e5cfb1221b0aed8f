//! Numbers serialised as one byte string each (`#[serde(with = "crate::data::byte_strings::floats")]`, or
//! `::bytes`), which postcard writes and reads as a copy, where serde's `Vec<f32>` and `Vec<u8>` are a call per
//! value each way: the MPI link's slots (a CartPole one holds 36K floats, an Atari one megabytes of pixels) and
//! weights.

use serde::de::{Error, Visitor};
use serde::{Deserializer, Serializer};

/// Floats as their little-endian bytes.
pub(crate) mod floats {
    use super::{Deserializer, Error, Serializer, Visitor};

    /// `values` as one byte string.
    pub(crate) fn serialize<S: Serializer>(values: &[f32], s: S) -> Result<S::Ok, S::Error> {
        let mut bytes = Vec::with_capacity(values.len() * 4);
        for v in values {
            bytes.extend_from_slice(&v.to_le_bytes());
        }
        s.serialize_bytes(&bytes)
    }

    /// The floats of a byte string [`serialize`] wrote.
    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<f32>, D::Error> {
        struct Floats;
        impl Visitor<'_> for Floats {
            type Value = Vec<f32>;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("the little-endian bytes of 32-bit floats")
            }

            fn visit_bytes<E: Error>(self, bytes: &[u8]) -> Result<Vec<f32>, E> {
                if bytes.len() % 4 != 0 {
                    return Err(E::invalid_length(bytes.len(), &self));
                }
                Ok(bytes
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect())
            }
        }
        d.deserialize_bytes(Floats)
    }
}

/// Bytes as they are.
pub(crate) mod bytes {
    use super::{Deserializer, Error, Serializer, Visitor};

    /// `values` as one byte string.
    pub(crate) fn serialize<S: Serializer>(values: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(values)
    }

    /// The bytes of a byte string.
    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        struct Bytes;
        impl Visitor<'_> for Bytes {
            type Value = Vec<u8>;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a byte string")
            }

            fn visit_bytes<E: Error>(self, bytes: &[u8]) -> Result<Vec<u8>, E> {
                Ok(bytes.to_vec())
            }
        }
        d.deserialize_bytes(Bytes)
    }
}

#[cfg(test)]
mod tests {
    use serde::{Deserialize, Serialize};

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Holder {
        #[serde(with = "super::floats")]
        values: Vec<f32>,
        after: u8,
    }

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Bytes {
        #[serde(with = "super::bytes")]
        values: Vec<u8>,
        after: u8,
    }

    #[test]
    fn floats_go_through_postcard_bit_for_bit() {
        let held = Holder {
            values: vec![
                0.0,
                -0.0,
                1.5,
                f32::MIN_POSITIVE,
                f32::INFINITY,
                f32::from_bits(0x7fc0_0001),
            ],
            after: 7,
        };
        let bytes = postcard::to_stdvec(&held).expect("encode");
        // A length and the bytes, then the next field.
        assert_eq!(bytes.len(), 1 + 6 * 4 + 1);
        let back: Holder = postcard::from_bytes(&bytes).expect("decode");
        let bits = |h: &Holder| h.values.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&back), bits(&held));
        assert_eq!(back.after, 7);
    }

    #[test]
    fn bytes_are_a_length_and_themselves() {
        let held = Bytes {
            values: vec![0, 255, 7],
            after: 9,
        };
        let bytes = postcard::to_stdvec(&held).expect("encode");
        assert_eq!(bytes, [3, 0, 255, 7, 9]);
        assert_eq!(postcard::from_bytes::<Bytes>(&bytes).expect("decode"), held);
    }

    #[test]
    fn a_byte_string_that_is_not_whole_floats_is_refused() {
        // A byte string of 3 bytes, then `after`.
        assert!(postcard::from_bytes::<Holder>(&[3, 1, 2, 3, 0]).is_err());
        assert!(
            postcard::from_bytes::<Holder>(&[4, 0, 0, 192, 63, 0]).is_ok(),
            "1.5 and 0"
        );
    }
}
