//! `synapse-bench-noop`: a program that does nothing, for `synapse-bench floor`'s spawn floor
//! (the cost of starting and reaping a minimal Rust binary on this machine).

fn main() {}
