"""thinwire's shared library: compressors, error feedback, collectives, training loop.

Never imports ``harness``, ``papers`` or ``pipelines``.
"""
