//! The `keel` command-line tool.
fn main() {}
