//! The subcommands too long to sit in `main.rs`.

pub(crate) mod artifact;
pub(crate) mod bench;
