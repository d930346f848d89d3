"""What the shipped grid worlds share: moves, rendering cells as an image or as characters, kwarg checks.

A grid is rows of :class:`Cell` (a fill colour, an optional centred mark, a character for text mode). In vision mode
an observation is the text with one ``<image>`` marker and the grid drawn as an RGB image of ``cell_size`` pixels
per cell; in text mode it is the text followed by the grid as characters, one line per row, and no image.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from PIL import Image, ImageDraw

from easyr1.envs.base import IMAGE_MARKER, Observation
from easyr1.errors import EnvError


RGB = tuple[int, int, int]
RENDER_MODES = ("vision", "text")
# The four moves of every shipped environment: (row, column) offsets.
MOVES: dict[str, tuple[int, int]] = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}
MOVE_WORDS = tuple(MOVES)
KWARGS_KEY = "env.env_kwargs"


@dataclass(frozen=True)
class Cell:
    """How one cell looks: its fill, an optional square mark in its middle (``mark_size`` of the cell's side), and
    its character in text mode."""

    fill: RGB
    char: str
    mark: RGB | None = None
    mark_size: float = 0.6


def render_image(cells: Sequence[Sequence[Cell]], cell_size: int) -> Image.Image:
    """The grid as an RGB image, ``cell_size`` pixels per cell."""
    rows, columns = len(cells), len(cells[0])
    image = Image.new("RGB", (columns * cell_size, rows * cell_size))
    draw = ImageDraw.Draw(image)
    for row, line in enumerate(cells):
        for column, cell in enumerate(line):
            left, top = column * cell_size, row * cell_size
            draw.rectangle((left, top, left + cell_size - 1, top + cell_size - 1), fill=cell.fill)
            if cell.mark is not None:
                margin = round(cell_size * (1 - cell.mark_size) / 2)
                inner = (left + margin, top + margin, left + cell_size - 1 - margin, top + cell_size - 1 - margin)
                draw.rectangle(inner, fill=cell.mark)
    return image


def render_text(cells: Sequence[Sequence[Cell]]) -> str:
    """The grid as characters, one line per row."""
    return "\n".join("".join(cell.char for cell in line) for line in cells)


def observation(text: str, cells: Sequence[Sequence[Cell]], render_mode: str, cell_size: int) -> Observation:
    """``text`` then the grid: an ``<image>`` marker and its image (vision mode), or the grid's characters (text)."""
    if render_mode == "vision":
        return Observation(text + IMAGE_MARKER, [render_image(cells, cell_size)])
    return Observation(text + render_text(cells))


def check_render_settings(render_mode: str, cell_size: int) -> None:
    """EnvError naming the kwarg when ``render_mode`` or ``cell_size`` is not usable."""
    if render_mode not in RENDER_MODES:
        raise EnvError(
            f"`{KWARGS_KEY}.render_mode` = {render_mode!r} is not supported; use one of {', '.join(RENDER_MODES)}"
        )
    if not isinstance(cell_size, int) or isinstance(cell_size, bool) or cell_size < 1:
        raise EnvError(f"`{KWARGS_KEY}.cell_size` = {cell_size!r} must be a positive number of pixels")


def check_int(name: str, value: object, low: int, high: int | None = None) -> int:
    """``value`` when it is an int in [low, high]; else EnvError naming ``env.env_kwargs.<name>``."""
    if not isinstance(value, int) or isinstance(value, bool) or value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise EnvError(f"`{KWARGS_KEY}.{name}` = {value!r} must be an integer {bound}")
    return value


def step_info(action: str | None, success: bool, **extra: object) -> dict[str, object]:
    """The info every shipped environment returns: the parsed action (None if unreadable), validity, success."""
    return {"action": action, "action_valid": action is not None, "success": success, **extra}
