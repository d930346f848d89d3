"""Data pipeline throughput: rows per second through load + process + collate, with 0 and 2 loader workers.

A generated dataset of photo-sized images (1 to 3 per row, 448x448 JPEGs with noise, so decoding costs what real
photos cost) goes through ``RLDataset`` (decode, resize to the processor's grid, process, m-rope positions) and a
torch ``DataLoader`` with ``collate_fn``, as the trainer's prompt stream does. Prints rows/s for each setting and
their ratio; the ratio says whether ``data.dataloader_num_workers`` pays off on this machine.

    python bench/bench_data.py [--rows 192] [--batch 16] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import time
from pathlib import Path

import torch
from PIL import Image
from torch.utils.data import DataLoader

from easyr1.data import RLDataset, collate_fn
from easyr1.models.loading import load_model_config, load_tokenizer_and_processor
from easyr1.tools.tiny_model import build_tiny_model


def write_photo_dataset(root: Path, rows: int, seed: int = 0) -> Path:
    """``rows`` rows of 1-3 noisy 448x448 JPEG images each; returns the jsonl path."""
    rng = random.Random(seed)
    (root / "images").mkdir(parents=True)
    lines = []
    for index in range(rows):
        names = []
        for k in range(rng.randint(1, 3)):
            noise = bytes(rng.getrandbits(8) for _ in range(448 * 448 * 3 // 64))
            image = Image.frombytes("RGB", (56, 56), noise).resize((448, 448), Image.Resampling.BICUBIC)
            names.append(f"images/{index:04d}_{k}.jpg")
            image.save(root / names[-1], quality=90)
        markers = "<image>" * len(names)
        lines.append(json.dumps({"problem": f"{markers}What colours do you see?", "answer": "red", "images": names}))
    path = root / "train.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    return path


def rows_per_second(dataset: RLDataset, batch_size: int, workers: int, repeats: int) -> float:
    """Rows/s over ``repeats`` passes (after one warm-up pass that also starts the worker processes)."""
    loader = DataLoader(dataset, batch_size=batch_size, collate_fn=collate_fn, num_workers=workers,
                        persistent_workers=workers > 0)  # fmt: skip
    for _ in loader:
        pass
    start, rows = time.perf_counter(), 0
    for _ in range(repeats):
        for batch in loader:
            rows += len(batch)
    return rows / (time.perf_counter() - start)


def main() -> None:
    """Build the data, measure both settings, print rows/s and the ratio."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=192)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.setdefault("OMP_NUM_THREADS", "1")))

    root = Path(tempfile.mkdtemp(prefix="bench_data_"))
    model_dir = build_tiny_model(root / "model")
    data_file = write_photo_dataset(root / "data", args.rows)
    tokenizer, processor = load_tokenizer_and_processor(str(model_dir))
    start = time.perf_counter()
    dataset = RLDataset(
        str(data_file),
        tokenizer,
        processor,
        prompt_key="problem",
        max_prompt_length=128,
        model_config=load_model_config(str(model_dir)),
    )
    check_seconds = time.perf_counter() - start
    serial = rows_per_second(dataset, args.batch, 0, args.repeats)
    parallel = rows_per_second(dataset, args.batch, 2, args.repeats)
    print(f"rows={len(dataset)} batch={args.batch} cpus={os.cpu_count()}")
    print(f"load-time checks (headers, integrity, prompt lengths): {len(dataset) / check_seconds:.0f} rows/s")
    print(f"loader workers=0: {serial:.1f} rows/s")
    print(f"loader workers=2: {parallel:.1f} rows/s")
    print(f"ratio workers=2 / workers=0: {parallel / serial:.2f}")


if __name__ == "__main__":
    main()
