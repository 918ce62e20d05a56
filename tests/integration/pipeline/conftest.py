"""Fixtures of the end-to-end pipeline tests: the real CDC connector and real view processes."""
