"""attn-gate's tests: a package, so `tests.buggy_kernels:NAME` names a user kernel for the CLI."""
