"""The demo's task in words: the prompt, the shapes and the colours that the tiny tokenizer, the shape dataset and
the demo's reward share."""

PROMPT = "<image>What colour is the shape?"
SHAPES = ("circle", "square", "triangle")
COLOURS = ("red", "green", "blue", "yellow")
