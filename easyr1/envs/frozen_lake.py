"""``frozen_lake``: walk on a frozen lake from the start to the goal without falling into a hole.

Each seed gives a ``size`` x ``size`` map: start and goal on two different cells, every other cell a hole with
probability ``hole_fraction``; maps without a path from start to goal (breadth-first search) are drawn again, so
every level can be solved. Not slippery by default; with ``is_slippery`` a move goes the intended way or to one of
its two sides, each with probability 1/3 (as in gym's FrozenLake), drawn from the episode's seed.

Rewards (gym's): 1.0 on reaching the goal, 0 otherwise; the episode ends at the goal (``success``) or in a hole.
A move into the lake's edge leaves the player in place. Text without one of up/down/left/right is an invalid
action: nothing changes, reward 0 (the trainer adds ``env.format_penalty``).
"""

from __future__ import annotations

import random
from collections import deque

from easyr1.envs.actions import first_word
from easyr1.envs.base import Environment, Observation, StepResult
from easyr1.envs.grid import MOVE_WORDS, MOVES, Cell, check_int, check_render_settings, observation, step_info
from easyr1.envs.registry import register_env
from easyr1.errors import EnvError


Position = tuple[int, int]
FROZEN, HOLE, GOAL = "_", "O", "G"
FILLS = {FROZEN: (170, 215, 240), HOLE: (20, 30, 90), GOAL: (40, 170, 70)}
PLAYER = (220, 40, 40)
# Moves perpendicular to each move: where a slippery step may go instead.
SIDEWAYS = {"up": ("left", "right"), "down": ("left", "right"), "left": ("up", "down"), "right": ("up", "down")}
_MAX_DRAWS = 10_000


def shortest_path_length(tiles: list[list[str]], start: Position, goal: Position) -> int | None:
    """Moves on the shortest hole-free path from ``start`` to ``goal`` (breadth-first search), None if none."""
    size = len(tiles)
    distance = {start: 0}
    queue = deque([start])
    while queue:
        here = queue.popleft()
        if here == goal:
            return distance[here]
        for dr, dc in MOVES.values():
            there = (here[0] + dr, here[1] + dc)
            if 0 <= there[0] < size and 0 <= there[1] < size and there not in distance:
                if tiles[there[0]][there[1]] != HOLE:
                    distance[there] = distance[here] + 1
                    queue.append(there)
    return None


def generate_map(size: int, hole_fraction: float, rng: random.Random) -> tuple[list[list[str]], Position, Position]:
    """A solvable map drawn from ``rng``: (tiles, start, goal)."""
    cells = [(row, column) for row in range(size) for column in range(size)]
    for _ in range(_MAX_DRAWS):
        start, goal = rng.sample(cells, 2)
        tiles = [[FROZEN] * size for _ in range(size)]
        for row, column in cells:
            if (row, column) not in (start, goal) and rng.random() < hole_fraction:
                tiles[row][column] = HOLE
        tiles[goal[0]][goal[1]] = GOAL
        if shortest_path_length(tiles, start, goal) is not None:
            return tiles, start, goal
    raise EnvError(
        f"`env.env_kwargs.hole_fraction` = {hole_fraction} leaves no path from start to goal in {_MAX_DRAWS} "
        f"draws of a {size}x{size} map; lower it"
    )


@register_env("frozen_lake")
class FrozenLakeEnv(Environment):
    """Reach the goal of a seeded frozen lake without stepping into a hole (see the module docstring).

    Args:
        size: the map's side in cells (2 to 16).
        hole_fraction: probability that a cell other than start and goal is a hole (0 to 0.8).
        is_slippery: whether a move may slide to one side (each side 1/3), drawn from the seed.
        render_mode: ``vision`` (an ``<image>`` of the map) or ``text`` (the map as characters).
        cell_size: pixels per cell in vision mode.
    """

    def __init__(
        self,
        size: int = 4,
        hole_fraction: float = 0.2,
        is_slippery: bool = False,
        render_mode: str = "vision",
        cell_size: int = 28,
    ) -> None:
        check_render_settings(render_mode, cell_size)
        self.size = check_int("size", size, 2, 16)
        if (
            isinstance(hole_fraction, bool)
            or not isinstance(hole_fraction, (int, float))
            or not 0 <= hole_fraction <= 0.8
        ):
            raise EnvError(f"`env.env_kwargs.hole_fraction` = {hole_fraction!r} must be a number from 0 to 0.8")
        if not isinstance(is_slippery, bool):
            raise EnvError(f"`env.env_kwargs.is_slippery` = {is_slippery!r} must be true or false")
        self.hole_fraction = float(hole_fraction)
        self.is_slippery = is_slippery
        self.render_mode = render_mode
        self.cell_size = cell_size
        self._rng = random.Random(0)
        self._tiles: list[list[str]] = []
        self._player: Position | None = None
        self.goal: Position = (0, 0)
        self._done = False

    def system_prompt(self) -> str:
        """The task, the legend (text mode) and the answer format."""
        legend = (
            "The player is red, frozen ice is light blue, holes are dark blue and the goal is green."
            if self.render_mode == "vision"
            else "P is you, _ is frozen ice, O is a hole and G is the goal."
        )
        slippery = " The ice is slippery: you may slide to the side." if self.is_slippery else ""
        return (
            f"You are walking on a frozen lake. Reach the goal without falling into a hole. {legend}{slippery} "
            "Answer with one word: up, down, left or right."
        )

    def reset(self, seed: int) -> Observation:
        """Draw the map of ``seed`` and put the player on its start."""
        self._rng = random.Random(seed)
        self._tiles, self._player, self.goal = generate_map(self.size, self.hole_fraction, self._rng)
        self._done = False
        return self._observe()

    def step(self, action_text: str) -> StepResult:
        """Move by the first move word of ``action_text`` (maybe sideways when slippery)."""
        if self._player is None or self._done:
            raise RuntimeError("FrozenLakeEnv.step called before reset or after the episode ended")
        action = first_word(action_text, MOVE_WORDS)
        if action is None:
            return self._observe(), 0.0, False, step_info(None, success=False, hole=False)
        move = action
        if self.is_slippery:
            move = (action, *SIDEWAYS[action])[self._rng.randrange(3)]
        row, column = self._player[0] + MOVES[move][0], self._player[1] + MOVES[move][1]
        if 0 <= row < self.size and 0 <= column < self.size:
            self._player = (row, column)
        tile = self._tiles[self._player[0]][self._player[1]]
        success, hole = tile == GOAL, tile == HOLE
        self._done = success or hole
        return self._observe(), float(success), self._done, step_info(action, success=success, hole=hole)

    def _observe(self) -> Observation:
        cells = [
            [
                Cell(FILLS[tile], "P", mark=PLAYER) if (row, column) == self._player else Cell(FILLS[tile], tile)
                for column, tile in enumerate(line)
            ]
            for row, line in enumerate(self._tiles)
        ]
        return observation("", cells, self.render_mode, self.cell_size)
