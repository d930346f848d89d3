"""worker.reward.timeout: the reward function runs in a child process that is killed when a call runs past the limit.
A hang (pure python, which no signal reaches from the Ray actor's thread) either stops the run with a RewardError
naming the file, the function and the sample, or, with worker.reward.timeout_score, gives that sample the stated
score and is counted; the function's own errors and non-finite scores read as they do in-process."""

from __future__ import annotations

import json
import os
import textwrap
import time
from pathlib import Path

import pytest

from easyr1.config import load_config
from easyr1.errors import ConfigError, RewardError
from easyr1.reward import LocalRewardScorer, Rewards, load_reward_function, score_batch
from easyr1.reward.timed import TimedRewardFunction, timed_reward_function


REPO = Path(__file__).resolve().parents[1]
LIMIT = 1.0

# Scores each sample with its length and the scoring process's pid; "hang" spins in pure python forever.
HANGING_REWARD = """
import json
import os
REWARD_TYPE = {reward_type!r}

def _one(item):
    if "hang" in item["response"]:
        while True:
            pass
    if item["response"] == "nan":
        return {{"overall": float("nan"), "pid": 0.0}}
    if item["response"] == "raise":
        raise ValueError("cannot grade")
    return {{"overall": float(len(item["response"])), "pid": float(os.getpid())}}

def compute_score(inputs):
    return [_one(item) for item in inputs] if REWARD_TYPE == "batch" else _one(inputs)
"""


def sample(response: str) -> dict:
    return {"response": response, "response_length": 1, "ground_truth": "gt", "prompt": "p"}


def timed(tmp_path: Path, reward_type: str, timeout_score: float | None = None) -> TimedRewardFunction:
    path = tmp_path / f"hanging_{reward_type}.py"
    path.write_text(HANGING_REWARD.format(reward_type=reward_type))
    return TimedRewardFunction(load_reward_function(f"{path}:compute_score"), LIMIT, timeout_score)


@pytest.fixture
def sequential(tmp_path):
    reward_fn = timed(tmp_path, "sequential")
    yield reward_fn
    reward_fn.close()


def test_a_sequential_hang_stops_naming_the_file_the_function_and_the_sample(sequential):
    start = time.monotonic()
    with pytest.raises(RewardError) as info:
        sequential([sample("ok"), sample("a hang here"), sample("fine")])
    assert time.monotonic() - start < LIMIT + 5
    message = str(info.value)
    assert "hanging_sequential.py:compute_score did not return within worker.reward.timeout=1 s" in message
    assert "sample 1 (response 'a hang here'" in message and "worker.reward.timeout_score" in message


def test_the_child_process_is_kept_between_calls_and_replaced_after_a_hang(sequential):
    first = sequential([sample("ok")])[0]["pid"]
    assert first != os.getpid() and sequential([sample("ok")])[0]["pid"] == first
    with pytest.raises(RewardError, match="did not return"):
        sequential([sample("hang")])
    assert sequential([sample("ok")])[0]["pid"] not in (first, os.getpid())


def test_a_timed_out_sample_gets_the_timeout_score_and_the_others_theirs(tmp_path):
    reward_fn = timed(tmp_path, "sequential", timeout_score=-1.0)
    try:
        scores, timed_out = reward_fn.score_with_timeouts(
            [sample("hang"), sample("abc"), sample("hang"), sample("xy")]
        )
    finally:
        reward_fn.close()
    assert [score["overall"] for score in scores] == [-1.0, 3.0, -1.0, 2.0]
    assert scores[0] == {"overall": -1.0, "pid": -1.0}  # every sub-score, so that every sample has the same keys
    assert timed_out == [True, False, True, False]


def test_a_batch_hang_scores_the_whole_call_and_keeps_the_keys_of_earlier_calls(tmp_path):
    reward_fn = timed(tmp_path, "batch", timeout_score=0.0)
    try:
        rewards = score_batch(reward_fn, [sample("ab")])
        assert rewards.timeouts == 0 and rewards.timed_out == [False]
        rewards = score_batch(reward_fn, [sample("ab"), sample("hang"), sample("c")])
    finally:
        reward_fn.close()
    assert rewards.sub_scores == {"overall": [0.0, 0.0, 0.0], "pid": [0.0, 0.0, 0.0]}
    assert rewards.timeouts == 3
    # the count follows the samples through a DAPO-style selection and concatenation
    assert Rewards.concat([rewards.index([2, 0]), Rewards({"overall": [1.0], "pid": [1.0]})]).timed_out == [
        True,
        True,
        False,
    ]


def test_a_batch_hang_without_a_timeout_score_says_how_to_find_the_sample(tmp_path):
    reward_fn = timed(tmp_path, "batch")
    try:
        with pytest.raises(
            RewardError, match=r"on a batch of 2 samples .*first is sample 0 .*'sequential' to find it"
        ):
            reward_fn([sample("ok"), sample("hang")])
    finally:
        reward_fn.close()


@pytest.mark.parametrize(
    ("response", "message"),
    [
        ("raise", r"raised ValueError: cannot grade on sample 1 \(response 'raise'"),
        ("nan", r"on sample 1 \(response 'nan'.*'overall' is nan; every score must be finite"),
    ],
)
def test_errors_and_non_finite_scores_read_as_in_this_process(sequential, response, message):
    with pytest.raises(RewardError, match=message):
        sequential([sample("ok"), sample(response)])
    assert sequential([sample("ok")])[0]["overall"] == 2.0  # the child is still of use


def test_an_import_that_fails_in_the_child_is_a_reward_error(tmp_path):
    path = tmp_path / "flaky_import.py"
    # imports in this process (the start-up check), fails in the reward process
    path.write_text(
        textwrap.dedent(
            f"""
            import os
            if os.getpid() != {os.getpid()}:
                raise ImportError("no grader here")

            def compute_score(inputs):
                return [{{"overall": 1.0}} for _ in inputs]
            """
        )
    )
    reward_fn = TimedRewardFunction(load_reward_function(str(path)), LIMIT)
    with pytest.raises(RewardError, match="flaky_import.py.*no grader here"):
        reward_fn([sample("ok")])
    reward_fn.close()


def test_importing_the_reward_file_may_take_longer_than_one_call(tmp_path):
    """The per-call limit does not bound the child's start (importing the reward file): a file slower to import than
    the limit still scores, and its calls are limited as before."""
    path = tmp_path / "slow_import.py"
    path.write_text(f"import time\ntime.sleep({LIMIT * 1.5})\n" + HANGING_REWARD.format(reward_type="sequential"))
    reward_fn = TimedRewardFunction(load_reward_function(f"{path}:compute_score"), LIMIT)
    try:
        assert reward_fn([sample("abc")])[0]["overall"] == 3.0
        with pytest.raises(RewardError, match="did not return"):
            reward_fn([sample("hang")])
    finally:
        reward_fn.close()


def test_the_local_scorer_closes_its_child(sequential):
    scorer = LocalRewardScorer(sequential)
    assert scorer.score([sample("ok")]).result().timed_out == [False]
    child = sequential._child.process
    scorer.close()
    assert child.poll() is not None


GATED_REWARD = """
import os, time
REWARD_TYPE = "sequential"
def compute_score(item):
    while not os.path.exists({gate!r}):  # scores only once the test opens the gate
        time.sleep(0.01)
    return {{"overall": float(len(item["response"]))}}
"""


def test_the_local_scorer_returns_at_once_and_scores_in_its_thread(tmp_path):
    """With a limit the caller is not held: ``score`` returns while the child still waits at the gate, calls are
    answered in order, and an error in the file reaches ``result`` as it is."""
    gate = tmp_path / "gate"
    path = tmp_path / "gated.py"
    path.write_text(GATED_REWARD.format(gate=str(gate)))
    scorer = LocalRewardScorer(TimedRewardFunction(load_reward_function(f"{path}:compute_score"), 30.0))
    try:
        first, second = scorer.score([sample("ab")]), scorer.score([sample("abcd"), sample("a")])
        gate.touch()  # had score() waited for the function, this line would never have run
        assert first.result().sub_scores["overall"] == [2.0]
        assert second.result().sub_scores["overall"] == [4.0, 1.0]
        path.write_text("REWARD_TYPE = 'sequential'\ndef compute_score(item):\n    raise ValueError('cannot grade')\n")
    finally:
        scorer.close()
    broken = LocalRewardScorer(TimedRewardFunction(load_reward_function(f"{path}:compute_score"), 30.0))
    try:
        pending = broken.score([sample("x")])
        with pytest.raises(RewardError, match="cannot grade"):
            pending.result()
    finally:
        broken.close()


def test_a_run_serves_a_limited_function_from_the_driver_and_an_unlimited_one_from_an_actor(monkeypatch):
    """The scorer a Ray run gets: the driver's own (the child does the work; no reward actor) under a limit, the
    Ray actor without one; a one-process run always the driver's own."""
    from easyr1 import build
    from easyr1.reward import ray_scorer

    made = []
    monkeypatch.setattr(ray_scorer, "RayRewardScorer", lambda *args, **kwargs: made.append(kwargs) or "actor")
    base = [f"config={REPO / 'examples' / 'config_cpu.yaml'}", "worker.reward.reward_function=reward_function/math.py"]
    reward_fn = load_reward_function(str(REPO / "reward_function" / "math.py"))
    for overrides, expected in (
        ([], "local-timed"),
        (["worker.reward.timeout=null"], "actor"),
        (["worker.reward.timeout=null", "trainer.single_process=true", "trainer.n_gpus_per_node=1"], "local"),
    ):
        scorer = build.start_scorer(load_config(base + overrides), reward_fn)
        kind = scorer if isinstance(scorer, str) else "local" + ("-timed" if scorer._thread is not None else "")
        assert kind == expected, overrides
        if not isinstance(scorer, str):
            scorer.close()
    assert made == [{"timeout": None, "timeout_score": None}]


def test_the_math_reward_scores_alike_with_and_without_the_limit():
    reward_fn = load_reward_function(str(REPO / "reward_function" / "math.py"))
    inputs = [sample("<think>2+2</think> \\boxed{4}") | {"ground_truth": "4"}, sample("\\boxed{9^{9^{9^{9}}}}")]
    limited = timed_reward_function(reward_fn, 5.0, None)
    try:
        assert limited(inputs) == reward_fn(inputs)
    finally:
        limited.close()
    assert timed_reward_function(reward_fn, None, None) is reward_fn


def test_config_defaults_and_checks():
    config = load_config(
        [f"config={REPO / 'examples' / 'config_cpu.yaml'}", "worker.reward.reward_function=reward_function/math.py"]
    )
    assert config.worker.reward.timeout == 300.0 and config.worker.reward.timeout_score is None
    for bad, message in (("timeout=0", "positive or null"), ("timeout_score=nan", "finite number or null")):
        with pytest.raises(ConfigError, match=message):
            load_config(
                [
                    f"config={REPO / 'examples' / 'config_cpu.yaml'}",
                    "worker.reward.reward_function=reward_function/math.py",
                    f"worker.reward.{bad}",
                ]
            )


def test_reward_actor_module_keeps_the_limit(tmp_path):
    """The Ray actor builds the same timed function from its arguments (its thread is not the main one, so the
    limit cannot be a signal): checked here without starting Ray."""
    from easyr1.reward.ray_scorer import RewardActor

    path = tmp_path / "hanging_sequential.py"
    path.write_text(HANGING_REWARD.format(reward_type="sequential"))
    actor = RewardActor.__ray_actor_class__(f"{path}:compute_score", {}, None, LIMIT, 5.0)
    try:
        assert actor.score([sample("hang"), sample("ok")]).sub_scores["overall"] == [5.0, 2.0]
    finally:
        actor.reward_fn.close()


# Scores like the demo's reward on its first call; its second call (step 2) spins forever.
HANGS_ON_THE_SECOND_CALL = """
import json

calls = 0

def compute_score(inputs):
    global calls
    calls += 1
    while calls >= 2:
        pass
    return [{"overall": float(item["ground_truth"] in item["response"])} for item in inputs]
"""


def test_a_reward_that_hangs_at_step_2_stops_the_run_and_loses_nothing(
    tiny_qwen2_5_vl_dir, tiny_dataset_dir, tmp_path, rank_environment
):
    """One short run in this process (no Ray, the HF engine): step 1 is saved, step 2's reward call hangs and is
    killed past the limit; the run stops with the sample named, step 1's checkpoint is whole and is the one a
    resume picks, and the metrics file holds step 1 as whole lines."""
    from helpers import ONE_PROCESS, train

    from easyr1.checkpoint.manager import CheckpointDirectory

    reward = tmp_path / "hangs_on_step_2.py"
    reward.write_text(HANGS_ON_THE_SECOND_CALL)
    run_dir = tmp_path / "run"
    result = train(
        [
            f"config={REPO / 'examples' / 'config_cpu.yaml'}",
            f"worker.actor.model.model_path={tiny_qwen2_5_vl_dir}",
            f"data.train_files={tiny_dataset_dir / 'train.jsonl'}",
            f"worker.reward.reward_function={reward}:compute_score",
            *ONE_PROCESS,
            "worker.rollout.name=hf",
            "data.rollout_batch_size=2",
            "worker.rollout.n=2",
            "worker.actor.global_batch_size=2",
            "data.max_response_length=4",
            "trainer.max_steps=3",
            "trainer.save_freq=1",
            "worker.reward.timeout=2",
            f"trainer.save_checkpoint_path={run_dir}",
            f"trainer.log_dir={tmp_path / 'logs'}",
        ]
    )
    assert result.returncode == 2, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("easyr1: error: ")]
    assert len(errors) == 1 and "Traceback" not in result.stderr
    assert (
        "hangs_on_step_2.py:compute_score did not return within worker.reward.timeout=2 s on a batch of 4" in errors[0]
    )
    checkpoints = CheckpointDirectory(run_dir)
    assert checkpoints.complete_steps() == [1]
    assert checkpoints.resume_path(None, find_last_checkpoint=True) == checkpoints.step_dir(1)
    lines = (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert [record["step"] for record in records] == [1]


@pytest.mark.ray
def test_the_ray_reward_actor_stops_a_hang_and_scores_on(tmp_path):
    """In the Ray actor (whose methods run outside its main thread, where no alarm signal can reach them) the child
    process is killed past the limit: the hung sample gets the timeout score and the next call is served."""
    from helpers import start_ray

    from easyr1.reward.ray_scorer import RayRewardScorer

    start_ray()
    path = tmp_path / "hanging_sequential.py"
    path.write_text(HANGING_REWARD.format(reward_type="sequential"))
    scorer = RayRewardScorer(f"{path}:compute_score", {}, None, num_cpus=1, timeout=LIMIT, timeout_score=-1.0)
    try:
        rewards = scorer.score([sample("ok"), sample("hang")]).result()
        assert rewards.sub_scores["overall"] == [2.0, -1.0] and rewards.timed_out == [False, True]
        assert scorer.score([sample("abc")]).result().sub_scores["overall"] == [3.0]
    finally:
        scorer.close()
