"""Golden generated sources: tests/test_golden.py compares, `python -m tests.golden.regen`
rewrites them (review the diff like code)."""
