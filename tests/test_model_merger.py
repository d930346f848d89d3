"""Hugging Face export of checkpoints: the exported model computes what the actor computed, LoRA folded in,
vLLM serves it, and bad input gets a clear message."""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from helpers import REPO, fork_ranks, training_batch
from PIL import Image
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

from easyr1.checkpoint.merge import load_model_state_dict, merge_to_huggingface
from easyr1.checkpoint.sharded import save_component, save_hf_metadata
from easyr1.distributed.fsdp import data_parallel_mesh, shard_model
from easyr1.errors import UserError
from easyr1.models.loading import load_model, load_tokenizer_and_processor
from easyr1.models.lora import apply_lora
from easyr1.workers.actor import forward_inputs


class Lora:
    rank, alpha, target_modules, exclude_modules = 4, 8, "all-linear", None


def fixed_input(model_dir):
    """One image + text prompt, processed like a real request."""
    _, processor = load_tokenizer_and_processor(str(model_dir))
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What colour is it?"}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return dict(processor(text=[text], images=[Image.new("RGB", (56, 56), (200, 40, 40))], return_tensors="pt"))


def trained_checkpoint(model_dir, data_dir, directory, lora: bool = False):
    """A sharded actor after two AdamW steps on real training rows, saved like a worker saves it."""
    torch.manual_seed(0)
    model = load_model(str(model_dir), torch.float32)
    if lora:
        model = apply_lora(model, Lora)
    shard_model(model, data_parallel_mesh("cpu"))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    batch = training_batch(model_dir, data_dir, 4)
    for _ in range(2):
        model(**forward_inputs(batch), use_cache=False).logits.float().pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    save_component(directory, model, optimizer, None)
    if not dist.is_initialized() or dist.get_rank() == 0:  # one writer, as in the workers
        tokenizer, processor = load_tokenizer_and_processor(str(model_dir))
        save_hf_metadata(directory, model, tokenizer, processor)
    return model


def two_rank_worker(rank: int, port: int, model_dir: str, data_dir: str, directory: str) -> None:
    """One of two gloo ranks training the same rows as the one-rank run and saving its shard."""
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        trained_checkpoint(Path(model_dir), Path(data_dir), Path(directory))
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_exported_model_computes_the_actors_logits(process_group, tiny_qwen2_5_vl_dir, tiny_dataset_dir, tmp_path):
    actor_dir = tmp_path / "global_step_2" / "actor"
    actor = trained_checkpoint(tiny_qwen2_5_vl_dir, tiny_dataset_dir, actor_dir).eval()
    target = merge_to_huggingface(actor_dir)
    assert target == actor_dir / "huggingface"
    names = {path.name for path in target.iterdir()}
    assert {"model.safetensors", "config.json", "generation_config.json", "tokenizer_config.json"} <= names
    assert {"chat_template.jinja", "processor_config.json"} & names
    assert json.loads((target / "generation_config.json").read_text()) == json.loads(
        (tiny_qwen2_5_vl_dir / "generation_config.json").read_text()
    )
    inputs = fixed_input(tiny_qwen2_5_vl_dir)
    exported = AutoModelForImageTextToText.from_pretrained(target, dtype=torch.float32).eval()
    with torch.no_grad():
        expected, actual = actor(**inputs).logits, exported(**inputs).logits
        initial = load_model(str(tiny_qwen2_5_vl_dir), torch.float32).eval()(**inputs).logits
    torch.testing.assert_close(actual, expected, rtol=0, atol=1e-5)
    assert (expected - initial).abs().max() > 1e-2  # the export carries the trained weights, not the initial ones
    # exporting again (into the same folder) gives the same model
    merge_to_huggingface(actor_dir)
    assert not (actor_dir / "huggingface.partial").exists()


def test_lora_export_is_base_plus_adapter(process_group, tiny_qwen2_5_vl_dir, tiny_dataset_dir, tmp_path):
    actor_dir = tmp_path / "global_step_2" / "actor"
    actor = trained_checkpoint(tiny_qwen2_5_vl_dir, tiny_dataset_dir, actor_dir, lora=True).eval()
    saved = load_model_state_dict(actor_dir)
    assert any("lora_B" in key for key in saved) and all(key.startswith("base_model.model.") for key in saved)
    target = merge_to_huggingface(actor_dir, tmp_path / "export")
    inputs = fixed_input(tiny_qwen2_5_vl_dir)
    exported = AutoModelForImageTextToText.from_pretrained(target, dtype=torch.float32).eval()
    assert not any("lora" in name for name, _ in exported.named_parameters())
    with torch.no_grad():
        expected, actual = actor(**inputs).logits, exported(**inputs).logits
        with actor.disable_adapter():
            base = actor(**inputs).logits
    torch.testing.assert_close(actual, expected, rtol=0, atol=1e-5)
    assert (expected - base).abs().max() > 1e-3  # the adapters changed the model, and the export has them


def test_two_ranks_export_the_same_model_as_one(tiny_qwen2_5_vl_dir, tiny_dataset_dir, tmp_path, request):
    one_rank, two_ranks = tmp_path / "one" / "actor", tmp_path / "two" / "actor"
    # forked before this process joins its one-rank group (helpers.fork_ranks)
    fork_ranks(two_rank_worker, (free_port(), str(tiny_qwen2_5_vl_dir), str(tiny_dataset_dir), str(two_ranks)), 2)
    request.getfixturevalue("process_group")
    trained_checkpoint(tiny_qwen2_5_vl_dir, tiny_dataset_dir, one_rank)
    assert len(list((two_ranks / "model").glob("*.distcp"))) == 2  # each rank wrote its own shard
    expected = load_file(merge_to_huggingface(one_rank) / "model.safetensors")
    actual = load_file(merge_to_huggingface(two_ranks) / "model.safetensors")
    assert actual.keys() == expected.keys()
    for name, value in expected.items():
        torch.testing.assert_close(actual[name], value, rtol=0, atol=1e-6, msg=name)
    exported_one = AutoModelForImageTextToText.from_pretrained(one_rank / "huggingface", dtype=torch.float32)
    exported_two = AutoModelForImageTextToText.from_pretrained(two_ranks / "huggingface", dtype=torch.float32)
    inputs = fixed_input(tiny_qwen2_5_vl_dir)
    with torch.no_grad():
        torch.testing.assert_close(exported_two.eval()(**inputs).logits, exported_one.eval()(**inputs).logits)


def test_text_model_exports_as_a_causal_lm_and_mismatched_config_is_an_error(process_group, tiny_model_dir, tmp_path):
    model_dir = tiny_model_dir("qwen3")
    actor_dir = tmp_path / "global_step_1" / "actor"
    torch.manual_seed(0)
    actor = load_model(str(model_dir), torch.float32)
    shard_model(actor, data_parallel_mesh("cpu"))
    optimizer = torch.optim.AdamW(actor.parameters(), lr=1e-2)
    ids = torch.randint(0, 200, (2, 8), generator=torch.Generator().manual_seed(0))
    actor(input_ids=ids).logits.pow(2).mean().backward()
    optimizer.step()
    save_component(actor_dir, actor, optimizer, None, model_only=True)
    tokenizer, processor = load_tokenizer_and_processor(str(model_dir))
    assert processor is None
    save_hf_metadata(actor_dir, actor, tokenizer, processor)

    target = merge_to_huggingface(actor_dir, tmp_path / "export")
    assert (target / "tokenizer_config.json").is_file() and not (target / "processor_config.json").exists()
    exported = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    with torch.no_grad():
        torch.testing.assert_close(
            exported(input_ids=ids).logits, actor.eval()(input_ids=ids).logits, rtol=0, atol=1e-5
        )

    config_file = actor_dir / "huggingface" / "config.json"
    config = json.loads(config_file.read_text())
    # configs that do not belong to these weights: other shapes, then more layers
    config_file.write_text(json.dumps({**config, "intermediate_size": config["intermediate_size"] + 8}))
    with pytest.raises(UserError, match=r"do not fit .*shape \(checkpoint vs config\): \['model\.layers\.0\.mlp"):
        merge_to_huggingface(actor_dir, tmp_path / "export")
    deeper = {key: value for key, value in config.items() if key != "layer_types"}
    config_file.write_text(json.dumps({**deeper, "num_hidden_layers": config["num_hidden_layers"] + 1}))
    with pytest.raises(UserError, match=r"do not fit .*missing: \['model\.layers\."):
        merge_to_huggingface(actor_dir, tmp_path / "export")
    config_file.write_text("{not json")
    with pytest.raises(UserError, match="config.json is not a valid model config"):
        merge_to_huggingface(actor_dir, tmp_path / "export")
    assert (target / "model.safetensors").is_file()  # the failed export left the earlier one alone


@pytest.mark.vllm
def test_vllm_serves_the_export(process_group, tiny_qwen2_5_vl_dir, tiny_dataset_dir, tmp_path):
    from helpers import vllm_generate
    from vllm import SamplingParams

    actor_dir = tmp_path / "global_step_2" / "actor"
    trained_checkpoint(tiny_qwen2_5_vl_dir, tiny_dataset_dir, actor_dir)
    target = merge_to_huggingface(actor_dir)
    dist.destroy_process_group()  # the rank goes to vLLM's engine
    params = SamplingParams(max_tokens=5, temperature=0.0, logprobs=0, ignore_eos=True)
    output = vllm_generate(target, [{"prompt": "What colour is grass?"}], params)[0].outputs[0]
    # greedy tokens equal the exported model's own greedy continuation
    exported = AutoModelForImageTextToText.from_pretrained(target, dtype=torch.float32).eval()
    tokenizer, _ = load_tokenizer_and_processor(str(target))
    ids = torch.tensor([tokenizer.encode("What colour is grass?", add_special_tokens=False)])
    with torch.no_grad():
        greedy = exported.generate(input_ids=ids, max_new_tokens=5, do_sample=False, min_new_tokens=5)
    assert list(output.token_ids) == greedy[0, ids.shape[1] :].tolist()


def test_clear_errors(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        merge_to_huggingface(tmp_path / "nowhere")
    (tmp_path / "global_step_4.partial" / "actor").mkdir(parents=True)
    with pytest.raises(UserError, match="partial checkpoint"):
        merge_to_huggingface(tmp_path / "global_step_4.partial" / "actor")
    actor_dir = tmp_path / "global_step_2" / "actor"
    actor_dir.mkdir(parents=True)
    with pytest.raises(UserError, match="not a complete easyr1 checkpoint component"):
        merge_to_huggingface(actor_dir)
    (actor_dir / "model").mkdir()
    (actor_dir / "model" / ".metadata").write_bytes(b"")
    with pytest.raises(UserError, match="huggingface has no config.json"):
        merge_to_huggingface(actor_dir)
    # the export replaces its target folder, so a folder that is not an earlier export is refused
    (actor_dir / "huggingface").mkdir()
    (actor_dir / "huggingface" / "config.json").write_text("{}")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("keep me")
    with pytest.raises(UserError, match="already holds files and is not a model export"):
        merge_to_huggingface(actor_dir, tmp_path / "notes")
    with pytest.raises(UserError, match="is a file"):
        merge_to_huggingface(actor_dir, tmp_path / "notes" / "todo.txt")
    assert (tmp_path / "notes" / "todo.txt").read_text() == "keep me"


def test_cli_reports_errors_and_success(process_group, tiny_qwen2_5_vl_dir, tiny_dataset_dir, tmp_path, capsys):
    script = REPO / "scripts" / "model_merger.py"
    # the error in this process (the script's main, as its last line calls it); the export in a process of its own
    spec = importlib.util.spec_from_file_location("model_merger_script", script)
    merger_script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(merger_script)
    assert merger_script.main(["--local_dir", str(tmp_path / "none")]) == 2
    failed = capsys.readouterr().err
    assert failed.startswith("model_merger: error: ") and "does not exist" in failed, failed
    assert "Traceback" not in failed
    merger = [sys.executable, str(script)]
    actor_dir = tmp_path / "global_step_2" / "actor"
    trained_checkpoint(tiny_qwen2_5_vl_dir, tiny_dataset_dir, actor_dir)
    done = subprocess.run(
        [*merger, "--local_dir", str(actor_dir), "--target_dir", str(tmp_path / "hf")], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert str(tmp_path / "hf") in done.stdout and (tmp_path / "hf" / "model.safetensors").is_file()
