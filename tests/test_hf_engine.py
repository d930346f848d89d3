"""The HF engine (``worker.rollout.name=hf``): a prompt's samples in one ``generate``, each row sampled from its own
seed, and nothing of the checkpoint's own sampling defaults."""

from __future__ import annotations

import json
import shutil

import numpy as np
import torch
from helpers import prompt_batch

from easyr1.engines.base import SamplingSettings
from easyr1.engines.hf_engine import HFEngine


SAMPLING = SamplingSettings(temperature=1.0, max_tokens=12, ignore_eos=True)


def _engine(model_dir) -> HFEngine:
    return HFEngine(
        str(model_dir), dtype=torch.float32, pad_token_id=0, eos_token_ids=[], banned_token_ids=[], device="cpu"
    )


def _objects(values: list) -> np.ndarray:
    array = np.empty(len(values), dtype=object)
    array[:] = values
    return array


def test_a_prompts_samples_share_one_generate_and_each_row_is_what_it_would_be_alone(
    tiny_qwen2_5_vl_dir, tiny_dataset_dir
):
    engine = _engine(tiny_qwen2_5_vl_dir)
    prompts = prompt_batch(tiny_qwen2_5_vl_dir, tiny_dataset_dir, 3).repeat(4, interleave=True)
    seeds = list(range(100, 112))
    assert engine.input_groups(prompts) == [(0, 4), (4, 4), (8, 4)]
    calls = []
    generate = engine.model.generate

    def counted(*args, **kwargs):
        calls.append(kwargs["input_ids"].shape[0])
        return generate(*args, **kwargs)

    engine.model.generate = counted
    together = engine.generate(prompts, SAMPLING, seeds)
    assert calls == [4, 4, 4]
    alone = [engine.generate(prompts.index([row]), SAMPLING, [seeds[row]]) for row in range(len(prompts))]
    assert torch.equal(torch.cat([one["responses"] for one in alone]), together["responses"])
    torch.testing.assert_close(
        torch.cat([one["rollout_log_probs"] for one in alone]), together["rollout_log_probs"], rtol=0, atol=1e-5
    )
    # a prompt's samples differ from each other: each row drew from its own seed
    assert len({tuple(row) for row in together["responses"][:4].tolist()}) == 4


def test_rows_differing_in_their_partial_response_or_activity_are_generated_apart(
    tiny_qwen2_5_vl_dir, tiny_dataset_dir
):
    prompts = prompt_batch(tiny_qwen2_5_vl_dir, tiny_dataset_dir, 2).repeat(3, interleave=True)
    assert HFEngine.input_groups(prompts) == [(0, 3), (3, 3)]
    continued = prompts.index(list(range(6)))
    continued["partial_ids"] = _objects([[], [], [7, 8], [], [], []])
    continued["partial_log_probs"] = _objects([[], [], [-1.0, -1.0], [], [], []])
    continued["active"] = torch.tensor([True, True, True, True, False, True])
    assert HFEngine.input_groups(continued) == [(0, 2), (2, 1), (3, 1), (4, 1), (5, 1)]
    # rows of different prompts are never one generate, even side by side
    two = prompt_batch(tiny_qwen2_5_vl_dir, tiny_dataset_dir, 2)
    assert HFEngine.input_groups(two) == [(0, 1), (1, 1)]


def test_the_checkpoints_sampling_defaults_leave_the_samples_unchanged(
    tiny_qwen2_5_vl_dir, tiny_dataset_dir, tmp_path
):
    """A checkpoint's generation_config.json may carry sampling defaults (Qwen2-VL-Instruct's: a repetition
    penalty of 1.05, top-k 1); transformers' generate applies them unless told otherwise. The rollout samples what
    worker.rollout says, as vLLM does, so a checkpoint with other defaults gives the same tokens and log-probs."""
    opinionated = tmp_path / "model"
    shutil.copytree(tiny_qwen2_5_vl_dir, opinionated)
    config_path = opinionated / "generation_config.json"
    generation = json.loads(config_path.read_text()) if config_path.exists() else {}
    generation.update(do_sample=True, temperature=0.1, top_k=1, top_p=0.001, repetition_penalty=5.0)
    config_path.write_text(json.dumps(generation))
    prompts = prompt_batch(tiny_qwen2_5_vl_dir, tiny_dataset_dir, 2).repeat(2, interleave=True)
    seeds = [1, 2, 3, 4]
    plain = _engine(tiny_qwen2_5_vl_dir).generate(prompts, SAMPLING, seeds)
    other = _engine(opinionated).generate(prompts, SAMPLING, seeds)
    assert torch.equal(plain["responses"], other["responses"])
    torch.testing.assert_close(plain["rollout_log_probs"], other["rollout_log_probs"], rtol=0, atol=0)
