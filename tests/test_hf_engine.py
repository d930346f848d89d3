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
from easyr1.protocol import Batch


SAMPLING = SamplingSettings(temperature=1.0, max_tokens=12, ignore_eos=True)


def _engine(model_dir, rows_per_generate: int = 16) -> HFEngine:
    return HFEngine(
        str(model_dir),
        dtype=torch.float32,
        pad_token_id=0,
        eos_token_ids=[],
        banned_token_ids=[],
        device="cpu",
        rows_per_generate=rows_per_generate,
    )


def _objects(values: list) -> np.ndarray:
    array = np.empty(len(values), dtype=object)
    array[:] = values
    return array


def _counted(engine: HFEngine) -> list[int]:
    """The rows of each ``generate`` the engine makes from now on."""
    calls: list[int] = []
    generate = engine.model.generate

    def counted(*args, **kwargs):
        calls.append(kwargs["input_ids"].shape[0])
        return generate(*args, **kwargs)

    engine.model.generate = counted
    return calls


def test_rows_share_generates_of_a_bounded_size_and_each_is_what_it_would_be_alone(
    tiny_qwen2_5_vl_dir, tiny_dataset_dir
):
    engine = _engine(tiny_qwen2_5_vl_dir, rows_per_generate=5)
    # images of two sizes: prompts of two lengths, left-padded to one another in a generate
    small, large = (prompt_batch(tiny_qwen2_5_vl_dir, tiny_dataset_dir, 2, pixels=pixels) for pixels in (3136, 12544))
    prompts = Batch.concat([small, large]).repeat(3, interleave=True)
    lengths = prompts["attention_mask"].sum(dim=-1)
    assert len(set(lengths.tolist())) > 1  # the rows are left-padded to one another
    seeds = list(range(100, 112))
    calls = _counted(engine)
    together = engine.generate(prompts, SAMPLING, seeds)
    assert calls == [5, 5, 2]
    alone = [engine.generate(prompts.index([row]), SAMPLING, [seeds[row]]) for row in range(len(prompts))]
    assert torch.equal(torch.cat([one["responses"] for one in alone]), together["responses"])
    torch.testing.assert_close(
        torch.cat([one["rollout_log_probs"] for one in alone]), together["rollout_log_probs"], rtol=0, atol=1e-5
    )
    # a prompt's samples differ from each other: each row drew from its own seed
    assert len({tuple(row) for row in together["responses"][:3].tolist()}) == 3


def test_rows_continuing_a_partial_response_share_a_generate_with_fresh_rows(tiny_qwen2_5_vl_dir, tiny_dataset_dir):
    engine = _engine(tiny_qwen2_5_vl_dir)
    prompts = prompt_batch(tiny_qwen2_5_vl_dir, tiny_dataset_dir, 2).repeat(2, interleave=True)
    prompts["partial_ids"] = _objects([[], [7, 8, 9], [], [5]])
    prompts["partial_log_probs"] = _objects([[], [-1.0, -1.0, -1.0], [], [-1.0]])
    prompts["active"] = torch.tensor([True, True, False, True])
    seeds = [1, 2, 3, 4]
    calls = _counted(engine)
    together = engine.generate(prompts, SAMPLING, seeds)
    assert calls == [3]  # the inactive row is not generated
    assert together["response_mask"][2].sum() == 0
    for row in (0, 1, 3):
        alone = engine.generate(prompts.index([row]), SAMPLING, [seeds[row]])
        assert torch.equal(alone["responses"][0], together["responses"][row])
    # each row used its own budget: 12 tokens in all, the partial ones included
    assert together["response_mask"][[0, 1, 3]].sum(dim=-1).tolist() == [12, 12, 12]


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
