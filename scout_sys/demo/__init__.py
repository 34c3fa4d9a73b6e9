"""Demo trainer and job launcher used by `make demo`, `scout-sys demo`, the tests and the benchmarks."""
