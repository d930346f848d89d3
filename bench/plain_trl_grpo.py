"""The plain TRL script: the ``GRPOTrainer`` run a TRL user would write for the peer bench's work, nothing else.

The reference that ``bench/peer_trl.py`` (the bench's TRL side) is checked against: the same model directory, the
same rows and 84x84 images, 4 prompts x 8 samples x 32 new tokens per step, beta 0, fp32, 2 threads, HF ``generate``,
no gradient checkpointing. Everything else is left at TRL's defaults. It prints the median seconds per step over
steps 2-8 (one step = one optimizer step, timed by a callback from ``on_step_begin`` to ``on_step_end``).

    OMP_NUM_THREADS=2 bench/.venv-trl/bin/python bench/plain_trl_grpo.py \
        --model .cache/peerbench/model-0.6M --data .cache/peerbench/data [--out FILE]
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from datasets import Dataset
from PIL import Image
from transformers import TrainerCallback
from trl import GRPOConfig, GRPOTrainer


sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from reward_function.shape_color import compute_score  # noqa: E402  the reward easyr1's side scores with


parser = argparse.ArgumentParser()
parser.add_argument("--model", required=True)
parser.add_argument("--data", required=True)
parser.add_argument("--steps", type=int, default=10)
parser.add_argument("--out", help="also write the per-step times here as JSON")
parser.add_argument("--workdir", default="/tmp/plain_trl_grpo")
args = parser.parse_args()
torch.set_num_threads(2)

# the shape task's rows as conversational image rows: 4 prompts per step, one more step's worth to spare
rows = []
for line in (Path(args.data) / "train.jsonl").read_text().splitlines()[: 4 * (args.steps + 1)]:
    record = json.loads(line)
    question = record["problem"].removeprefix("<image>")
    rows.append(
        {
            "prompt": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question}]}],
            "image": Image.open(Path(args.data) / record["images"][0]).convert("RGB"),
            "answer": record["answer"],
        }
    )


def shape_color(completions, answer, **kwargs):
    scores = compute_score([{"response": c[-1]["content"], "ground_truth": a} for c, a in zip(completions, answer)])
    return [score["overall"] for score in scores]


step_times, cpu_times = [], []


class StepTimer(TrainerCallback):
    def on_step_begin(self, *args, **kwargs):
        self.start, self.cpu = time.perf_counter(), time.process_time()

    def on_step_end(self, *args, **kwargs):
        step_times.append(time.perf_counter() - self.start)
        cpu_times.append(time.process_time() - self.cpu)


config = GRPOConfig(
    output_dir=args.workdir,
    use_cpu=True,
    bf16=False,
    gradient_checkpointing=False,
    max_steps=args.steps,
    per_device_train_batch_size=32,  # 4 prompts x 8 samples
    num_generations=8,
    max_completion_length=32,
    generation_kwargs={"min_new_tokens": 32},  # every sample 32 tokens long, as on easyr1's side
    beta=0.0,
    learning_rate=1e-5,
    lr_scheduler_type="constant",
    report_to="none",
    save_strategy="no",
)
trainer = GRPOTrainer(
    model=args.model,
    reward_funcs=shape_color,
    args=config,
    train_dataset=Dataset.from_list(rows),
    callbacks=[StepTimer()],
)
trainer.train()

median = statistics.median(step_times[1:8])  # steps 2-8
print(f"plain GRPOTrainer: {median:.3f} s/step (median of steps 2-8; threads {torch.get_num_threads()})")
print("steps: " + " ".join(f"{t:.3f}" for t in step_times))
if args.out:
    steps = [
        {"step": t, "cpu": c, "gen": float("nan"), "rest": float("nan"), "tokens": float("nan")}
        for t, c in zip(step_times, cpu_times)
    ]
    Path(args.out).write_text(json.dumps({"steps": steps, "threads": torch.get_num_threads()}))
