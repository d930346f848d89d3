"""Data pipeline throughput: rows per second through load + process + collate, with 0 and 2 loader workers.

A generated dataset of photo-sized images (1 to 3 per row, 448x448 JPEGs with noise, so decoding costs what real
photos cost) goes through ``RLDataset`` (decode, resize to the processor's grid, process, m-rope positions) and a
torch ``DataLoader`` with ``collate_fn``, as the trainer's prompt stream does. Prints rows/s for each setting and
their ratio (the ratio says whether ``data.dataloader_num_workers`` pays off on this machine), the rate of the
load-time row checks, and what the image integrity check costs per row against a header read and a full decode,
on these photos and on the demo's 56x56 PNG shapes.

    python bench/bench_data.py [--rows 256] [--batch 16] [--repeats 1]
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
from easyr1.data.vision import image_size, load_image
from easyr1.models.loading import load_model_config, load_tokenizer_and_processor
from easyr1.tools.tiny_dataset import build_shape_dataset
from easyr1.tools.tiny_model import build_tiny_model


def write_photo_dataset(root: Path, rows: int, seed: int = 0) -> Path:
    """``rows`` rows of 1-3 noisy 448x448 JPEG images each; returns the jsonl path."""
    rng = random.Random(seed)
    (root / "images").mkdir(parents=True)
    lines = []
    for index in range(rows):
        names = []
        for k in range(rng.randint(1, 3)):
            noise = bytes(rng.getrandbits(8) for _ in range(56 * 56 * 3))
            image = Image.frombytes("RGB", (56, 56), noise).resize((448, 448), Image.Resampling.BICUBIC)
            names.append(f"images/{index:04d}_{k}.jpg")
            image.save(root / names[-1], quality=90)
        markers = "<image>" * len(names)
        lines.append(json.dumps({"problem": f"{markers}What colours do you see?", "answer": "red", "images": names}))
    path = root / "train.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    return path


def rows_per_second(dataset: RLDataset, batch_size: int, workers: int, repeats: int) -> float:
    """Rows/s over ``repeats`` passes, after two warm-up batches (which also start the worker processes)."""
    loader = DataLoader(dataset, batch_size=batch_size, collate_fn=collate_fn, num_workers=workers,
                        persistent_workers=workers > 0)  # fmt: skip
    warm_up = iter(loader)
    for _ in range(2):
        next(warm_up)
    del warm_up
    start, rows = time.perf_counter(), 0
    for _ in range(repeats):
        for batch in loader:
            rows += len(batch)
    return rows / (time.perf_counter() - start)


def image_check_costs(data_file: Path) -> dict[str, float]:
    """Milliseconds per row to read every image's header, to also check its integrity (what loading the data
    does), and to decode it fully (what an item does)."""
    rows = [json.loads(line) for line in data_file.read_text().splitlines()]
    images = [image for row in rows for image in row["images"]]
    costs = {}
    for name, read in (
        ("header", lambda value: image_size(value, data_file.parent, "bench")),
        ("header + integrity", lambda value: image_size(value, data_file.parent, "bench", verify=True)),
        ("full decode", lambda value: load_image(value, data_file.parent, "bench")),
    ):
        start = time.perf_counter()
        for value in images:
            read(value)
        costs[name] = (time.perf_counter() - start) * 1e3 / len(rows)
    return costs


def main() -> None:
    """Build the data, measure both settings and the check costs, print rows/s, ratio and milliseconds."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.setdefault("OMP_NUM_THREADS", "1")))

    with tempfile.TemporaryDirectory(prefix="bench_data_") as tmp:
        root = Path(tmp)
        model_dir = build_tiny_model(root / "model")
        data_file = write_photo_dataset(root / "data", args.rows)
        shapes_file = build_shape_dataset(root / "shapes", num_train=args.rows, num_val=4, seed=0) / "train.jsonl"
        tokenizer, processor = load_tokenizer_and_processor(str(model_dir))
        start = time.perf_counter()
        dataset = RLDataset(str(data_file), tokenizer, processor, prompt_key="problem", max_prompt_length=128,
                            model_config=load_model_config(str(model_dir)))  # fmt: skip
        check_seconds = time.perf_counter() - start
        serial = rows_per_second(dataset, args.batch, 0, args.repeats)
        parallel = rows_per_second(dataset, args.batch, 2, args.repeats)
        costs = {
            "448x448 JPEG photos": image_check_costs(data_file),
            "56x56 PNG shapes": image_check_costs(shapes_file),
        }

    print(f"rows={len(dataset)} (1-3 images each) batch={args.batch} cpus={os.cpu_count()}")
    print(f"load-time row checks (headers, integrity, prompt lengths): {len(dataset) / check_seconds:.0f} rows/s")
    print(f"loader workers=0: {serial:.1f} rows/s")
    print(f"loader workers=2: {parallel:.1f} rows/s")
    print(f"ratio workers=2 / workers=0: {parallel / serial:.2f}")
    for data, cost in costs.items():
        print(f"image reads, ms per row, {data}: " + ", ".join(f"{name} {ms:.2f}" for name, ms in cost.items()))


if __name__ == "__main__":
    main()
