//! The math of the algorithms, one file each.

pub mod adam;
pub mod appo;
pub mod dqn;
