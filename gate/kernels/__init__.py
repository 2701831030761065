"""Kernel adapters: one module per kernel family, a registry to find them by name."""
