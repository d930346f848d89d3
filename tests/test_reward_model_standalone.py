"""worker.reward_model.placement=standalone: the reward model on a Ray worker of its own scores what the colocated
scorer scores (the classifier, the judge on the HF engine and on vLLM, whose judgements are the HF judge's token for
token), each score depending on the sample's image, and the reward function gets the results; the refusals name the
key. (A whole split run with a standalone classifier, resumed, is in test_one_step_off.py.)
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from helpers import (
    classifier_config,
    demo_config,
    judge_config,
    one_response_two_images,
    start_ray,
    tiny_judge_files,
    with_judge_requests,
)

from easyr1.errors import ConfigError
from easyr1.models.loading import load_tokenizer_and_processor
from easyr1.protocol import Batch
from easyr1.reward import build_reward_inputs
from easyr1.reward.function import RewardFunction
from easyr1.reward.scorer import LocalRewardScorer
from easyr1.reward_model.client import RewardModelClient
from easyr1.reward_model.scorer import SCORE, TEXT, RewardModelScorer


@pytest.fixture(scope="module")
def judge_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return tiny_judge_files(tmp_path_factory.mktemp("reward_models"))


def colocated_results(config, batch: Batch, model_dir: Path) -> tuple[list[float], list[str | None]]:
    """The scores and texts the colocated scorer (in this process) gives ``batch``, a judge on the HF engine (greedy
    in fp32: the vLLM judge must write the same judgements token for token)."""
    config = copy.deepcopy(config)
    config.worker.reward_model.engine = "hf"
    scorer = RewardModelScorer(config, torch.float32, "cpu")
    try:
        results = scorer.score(with_judge_requests(config, batch, model_dir))
        return results[SCORE].tolist(), list(results[TEXT])
    finally:
        scorer.close()


@pytest.mark.ray
@pytest.mark.parametrize("kind", ["classifier", "judge-hf", pytest.param("judge-vllm", marks=pytest.mark.vllm)])
def test_standalone_worker_scores_what_the_colocated_scorer_scores(
    kind, tiny_qwen2_5_vl_dir, tiny_dataset_dir, judge_files
):
    """One RewardModelWorker in its own Ray actor: two samples that differ by their image alone get two different
    scores, each the colocated scorer's; the reward function (the built-in one: the score is the reward) gets them
    through its ``reward_model`` argument."""
    from easyr1.build import start_reward_model_workers
    from easyr1.reward_model.worker import RewardModelWorker

    standalone = ["worker.reward_model.placement=standalone", "worker.reward.reward_function=null"]
    if kind == "classifier":
        config = classifier_config(tiny_qwen2_5_vl_dir, tiny_dataset_dir, judge_files, *standalone)
    else:
        engine = f"worker.reward_model.engine={kind.removeprefix('judge-')}"
        config = judge_config(tiny_qwen2_5_vl_dir, tiny_dataset_dir, judge_files, engine, *standalone)
    config.fill_derived()  # no reward file: the built-in one, the reward model's score
    batch = one_response_two_images(tiny_qwen2_5_vl_dir, tiny_dataset_dir)
    tokenizer, _ = load_tokenizer_and_processor(str(tiny_qwen2_5_vl_dir))
    inputs = build_reward_inputs(batch, tokenizer, True)
    expected, texts = colocated_results(config, batch, tiny_qwen2_5_vl_dir)
    assert expected[0] != expected[1]  # the same text: only the image differs

    start_ray()
    own_workers = start_reward_model_workers(config, "cpu")
    client = RewardModelClient(config, None, own_workers)
    try:
        own_workers.run_all(RewardModelWorker.init_models)
        scorer = LocalRewardScorer(RewardFunction(config.worker.reward.reward_function))
        rewards = client.rewards(batch, inputs, scorer).result()
    finally:
        client.close()
    assert [result["score"] for result in rewards.reward_model] == pytest.approx(expected, abs=1e-4)
    assert [result["text"] for result in rewards.reward_model] == texts  # None for the classifier
    assert rewards.sub_scores["overall"] == pytest.approx(expected, abs=1e-4)
    assert [reward_input["reward_model"]["score"] for reward_input in inputs] == pytest.approx(expected, abs=1e-4)


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        (["worker.reward_model.placement=remote"], "worker.reward_model.placement"),
        (["worker.reward_model.placement=standalone", "trainer.single_process=true"], "trainer.single_process"),
        (
            [
                "async_training.schedule=one_step_off",
                "async_training.placement=split",
                "async_training.generator_workers=1",
            ],
            "worker.reward_model.placement=standalone",
        ),
        (["worker.reward_model.placement=standalone", "worker.reward_model.num_workers=0"], "num_workers"),
    ],
)
def test_placement_refusals_name_the_key(tiny_qwen2_5_vl_dir, tiny_dataset_dir, overrides, named):
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
        demo_config(
            tiny_qwen2_5_vl_dir,
            tiny_dataset_dir,
            "worker.reward_model.kind=classifier",
            f"worker.reward_model.model_path={tiny_qwen2_5_vl_dir}",
            *overrides,
        )
