//! Runnable keiro examples live under `examples/`.
