"""rljax: reinforcement learning for LLMs in JAX, with quantized rollout."""

__version__ = "0.1.0"
