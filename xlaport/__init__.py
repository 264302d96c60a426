"""xlaport: migrate CUDA PyTorch code to PyTorch/XLA, and prove the result."""

__version__ = "0.1.0"
