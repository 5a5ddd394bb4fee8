"""Released functions: evaluate at client points under one shared, persisted GP state.

Never charges budget: every answer is post-processing of the one charged release.
"""
