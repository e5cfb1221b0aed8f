//! Numbers serialised as one byte string each (`#[serde(with = "crate::data::byte_strings::floats")]`, or
//! `::bytes`), which postcard writes and reads as a copy, where serde's `Vec<f32>` and `Vec<u8>` are a call per
//! value each way: the MPI link's slots (a CartPole one holds 36K floats, an Atari one megabytes of pixels) and
//! weights.

use serde::de::{Error, Unexpected, Visitor};
use serde::Deserializer;

/// A byte string, turned into a value by `convert` (`None`: the bytes are not `what`).
fn byte_string<'de, D: Deserializer<'de>, T>(
    d: D,
    what: &'static str,
    convert: fn(&[u8]) -> Option<T>,
) -> Result<T, D::Error> {
    struct ByteString<T> {
        what: &'static str,
        convert: fn(&[u8]) -> Option<T>,
    }
    impl<T> Visitor<'_> for ByteString<T> {
        type Value = T;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.what)
        }

        fn visit_bytes<E: Error>(self, bytes: &[u8]) -> Result<T, E> {
            (self.convert)(bytes).ok_or_else(|| E::invalid_value(Unexpected::Bytes(bytes), &self))
        }
    }
    d.deserialize_bytes(ByteString { what, convert })
}

/// Floats as their little-endian bytes.
pub(crate) mod floats {
    use serde::{Deserializer, Serializer};

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
        super::byte_string(d, "the little-endian bytes of 32-bit floats", |bytes| {
            (bytes.len() % 4 == 0).then(|| {
                bytes
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect()
            })
        })
    }
}

/// Bytes as they are.
pub(crate) mod bytes {
    use serde::{Deserializer, Serializer};

    /// `values` as one byte string.
    pub(crate) fn serialize<S: Serializer>(values: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(values)
    }

    /// The bytes of a byte string.
    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        super::byte_string(d, "a byte string", |bytes| Some(bytes.to_vec()))
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
