"""``target``: move a cursor onto a coloured square seen only in the image; the task the tiny CPU demo model learns.

The grid is 3x3; the cursor (white) starts in the centre, the target (a coloured square) sits in one of the centre's
four neighbours, chosen by the seed. One correct move solves it, a wrong one leaves the target two moves away, so
episodes take 1-3 turns. At the default ``cell_size=28`` the image is 84x84 and each cell is exactly one merged
vision token of Qwen2.5-VL (14 px patches, 2x2 merge).

In vision mode the text is the same for every episode (the system prompt and a bare ``<image>``): the image is the
only clue to where the target is, so a policy blind to the image cannot beat chance (1/4 on the first move).

Rewards: 1.0 and done when the cursor reaches the target; otherwise ``step_reward`` (default 0) per move. A move
into the border leaves the cursor in place. Text without one of the four words is an invalid action: nothing
changes and the reward is 0 (the trainer adds ``env.format_penalty``).
"""

from __future__ import annotations

import random

from easyr1.envs.actions import first_word
from easyr1.envs.base import Environment, Observation, StepResult
from easyr1.envs.grid import MOVE_WORDS, MOVES, Cell, check_render_settings, observation, step_info
from easyr1.envs.registry import register_env
from easyr1.errors import EnvError


# The words the model answers with; the agent demo's tokenizer makes each one a single token.
ACTION_WORDS = MOVE_WORDS
SIZE = 3
CENTRE = (1, 1)
NEIGHBOURS = tuple((CENTRE[0] + dr, CENTRE[1] + dc) for dr, dc in MOVES.values())
TARGET_COLOURS = {"red": (220, 30, 30), "green": (30, 190, 60), "blue": (40, 90, 230), "yellow": (230, 200, 20)}
# colour_by_side: the colour of a target on each side of the centre
SIDE_COLOURS = dict(zip(NEIGHBOURS, ("red", "blue", "yellow", "green")))
EMPTY = (40, 40, 40)
CURSOR = (235, 235, 235)
# Short on purpose: with the agent demo's tokenizer the whole first prompt (chat template, this text, the image's 9
# tokens) is 59 tokens, inside the tiny model's budget of about 64.
VISION_PROMPT = "Move the white square onto the coloured square: up, down, left or right?"
TEXT_PROMPT = (
    "Move the cursor C onto the target T in the grid (. is empty). Answer with one word: up, down, left or right."
)


@register_env("target")
class TargetEnv(Environment):
    """Move the white cursor onto the coloured target of a 3x3 grid (see the module docstring).

    Args:
        render_mode: ``vision`` (an ``<image>`` of the grid) or ``text`` (the grid as characters).
        cell_size: pixels per cell in vision mode (28: one merged vision token of Qwen2.5-VL per cell).
        step_reward: reward of a move that does not reach the target.
        colours: the target's possible colours (names of ``TARGET_COLOURS``), picked by the seed.
        colour_by_side: the target's colour tells its side instead (up red, right green, down blue, left yellow):
            a second visual cue beside its position, which a tiny model picks up sooner (the CPU agent demo uses it).
    """

    def __init__(
        self,
        render_mode: str = "vision",
        cell_size: int = 28,
        step_reward: float = 0.0,
        colours: tuple[str, ...] | list[str] = ("red",),
        colour_by_side: bool = False,
    ) -> None:
        check_render_settings(render_mode, cell_size)
        if isinstance(step_reward, bool) or not isinstance(step_reward, (int, float)):
            raise EnvError(f"`env.env_kwargs.step_reward` = {step_reward!r} must be a number")
        unknown = [colour for colour in colours if colour not in TARGET_COLOURS] if colours else []
        if not colours or isinstance(colours, str) or unknown:
            raise EnvError(
                f"`env.env_kwargs.colours` = {colours!r} must be a non-empty list of {', '.join(TARGET_COLOURS)}"
            )
        self.render_mode = render_mode
        self.cell_size = cell_size
        self.step_reward = float(step_reward)
        self.colours = tuple(colours)
        self.colour_by_side = bool(colour_by_side)
        self._cursor: tuple[int, int] | None = None
        self._target = NEIGHBOURS[0]
        self._colour = TARGET_COLOURS[self.colours[0]]
        self._done = False

    def system_prompt(self) -> str:
        """The task and the answer format, the same for every episode."""
        return VISION_PROMPT if self.render_mode == "vision" else TEXT_PROMPT

    def reset(self, seed: int) -> Observation:
        """Cursor in the centre, target in the neighbour (and colour) the seed picks."""
        rng = random.Random(seed)
        self._target = NEIGHBOURS[rng.randrange(len(NEIGHBOURS))]
        self._colour = TARGET_COLOURS[self.colours[rng.randrange(len(self.colours))]]
        if self.colour_by_side:
            self._colour = TARGET_COLOURS[SIDE_COLOURS[self._target]]
        self._cursor = CENTRE
        self._done = False
        return self._observe()

    def step(self, action_text: str) -> StepResult:
        """Move the cursor by the first move word of ``action_text``; reward 1.0 and done on the target."""
        if self._cursor is None or self._done:
            raise RuntimeError("TargetEnv.step called before reset or after the episode ended")
        action = first_word(action_text, ACTION_WORDS)
        if action is None:
            return self._observe(), 0.0, False, step_info(None, success=False)
        row, column = self._cursor[0] + MOVES[action][0], self._cursor[1] + MOVES[action][1]
        if 0 <= row < SIZE and 0 <= column < SIZE:
            self._cursor = (row, column)
        self._done = self._cursor == self._target
        reward = 1.0 if self._done else self.step_reward
        return self._observe(), reward, self._done, step_info(action, success=self._done)

    def _observe(self) -> Observation:
        cells = []
        for row in range(SIZE):
            line = []
            for column in range(SIZE):
                here = (row, column)
                if here == self._target:
                    mark = CURSOR if here == self._cursor else None
                    line.append(Cell(self._colour, "C" if mark else "T", mark=mark))
                elif here == self._cursor:
                    line.append(Cell(CURSOR, "C"))
                else:
                    line.append(Cell(EMPTY, "."))
            cells.append(line)
        return observation("", cells, self.render_mode, self.cell_size)
