"""easyr1: reinforcement learning for vision-language models with Ray, FSDP2 and vLLM."""

__version__ = "0.1.0"
