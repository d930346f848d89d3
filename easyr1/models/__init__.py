"""Model helpers: loading Hugging Face models, Qwen-VL m-rope position ids, padding-free forward, LoRA."""
