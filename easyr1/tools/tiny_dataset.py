"""Build the synthetic "what colour is the shape?" dataset used by the CPU demo and the tests.

Every image shows one circle, square or triangle in red, green, blue or yellow on a white or light grey
background; the answer is the colour word. ``python -m easyr1.tools.tiny_dataset OUT_DIR`` writes
``train.jsonl``, ``val.jsonl`` and ``images/*.png``. With ``--mixed`` it writes the mixed dataset instead
(:func:`build_mixed_dataset`): text-only, one-image, three-image and video rows in turn, for tests of batches that
mix them.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from PIL import Image, ImageDraw

from easyr1.tools.shape_task import COLOURS, PROMPT, SHAPES


__all__ = ["COLOURS", "MIXED_KINDS", "PROMPT", "SHAPES", "build_mixed_dataset", "build_shape_dataset"]


_RGB = {"red": (220, 30, 30), "green": (30, 170, 40), "blue": (30, 60, 220), "yellow": (235, 210, 20)}
_COLOUR_JITTER = 20  # per channel, so the model cannot key on one exact pixel value


def _jitter(value: int, rng: random.Random) -> int:
    return max(0, min(255, value + rng.randint(-_COLOUR_JITTER, _COLOUR_JITTER)))


def _paint(
    shape: str, fill: tuple[int, ...], background: int, box: tuple[int, int, int], image_size: int
) -> Image.Image:
    """``shape`` filled with ``fill`` on a plain grey-level ``background``; ``box`` is (left, top, side)."""
    left, top, side = box
    image = Image.new("RGB", (image_size, image_size), (background,) * 3)
    corners = (left, top, left + side - 1, top + side - 1)
    draw = ImageDraw.Draw(image)
    if shape == "circle":
        draw.ellipse(corners, fill=fill)
    elif shape == "square":
        draw.rectangle(corners, fill=fill)
    elif shape == "triangle":
        draw.polygon([(left + (side - 1) / 2, top), (corners[2], corners[3]), (left, corners[3])], fill=fill)
    else:
        raise ValueError(f"unknown shape {shape!r}; choose one of {SHAPES}")
    return image


def draw_shape(shape: str, colour: str, image_size: int, rng: random.Random) -> Image.Image:
    """One RGB image of ``shape`` in ``colour``: side 0.5-0.9 of the image, placed fully inside at random."""
    background = 255 if rng.random() < 0.5 else rng.randint(215, 235)
    side = rng.randint(round(0.5 * image_size), round(0.9 * image_size))
    left = rng.randint(0, image_size - side)
    top = rng.randint(0, image_size - side)
    fill = tuple(_jitter(channel, rng) for channel in _RGB[colour])
    return _paint(shape, fill, background, (left, top, side), image_size)


def moving_shape_frames(
    shape: str, colour: str, image_size: int, rng: random.Random, num_frames: int = 4
) -> list[Image.Image]:
    """Video frames of one ``shape`` in ``colour`` sliding right by the same number of pixels each frame.

    The side is 0.4-0.6 of the image so that the shape has room to move and stays fully inside every frame.
    """
    if num_frames < 1:
        raise ValueError(f"num_frames must be at least 1, got {num_frames}")
    background = 255 if rng.random() < 0.5 else rng.randint(215, 235)
    side = rng.randint(round(0.4 * image_size), round(0.6 * image_size))
    step = max(1, (image_size - side) // (2 * max(num_frames - 1, 1)))  # the path spans about half the free room
    left = rng.randint(0, image_size - side - (num_frames - 1) * step)
    top = rng.randint(0, image_size - side)
    fill = tuple(_jitter(channel, rng) for channel in _RGB[colour])
    return [_paint(shape, fill, background, (left + k * step, top, side), image_size) for k in range(num_frames)]


def _write_split(out_dir: Path, split: str, count: int, seed: int, image_size: int) -> None:
    # A string seed gives each split its own stream that does not depend on the other split's size.
    rng = random.Random(f"shapes-{split}-{seed}")
    colours = [COLOURS[i % len(COLOURS)] for i in range(count)]  # balanced up to one sample per colour
    rng.shuffle(colours)
    lines = []
    for index, colour in enumerate(colours):
        shape = SHAPES[rng.randrange(len(SHAPES))]
        relative_path = f"images/{split}_{index:05d}.png"
        draw_shape(shape, colour, image_size, rng).save(out_dir / relative_path, format="PNG")
        lines.append(json.dumps({"problem": PROMPT, "answer": colour, "images": [relative_path]}))
    (out_dir / f"{split}.jsonl").write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def build_shape_dataset(
    out_dir: str | Path, num_train: int = 2048, num_val: int = 128, seed: int = 0, image_size: int = 56
) -> Path:
    """Write ``train.jsonl``, ``val.jsonl`` and ``images/`` into ``out_dir``; the same seed gives the same bytes."""
    if num_train < 0 or num_val < 0:
        raise ValueError(f"sample counts must be >= 0, got num_train={num_train}, num_val={num_val}")
    if image_size < 8:
        raise ValueError(f"image_size must be at least 8 pixels, got {image_size}")
    out_dir = Path(out_dir)
    (out_dir / "images").mkdir(parents=True, exist_ok=True)
    _write_split(out_dir, "train", num_train, seed, image_size)
    _write_split(out_dir, "val", num_val, seed, image_size)
    return out_dir


# Text-only questions of the mixed dataset, answered by a colour word like every other row.
_TEXT_QUESTIONS = (("grass", "green"), ("the sky", "blue"), ("a banana", "yellow"), ("a ripe tomato", "red"))
MIXED_KINDS = ("text", "image", "three_images", "video")


def build_mixed_dataset(
    out_dir: str | Path, num_rows: int = 64, seed: int = 0, image_size: int = 56, num_frames: int = 4
) -> Path:
    """Write ``train.jsonl`` and ``images/`` whose rows cycle through the four kinds a batch can mix.

    In order: a text-only question ("What colour is grass?"), one shape image (the shape task), three shape
    images (the answer is the first shape's colour), and a video of one shape moving across ``num_frames``
    frames, given as a list of frame files. Every answer is a colour word; the same seed gives the same bytes.
    Returns ``out_dir``.
    """
    if num_rows < 0:
        raise ValueError(f"num_rows must be >= 0, got {num_rows}")
    if image_size < 8:
        raise ValueError(f"image_size must be at least 8 pixels, got {image_size}")
    out_dir = Path(out_dir)
    (out_dir / "images").mkdir(parents=True, exist_ok=True)
    rng = random.Random(f"mixed-{seed}")

    def save(image: Image.Image, name: str) -> str:
        image.save(out_dir / "images" / name, format="PNG")
        return f"images/{name}"

    def random_shape() -> str:
        return SHAPES[rng.randrange(len(SHAPES))]

    lines = []
    for index in range(num_rows):
        kind, colour = MIXED_KINDS[index % len(MIXED_KINDS)], COLOURS[rng.randrange(len(COLOURS))]
        if kind == "text":
            thing, colour = _TEXT_QUESTIONS[rng.randrange(len(_TEXT_QUESTIONS))]
            row = {"problem": f"What colour is {thing}?", "answer": colour}
        elif kind == "image":
            image = draw_shape(random_shape(), colour, image_size, rng)
            row = {"problem": PROMPT, "answer": colour, "images": [save(image, f"{index:05d}.png")]}
        elif kind == "three_images":
            colours = [colour, *(COLOURS[rng.randrange(len(COLOURS))] for _ in range(2))]
            images = [
                save(draw_shape(random_shape(), c, image_size, rng), f"{index:05d}_{k}.png")
                for k, c in enumerate(colours)
            ]
            row = {
                "problem": "<image><image><image>What colour is the first shape?",
                "answer": colour,
                "images": images,
            }
        else:
            frames = moving_shape_frames(random_shape(), colour, image_size, rng, num_frames)
            paths = [save(frame, f"{index:05d}_f{k}.png") for k, frame in enumerate(frames)]
            row = {"problem": "<video>What colour is the moving shape?", "answer": colour, "videos": [paths]}
        lines.append(json.dumps(row))
    (out_dir / "train.jsonl").write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return out_dir


def main(argv: list[str] | None = None) -> None:
    """Command line entry point: build the shape dataset."""
    parser = argparse.ArgumentParser(description="Build the synthetic shape-colour dataset (or the mixed one).")
    parser.add_argument("out_dir", help="directory to write train.jsonl, val.jsonl and images/ into")
    parser.add_argument("--num-train", type=int, default=2048, help="number of training rows")
    parser.add_argument("--num-val", type=int, default=128, help="number of validation rows")
    parser.add_argument("--seed", type=int, default=0, help="random seed")
    parser.add_argument("--image-size", type=int, default=56, help="side of the square images in pixels")
    parser.add_argument("--mixed", action="store_true", help="text, 1-image, 3-image and video rows (train only)")
    args = parser.parse_args(argv)
    if args.mixed:
        path = build_mixed_dataset(args.out_dir, args.num_train, args.seed, args.image_size)
        print(f"wrote {args.num_train} mixed rows to {path}")
        return
    path = build_shape_dataset(args.out_dir, args.num_train, args.num_val, args.seed, args.image_size)
    print(f"wrote {args.num_train} training and {args.num_val} validation rows to {path}")


if __name__ == "__main__":
    main()
