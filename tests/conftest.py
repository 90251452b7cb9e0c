"""Shared pytest configuration. Helpers live in tests/helpers.py and tests/backends.py."""
