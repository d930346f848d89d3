"""Loading reward files, validating what they return, and the reward functions shipped in reward_function/."""

import importlib
import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from easyr1.errors import RewardError
from easyr1.reward import Rewards, load_reward_function, score_batch
from easyr1.reward.function import parse_reward_spec


REWARD_DIR = Path(__file__).resolve().parents[1] / "reward_function"


def write(directory: Path, name: str, source: str) -> Path:
    path = directory / name
    path.write_text(textwrap.dedent(source))
    return path


def sample(response: str, ground_truth: str = "4", length: int = 3) -> dict:
    return {"response": response, "response_length": length, "ground_truth": ground_truth}


BATCH_FILE = """
    REWARD_TYPE = "batch"

    def compute_score(reward_inputs, bonus=0.0):
        return [{"overall": float(x["response"] == x["ground_truth"]) + bonus, "len": x["response_length"]}
                for x in reward_inputs]

    def other(reward_inputs):
        return [{"overall": 0.5} for _ in reward_inputs]

    NOT_A_FUNCTION = 3
"""

SEQUENTIAL_FILE = """
    REWARD_TYPE = "sequential"

    def compute_score(reward_input, scale=1.0):
        return {"overall": scale * float(reward_input["response"] == reward_input["ground_truth"])}
"""


# ----------------------------------------------------------------------------------------------------------------
# Loading


def test_load_with_and_without_function_name(tmp_path: Path) -> None:
    path = write(tmp_path, "rewards.py", BATCH_FILE)
    default = load_reward_function(str(path))
    named = load_reward_function(f"{path}:other")
    assert default.function_name == "compute_score" and default.reward_type == "batch"
    inputs = [sample("4"), sample("5")]
    assert default(inputs) == [{"overall": 1.0, "len": 3.0}, {"overall": 0.0, "len": 3.0}]
    assert named(inputs) == [{"overall": 0.5}, {"overall": 0.5}]


def test_parse_spec() -> None:
    assert parse_reward_spec("a/b.py") == ("a/b.py", "compute_score")
    assert parse_reward_spec("a/b.py:main") == ("a/b.py", "main")
    assert parse_reward_spec("C:\\r\\b.py") == ("C:\\r\\b.py", "compute_score")  # a drive letter is not a function
    with pytest.raises(RewardError, match="not a python function name"):
        parse_reward_spec("a/b.py:")
    with pytest.raises(RewardError, match="worker.reward.reward_function"):
        parse_reward_spec("")


def test_sequential_and_kwargs(tmp_path: Path) -> None:
    path = write(tmp_path, "seq.py", SEQUENTIAL_FILE)
    reward_fn = load_reward_function(f"{path}:compute_score", {"scale": 2.0})
    assert reward_fn.reward_type == "sequential"
    assert reward_fn([sample("4"), sample("x"), sample("4")]) == [{"overall": 2.0}, {"overall": 0.0}, {"overall": 2.0}]
    batch_fn = load_reward_function(str(write(tmp_path, "b.py", BATCH_FILE)), {"bonus": 0.25})
    assert batch_fn([sample("4")])[0]["overall"] == 1.25


def test_reward_type_defaults_to_batch_and_config_overrides(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "untyped.py",
        """
        def compute_score(x):
            if isinstance(x, list):
                return [{"overall": 1.0} for _ in x]
            return {"overall": 0.0}
        """,
    )
    assert load_reward_function(str(path)).reward_type == "batch"
    assert load_reward_function(str(path))([sample("a")]) == [{"overall": 1.0}]
    sequential = load_reward_function(str(path), reward_type="sequential")
    assert sequential.reward_type == "sequential" and sequential([sample("a")]) == [{"overall": 0.0}]
    with pytest.raises(RewardError, match="worker.reward.reward_type"):
        load_reward_function(str(path), reward_type="parallel")


def test_bad_reward_type_in_module(tmp_path: Path) -> None:
    path = write(tmp_path, "bad_type.py", "REWARD_TYPE = 'batched'\ndef compute_score(x):\n    return x\n")
    with pytest.raises(RewardError, match=r"REWARD_TYPE = 'batched' in .*bad_type.py"):
        load_reward_function(str(path))


def test_missing_file_names_path_and_key(tmp_path: Path) -> None:
    missing = tmp_path / "nope" / "reward.py"
    with pytest.raises(RewardError) as info:
        load_reward_function(f"{missing}:compute_score")
    message = str(info.value)
    assert str(missing) in message and "worker.reward.reward_function" in message


def test_missing_function_lists_the_functions_in_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "rewards.py", BATCH_FILE)
    with pytest.raises(RewardError, match=r"'score' is not defined .*Functions defined there: compute_score, other"):
        load_reward_function(f"{path}:score")
    with pytest.raises(RewardError, match="'NOT_A_FUNCTION' is not callable"):
        load_reward_function(f"{path}:NOT_A_FUNCTION")


def test_unknown_kwargs_are_reported_at_load_time(tmp_path: Path) -> None:
    path = write(tmp_path, "rewards.py", BATCH_FILE)
    with pytest.raises(RewardError, match=r"reward_function_kwargs.*\['format_weight'\].*\['bonus'\]"):
        load_reward_function(str(path), {"format_weight": 0.1})


def test_import_error_in_file_is_a_reward_error(tmp_path: Path) -> None:
    path = write(tmp_path, "broken.py", "import a_module_that_does_not_exist_anywhere\n")
    with pytest.raises(RewardError, match="broken.py.*ModuleNotFoundError") as info:
        load_reward_function(str(path))
    assert isinstance(info.value.__cause__, ModuleNotFoundError)


def test_file_can_import_its_siblings(tmp_path: Path) -> None:
    write(tmp_path, "reward_helpers_for_test.py", "WEIGHT = 0.75\n")
    path = write(
        tmp_path,
        "uses_helper.py",
        """
        from reward_helpers_for_test import WEIGHT

        def compute_score(inputs):
            return [{"overall": WEIGHT} for _ in inputs]
        """,
    )
    assert load_reward_function(str(path))([sample("a")]) == [{"overall": 0.75}]


def test_files_with_the_same_name_do_not_collide(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = write(tmp_path / "a", "math.py", BATCH_FILE)
    second = write(tmp_path / "b", "math.py", SEQUENTIAL_FILE)
    fn_a, fn_b = load_reward_function(str(first)), load_reward_function(str(second))
    assert fn_a.reward_type == "batch" and fn_b.reward_type == "sequential"
    assert fn_a([sample("4")]) == [{"overall": 1.0, "len": 3.0}] and fn_b([sample("4")]) == [{"overall": 1.0}]


def test_reward_directory_does_not_shadow_the_stdlib(tmp_path: Path) -> None:
    write(tmp_path, "colorsys.py", "SHADOW = True\n")  # a sibling named like a stdlib module
    load_reward_function(str(write(tmp_path, "rewards.py", BATCH_FILE)))
    sys.modules.pop("colorsys", None)
    colorsys = importlib.import_module("colorsys")
    assert hasattr(colorsys, "rgb_to_hsv") and not hasattr(colorsys, "SHADOW")


def test_pickle_round_trip_reloads_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "seq.py", SEQUENTIAL_FILE)
    reward_fn = load_reward_function(str(path), {"scale": 3.0})
    clone = pickle.loads(pickle.dumps(reward_fn))
    assert clone.kwargs == {"scale": 3.0} and clone([sample("4")]) == [{"overall": 3.0}]


# ----------------------------------------------------------------------------------------------------------------
# Validating calls


def load_inline(tmp_path: Path, body: str, reward_type: str = "batch"):
    path = write(tmp_path, "inline.py", f"REWARD_TYPE = {reward_type!r}\n" + textwrap.dedent(body))
    return load_reward_function(str(path))


def test_raising_sequential_function_names_the_sample(tmp_path: Path) -> None:
    reward_fn = load_inline(
        tmp_path,
        """
        def compute_score(x):
            if x["response"] == "bad":
                raise KeyError("boom")
            return {"overall": 1.0}
        """,
        "sequential",
    )
    with pytest.raises(RewardError) as info:
        reward_fn([sample("ok"), sample("bad", ground_truth="42")])
    message = str(info.value)
    assert "sample 1" in message and "'bad'" in message and "'42'" in message and "KeyError" in message
    assert isinstance(info.value.__cause__, KeyError)


def test_raising_batch_function_is_wrapped(tmp_path: Path) -> None:
    reward_fn = load_inline(tmp_path, "def compute_score(xs):\n    raise ZeroDivisionError('x')\n")
    with pytest.raises(RewardError, match="ZeroDivisionError.*batch of 2 samples") as info:
        reward_fn([sample("a"), sample("b")])
    assert isinstance(info.value.__cause__, ZeroDivisionError)


def test_long_responses_are_truncated_in_messages(tmp_path: Path) -> None:
    reward_fn = load_inline(tmp_path, "def compute_score(xs):\n    return [{'score': 1.0} for _ in xs]\n")
    with pytest.raises(RewardError, match="without 'overall'") as info:
        reward_fn([sample("y" * 5000)])
    assert len(str(info.value)) < 1000 and "chars)" in str(info.value)


@pytest.mark.parametrize(
    ("body", "match"),
    [
        ("return {'overall': 1.0}", "returned dict .* REWARD_TYPE = 'sequential'"),
        ("return [{'overall': 1.0}]", "returned 1 scores for a batch of 2"),
        ("return [{'acc': 1.0}, {'acc': 0.0}]", "sample 0 .* without 'overall'"),
        ("return [{'overall': 1.0}, 0.5]", "sample 1 .* returned float"),
        ("return [{'overall': 1.0}, {'overall': 'high'}]", "sample 1 .*'overall' is 'high'"),
        ("return [{'overall': 1.0}, {'overall': float('nan')}]", "sample 1 .*'overall' is nan"),
        ("return [{'overall': 1.0, 'f': 1.0}, {'overall': 0.0}]", r"keys \['overall'\] for sample 1"),
        ("return [{'overall': None}, {'overall': 0.0}]", "sample 0 .* every score must be a number"),
    ],
)
def test_wrong_results_are_rejected(tmp_path: Path, body: str, match: str) -> None:
    reward_fn = load_inline(tmp_path, f"def compute_score(xs):\n    {body}\n")
    with pytest.raises(RewardError, match=match):
        reward_fn([sample("a"), sample("b")])


def test_sequential_function_returning_a_list_suggests_batch(tmp_path: Path) -> None:
    reward_fn = load_inline(tmp_path, "def compute_score(x):\n    return [{'overall': 1.0}]\n", "sequential")
    with pytest.raises(RewardError, match="REWARD_TYPE = 'batch'"):
        reward_fn([sample("a")])


def test_numeric_types_are_converted_to_float(tmp_path: Path) -> None:
    reward_fn = load_inline(
        tmp_path,
        """
        import numpy as np
        import torch

        def compute_score(xs):
            return [{"overall": torch.tensor(0.5), "a": np.float32(0.25), "b": True, "c": 2} for _ in xs]
        """,
    )
    scores = reward_fn([sample("a")])
    assert scores == [{"overall": 0.5, "a": 0.25, "b": 1.0, "c": 2.0}]
    assert all(type(v) is float for v in scores[0].values())
    assert reward_fn([]) == []


def test_score_batch_collects_overall_and_sub_scores(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "echo.py",
        """
        def compute_score(xs):
            return [{"overall": float(x["response_length"]), "src": float(x["data_source"] == "geo")} for x in xs]
        """,
    )
    reward_fn = load_reward_function(str(path))
    inputs = [sample("a", length=3) | {"data_source": "geo"}, sample("b", length=5) | {"data_source": "other"}]
    rewards = score_batch(reward_fn, inputs)
    assert rewards.scores.dtype == torch.float32 and rewards.scores.tolist() == [3.0, 5.0]
    assert rewards.sub_scores == {"overall": [3.0, 5.0], "src": [1.0, 0.0]}


def test_rewards_follow_their_samples_through_index_and_concat() -> None:
    first = Rewards({"overall": [1.0, 2.0, 3.0], "acc": [0.0, 1.0, 0.0]})
    second = Rewards({"overall": [4.0], "acc": [1.0]})
    merged = Rewards.concat([first.index([2, 0]), second])
    assert len(merged) == 3
    assert merged.scores.tolist() == [3.0, 1.0, 4.0]
    assert merged.sub_scores == {"overall": [3.0, 1.0, 4.0], "acc": [0.0, 0.0, 1.0]}
    assert first.index(torch.tensor([1])).sub_scores == {"overall": [2.0], "acc": [1.0]}

    # the reward model's per-sample results travel with them (the rollout log reads them in the batch's order)
    judged = [{"score": float(i), "text": f"t{i}", "parsed": True} for i in range(3)]
    with_results = Rewards(first.sub_scores, reward_model=judged)
    reordered = Rewards.concat(
        [with_results.index([2, 0]), Rewards({"overall": [4.0], "acc": [1.0]}, reward_model=[judged[1]])]
    )
    assert [result["text"] for result in reordered.reward_model] == ["t2", "t0", "t1"]


# ----------------------------------------------------------------------------------------------------------------
# Shipped reward functions


def test_shape_color_reward() -> None:
    reward_fn = load_reward_function(str(REWARD_DIR / "shape_color.py"))
    cases = [
        ("red", "red", 1.0, 1.0, 1.0),
        ("It is RED.", "red", 1.0, 1.0, 1.0),
        ("blue", "Red", 0.2, 1.0, 0.0),
        ("green, no wait, red", "red", 0.2, 1.0, 0.0),  # only the first colour word counts
        ("reddish bluegreen", "red", 0.0, 0.0, 0.0),  # whole words only
        ("", "yellow", 0.0, 0.0, 0.0),
        ("yellow yellow", "yellow", 1.0, 1.0, 1.0),
    ]
    scores = reward_fn([sample(response, truth) for response, truth, *_ in cases])
    for (response, _, overall, fmt, acc), score in zip(cases, scores, strict=True):
        assert score["overall"] == pytest.approx(overall), response
        assert (score["format"], score["accuracy"]) == (fmt, acc), response
    with pytest.raises(RewardError, match="not one of the colours"):
        reward_fn([sample("red", "purple")])


def test_shape_color_ceiling_without_the_image() -> None:
    """Answering the same colour for every image earns exactly 0.2 + 0.8 / 4 on balanced colours."""
    reward_fn = load_reward_function(str(REWARD_DIR / "shape_color.py"))
    colours = ["red", "green", "blue", "yellow"] * 5
    rewards = score_batch(reward_fn, [sample("blue", colour, 1) for colour in colours])
    assert rewards.scores.mean().item() == pytest.approx(0.4)


def test_math_reward() -> None:
    pytest.importorskip("mathruler.grader", reason="mathruler needs pylatexenc")
    reward_fn = load_reward_function(f"{REWARD_DIR / 'math.py'}:compute_score", {"format_weight": 0.1})
    assert reward_fn.reward_type == "batch"
    scores = reward_fn(
        [
            sample("<think>2+2</think> The answer is \\boxed{4}.", "4"),
            sample("< think >half</ think > so \\boxed{\\frac{1}{2}}", "0.5"),  # spaced tags, symbolic match
            sample("The answer is \\boxed{4}", "4"),  # right but no reasoning block
            sample("<think>hmm</think> \\boxed{5}", "4"),
            sample("<think>hmm</think> 4", "4"),  # no box: wrong format and no answer
        ]
    )
    expected = [(1.0, 1.0, 1.0), (1.0, 1.0, 1.0), (0.9, 0.0, 1.0), (0.1, 1.0, 0.0), (0.0, 0.0, 0.0)]
    for score, (overall, fmt, acc) in zip(scores, expected, strict=True):
        assert score["overall"] == pytest.approx(overall)
        assert (score["format"], score["accuracy"]) == (fmt, acc)


def test_r1v_reward() -> None:
    pytest.importorskip("mathruler.grader", reason="mathruler needs pylatexenc")
    reward_fn = load_reward_function(str(REWARD_DIR / "r1v.py"))
    assert reward_fn.reward_type == "sequential"
    scores = reward_fn(
        [
            sample("<think>count</think>\n<answer> 3 </answer>", "3"),
            sample("<think>count</think><answer>4</answer>", "3"),
            sample("3", "3"),  # no tags: the whole response is graded
            sample("<answer>3</answer>", "3"),  # answer without reasoning
        ]
    )
    expected = [(1.0, 1.0, 1.0), (0.5, 1.0, 0.0), (0.5, 0.0, 1.0), (0.5, 0.0, 1.0)]
    for score, (overall, fmt, acc) in zip(scores, expected, strict=True):
        assert score["overall"] == pytest.approx(overall)
        assert (score["format"], score["accuracy"]) == (fmt, acc)


def test_the_reward_actor_scores_without_importing_torch() -> None:
    """The reward actor is a process of its own; with torch imported it would hold ~0.2 GB more for nothing. The
    check runs in a fresh interpreter: this one has torch already."""
    repo = Path(__file__).resolve().parents[1]
    script = textwrap.dedent(
        """
        import sys
        from easyr1.reward.ray_scorer import RewardActor
        from easyr1.reward import load_reward_function, score_batch
        reward_fn = load_reward_function("reward_function/math.py")
        rewards = score_batch(reward_fn, [{"response": "\\\\boxed{4}", "ground_truth": "4", "response_length": 3,
                                           "prompt": "2+2?"}])
        assert rewards.sub_scores["accuracy"] == [1.0], rewards.sub_scores
        print("torch" in sys.modules)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=repo,
        env={**os.environ, "PYTHONPATH": str(repo)},
        capture_output=True,
        text=True,
        check=True,
    )
    assert result.stdout.strip() == "False", "the reward actor's imports pull in torch: " + result.stdout


def test_rewards_make_their_float32_scores_from_overall() -> None:
    rewards = Rewards({"overall": [0.5, 1.0], "acc": [0.0, 1.0]})
    assert rewards.scores.dtype == torch.float32 and rewards.scores.tolist() == [0.5, 1.0]
    assert rewards.index(torch.tensor([1])).scores.tolist() == [1.0]


@pytest.mark.ray
def test_the_ray_scorer_hands_the_reward_files_error_to_the_driver_as_it_is(tmp_path):
    """Scored in the Ray actor, a reward function that raises reaches the driver as the RewardError the function's
    own call gives (its message names the sample), not as Ray's task error; a working file scores as in-process."""
    from helpers import start_ray
    from test_cli import RAISING_REWARD

    from easyr1.errors import RewardError
    from easyr1.reward.ray_scorer import RayRewardScorer

    start_ray()
    bad = tmp_path / "bad_reward.py"
    bad.write_text(RAISING_REWARD)
    inputs = [{"response": "red", "response_length": 1, "ground_truth": "red", "prompt": "?"}]
    scorer = RayRewardScorer(str(bad), {}, None, num_cpus=1)
    try:
        pending = scorer.score(inputs)
        with pytest.raises(RewardError, match=r"ZeroDivisionError.*sample 0"):
            pending.result()
    finally:
        scorer.close()
    shape_color = str(Path(__file__).resolve().parents[1] / "reward_function" / "shape_color.py")
    good = RayRewardScorer(shape_color, {}, None, num_cpus=1)
    try:
        expected = score_batch(load_reward_function(shape_color), inputs)
        assert good.score(inputs).result() == expected
    finally:
        good.close()
