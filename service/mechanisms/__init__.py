"""Pure DP computation: arrays + public domain + parameters + randomness -> release.

Nothing in this package performs I/O, reads the environment or touches the database
(enforced by an import-linter contract in ``pyproject.toml``).
"""
