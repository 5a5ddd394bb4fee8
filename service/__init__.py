"""DP causal curator service."""

__version__ = "0.1.0"
