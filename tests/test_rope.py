"""M-rope position ids: against transformers' own implementation, a hand-written rule and a real forward pass."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import AutoModelForImageTextToText, AutoProcessor

from easyr1.models.rope import (
    MRopeSettings,
    extend_position_ids,
    get_rope_index,
    prompt_position_ids,
    text_position_ids,
)
from easyr1.tools.tiny_model import VISION_FAMILIES as FAMILIES


def _reference_rope_index(tokens: list[int], settings: MRopeSettings, grids: list[tuple[int, int, int, float]]):
    """The m-rope rule written out with plain loops: text advances by one, a vision grid starts at the current
    position, and the text after it continues from the largest position used so far + 1."""
    rows: list[list[int]] = [[], [], []]
    position, grid_index, i = 0, 0, 0
    vision_ids = {settings.image_token_id, settings.video_token_id}
    while i < len(tokens):
        if tokens[i] not in vision_ids:
            for row in rows:
                row.append(position)
            position += 1
            i += 1
            continue
        t, h, w, step = grids[grid_index]
        grid_index += 1
        largest = position
        for ti in range(t):
            for hi in range(h):
                for wi in range(w):
                    values = (position + int(ti * step), position + hi, position + wi)
                    for row, value in zip(rows, values):
                        row.append(value)
                    largest = max(largest, *values)
        position = largest + 1
        i += t * h * w
    return torch.tensor(rows)


@pytest.fixture(scope="module")
def models(tiny_model_dir):
    loaded = {}
    for family in FAMILIES:
        path = tiny_model_dir(family)
        loaded[family] = (
            AutoModelForImageTextToText.from_pretrained(path).eval(),
            AutoProcessor.from_pretrained(path),
        )
    return loaded


def _content(pieces: list[str]) -> list[dict]:
    return [{"type": piece} if piece in ("image", "video") else {"type": "text", "text": piece} for piece in pieces]


CASES = {
    "text": (["What is 3 + 4?"], []),
    "one_image": (["image", "What colour is the shape?"], [(56, 56)]),
    "two_images": (["Compare", "image", "with", "image", "please."], [(112, 56), (56, 84)]),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("family", FAMILIES)
def test_matches_transformers_get_rope_index(models, family, case):
    model, processor = models[family]
    pieces, sizes = CASES[case]
    text = processor.apply_chat_template(
        [{"role": "user", "content": _content(pieces)}], add_generation_prompt=True, tokenize=False
    )
    images = [Image.new("RGB", size, (i * 80, 50, 200)) for i, size in enumerate(sizes)] or None
    inputs = processor(text=[text], images=images, return_tensors="pt")
    settings = MRopeSettings.from_model_config(model.config)
    ours = get_rope_index(inputs["input_ids"][0], settings, image_grid_thw=inputs.get("image_grid_thw"))
    if images is None:
        assert torch.equal(ours, torch.arange(inputs["input_ids"].shape[1]).expand(3, -1))
        return
    expected, _ = model.model.get_rope_index(
        inputs["input_ids"], mm_token_type_ids=inputs["mm_token_type_ids"], image_grid_thw=inputs["image_grid_thw"]
    )
    assert torch.equal(ours, expected[:, 0])


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_video_positions_match_transformers(models, family):
    model, processor = models[family]
    text = processor.apply_chat_template(
        [{"role": "user", "content": _content(["video", "What happens?", "image"])}],
        add_generation_prompt=True,
        tokenize=False,
    )
    # Frames of 4x4 merged tokens: transformers 5.19 continues the text after a video at the spatial extent, which
    # equals the largest position + 1 only while the temporal positions stay below it (see the long-video test).
    side = 128 if family == "qwen3_vl" else 112
    video = np.stack([np.full((side, side, 3), 30 * i, dtype=np.uint8) for i in range(4)])
    metadata = [{"fps": 2.0, "total_num_frames": 4, "frames_indices": [0, 1, 2, 3]}]
    inputs = processor(
        text=[text],
        images=[Image.new("RGB", (side // 2, side // 2))],
        videos=[video],
        video_metadata=metadata,
        do_sample_frames=False,
        return_tensors="pt",
    )
    settings = MRopeSettings.from_model_config(model.config)
    ours = get_rope_index(
        inputs["input_ids"][0],
        settings,
        image_grid_thw=inputs["image_grid_thw"],
        video_grid_thw=inputs["video_grid_thw"],
        second_per_grid_ts=inputs.get("second_per_grid_ts"),
    )
    expected, _ = model.model.get_rope_index(
        inputs["input_ids"],
        mm_token_type_ids=inputs["mm_token_type_ids"],
        image_grid_thw=inputs["image_grid_thw"],
        video_grid_thw=inputs["video_grid_thw"],
        second_per_grid_ts=inputs.get("second_per_grid_ts"),
    )
    assert torch.equal(ours, expected[:, 0])
    assert inputs["video_grid_thw"][0, 0] == 2 and (inputs["input_ids"] == settings.video_token_id).sum() == 32


def test_long_video_continues_after_the_largest_temporal_position():
    # 6 temporal grids of 1x2 merged tokens, 2 seconds per grid at 2 tokens per second: temporal positions step by 4,
    # so the text after the video must start beyond them (transformers 5.19 restarts at the spatial extent instead;
    # vLLM and the original Qwen code use the largest position + 1, which is what the rollout sees).
    settings = MRopeSettings(image_token_id=90, video_token_id=91, spatial_merge_size=2, tokens_per_second=2)
    tokens = [1, 2, *[91] * 12, 3, 4, 90, 90, 90, 90, 5]
    ours = get_rope_index(
        torch.tensor(tokens),
        settings,
        image_grid_thw=torch.tensor([[1, 4, 4]]),
        video_grid_thw=torch.tensor([[6, 2, 4]]),
        second_per_grid_ts=[2.0],
    )
    expected = _reference_rope_index(tokens, settings, [(6, 1, 2, 4.0), (1, 2, 2, 1.0)])
    assert torch.equal(ours, expected)
    assert ours[0, 14].item() == 2 + 5 * 4 + 1  # first text token after the video


def test_qwen3_frames_are_separate_grids():
    settings = MRopeSettings(image_token_id=90, video_token_id=91, spatial_merge_size=2, frames_as_separate_grids=True)
    # two frames of 2x2 merged tokens, each preceded by two timestamp tokens
    tokens = [1, 7, 8, 91, 91, 91, 91, 7, 8, 91, 91, 91, 91, 2]
    ours = get_rope_index(torch.tensor(tokens), settings, video_grid_thw=torch.tensor([[2, 4, 4]]))
    expected = _reference_rope_index(tokens, settings, [(1, 2, 2, 1.0), (1, 2, 2, 1.0)])
    assert torch.equal(ours, expected)


def test_padding_gets_zero_and_real_tokens_are_unchanged():
    settings = MRopeSettings(image_token_id=90, video_token_id=91)
    tokens = torch.tensor([5, 6, 90, 90, 90, 90, 7, 8])
    grid = torch.tensor([[1, 4, 4]])
    unpadded = get_rope_index(tokens, settings, image_grid_thw=grid)
    padded_ids = torch.cat([torch.zeros(3, dtype=torch.long), tokens])
    mask = torch.cat([torch.zeros(3, dtype=torch.long), torch.ones(8, dtype=torch.long)])
    padded = get_rope_index(padded_ids, settings, image_grid_thw=grid, attention_mask=mask)
    assert torch.equal(padded[:, :3], torch.zeros(3, 3, dtype=torch.long))
    assert torch.equal(padded[:, 3:], unpadded)
    full = prompt_position_ids(padded_ids, mask, settings, image_grid_thw=grid)
    assert full.shape == (4, 11)
    assert full[0].tolist() == [0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7]
    assert torch.equal(full[1:], padded)
    assert prompt_position_ids(padded_ids, mask).tolist() == full[0].tolist()


def test_vision_token_count_must_match_the_grids():
    settings = MRopeSettings(image_token_id=90, video_token_id=91)
    with pytest.raises(ValueError, match="fewer image tokens"):
        get_rope_index(torch.tensor([1, 90, 90, 90, 90, 2]), settings, image_grid_thw=torch.tensor([[1, 4, 4]] * 2))
    with pytest.raises(ValueError, match="more image tokens"):
        get_rope_index(torch.tensor([1, 90, 90, 90, 90, 2, 90]), settings, image_grid_thw=torch.tensor([[1, 4, 4]]))
    with pytest.raises(ValueError, match="do not match the grid"):
        get_rope_index(torch.tensor([1, 90, 90, 90, 2]), settings, image_grid_thw=torch.tensor([[1, 4, 4]]))


def test_text_position_ids_count_real_tokens_only():
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 0]])
    assert text_position_ids(mask).tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 3, 0]]


def test_extend_position_ids_continues_every_row():
    prompt = torch.tensor([[0, 0, 0, 1, 2], [0, 1, 2, 3, 4]])
    extended = extend_position_ids(prompt, 3)
    assert extended.tolist() == [[0, 0, 0, 1, 2, 3, 4, 5], [0, 1, 2, 3, 4, 5, 6, 7]]

    # (B, 4, P): the first prompt ends with text, the second with an image whose width row runs ahead
    mrope = torch.tensor(
        [
            [[0, 0, 1, 2, 3], [0, 0, 1, 1, 4], [0, 0, 1, 2, 4], [0, 0, 2, 1, 4]],
            [[0, 1, 2, 3, 4], [0, 1, 2, 2, 2], [0, 1, 2, 2, 3], [0, 1, 2, 3, 2]],
        ]
    )
    extended = extend_position_ids(mrope, 2)
    assert extended.shape == (2, 4, 7)
    assert torch.equal(extended[..., :5], mrope)
    for b in range(2):
        assert extended[b, 0, 5:].tolist() == [int(mrope[b, 0].max()) + 1, int(mrope[b, 0].max()) + 2]
        common = int(mrope[b, 1:].max())
        for row in range(1, 4):
            assert extended[b, row, 5:].tolist() == [common + 1, common + 2]
    assert torch.equal(extend_position_ids(mrope[:, 1:], 2), extended[:, 1:])
    assert torch.equal(extend_position_ids(mrope, 0), mrope)


@pytest.mark.parametrize("family", FAMILIES)
def test_left_padded_batch_forward_equals_single_rows(models, family, tiny_dataset_dir, tmp_path):
    """A left-padded batch with (4, B, L) position ids and an attention mask gives each row's unpadded logits."""
    import json

    from easyr1.data import RLDataset, collate_fn

    rows = [
        {"problem": "<image>What colour is the shape?", "answer": "red", "images": ["images/train_00000.png"]},
        {"problem": "What is 3 + 4? Answer with a number.", "answer": "7"},
        {"problem": "Is <image> like <image>?", "answer": "no", "images": ["images/train_00001.png"] * 2},
    ]
    data_file = tiny_dataset_dir / f"mixed_{family}.jsonl"
    data_file.write_text("".join(json.dumps(row) + "\n" for row in rows))
    model, processor = models[family]
    dataset = RLDataset(str(data_file), processor.tokenizer, processor, prompt_key="problem", max_prompt_length=64)
    items = [dataset[i] for i in range(len(dataset))]
    batch = collate_fn(items)
    vision = [item["multi_modal_inputs"] for item in items if item["multi_modal_inputs"]]
    with torch.no_grad():
        batched = model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            position_ids=batch["position_ids"].transpose(0, 1),  # (B, 4, L) -> (4, B, L)
            pixel_values=torch.cat([v["pixel_values"] for v in vision]),
            image_grid_thw=torch.cat([v["image_grid_thw"] for v in vision]),
        ).logits
        for row, item in enumerate(items):
            mask = item["attention_mask"].bool()
            single = model(
                input_ids=item["input_ids"][mask][None],
                position_ids=item["position_ids"][:, mask][:, None],
                **item["multi_modal_inputs"],
            ).logits[0]
            assert torch.allclose(batched[row][mask], single, atol=1e-5), (family, row)
            # the positions are the ones the model computes for itself from the processor's outputs
            if item["multi_modal_inputs"]:
                own = model(input_ids=item["input_ids"][mask][None], **_own_inputs(processor, item)).logits[0]
                assert torch.allclose(own, single, atol=1e-6)


def _own_inputs(processor, item) -> dict:
    """The processor's own outputs for a dataset item (with mm_token_type_ids, so the model builds positions)."""
    tokenizer = processor.tokenizer
    text = tokenizer.decode(item["raw_prompt_ids"])
    inputs = processor(text=[text], images=item["multi_modal_data"]["images"], return_tensors="pt")
    assert torch.equal(inputs["input_ids"][0], item["input_ids"][item["attention_mask"].bool()])
    return {key: value for key, value in inputs.items() if key != "input_ids"}
