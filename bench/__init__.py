"""Benchmarks: scripts that print figures and ratios measured side by side in one run.

Installed as ``draco_gym.bench`` so that ``draco-gym bench`` finds its benchmarks from any
directory; each script also runs on its own (``python bench/<name>.py``).
"""
