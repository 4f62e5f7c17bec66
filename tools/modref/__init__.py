"""PyTorch reference implementation of the modserve Mixture-of-Depths contract (DESIGN.md).

It is the oracle the C++ engine is checked against: plain, readable, fp32/fp64, no speed tricks.
"""
