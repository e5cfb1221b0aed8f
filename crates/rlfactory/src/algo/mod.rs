//! The math of the algorithms, one file each.

pub mod appo;
