"""One TRL ``GRPOTrainer`` run of the peer benchmark, in the bench-only TRL environment (``bench/.venv-trl``).

``bench/peer_bench.py`` starts it as a subprocess; it trains ``--steps`` optimizer steps on the shared tiny model and
dataset and writes one JSON file: per-step wall time (``on_step_begin`` to ``on_step_end``: generation, scoring,
forward, backward, clipping, the optimizer), the period between consecutive step ends (data loading and logging
added), the process's CPU seconds in the step, time in generation (TRL's ``_generate``: weight sync to vLLM, chat
template, tokenisation, sampling), generated tokens per step and the start-up time. With ``--print-prompt-ids`` it
only prints the prompt token ids TRL's processor produces for the first rows (no training), for the bench's check
that both trainers see the same prompts.

Settings are TRL's defaults but for the work itself (batch, lengths, loss, optimizer: ``bench/README.md``) and no
gradient checkpointing; ``--set KEY=VALUE`` changes any ``GRPOConfig`` field (``bench/peer_trl_sweep.py`` tries
them), ``--profile FILE`` writes a cProfile of the steps from ``--profile-from`` on.

    bench/.venv-trl/bin/python bench/peer_trl.py --model DIR --data DIR --engine hf|vllm --out FILE

Run it without ``RANK`` / ``WORLD_SIZE`` / ``MASTER_ADDR`` in the environment: with them accelerate treats the one
process as a distributed CPU job (``peer_bench.run_env`` explains); TRL sets them itself for its colocated vLLM.
"""

from __future__ import annotations

import argparse
import cProfile
import importlib.util
import json
import os
import sys
import time
from pathlib import Path

import psutil


PROCESS_START = psutil.Process().create_time()
QUESTION = "What colour is the shape?"
REPO = Path(__file__).resolve().parent.parent


def load_rows(data_dir: Path, count: int) -> list[dict]:
    """The first ``count`` rows of the shape dataset as TRL's conversational image rows."""
    from PIL import Image

    rows = []
    with (data_dir / "train.jsonl").open(encoding="utf-8") as file:
        for line in file:
            if len(rows) == count:
                break
            record = json.loads(line)
            if record["problem"] != "<image>" + QUESTION:
                raise ValueError(f"unexpected prompt {record['problem']!r} in {data_dir}")
            image = Image.open(data_dir / record["images"][0]).convert("RGB")
            prompt = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}]
            rows.append({"prompt": prompt, "image": image, "answer": record["answer"]})
    return rows


def shape_colour_reward():
    """reward_function/shape_color.py wrapped as a TRL reward function (the same scores easyr1 computes)."""
    spec = importlib.util.spec_from_file_location("shape_color", REPO / "reward_function" / "shape_color.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    def shape_color(completions, answer, **_):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        inputs = [{"response": t, "ground_truth": a} for t, a in zip(texts, answer)]
        return [score["overall"] for score in module.compute_score(inputs)]

    return shape_color


def print_prompt_ids(model_dir: Path, data_dir: Path, count: int) -> None:
    """Print, as JSON, the prompt ids TRL's processor makes for the first ``count`` rows (as its HF path does)."""
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(model_dir)
    ids = []
    for row in load_rows(data_dir, count):
        messages = [
            {
                "role": "user",
                "content": [{"type": "image", "image": row["image"]}, {"type": "text", "text": QUESTION}],
            }
        ]
        encoded = processor.apply_chat_template(
            [messages], add_generation_prompt=True, tokenize=True, return_dict=True
        )
        ids.append([int(token) for token in encoded["input_ids"][0]])
    print("PROMPT_IDS " + json.dumps(ids))


def force_vllm_dtype(dtype: str) -> None:
    """Make TRL's colocated ``vllm.LLM`` run in ``dtype``: TRL passes no dtype, so vLLM picks ``auto``, which runs
    an fp32 checkpoint in bf16."""
    import trl.generation.vllm_generation as generation

    original = generation.LLM

    def llm_with_dtype(*args, **kwargs):
        kwargs["dtype"] = dtype
        return original(*args, **kwargs)

    generation.LLM = llm_with_dtype


def cpu_colocate_weight_sync() -> None:
    """Replace TRL's colocated weight sync with one that works on vLLM's CPU backend.

    TRL loads each parameter with ``model_runner.model.load_weights``; on the CPU backend vLLM has repacked its
    linear weights after loading, so that call fails (``'Parameter' object has no attribute 'weight_loader'``).
    vLLM's ``reload_weights`` with a weights iterator runs the full loading path, repacking included; afterwards the
    prefix and encoder caches must be dropped (the encoder cache still holds image features of the old weights, and
    the next image request fails with an encoder cache miss without the reset). The same calls easyr1 makes.
    """
    from trl.generation.vllm_generation import VLLMGeneration

    original = VLLMGeneration.sync_weights

    def sync_weights(self):
        if self.mode != "colocate":
            return original(self)
        weights = ((name, param.detach()) for name, param in self._iter_named_params())
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
        self.llm.reset_prefix_cache()
        self.llm.llm_engine.reset_encoder_cache()

    VLLMGeneration.sync_weights = sync_weights


def generation_kwargs(args: argparse.Namespace) -> dict:
    """Sampling settings that make TRL's generation the same work as easyr1's.

    - Exactly ``max_tokens`` tokens per sample (easyr1: ``ignore_eos``): the end token cannot be sampled earlier.
    - The image and video pad tokens are never sampled, as in easyr1 (a logit bias of -100 on both). TRL's HF path
      suppresses the image pad only and its vLLM path nothing; a sampled image pad in a completion then breaks the
      update's forward ("Image features and image tokens do not match").
    """
    config = json.loads((Path(args.model) / "config.json").read_text())
    banned = [config[key] for key in ("image_token_id", "video_token_id") if config.get(key) is not None]
    if args.engine == "vllm":
        return {"min_tokens": args.max_tokens, "logit_bias": {token: -100.0 for token in banned}}
    return {"min_new_tokens": args.max_tokens, "suppress_tokens": banned}


def config_overrides(pairs: list[str]) -> dict:
    """``KEY=VALUE`` pairs as ``GRPOConfig`` keyword arguments; a value is read as JSON where it parses as JSON
    (``true``, ``10``, ``"static"``), else kept as a string."""
    overrides = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        try:
            overrides[key] = json.loads(value)
        except json.JSONDecodeError:
            overrides[key] = value
    return overrides


def train(args: argparse.Namespace) -> dict:
    """Run GRPO for ``args.steps`` steps and return the measurements."""
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(args.threads)
    if args.engine == "vllm":
        cpu_colocate_weight_sync()
        if args.vllm_dtype != "auto":
            force_vllm_dtype(args.vllm_dtype)
    samples = args.prompts * args.n
    dataset = Dataset.from_list(load_rows(Path(args.data), args.prompts * (args.steps + 1)))
    settings = {
        "output_dir": args.workdir,
        "use_cpu": True,
        "bf16": args.bf16,
        "seed": args.seed,
        "max_steps": args.steps,
        "learning_rate": 1e-5,
        "lr_scheduler_type": "constant",
        "warmup_steps": 0,
        "weight_decay": 0.0,
        "max_grad_norm": 1.0,
        # one generation batch of prompts x n samples per optimizer step, used once, in one forward/backward pass
        "per_device_train_batch_size": samples,
        "gradient_accumulation_steps": 1,
        "steps_per_generation": 1,
        "num_iterations": 1,
        "num_generations": args.n,
        "max_completion_length": args.max_tokens,
        "temperature": 1.0,
        "beta": 0.0,
        "loss_type": "dapo",  # token losses averaged over all tokens of the batch: easyr1's token-mean
        "epsilon": 0.2,
        "epsilon_high": 0.3,  # easyr1's clip_ratio_low / clip_ratio_high defaults
        "use_vllm": args.engine == "vllm",
        "vllm_mode": "colocate",
        "vllm_max_model_length": 128,
        # every sample generates exactly max_tokens tokens, like easyr1's worker.rollout.ignore_eos=true: the
        # end-of-sequence token cannot be sampled before the last position
        "generation_kwargs": generation_kwargs(args),
        # TRL's GRPOConfig turns gradient checkpointing on by default: a recomputed forward in every backward, memory
        # a model this small does not need (the plain script and the independent run train without it)
        "gradient_checkpointing": False,
        "report_to": [],
        "save_strategy": "no",
        "dataloader_num_workers": 0,
        "disable_tqdm": True,
    }
    settings.update(config_overrides(args.set))
    config = GRPOConfig(**settings)
    steps: list[dict] = []

    ends = []
    profiler = cProfile.Profile() if args.profile else None

    class StepTimer(TrainerCallback):
        def on_train_begin(self, *_, **__):
            ends.append(time.perf_counter())

        def on_step_begin(self, *_, **__):
            if profiler is not None and len(steps) + 1 == args.profile_from:
                profiler.enable()
            steps.append(
                {
                    "start": time.perf_counter(),
                    "cpu0": time.process_time(),
                    "wall": time.time(),
                    "gen": 0.0,
                    "tokens": 0,
                }
            )

        def on_step_end(self, *_, **__):
            ends.append(time.perf_counter())
            steps[-1]["step"] = ends[-1] - steps[-1]["start"]
            steps[-1]["period"] = ends[-1] - ends[-2]
            steps[-1]["cpu"] = time.process_time() - steps[-1]["cpu0"]

    trainer = GRPOTrainer(
        model=args.model,
        reward_funcs=shape_colour_reward(),
        args=config,
        train_dataset=dataset,
        callbacks=[StepTimer()],
    )
    generate = trainer._generate

    def timed_generate(prompts):
        start = time.perf_counter()
        result = generate(prompts)
        steps[-1]["gen"] += time.perf_counter() - start
        steps[-1]["tokens"] += sum(len(ids) for ids in result[1])
        return result

    trainer._generate = timed_generate
    trainer.train()
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(args.profile)
    return {
        "steps": [
            {k: s[k] for k in ("step", "period", "cpu", "gen", "tokens")} | {"rest": s["step"] - s["gen"]}
            for s in steps
        ],
        "startup_s": steps[0]["wall"] - PROCESS_START,  # interpreter start to the first step's start
        "threads": torch.get_num_threads(),
        "param_dtype": str(next(trainer.model.parameters()).dtype),
        "vllm_dtype": str(trainer.vllm_generation.llm.llm_engine.model_config.dtype) if args.engine == "vllm" else "",
    }


def main() -> None:
    """Parse the arguments, run TRL, write the JSON result."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--data", required=True)
    parser.add_argument("--engine", choices=("hf", "vllm"), default="hf")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--bf16", action="store_true", help="TRL's bf16=True (mixed precision training)")
    parser.add_argument("--vllm-dtype", default="float32", help="dtype of the colocated vLLM engine, or 'auto'")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="a GRPOConfig field (repeatable), JSON value"
    )
    parser.add_argument("--profile", help="write a cProfile of the steps from --profile-from on to this file")
    parser.add_argument("--profile-from", type=int, default=3)
    parser.add_argument("--workdir", default="/tmp/peer_trl")
    parser.add_argument("--out", help="JSON result file")
    parser.add_argument("--print-prompt-ids", type=int, metavar="COUNT", help="only print TRL's prompt ids")
    args = parser.parse_args()
    if args.print_prompt_ids:
        print_prompt_ids(Path(args.model), Path(args.data), args.print_prompt_ids)
        return
    result = train(args)
    Path(args.out).write_text(json.dumps(result), encoding="utf-8")
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
