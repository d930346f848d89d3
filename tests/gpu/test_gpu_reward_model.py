"""On a GPU: a colocated reward model gives its device memory back when it sleeps, and still sees the images.

The classifier and the judge on the HF engine (the GPU test machines have no vLLM: the vLLM judge's sleep is vLLM's
own, level 1, as the policy engine's in ``test_gpu_vllm.py``), each as a worker holds it (``RewardModelScorer``, fp32
here so that the scores can be compared with the CPU's): CUDA's allocated bytes before it is built, after it is built
(asleep), and after it scored a batch and went back to sleep. The numbers are printed for the closing note (``-s``
shows them).
"""

from __future__ import annotations

import pytest
import torch
from helpers import classifier_config, judge_config, one_response_two_images, tiny_judge_files, with_judge_requests


pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

MIB = 2**20


@pytest.fixture(scope="module")
def judge_files(tmp_path_factory):
    return tiny_judge_files(tmp_path_factory.mktemp("gpu_reward_models"))


@pytest.mark.parametrize("kind", ["classifier", "judge-hf"])
def test_colocated_reward_model_sleeps_back_to_the_memory_it_found(
    kind, tiny_qwen2_5_vl_dir, tiny_dataset_dir, judge_files
):
    from easyr1.reward_model.scorer import SCORE, RewardModelScorer

    make_config = classifier_config if kind == "classifier" else judge_config
    config = make_config(tiny_qwen2_5_vl_dir, tiny_dataset_dir, judge_files)
    batch = with_judge_requests(
        config, one_response_two_images(tiny_qwen2_5_vl_dir, tiny_dataset_dir), tiny_qwen2_5_vl_dir
    )
    expected = RewardModelScorer(config, torch.float32, "cpu").score(batch)[SCORE]

    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    scorer = RewardModelScorer(config, torch.float32, "cuda")
    built = torch.cuda.memory_allocated()
    scores = scorer.score(batch)[SCORE]  # wakes, scores, sleeps again
    torch.cuda.synchronize()
    after = torch.cuda.memory_allocated()
    print(
        f"reward model {kind}: allocated before {before / MIB:.2f} MiB, built and asleep {built / MIB:.2f} MiB, "
        f"after scoring and sleeping {after / MIB:.2f} MiB; scores cuda {scores.tolist()} cpu {expected.tolist()}"
    )
    scorer.close()
    assert built - before < MIB  # built asleep: nothing of it on the device
    assert after - before < MIB  # its weights and activations gone again
    assert scores[0] != scores[1]  # two images, the same text: the image reaches the model on the GPU too
    torch.testing.assert_close(scores, expected, rtol=1e-3, atol=1e-3)
