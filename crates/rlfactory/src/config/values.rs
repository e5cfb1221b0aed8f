//! The values the command line writes in a form of their own: booleans as Sample Factory users type them, layer sizes
//! (`64,64`) and convolutions (`32x8s4`).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize};

use crate::error::Result;

/// Parses a boolean the way Sample Factory users type it: `true`/`false`, `True`/`False`, `1`/`0`.
pub fn parse_bool(s: &str) -> Result<bool, String> {
    match s {
        "true" | "True" | "TRUE" | "1" | "yes" => Ok(true),
        "false" | "False" | "FALSE" | "0" | "no" => Ok(false),
        _ => Err(format!("`{s}` is not a boolean (use true or false)")),
    }
}

/// Hidden layer sizes of an MLP, written `64,64` on the command line and `[64, 64]` (or `"64,64"`)
/// in files.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct Layers(pub Vec<i64>);

impl<'de> Deserialize<'de> for Layers {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Written {
            List(Vec<i64>),
            Text(String),
        }
        let text = match Written::deserialize(deserializer)? {
            Written::Text(text) => text,
            Written::List(sizes) => sizes.iter().map(i64::to_string).collect::<Vec<_>>().join(","),
        };
        text.parse().map_err(serde::de::Error::custom)
    }
}

impl FromStr for Layers {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let sizes = s
            .split(',')
            .map(|p| match p.trim().parse::<i64>() {
                Ok(n) if n > 0 => Ok(n),
                _ => Err(format!(
                    "`{s}` is not a comma-separated list of positive layer sizes"
                )),
            })
            .collect::<Result<Vec<_>, _>>()?;
        if sizes.is_empty() {
            return Err("at least one layer is needed".into());
        }
        Ok(Layers(sizes))
    }
}

impl fmt::Display for Layers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.0.iter().map(i64::to_string).collect();
        f.write_str(&parts.join(","))
    }
}

/// One convolution of the encoder: `channels` filters of `kernel` × `kernel`, moved by `stride`
/// (padded to keep the size when the stride is 1, unpadded otherwise).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConvLayer {
    /// Output channels.
    pub channels: i64,
    /// Kernel height and width.
    pub kernel: i64,
    /// Stride.
    pub stride: i64,
}

/// The convolutions of the encoder, written `64x3,64x3` (channels × kernel, stride 1) or `32x8s4`
/// (stride 4); empty for none (an MLP on the flat observation).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ConvLayers(pub Vec<ConvLayer>);

impl FromStr for ConvLayers {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s.trim().is_empty() {
            return Ok(Self::default());
        }
        let bad = |p: &str| {
            format!("`{p}` in `{s}` is not a convolution `CHANNELSxKERNEL` or `CHANNELSxKERNELsSTRIDE`")
        };
        let positive = |t: &str, p: &str| match t.trim().parse::<i64>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(bad(p)),
        };
        s.split(',')
            .map(|p| {
                let (channels, rest) = p.split_once('x').ok_or_else(|| bad(p))?;
                let (kernel, stride) = rest.split_once('s').unwrap_or((rest, "1"));
                Ok(ConvLayer {
                    channels: positive(channels, p)?,
                    kernel: positive(kernel, p)?,
                    stride: positive(stride, p)?,
                })
            })
            .collect::<Result<Vec<_>, String>>()
            .map(Self)
    }
}

impl fmt::Display for ConvLayers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self
            .0
            .iter()
            .map(|l| match l.stride {
                1 => format!("{}x{}", l.channels, l.kernel),
                s => format!("{}x{}s{s}", l.channels, l.kernel),
            })
            .collect();
        f.write_str(&parts.join(","))
    }
}

impl Serialize for ConvLayers {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for ConvLayers {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}
