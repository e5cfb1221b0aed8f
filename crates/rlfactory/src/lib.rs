//! rlfactory.
#![forbid(unsafe_code)]
