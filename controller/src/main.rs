//! The `weir` binary.

fn main() {}
