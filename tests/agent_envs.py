"""Environments the agent tests play (``env.env_class=tests/agent_envs.py:ColourEnv``): small, deterministic, with
images on every turn, and with ways to misbehave on demand."""

from __future__ import annotations

import time

from PIL import Image

from easyr1.envs import Environment, Observation


COLOURS = {"red": (255, 0, 0), "green": (0, 255, 0), "blue": (0, 0, 255), "yellow": (255, 255, 0)}


class ColourEnv(Environment):
    """Each observation shows one colour (56x56: 4 vision tokens); the answer is its name. Seed-determined."""

    def __init__(self, turns: int = 3, fail: str | None = None) -> None:
        self.turns, self.fail = turns, fail

    def system_prompt(self) -> str:
        return "Name the colour."

    def _show(self) -> Observation:
        colour = list(COLOURS)[(self.seed + self.t) % 4]
        self.answer = colour
        return Observation("<image>colour?" if self.t else "<image>", [Image.new("RGB", (56, 56), COLOURS[colour])])

    def reset(self, seed: int) -> Observation:
        self.seed, self.t = seed, 0
        return self._show()

    def step(self, action_text: str):
        if self.fail == "raise" and self.t == 1:
            raise RuntimeError("board exploded")
        if self.fail == "hang" and self.t == 1:
            time.sleep(5)
        if self.fail == "nan" and self.t == 1:
            self.t += 1
            return self._show(), float("nan"), False, {}
        if self.fail == "type" and self.t == 1:
            return "not a tuple"
        if self.fail == "markers" and self.t == 1:
            self.t += 1
            return Observation("<image><image>", [Image.new("RGB", (56, 56))]), 0.0, False, {}
        words = [word for word in COLOURS if word in action_text]
        right = bool(words) and words[0] == self.answer
        self.t += 1
        done = right or self.t >= self.turns
        info = {"success": right, "action_valid": bool(words), "action": words[0] if words else None}
        return self._show(), float(right), done, info
