"""attn-gate: the regression gate for attention kernels.

Data flows one way: cases -> run -> results -> compare -> verdict -> render.
"""

__version__ = "0.1.0"
