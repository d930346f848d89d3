"""Generation that stops early and continues later (``async_training.schedule=partial_rollout``), engine by engine.

A call with a :class:`~easyr1.engines.StopRule` ends once enough groups are complete; the rows still running come
back with the tokens they have, and a later call continues them: the prompt followed by the partial tokens, the
same images, the rest of the token budget. The continued response must be one the trainer scores as the engine
sampled it: the actor's log-probs of every token (the partial ones and the new ones) equal the engine's, which holds
only if the continuation saw the images at their positions.
"""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch
from helpers import single_rank_vllm_world

from easyr1.data import RLDataset, collate_fn
from easyr1.engines.base import SamplingSettings, StopRule, stop_position
from easyr1.models.loading import load_model, load_model_config, load_tokenizer_and_processor
from easyr1.protocol import Batch
from easyr1.workers.actor import response_log_probs


MAX_PROMPT_LENGTH = 128
MAX_TOKENS = 24
# fp32 on both sides; both engines sample at the dataset's positions, the ones the actor scores with (the HF engine
# once placed image tokens at text positions: a gap of ~3e-3 on this model)
GAP_LIMIT = {"VLLMEngine": 1e-4, "HFEngine": 1e-4}


def test_stop_position_waits_for_the_quota_of_groups_and_the_rows_that_must_finish():
    lengths = [3, 9, 4, 2, 7, 20]
    finished = [True, True, True, True, True, False]
    uids = ["a", "a", "b", "b", "c", "c"]
    # group a completes at 9, b at 4, c never (its last row is cut by the budget)
    assert stop_position(lengths, finished, uids, [False] * 6, groups=1) == 4
    assert stop_position(lengths, finished, uids, [False] * 6, groups=2) == 9
    assert stop_position(lengths, finished, uids, [False] * 6, groups=3) == 2**62  # run every row to its end
    must = [False, True, False, False, False, False]
    assert stop_position(lengths, finished, uids, must, groups=1) == 9  # row 1 must finish even if b is enough


def _prompts(model_dir, data_dir, rows: list[int]) -> Batch:
    tokenizer, processor = load_tokenizer_and_processor(str(model_dir))
    dataset = RLDataset(
        str(data_dir / "train.jsonl"),
        tokenizer,
        processor,
        prompt_key="problem",
        max_prompt_length=MAX_PROMPT_LENGTH,
        model_config=load_model_config(str(model_dir)),
    )
    prompts = collate_fn([dataset[i] for i in rows]).repeat(2, interleave=True)
    prompts["uid"] = np.array([f"g{row // 2}" for row in range(len(prompts))], dtype=object)
    return prompts


def _as_partial(prompts: Batch, batch: Batch, rows: list[int], lengths: list[int]) -> Batch:
    """Rows ``rows`` of ``prompts`` continuing the first ``lengths`` tokens of their responses in ``batch``."""
    out = prompts.index(rows)
    out["partial_ids"] = _objects([batch["responses"][row, :length].tolist() for row, length in zip(rows, lengths)])
    out["partial_log_probs"] = _objects(
        [batch["rollout_log_probs"][row, :length].tolist() for row, length in zip(rows, lengths)]
    )
    return out


def _objects(values: list) -> np.ndarray:
    array = np.empty(len(values), dtype=object)
    array[:] = values
    return array


def _check_against_the_actor(model_dir, batch: Batch, banned: list[int], limit: float) -> None:
    model = load_model(str(model_dir), torch.float32).eval()
    with torch.no_grad():
        actor, _ = response_log_probs(model, batch, 1.0, banned_token_ids=banned)
    mask = batch["response_mask"].bool()
    gaps = (actor - batch["rollout_log_probs"]).abs() * mask
    gap = float(gaps.max())
    assert gap < limit, f"the continued responses are not what the actor scores: max gap {gap:.2e}"


def _run_partial_round_trip(engine, prompts: Batch, model_dir, banned: list[int]) -> None:
    """Three segments per response: a whole first call, a call that stops at one complete group, a last call."""
    sampling = SamplingSettings(temperature=1.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    whole = engine.generate(prompts, sampling, list(range(100, 100 + len(prompts))))
    assert int(whole["response_mask"].sum(-1).min()) == MAX_TOKENS
    # groups g0, g1, g2 keep 20, 4 and 12 tokens: g0 has 4 tokens of budget left, g2 12, g1 20
    kept = [20, 20, 4, 4, 12, 12]
    rows = _as_partial(prompts, whole, list(range(len(prompts))), kept)
    seeds = list(range(200, 200 + len(rows)))
    unstopped = engine.generate(rows, sampling, seeds)
    first = engine.generate(rows, sampling, seeds, StopRule(groups=1))
    assert first["finished"].tolist() == [True, True, False, False, False, False]
    lengths = first["response_mask"].sum(-1).tolist()
    assert lengths[:2] == [MAX_TOKENS, MAX_TOKENS] and all(length < MAX_TOKENS for length in lengths[2:])
    for row in range(len(rows)):  # what a stopped row has is a prefix of what it would have had
        assert first["responses"][row, : lengths[row]].tolist() == unstopped["responses"][row, : lengths[row]].tolist()
        assert int(first["new_tokens"][row]) == lengths[row] - kept[row]
    assert first["responses"][:, :4].tolist() == whole["responses"][:, :4].tolist()  # every partial is kept

    open_rows = [row for row in range(len(rows)) if not bool(first["finished"][row])]
    last = engine.generate(
        _as_partial(prompts, first, open_rows, [lengths[row] for row in open_rows]),
        sampling,
        [300 + row for row in open_rows],
    )
    assert bool(last["finished"].all()) and last["response_mask"].sum(-1).tolist() == [MAX_TOKENS] * len(open_rows)
    # every token of the three segments is scored by the actor as the engine sampled it: images and positions right
    limit = GAP_LIMIT[type(engine).__name__]
    _check_against_the_actor(model_dir, Batch.concat([first.index([0, 1]), last]), banned, limit)


def test_hf_engine_stops_at_the_quota_and_continues_partial_responses(tiny_qwen2_5_vl_dir, tiny_dataset_dir):
    from easyr1.engines.hf_engine import HFEngine

    config = load_model_config(str(tiny_qwen2_5_vl_dir))
    banned = [config.image_token_id, config.video_token_id]
    engine = HFEngine(
        str(tiny_qwen2_5_vl_dir),
        dtype=torch.float32,
        pad_token_id=0,
        eos_token_ids=[load_tokenizer_and_processor(str(tiny_qwen2_5_vl_dir))[0].eos_token_id],
        banned_token_ids=banned,
        device="cpu",
    )
    _run_partial_round_trip(
        engine, _prompts(tiny_qwen2_5_vl_dir, tiny_dataset_dir, [0, 1, 2]), tiny_qwen2_5_vl_dir, banned
    )


@pytest.fixture(scope="module")
def engine_world():
    with single_rank_vllm_world(VLLM_CPU_KVCACHE_SPACE="1"):
        yield


@pytest.fixture(scope="module")
def mixed_dir(tmp_path_factory):
    from easyr1.tools.tiny_dataset import build_mixed_dataset

    return build_mixed_dataset(tmp_path_factory.mktemp("mixed"), num_rows=4, seed=0)


@pytest.mark.vllm
def test_vllm_engine_stops_at_the_quota_and_continues_partial_responses_with_their_images(
    tiny_qwen2_5_vl_dir, mixed_dir, engine_world
):
    """One image, three images and a video (the mixed rows 1-3), each continued twice."""
    from easyr1.engines.vllm_engine import VLLMEngine

    config = load_model_config(str(tiny_qwen2_5_vl_dir))
    banned = [config.image_token_id, config.video_token_id]
    engine = VLLMEngine(
        str(tiny_qwen2_5_vl_dir),
        str(tiny_qwen2_5_vl_dir),
        dtype=torch.float32,
        max_model_len=MAX_PROMPT_LENGTH + MAX_TOKENS,
        tensor_parallel_size=1,
        seed=0,
        pad_token_id=0,
        banned_token_ids=banned,
        enforce_eager=True,
    )
    try:
        _run_partial_round_trip(
            engine, _prompts(tiny_qwen2_5_vl_dir, mixed_dir, [1, 2, 3]), tiny_qwen2_5_vl_dir, banned
        )
    finally:
        del engine
        gc.collect()
