"""The benchmark suite of issue 6: `python -m bench` measures loopwarden and writes
`docs/benchmarks.md`. Not tests: nothing here is collected by pytest (`testpaths = ["tests"]`)."""
