//! The native envs against what the reference libraries recorded (`tests/data/`), a module per recording.

mod classic_control;
mod connect_four;
