//! Scale figures (issue 9): placeholder until the benchmark lands.
fn main() {}
