"""Export an easyr1 checkpoint as a Hugging Face model.

    python scripts/model_merger.py --local_dir checkpoints/<project>/<experiment>/global_step_N/actor \
        [--target_dir DIR]

Writes safetensors weights (LoRA adapters folded in), config, generation config, tokenizer, processor and chat
template to DIR (default: the checkpoint's ``actor/huggingface``), loadable with ``AutoModelForImageTextToText`` /
``AutoModelForCausalLM`` and by vLLM.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from easyr1.checkpoint.merge import merge_to_huggingface  # noqa: E402
from easyr1.errors import UserError  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments, export, and print where the model went."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--local_dir", required=True, help="a checkpoint's global_step_N/actor directory")
    parser.add_argument("--target_dir", default=None, help="where to write (default: LOCAL_DIR/huggingface)")
    args = parser.parse_args(argv)
    try:
        target = merge_to_huggingface(args.local_dir, args.target_dir)
    except UserError as error:
        print(f"model_merger: error: {error}", file=sys.stderr)
        return 2
    print(f"model_merger: wrote a Hugging Face model to {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
