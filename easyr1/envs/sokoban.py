"""``sokoban``: push every box onto a target, seen as an image of the room (or as characters in text mode).

Levels come from the seed the way gym-sokoban makes them: a random walk carves the room's floor inside the outer
wall, boxes start on their targets, and the player then walks backwards for a while, pulling any box it backs away
from. Every pull is a push played in reverse, so the level reached can be solved; the level kept is the one along
the walk whose boxes ended farthest from their targets (at least one box off target), with the player then put on
a random cell it can walk to from there (a walk is a walk played in reverse too).

Rewards follow gym-sokoban, which RAGEN uses: -0.1 per move, +1 for a box pushed onto a target, -1 for a box
pushed off one, +10 when every box is on a target (the episode then ends with ``success``). A move into a wall, or
a push into a wall or another box, leaves the room as it was and still costs the step. Text without one of
up/down/left/right is an invalid action: nothing changes, reward 0 (the trainer adds ``env.format_penalty``).
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass

from easyr1.envs.actions import first_word
from easyr1.envs.base import Environment, Observation, StepResult
from easyr1.envs.grid import MOVE_WORDS, MOVES, Cell, check_int, check_render_settings, observation, step_info
from easyr1.envs.registry import register_env
from easyr1.errors import EnvError


Position = tuple[int, int]
STEP_PENALTY = -0.1
BOX_ON_TARGET = 1.0
BOX_OFF_TARGET = -1.0
SOLVED_BONUS = 10.0

WALL_FILL, FLOOR_FILL, TARGET_FILL = (110, 70, 40), (30, 30, 30), (130, 30, 30)
BOX, BOX_ON_TARGET_MARK, PLAYER = (210, 160, 60), (60, 190, 70), (70, 130, 240)
_MAX_DRAWS = 1_000


@dataclass(frozen=True)
class Level:
    """A room: its floor cells (everything else is wall), the targets, the boxes and the player."""

    size: int
    floor: frozenset[Position]
    targets: frozenset[Position]
    boxes: frozenset[Position]
    player: Position

    @property
    def solved(self) -> bool:
        """Whether every box is on a target."""
        return self.boxes == self.targets


def _shift(position: Position, move: str, steps: int = 1) -> Position:
    return position[0] + steps * MOVES[move][0], position[1] + steps * MOVES[move][1]


def push(level: Level, move: str) -> Level:
    """The level after the player tries ``move``: walks, pushes one box, or stays (wall, blocked box)."""
    ahead = _shift(level.player, move)
    if ahead not in level.floor:
        return level
    if ahead in level.boxes:
        beyond = _shift(level.player, move, 2)
        if beyond not in level.floor or beyond in level.boxes:
            return level
        return Level(level.size, level.floor, level.targets, (level.boxes - {ahead}) | {beyond}, ahead)
    return Level(level.size, level.floor, level.targets, level.boxes, ahead)


def solution_length(level: Level, max_states: int = 200_000) -> int | None:
    """Moves of a shortest solution (breadth-first search over player and box positions), None if unsolvable."""
    start = (level.player, level.boxes)
    distance = {start: 0}
    queue = deque([level])
    while queue and len(distance) <= max_states:
        here = queue.popleft()
        if here.solved:
            return distance[(here.player, here.boxes)]
        for move in MOVE_WORDS:
            there = push(here, move)
            key = (there.player, there.boxes)
            if key not in distance:
                distance[key] = distance[(here.player, here.boxes)] + 1
                queue.append(there)
    return None


def _carve_floor(size: int, rng: random.Random) -> set[Position]:
    """Floor cells of a random walk inside the outer wall, about 1.5 steps per inner cell."""
    inner = size - 2
    position = (rng.randrange(1, size - 1), rng.randrange(1, size - 1))
    floor = {position}
    for _ in range(int(1.5 * inner * inner)):
        move = MOVES[rng.choice(MOVE_WORDS)]
        row = min(max(position[0] + move[0], 1), size - 2)
        column = min(max(position[1] + move[1], 1), size - 2)
        position = (row, column)
        floor.add(position)
    return floor


def _pull_walk(level: Level, steps: int, rng: random.Random) -> Level:
    """Walk the player backwards ``steps`` times, pulling boxes; the state whose boxes are farthest from targets."""
    best, best_score = level, 0
    boxes, player = set(level.boxes), level.player
    for _ in range(steps):
        move = rng.choice(MOVE_WORDS)
        ahead = _shift(player, move)
        if ahead not in level.floor or ahead in boxes:
            continue
        behind = _shift(player, move, -1)
        if behind in boxes:
            boxes.remove(behind)
            boxes.add(player)
        player = ahead
        # Each box's distance to its nearest target: a cheap measure of how much pushing the level needs.
        score = sum(min(abs(b[0] - t[0]) + abs(b[1] - t[1]) for t in level.targets) for b in boxes)
        if score > best_score:
            best, best_score = Level(level.size, level.floor, level.targets, frozenset(boxes), player), score
    return best


def _walkable_from(level: Level) -> list[Position]:
    """Floor cells the player reaches from where it stands without moving a box, sorted."""
    seen = {level.player}
    queue = deque([level.player])
    while queue:
        here = queue.popleft()
        for move in MOVE_WORDS:
            there = _shift(here, move)
            if there in level.floor and there not in level.boxes and there not in seen:
                seen.add(there)
                queue.append(there)
    return sorted(seen)


def generate_level(size: int, num_boxes: int, rng: random.Random) -> Level:
    """A solvable, unsolved room of ``size`` x ``size`` cells (outer wall included) with ``num_boxes`` boxes."""
    for _ in range(_MAX_DRAWS):
        floor = _carve_floor(size, rng)
        if len(floor) < num_boxes + 2:
            continue
        cells = sorted(floor)
        targets = frozenset(rng.sample(cells, num_boxes))
        player = rng.choice([cell for cell in cells if cell not in targets])
        start = Level(size, frozenset(floor), targets, targets, player)
        level = _pull_walk(start, steps=20 * (size - 2) * num_boxes, rng=rng)
        if not level.solved:
            # Walking without pulling is a walk played in reverse too: any cell the player reaches that way is a
            # solvable start, and most are farther from the box than the spot where the last pull left it.
            player = rng.choice(_walkable_from(level))
            return Level(size, level.floor, level.targets, level.boxes, player)
    raise EnvError(
        f"no {size}x{size} sokoban room with {num_boxes} boxes came out of {_MAX_DRAWS} draws; "
        "lower `env.env_kwargs.num_boxes` or raise `env.env_kwargs.size`"
    )


@register_env("sokoban")
class SokobanEnv(Environment):
    """Push the boxes of a seeded room onto its targets (see the module docstring).

    Args:
        size: the room's side in cells, outer wall included (5 to 10).
        num_boxes: boxes (and targets) in the room (1 to 3).
        render_mode: ``vision`` (an ``<image>`` of the room) or ``text`` (the room as characters).
        cell_size: pixels per cell in vision mode.
    """

    def __init__(self, size: int = 6, num_boxes: int = 1, render_mode: str = "vision", cell_size: int = 28) -> None:
        check_render_settings(render_mode, cell_size)
        self.size = check_int("size", size, 5, 10)
        self.num_boxes = check_int("num_boxes", num_boxes, 1, 3)
        self.render_mode = render_mode
        self.cell_size = cell_size
        self.level: Level | None = None
        self._done = False

    def system_prompt(self) -> str:
        """The rules, the legend and the answer format."""
        legend = (
            "Walls are brown, targets dark red, boxes yellow (green once on a target) and you are blue."
            if self.render_mode == "vision"
            else "# is a wall, _ floor, O a target, X a box, * a box on a target, P you, S you on a target."
        )
        return (
            "You are playing Sokoban. Push every box onto a target; boxes can be pushed, not pulled. "
            f"{legend} Answer with one word: up, down, left or right."
        )

    def reset(self, seed: int) -> Observation:
        """Generate the room of ``seed``."""
        self.level = generate_level(self.size, self.num_boxes, random.Random(seed))
        self._done = False
        return self._observe()

    def step(self, action_text: str) -> StepResult:
        """Move (and push) by the first move word of ``action_text``."""
        if self.level is None or self._done:
            raise RuntimeError("SokobanEnv.step called before reset or after the episode ended")
        action = first_word(action_text, MOVE_WORDS)
        if action is None:
            return self._observe(), 0.0, False, step_info(None, success=False)
        before = self.level
        self.level = push(before, action)
        on_before = len(before.boxes & before.targets)
        on_after = len(self.level.boxes & self.level.targets)
        reward = STEP_PENALTY + (BOX_ON_TARGET if on_after > on_before else 0.0)
        reward += BOX_OFF_TARGET if on_after < on_before else 0.0
        self._done = self.level.solved
        reward += SOLVED_BONUS if self._done else 0.0
        return self._observe(), reward, self._done, step_info(action, success=self._done, boxes_on_target=on_after)

    def _observe(self) -> Observation:
        assert self.level is not None
        level = self.level
        cells = []
        for row in range(level.size):
            line = []
            for column in range(level.size):
                here = (row, column)
                on_target = here in level.targets
                fill = TARGET_FILL if on_target else FLOOR_FILL
                if here not in level.floor:
                    line.append(Cell(WALL_FILL, "#"))
                elif here in level.boxes:
                    line.append(Cell(fill, "*" if on_target else "X", BOX_ON_TARGET_MARK if on_target else BOX, 0.8))
                elif here == level.player:
                    line.append(Cell(fill, "S" if on_target else "P", PLAYER))
                else:
                    line.append(Cell(fill, "O" if on_target else "_"))
            cells.append(line)
        return observation("", cells, self.render_mode, self.cell_size)
