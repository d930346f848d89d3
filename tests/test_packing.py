"""Padding-free packing against hand-written layouts, and packed vs padded forwards on the tiny VLM."""

from __future__ import annotations

import pytest
import torch
from helpers import training_batch

from easyr1.algorithms import log_probs_from_logits
from easyr1.models.loading import load_model
from easyr1.protocol import merge_vision_inputs
from easyr1.workers.actor import forward_inputs
from easyr1.workers.packing import pack, packed_response_logits, token_budget_groups


def test_pack_layout_by_hand():
    # sample 0: prompt [5 6] (1 left pad), response [7 8] ; sample 1: prompt [9 10 11], response [12] (1 right pad)
    input_ids = torch.tensor([[0, 5, 6, 7, 8], [9, 10, 11, 12, 0]])
    attention_mask = torch.tensor([[0, 1, 1, 1, 1], [1, 1, 1, 1, 0]])
    text = torch.tensor([[0, 0, 1, 2, 3], [0, 1, 2, 3, 0]])
    position_ids = torch.stack([text, text + 10, text + 20, text + 30], dim=1)  # (B, 4, L)
    packed = pack(input_ids, attention_mask, position_ids, response_length=2)
    assert packed.input_ids.tolist() == [[5, 6, 7, 8, 9, 10, 11, 12]]
    assert packed.position_ids.shape == (4, 1, 8)
    assert packed.position_ids[0, 0].tolist() == [0, 1, 2, 3, 0, 1, 2, 3]
    assert packed.position_ids[2, 0].tolist() == [20, 21, 22, 23, 20, 21, 22, 23]
    # logits at packed index j predict token j + 1: sample 0's response [7 8] sits at 2, 3 -> logits 1, 2;
    # sample 1's response [12] sits at 7 -> logit 6; its padded slot points at its last prompt logit (6)
    assert packed.response_index.tolist() == [[1, 2], [6, 6]]
    flat = pack(input_ids, attention_mask, text, response_length=2)
    assert flat.position_ids.tolist() == [[0, 1, 2, 3, 0, 1, 2, 3]]


@pytest.mark.parametrize("counts,groups", [([5, 1, 4, 2, 3, 3], 2), ([1, 1, 1], 3), ([9, 1, 1, 1], 2), ([4], 1)])
def test_token_budget_groups_cover_every_sample_once_and_balance(counts, groups):
    result = token_budget_groups(counts, groups)
    assert len(result) == groups and all(result)
    assert sorted(i for group in result for i in group) == list(range(len(counts)))
    loads = [sum(counts[i] for i in group) for group in result]
    # longest-first to the lightest group is within the largest item of the optimum
    assert max(loads) - min(loads) <= max(counts)


def test_token_budget_groups_rejects_impossible_splits():
    with pytest.raises(ValueError, match="non-empty"):
        token_budget_groups([1, 2], 3)


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
def test_packed_forward_equals_padded_forward_and_gradients(family, tiny_model_dir, tiny_dataset_dir):
    model_dir = tiny_model_dir(family)
    torch.manual_seed(0)
    model = load_model(str(model_dir), torch.float32)
    pixels = 4096 if family == "qwen3_vl" else 3136  # 2x2 merged patches: 32 px patches for Qwen3-VL, 28 px before
    batch = training_batch(model_dir, tiny_dataset_dir, count=4, response_length=6, seed=3, pixels=pixels)
    mask = batch["response_mask"].bool()
    response_length = batch["responses"].shape[1]

    def log_probs(packed: bool) -> torch.Tensor:
        model.zero_grad(set_to_none=True)
        if packed:
            logits = packed_response_logits(
                model,
                batch["input_ids"],
                batch["attention_mask"],
                batch["position_ids"],
                response_length,
                merge_vision_inputs(batch["multi_modal_inputs"]),
            )
        else:
            logits = model(**forward_inputs(batch), use_cache=False, logits_to_keep=response_length + 1).logits[:, :-1]
        values = log_probs_from_logits(logits, batch["responses"])
        (values * mask).sum().backward()
        return values.detach()

    padded = log_probs(packed=False)
    padded_grads = {name: param.grad.clone() for name, param in model.named_parameters() if param.grad is not None}
    packed = log_probs(packed=True)
    assert (packed - padded)[mask].abs().max() < 1e-5
    for name, param in model.named_parameters():
        if name in padded_grads:
            torch.testing.assert_close(param.grad, padded_grads[name], atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
def test_packed_equals_padded_on_text_image_multi_image_and_video_rows(family, tiny_model_dir, tmp_path):
    from easyr1.data import RLDataset, collate_fn
    from easyr1.engines.base import pack_responses
    from easyr1.models.loading import load_model_config, load_tokenizer_and_processor
    from easyr1.tools.tiny_dataset import build_mixed_dataset

    model_dir = tiny_model_dir(family)
    data_dir = build_mixed_dataset(tmp_path, num_rows=4, seed=1)  # one row of each kind
    tokenizer, processor = load_tokenizer_and_processor(str(model_dir))
    dataset = RLDataset(
        str(data_dir / "train.jsonl"),
        tokenizer,
        processor,
        prompt_key="problem",
        max_prompt_length=120,
        model_config=load_model_config(str(model_dir)),
    )
    prompts = collate_fn([dataset[i] for i in range(4)])
    assert [sorted(row) for row in prompts["multi_modal_data"]] == [
        [],
        ["images"],
        ["images"],
        ["video_metadata", "videos"],
    ]
    generator = torch.Generator().manual_seed(0)
    responses = [torch.randint(0, 300, (length,), generator=generator).tolist() for length in (5, 2, 4, 3)]
    batch = pack_responses(prompts, responses, [[0.0] * len(r) for r in responses], 5, pad_token_id=0)
    mask = batch["response_mask"].bool()
    torch.manual_seed(0)
    model = load_model(str(model_dir), torch.float32)

    def log_probs_and_grads(packed: bool):
        model.zero_grad(set_to_none=True)
        if packed:
            vision = merge_vision_inputs(batch["multi_modal_inputs"])
            ids, attention, positions = batch["input_ids"], batch["attention_mask"], batch["position_ids"]
            logits = packed_response_logits(model, ids, attention, positions, 5, vision)
        else:
            logits = model(**forward_inputs(batch), use_cache=False).logits[:, -6:-1]
        values = log_probs_from_logits(logits, batch["responses"])
        (values * mask).sum().backward()
        grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
        return values.detach(), grads

    padded, padded_grads = log_probs_and_grads(packed=False)
    packed, packed_grads = log_probs_and_grads(packed=True)
    assert (packed - padded)[mask].abs().max() < 1e-5
    assert padded_grads.keys() == packed_grads.keys()
    assert any(name.startswith("model.visual.") for name in padded_grads)  # images and video reached the tower
    for name, grad in padded_grads.items():
        torch.testing.assert_close(packed_grads[name], grad, atol=1e-5, rtol=1e-4, msg=name)
