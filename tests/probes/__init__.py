"""Kernels that exist only for their tests: experiments that checked a DSL feature on the GPU
before the package's kernels relied on it (imported by the tests as `probes.<name>`)."""
