"""Prompt sharing in the actor's forward: each prompt laid out once for its samples, against the padded forward.

Log-probs, entropies and the gradients of a loss must equal the unshared path's, with groups of several sizes,
unique prompts mixed in, text-only, single-image, multi-image and video rows, prompts of different lengths (left
padding), responses of different lengths and micro-batches that split a group.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from easyr1.models.loading import load_model
from easyr1.protocol import Batch
from easyr1.workers.actor import Actor, computed_tokens, micro_batches, response_log_probs
from easyr1.workers.packing import pack_shared, prompt_group_units, prompt_groups


def test_pack_shared_layout_by_hand():
    # rows 0 and 2 share prompt [5 6] (row 2 with one more left pad); row 1 has its own prompt [9]
    # responses: row 0 [7 8], row 1 [3] (one right pad), row 2 [4 2]
    input_ids = torch.tensor([[0, 5, 6, 7, 8], [0, 0, 9, 3, 0], [0, 5, 6, 4, 2]])
    attention_mask = torch.tensor([[0, 1, 1, 1, 1], [0, 0, 1, 1, 0], [0, 1, 1, 1, 1]])
    text = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    position_ids = torch.stack([text, text + 10, text + 20, text + 30], dim=1)
    groups = prompt_groups(input_ids, attention_mask, 2)
    assert groups == [[0, 2], [1]]
    packed = pack_shared(input_ids, attention_mask, position_ids, 2, groups)
    # group 0: prompt 5 6 | row 0: 7 8 | row 2: 4 2 ; group 1: prompt 9 | row 1: 3
    assert packed.input_ids.tolist() == [[5, 6, 7, 8, 4, 2, 9, 3]]
    assert packed.position_ids[0, 0].tolist() == [0, 1, 2, 3, 2, 3, 0, 1]
    assert packed.position_ids[3, 0].tolist() == [30, 31, 32, 33, 32, 33, 30, 31]
    # row 0's first token is predicted by the prompt's last logit (1), its second by its own first token (2);
    # row 2's by 1 and 4; row 1's by 6, its padded slot points at its prompt's last logit too
    assert packed.response_index.tolist() == [[1, 2], [6, 6], [1, 4]]
    assert packed.representatives == [0, 1]
    visible = packed.attention_mask[0, 0].int().tolist()
    assert visible == [
        [1, 0, 0, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0, 0, 0],
        [1, 1, 1, 1, 0, 0, 0, 0],
        [1, 1, 0, 0, 1, 0, 0, 0],  # row 2's response sees the prompt and itself, not row 0's response
        [1, 1, 0, 0, 1, 1, 0, 0],
        [0, 0, 0, 0, 0, 0, 1, 0],  # the next group sees nothing of the first
        [0, 0, 0, 0, 0, 0, 1, 1],
    ]


def test_prompt_groups_compare_vision_inputs():
    ids = torch.tensor([[1, 2, 3], [1, 2, 4], [1, 2, 5]])
    mask = torch.ones_like(ids)
    image = {"pixel_values": torch.ones(4, 3), "image_grid_thw": torch.tensor([[1, 2, 2]])}
    other = {"pixel_values": torch.ones(4, 3) * 2, "image_grid_thw": torch.tensor([[1, 2, 2]])}
    assert prompt_groups(ids, mask, 1, [image, dict(image), other]) == [[0, 1], [2]]
    assert prompt_groups(ids, mask, 1, [image, None, image]) == [[0, 2], [1]]


def test_prompt_group_units_split_only_when_needed():
    groups = [[0, 1, 2, 3], [4, 5]]
    counts = [1] * 6
    assert prompt_group_units(groups, counts, 2) == [[0, 1, 2, 3], [4, 5]]
    assert prompt_group_units(groups, counts, 3) == [[0, 1], [2, 3], [4, 5]]
    assert len(prompt_group_units(groups, counts, 6)) == 6


def _mixed_prompts(model_dir, tmp_path):
    from easyr1.data import RLDataset, collate_fn
    from easyr1.models.loading import load_model_config, load_tokenizer_and_processor
    from easyr1.tools.tiny_dataset import build_mixed_dataset

    data_dir = build_mixed_dataset(tmp_path, num_rows=4, seed=1)  # text, image, two images, video
    tokenizer, processor = load_tokenizer_and_processor(str(model_dir))
    dataset = RLDataset(
        str(data_dir / "train.jsonl"),
        tokenizer,
        processor,
        prompt_key="problem",
        max_prompt_length=120,
        model_config=load_model_config(str(model_dir)),
    )
    return collate_fn([dataset[i] for i in range(4)])


# groups of 3, 1, 4 and 2 samples, interleaved the way the driver sends them (aabb...) and one out of order
LAYOUT = [0, 0, 0, 1, 2, 2, 2, 2, 3, 0, 3]
RESPONSE_LENGTH = 6


def _batch(prompts: Batch, seed: int) -> Batch:
    from easyr1.engines.base import pack_responses

    generator = torch.Generator().manual_seed(seed)
    rows = prompts.index(LAYOUT)
    # lengths 1..R: some responses stop early (EOS), one is a single token
    lengths = [RESPONSE_LENGTH, 2, 5, 1, 6, 3, 6, 4, 2, 6, 5]
    responses = [torch.randint(0, 300, (length,), generator=generator).tolist() for length in lengths]
    batch = pack_responses(rows, responses, [[0.0] * len(r) for r in responses], RESPONSE_LENGTH, pad_token_id=0)
    batch["advantages"] = torch.randn(len(LAYOUT), RESPONSE_LENGTH, generator=generator)
    return batch


def _loss_and_grads(model, batch: Batch, parts: list[Batch], **options):
    model.zero_grad(set_to_none=True)
    log_probs, entropies = [], []
    for part in parts:
        values, entropy = response_log_probs(
            model, part, temperature=0.7, with_entropy=True, banned_token_ids=[5], **options
        )
        mask = part["response_mask"]
        # a policy-gradient-like loss plus an entropy bonus: both reach the shared prompt's activations
        loss = ((values * part["advantages"] - 0.01 * entropy) * mask).sum()
        loss.backward()
        log_probs.append(values.detach())
        entropies.append(entropy.detach())
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return torch.cat(log_probs), torch.cat(entropies), grads


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
def test_shared_prompts_equal_padded_forward_and_gradients(family, tiny_model_dir, tmp_path):
    model_dir = tiny_model_dir(family)
    batch = _batch(_mixed_prompts(model_dir, tmp_path), seed=2)
    mask = batch["response_mask"].bool()
    torch.manual_seed(0)
    model = load_model(str(model_dir), torch.float32)

    reference, reference_entropy, reference_grads = _loss_and_grads(model, batch, [batch])
    # one micro-batch holding everything, and micro-batches of 4 that split groups 0 and 2
    whole = _loss_and_grads(model, batch, [batch], share_prompt=True)
    parts = [part for _, part in micro_batches(batch, 4, dynamic=False)]
    split = _loss_and_grads(model, batch, parts, share_prompt=True)
    assert any(name.startswith("model.visual.") for name in reference_grads)  # images reached the tower
    for log_probs, entropy, grads in (whole, split):
        assert (log_probs - reference)[mask].abs().max() < 1e-5
        assert (entropy - reference_entropy)[mask].abs().max() < 1e-5
        assert grads.keys() == reference_grads.keys()
        for name, grad in reference_grads.items():
            torch.testing.assert_close(grads[name], grad, atol=1e-5, rtol=1e-4, msg=name)
    # the vision tower and the prompts ran once per group: 4 prompts instead of 11 in the whole micro-batch
    prompt_length = batch["input_ids"].shape[1] - RESPONSE_LENGTH
    prompt_tokens = batch["attention_mask"][:, :prompt_length].sum(-1)
    unique_prompts = sum(int(prompt_tokens[LAYOUT.index(p)]) for p in range(4))
    assert computed_tokens(batch, True) == unique_prompts + int(mask.sum())
    assert computed_tokens(batch, False) == int(batch["attention_mask"].sum())


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_shared_prompts_on_a_text_model(attention, tiny_model_dir):
    model_dir = tiny_model_dir("qwen2")
    torch.manual_seed(0)
    model = load_model(str(model_dir), torch.float32, attn_implementation=attention)
    generator = torch.Generator().manual_seed(4)
    prompt_lengths, prompt_width = [7, 3, 5], 8
    prompts = [torch.randint(10, 300, (length,), generator=generator) for length in prompt_lengths]
    layout, lengths = [0, 0, 1, 2, 2, 2, 0], [4, 2, 4, 1, 3, 4, 4]
    ids = torch.zeros(len(layout), prompt_width + 4, dtype=torch.long)
    attention_mask = torch.zeros_like(ids)
    for row, (prompt, length) in enumerate(zip(layout, lengths)):
        start = prompt_width - prompt_lengths[prompt]
        ids[row, start:prompt_width] = prompts[prompt]
        ids[row, prompt_width : prompt_width + length] = torch.randint(10, 300, (length,), generator=generator)
        attention_mask[row, start : prompt_width + length] = 1
    batch = Batch(
        tensors={
            "input_ids": ids,
            "attention_mask": attention_mask,
            "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0),
            "responses": ids[:, prompt_width:],
            "response_mask": attention_mask[:, prompt_width:],
            "advantages": torch.randn(len(layout), 4, generator=generator),
        }
    )
    mask = batch["response_mask"].bool()
    reference, reference_entropy, reference_grads = _loss_and_grads(model, batch, [batch])
    log_probs, entropy, grads = _loss_and_grads(model, batch, [batch], share_prompt=True)
    # float32 rounding only (the norms and eager softmax compute in float32 even in a float64 model, so a float64
    # run differs at the 1e-7 level too: the shared prompt's gradient is summed inside them, not after)
    assert (log_probs - reference)[mask].abs().max() < 1e-5
    assert (entropy - reference_entropy)[mask].abs().max() < 1e-5
    assert grads.keys() == reference_grads.keys()
    for name, grad in reference_grads.items():
        torch.testing.assert_close(grads[name], grad, atol=1e-5, rtol=1e-4, msg=name)


def test_dynamic_micro_batches_keep_prompt_groups_together():
    # 3 prompts x 4 samples, interleaved like the driver's aabb order; a budget of 2 full rows per micro-batch
    layout = [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2]
    ids = torch.tensor([[prompt + 1, prompt + 1, 7, 8] for prompt in layout])
    mask = torch.ones_like(ids)
    batch = Batch(tensors={"input_ids": ids, "attention_mask": mask, "responses": ids[:, 2:]})
    shared = micro_batches(batch, 4, dynamic=True, share_prompt=True)
    assert sorted(rows for rows, _ in shared) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    # more micro-batches than prompts: groups are halved, never mixed
    halves = micro_batches(batch, 1, dynamic=True, share_prompt=True)
    assert len(halves) == 12 and sorted(rows for rows, _ in halves)[0] == [0]


def test_actor_counts_the_tokens_it_computes(tiny_model_dir):
    model_dir = tiny_model_dir("qwen2")
    model = load_model(str(model_dir), torch.float32)
    ids = torch.tensor([[3, 4, 5, 6], [3, 4, 7, 8], [9, 4, 7, 0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 0]])
    batch = Batch(
        tensors={
            "input_ids": ids,
            "attention_mask": mask,
            "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
            "responses": ids[:, 2:],
            "response_mask": mask[:, 2:],
        }
    )
    config = SimpleNamespace(
        use_torch_compile=False, padding_free=False, share_prompt=True, dynamic_batching=False, entropy_coeff=0.0
    )
    actor = Actor(model, config)
    actor.compute_log_probs(batch, 1.0, micro_batch_size=8)
    assert actor.computed_tokens == 2 + 2 + 2 + 2 + 1  # prompt [3 4] once for rows 0 and 1
