"""The shipped environments (sokoban, frozen_lake, target), the action parser, and environments from a file.

Fast: no Ray, no vLLM. Levels are checked solvable both by the module's own solver and by playing a breadth-first
search through the public ``step`` API (the text observation is the state), so a generator and a solver that agree
on a wrong rule would still be caught by the play-through.
"""

from __future__ import annotations

import copy
import sys
import textwrap
from collections import deque
from pathlib import Path

import pytest

from easyr1.config import load_config
from easyr1.envs import ENVIRONMENTS, IMAGE_MARKER, Environment, build_environment, check_environment
from easyr1.envs.actions import first_word
from easyr1.envs.frozen_lake import FrozenLakeEnv, shortest_path_length
from easyr1.envs.registry import environment_class
from easyr1.envs.sokoban import Level, SokobanEnv, solution_length
from easyr1.envs.target import ACTION_WORDS, TARGET_COLOURS, TargetEnv
from easyr1.errors import ConfigError, EnvError


SHIPPED = ("frozen_lake", "sokoban", "target")
MOVES = ("up", "down", "left", "right")
# A fixed sequence of answers, some unreadable, played until the episode ends.
SCRIPT = ["up", "Left.", "I am not sure", "<answer>down</answer>", "right", "RIGHT", "up", "left", "down", "down"]


def make(name: str, **kwargs) -> Environment:
    return build_environment(name, None, kwargs)


def snapshot(observation) -> tuple:
    """Everything an observation shows: its text and its images' sizes, modes and pixels."""
    return observation.text, tuple((image.size, image.mode, image.tobytes()) for image in observation.images)


def play(env: Environment, seed: int, answers: list[str]) -> list[tuple]:
    """The episode of ``seed`` under ``answers``: the first observation, then each step's full result."""
    trace = [snapshot(env.reset(seed))]
    for answer in answers:
        observation, reward, done, info = env.step(answer)
        trace.append((snapshot(observation), reward, done, info))
        if done:
            break
    return trace


def grid_of(env: Environment, seed: int) -> list[str]:
    """The rows of the text-mode observation after ``reset(seed)``."""
    return env.reset(seed).text.splitlines()


def find(rows: list[str], chars: str) -> list[tuple[int, int]]:
    return [(r, c) for r, row in enumerate(rows) for c, char in enumerate(row) if char in chars]


def solve_by_play(env: Environment, seed: int, max_states: int = 5000) -> list[str] | None:
    """Shortest list of moves that makes ``step`` report success, searched through copies of the environment."""
    start = env.reset(seed).text
    queue = deque([(env, [])])
    seen = {start}
    while queue and len(seen) < max_states:
        here, path = queue.popleft()
        for move in MOVES:
            there = copy.deepcopy(here)
            observation, _, done, info = there.step(move)
            if info["success"]:
                return [*path, move]
            if not done and observation.text not in seen:
                seen.add(observation.text)
                queue.append((there, [*path, move]))
    return None


# ------------------------------------------------------------------------------------------------ action parser
@pytest.mark.parametrize(
    "text, expected",
    [
        ("up", "up"),
        ("Up.", "up"),
        ("I will go LEFT, then up", "left"),
        ("upward and onward", None),  # whole words only
        ("<think>left looks wrong</think><answer>Right</answer>", "right"),  # the answer block wins
        ("<answer>jump</answer> so: down", "down"),  # an answer without a move: the whole text
        ("<answer></answer><answer>down</answer>", "down"),
        ("", None),
        ("no move here", None),
    ],
)
def test_first_word(text, expected):
    assert first_word(text, MOVES) == expected


def test_first_word_never_raises_on_odd_input():
    assert first_word(None, MOVES) is None  # type: ignore[arg-type]
    assert first_word("up", ()) is None
    assert first_word("a+b (up)", ("a+b", "up")) == "a+b"  # words are matched literally, not as patterns


# ------------------------------------------------------------------------------------------------ registry, modes
def test_the_shipped_environments_are_registered():
    assert set(SHIPPED) <= set(ENVIRONMENTS.names())  # other tests may register their own beside them
    for name in SHIPPED:
        assert issubclass(environment_class(name, None), Environment)


@pytest.mark.parametrize("name", SHIPPED)
@pytest.mark.parametrize("render_mode", ["vision", "text"])
def test_same_seed_same_episode_and_seeds_differ(name, render_mode):
    first, second = make(name, render_mode=render_mode), make(name, render_mode=render_mode)
    for seed in (0, 7):
        trace = play(first, seed, SCRIPT)
        assert trace == play(first, seed, SCRIPT)  # the same instance, reset again
        assert trace == play(second, seed, SCRIPT)  # another instance
    starts = {snapshot(first.reset(seed)) for seed in range(20)}
    assert len(starts) >= 4, f"{name}: 20 seeds gave only {len(starts)} different levels"


@pytest.mark.parametrize("name", SHIPPED)
def test_vision_and_text_observations(name):
    vision = make(name, cell_size=10)
    observation = vision.reset(3)
    assert observation.text.count(IMAGE_MARKER) == len(observation.images) == 1
    rows = len(grid_of(make(name, render_mode="text"), 3))
    (image,) = observation.images
    assert image.mode == "RGB" and image.size == (10 * rows, 10 * rows)
    observation, *_ = vision.step("up")
    assert observation.text.count(IMAGE_MARKER) == len(observation.images) == 1

    text = make(name, render_mode="text").reset(3)
    assert text.images == [] and IMAGE_MARKER not in text.text
    assert len({len(row) for row in text.text.splitlines()}) == 1  # a rectangle of characters


@pytest.mark.parametrize("name", SHIPPED)
def test_an_unreadable_action_is_invalid_and_changes_nothing(name):
    env = make(name)
    before = snapshot(env.reset(11))
    for text in ("I am not sure", "", "upwards!", "<answer>jump</answer>"):
        observation, reward, done, info = env.step(text)
        assert snapshot(observation) == before
        assert (reward, done, info["action_valid"], info["success"], info["action"]) == (
            0.0,
            False,
            False,
            False,
            None,
        )
    _, _, _, info = env.step("<think>hmm</think><answer>left</answer>")
    assert info["action_valid"] and info["action"] == "left"


@pytest.mark.parametrize(
    "name, kwargs, key",
    [
        ("sokoban", {"render_mode": "pixels"}, "render_mode"),
        ("sokoban", {"num_boxes": 0}, "num_boxes"),
        ("sokoban", {"cell_size": 0}, "cell_size"),
        ("frozen_lake", {"hole_fraction": 0.95}, "hole_fraction"),
        ("frozen_lake", {"size": 1}, "size"),
        ("target", {"colours": ["purple"]}, "colours"),
        ("target", {"step_reward": "a lot"}, "step_reward"),
    ],
)
def test_bad_kwargs_of_shipped_environments_name_the_key(name, kwargs, key):
    with pytest.raises(EnvError, match=rf"env\.env_kwargs\.{key}"):
        make(name, **kwargs)


@pytest.mark.parametrize("name", SHIPPED)
def test_step_before_reset_and_after_the_end_is_a_bug_not_a_silent_step(name):
    env = make(name)
    with pytest.raises(RuntimeError, match="before reset"):
        env.step("up")


# ------------------------------------------------------------------------------------------------ sokoban
def room(player, boxes, targets, size=6) -> Level:
    """A size x size room whose inside is all floor."""
    floor = frozenset((r, c) for r in range(1, size - 1) for c in range(1, size - 1))
    return Level(size, floor, frozenset(targets), frozenset(boxes), player)


def sokoban_at(level: Level) -> SokobanEnv:
    env = SokobanEnv(render_mode="text")
    env.reset(0)
    env.level = level
    return env


def test_sokoban_levels_are_solvable_unsolved_and_varied():
    lengths = []
    for seed in range(200):
        env = SokobanEnv(render_mode="text")
        rows = grid_of(env, seed)
        # one player (P, or S on a target), one box off its target (X), one free target (O, or under S)
        assert len(find(rows, "PS")) == 1 and len(find(rows, "X")) == 1 and len(find(rows, "OS")) == 1
        length = solution_length(env.level)
        assert length is not None and length >= 1, seed
        lengths.append(length)
    assert max(lengths) >= 5 and sum(length >= 3 for length in lengths) >= 50  # not a gallery of one-move levels
    for seed in range(50):
        env = SokobanEnv(size=7, num_boxes=2)
        env.reset(seed)
        assert len(env.level.boxes) == 2 and not env.level.solved and solution_length(env.level) is not None


def test_sokoban_solver_agrees_with_playing_the_environment():
    for seed in range(20):
        env = SokobanEnv(render_mode="text")
        env.reset(seed)
        moves = solve_by_play(env, seed)
        assert moves is not None and len(moves) == solution_length(env.level), seed


def test_solution_length_of_hand_made_rooms():
    assert solution_length(room((2, 1), [(2, 2)], [(2, 4)])) == 2  # push right twice
    assert solution_length(room((1, 1), [(2, 2)], [(2, 4)])) == 3  # step down, then push right twice
    assert solution_length(room((2, 2), [(1, 1)], [(2, 2)])) is None  # a box in a corner cannot move


def test_sokoban_moves_pushes_walls_and_rewards():
    env = sokoban_at(room((2, 1), [(2, 2)], [(2, 4)]))
    _, reward, done, info = env.step("right")
    assert env.level.player == (2, 2) and env.level.boxes == {(2, 3)}
    assert (reward, done, info["success"], info["action_valid"]) == (pytest.approx(-0.1), False, False, True)
    observation, reward, done, info = env.step("right")
    assert env.level.boxes == {(2, 4)} and done and info["success"]
    assert reward == pytest.approx(-0.1 + 1.0 + 10.0)
    assert "*" in observation.text  # the box on its target
    with pytest.raises(RuntimeError, match="ended"):
        env.step("left")

    env = sokoban_at(room((1, 1), [(3, 3)], [(4, 4)]))
    before = env.level
    _, reward, done, _ = env.step("up")  # into the wall: nothing moves, the step still costs
    assert env.level == before and reward == pytest.approx(-0.1) and not done

    env = sokoban_at(room((2, 3), [(2, 4)], [(1, 1)]))
    _, reward, _, _ = env.step("right")  # the box is against the wall
    assert env.level.boxes == {(2, 4)} and env.level.player == (2, 3) and reward == pytest.approx(-0.1)

    env = sokoban_at(room((2, 1), [(2, 2), (2, 3)], [(1, 1), (4, 4)]))
    env.step("right")  # a box cannot push another box
    assert env.level.boxes == {(2, 2), (2, 3)} and env.level.player == (2, 1)


def test_sokoban_box_off_a_target_costs():
    env = sokoban_at(room((2, 1), [(2, 2), (4, 1)], [(2, 2), (4, 4)]))
    _, reward, done, info = env.step("right")
    assert reward == pytest.approx(-0.1 - 1.0) and not done and info["boxes_on_target"] == 0


# ------------------------------------------------------------------------------------------------ frozen lake
def test_shortest_path_on_a_hand_made_lake():
    tiles = [list("_O_"), list("_O_"), list("__G")]
    assert shortest_path_length(tiles, (0, 0), (2, 2)) == 4
    assert shortest_path_length(tiles, (0, 2), (2, 2)) == 2
    tiles[2][1] = "O"
    assert shortest_path_length(tiles, (0, 0), (2, 2)) is None


def test_frozen_lake_maps_have_a_path_and_play_to_the_goal():
    for seed in range(200):
        env = FrozenLakeEnv(render_mode="text")
        rows = grid_of(env, seed)
        assert len(rows) == 4 and len(find(rows, "P")) == 1 and len(find(rows, "G")) == 1
        assert solve_by_play(env, seed) is not None, seed
    for seed in range(20):
        env = FrozenLakeEnv(render_mode="text", size=5)
        moves = solve_by_play(env, seed)
        assert moves is not None, seed
        trace = play(env, seed, moves)
        assert trace[-1][1:3] == (1.0, True) and trace[-1][3]["success"]
        assert all(step[1] == 0.0 and not step[2] for step in trace[1:-1])


def test_frozen_lake_holes_end_the_episode_without_reward_and_edges_hold():
    fell = walked_into_edge = False
    for seed in range(100):
        env = FrozenLakeEnv(render_mode="text")
        rows = grid_of(env, seed)
        (player,) = find(rows, "P")
        for move, (dr, dc) in zip(MOVES, [(-1, 0), (1, 0), (0, -1), (0, 1)], strict=True):
            row, column = player[0] + dr, player[1] + dc
            env.reset(seed)
            observation, reward, done, info = env.step(move)
            if not (0 <= row < 4 and 0 <= column < 4):
                assert observation.text == "\n".join(rows) and not done and reward == 0.0
                walked_into_edge = True
            elif rows[row][column] == "O":
                assert done and reward == 0.0 and not info["success"] and info["hole"]
                fell = True
    assert fell and walked_into_edge


def test_slippery_lake_is_seeded_and_slips():
    slipped = False
    for seed in range(30):
        env = FrozenLakeEnv(is_slippery=True, hole_fraction=0.0, render_mode="text")
        assert play(env, seed, SCRIPT) == play(env, seed, SCRIPT)
        steady = FrozenLakeEnv(hole_fraction=0.0, render_mode="text")
        slipped |= play(env, seed, ["down", "down", "right"]) != play(steady, seed, ["down", "down", "right"])
    assert slipped


# ------------------------------------------------------------------------------------------------ target
def target_cell(seed: int) -> tuple[int, int]:
    (cell,) = find(grid_of(TargetEnv(render_mode="text"), seed), "T")
    return cell


def test_target_text_carries_no_clue_and_the_image_does():
    env = TargetEnv()
    texts = {(env.system_prompt(), env.reset(seed).text) for seed in range(40)}
    assert texts == {(env.system_prompt(), IMAGE_MARKER)}
    cells = {target_cell(seed) for seed in range(40)}
    assert cells == {(0, 1), (2, 1), (1, 0), (1, 2)}  # every neighbour of the centre occurs
    red = TARGET_COLOURS["red"]
    for seed in range(8):
        (image,) = env.reset(seed).images
        assert image.size == (84, 84)
        coloured = {(r, c) for r in range(3) for c in range(3) if image.getpixel((28 * c + 14, 28 * r + 14)) == red}
        assert coloured == {target_cell(seed)}
        assert image.getpixel((42, 42)) == (235, 235, 235)  # the cursor, in the centre


def test_target_colour_by_side_tells_the_side_by_colour():
    env = TargetEnv(colour_by_side=True)
    side_colour = {(0, 1): "red", (2, 1): "blue", (1, 0): "yellow", (1, 2): "green"}
    for seed in range(16):
        (image,) = env.reset(seed).images
        row, column = target_cell(seed)
        assert image.getpixel((28 * column + 14, 28 * row + 14)) == TARGET_COLOURS[side_colour[(row, column)]]


def test_target_moves_rewards_and_walls():
    for seed in range(8):
        row, column = target_cell(seed)
        towards = {(0, 1): "up", (2, 1): "down", (1, 0): "left", (1, 2): "right"}[(row, column)]
        away = {"up": "down", "down": "up", "left": "right", "right": "left"}[towards]
        env = TargetEnv(step_reward=-0.05)
        env.reset(seed)
        assert env.step(f"I go {towards}")[1:3] == (1.0, True)

        env = TargetEnv(step_reward=-0.05, render_mode="text")
        start = env.reset(seed).text
        observation, reward, done, info = env.step(away)
        assert (reward, done, info["success"]) == (-0.05, False, False) and observation.text != start
        wall, reward, done, _ = env.step(away)  # the cursor is on the border now: a wall keeps it in place
        assert wall.text == observation.text and (reward, done) == (-0.05, False)
        env.step(towards)
        _, reward, done, info = env.step(towards)
        assert (reward, done, info["success"]) == (1.0, True, True)


def test_target_image_follows_the_cursor():
    env = TargetEnv()
    first = snapshot(env.reset(0))
    moved, *_ = env.step({(0, 1): "down", (2, 1): "up", (1, 0): "right", (1, 2): "left"}[target_cell(0)])
    assert snapshot(moved) != first and moved.text == IMAGE_MARKER


def test_action_words_are_the_moves():
    assert ACTION_WORDS == MOVES


# ------------------------------------------------------------------------------------------------ env.env_class
GOOD_FILE = """
from easyr1.envs import Environment, Observation

CLOSED = []


class Counter(Environment):
    def __init__(self, start=0, goal=3):
        self.start, self.goal = start, goal

    def system_prompt(self):
        return "Say up."

    def reset(self, seed):
        self.value = self.start + seed
        return Observation(str(self.value))

    def step(self, action_text):
        self.value += action_text == "up"
        done = self.value >= self.goal
        return Observation(str(self.value)), float(done), done, {"success": done, "action_valid": True}

    def close(self):
        CLOSED.append(self)


class Helper:
    pass
"""


def write(directory: Path, name: str, text: str) -> str:
    path = directory / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return str(path)


def test_a_class_from_a_file_is_built_with_its_kwargs(tmp_path):
    spec = write(tmp_path, "my_env.py", GOOD_FILE) + ":Counter"
    env = build_environment(None, spec, {"goal": 2})
    assert env.reset(1).text == "1" and env.step("up")[1:3] == (1.0, True)
    assert environment_class(None, spec) is type(env)  # imported once per process
    check_environment(None, spec, {"start": 5})
    assert len(sys.modules[type(env).__module__].CLOSED) == 1  # check_environment closed the one it built


def test_a_duck_typed_class_is_accepted(tmp_path):
    spec = write(
        tmp_path,
        "duck.py",
        """
        class Duck:
            def system_prompt(self): return "quack"
            def reset(self, seed): return None
            def step(self, action_text): return None
            def close(self): pass
        """,
    )
    check_environment(None, spec + ":Duck", {})


def test_a_missing_file_names_the_key(tmp_path):
    with pytest.raises(EnvError, match=r"nowhere\.py.*env\.env_class.*does not exist"):
        check_environment(None, f"{tmp_path}/nowhere.py:Env", {})


def test_an_import_error_names_the_key_and_keeps_the_cause(tmp_path):
    spec = write(tmp_path, "broken_env.py", "import a_module_that_does_not_exist_anywhere\n") + ":Env"
    with pytest.raises(
        EnvError, match=r"environment file .*broken_env\.py \(`env\.env_class`\).*ModuleNotFound"
    ) as info:
        check_environment(None, spec, {})
    assert isinstance(info.value.__cause__, ModuleNotFoundError)


def test_a_missing_class_lists_the_classes_of_the_file(tmp_path):
    path = write(tmp_path, "my_env.py", GOOD_FILE)
    with pytest.raises(
        EnvError, match=r"env\.env_class.*'Countr' is not defined.*Classes defined there: Counter, Helper"
    ):
        check_environment(None, f"{path}:Countr", {})


def test_a_class_that_is_not_an_environment_names_what_it_lacks(tmp_path):
    path = write(tmp_path, "my_env.py", GOOD_FILE)
    with pytest.raises(EnvError, match=r"env\.env_class.*Helper .*lacks system_prompt, reset, step, close"):
        check_environment(None, f"{path}:Helper", {})


def test_unknown_kwargs_are_refused_before_the_constructor_runs(tmp_path):
    marker = tmp_path / "constructed"
    spec = write(
        tmp_path,
        "slow_env.py",
        f"""
        from easyr1.envs import Environment

        class Slow(Environment):
            def __init__(self, size=3):
                open({str(marker)!r}, "w").close()  # stands for expensive set-up
            def system_prompt(self): return ""
            def reset(self, seed): return None
            def step(self, action_text): return None
        """,
    )
    with pytest.raises(EnvError, match=r"env\.env_kwargs.*\['sise'\].*\['size'\]"):
        check_environment(None, spec + ":Slow", {"sise": 4})
    assert not marker.exists()
    with pytest.raises(EnvError, match=r"env\.env_kwargs.*\['boxes'\].*env\.name.*'sokoban'.*num_boxes"):
        check_environment("sokoban", None, {"boxes": 2})


def test_a_constructor_that_raises_names_the_kwargs(tmp_path):
    spec = write(
        tmp_path,
        "picky.py",
        """
        from easyr1.envs import Environment

        class Picky(Environment):
            def __init__(self, size=3):
                if size > 5:
                    raise ValueError("size at most 5")
            def system_prompt(self): return ""
            def reset(self, seed): return None
            def step(self, action_text): return None
        """,
    )
    with pytest.raises(EnvError, match=r"env\.env_class.*env\.env_kwargs.*\{'size': 9\}.*ValueError: size at most 5"):
        check_environment(None, spec + ":Picky", {"size": 9})


def test_a_malformed_spec_says_the_form(tmp_path):
    with pytest.raises(EnvError, match=r"env\.env_class.*'path/to/env\.py:ClassName'"):
        check_environment(None, "my_env.py", {})


# ------------------------------------------------------------------------------------------------ config
REQUIRED = ["worker.actor.model.model_path=/models/tiny", "worker.reward.reward_function=/rewards/r.py:compute_score"]


@pytest.mark.parametrize("name", SHIPPED)
def test_config_accepts_the_registered_names(name):
    assert load_config([*REQUIRED, f"env.name={name}"]).env.name == name


def test_config_suggests_the_closest_name_for_a_typo():
    with pytest.raises(ConfigError, match=r"env\.name='sokobn'.*did you mean 'sokoban'.*valid values") as info:
        load_config([*REQUIRED, "env.name=sokobn"])
    assert all(name in str(info.value).split("valid values:")[1] for name in SHIPPED)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["env.max_tokens_per_turn=600"], r"env\.max_tokens_per_turn=600 exceeds data\.max_response_length=512"),
        (["algorithm.online_filtering=true"], r"online_filtering \(DAPO refills\) is not available for agent runs"),
        (["algorithm.adv_estimator=remax"], r"adv_estimator=remax needs a greedy baseline round"),
    ],
)
def test_config_refuses_what_agent_runs_do_not_play(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config([*REQUIRED, "env.name=target", *overrides])
    load_config([*REQUIRED, "env.name=target"])  # the agent run itself is fine


def test_the_agent_demo_config_loads_as_an_agent_run(monkeypatch):
    monkeypatch.chdir(Path(__file__).resolve().parents[1])
    config = load_config(["config=examples/config_agent_cpu.yaml"])
    assert config.env.enabled and config.env.name == "target" and config.worker.reward.reward_function is None
    assert config.env.max_tokens_per_turn * config.env.max_turns <= config.data.max_response_length
    assert config.worker.actor.model.model_path.endswith(".cache/demo/model/qwen2_5_vl_agent")


def test_an_agent_run_needs_no_reward_function():
    config = load_config(["worker.actor.model.model_path=/models/tiny", "env.name=target"])
    assert config.worker.reward.reward_function is None
    with pytest.raises(ConfigError, match="worker.reward.reward_function is not set"):
        load_config(["worker.actor.model.model_path=/models/tiny"])


# ------------------------------------------------------------------------------------------------ docs
def test_the_example_environment_of_docs_agents_works(tmp_path):
    section = (Path(__file__).resolve().parents[1] / "docs" / "agents.md").read_text(encoding="utf-8")
    section = section.split("## Environments", 1)[1].split("\n## ", 1)[0]
    (code,) = [block.split("\n", 1)[1] for block in section.split("```")[1::2] if block.startswith("python")]
    spec = write(tmp_path, "my_env.py", code) + ":GuessColour"
    check_environment(None, spec, {"tries": 2})
    env = build_environment(None, spec, {"tries": 3})
    for seed in range(6):
        observation = env.reset(seed)
        assert observation.text == IMAGE_MARKER and len(observation.images) == 1
        assert env.step("no idea")[3]["action_valid"] is False
        for colour in ("red", "green", "blue"):
            observation, reward, done, info = env.step(f"<answer>{colour}</answer>")
            if done:
                break
            assert (observation.text, reward, info["success"]) == ("No. " + IMAGE_MARKER, 0.0, False)
        assert (reward, done, info["success"]) == (1.0, True, True)
