"""vLLM's sleep and wake in the hybrid engine, on a GPU: a level-2 sleep frees the engine's memory, and after it
waking the weights, pushing the actor's weights, waking the KV cache and generating samples from the pushed weights.

Drives one :class:`~easyr1.engines.vllm_engine.VLLMEngine` in this process (one rank, no Ray) on the
tiny text model; the "actor" is a Hugging Face copy of the model whose weights are perturbed, so that only an
engine that really received them matches its log-probs.
"""

from __future__ import annotations

import os
import socket

import pytest
import torch


if not torch.cuda.is_available():  # before importing vLLM, which takes seconds
    pytest.skip("needs a CUDA device", allow_module_level=True)
pytest.importorskip("vllm")

from easyr1.engines.base import SamplingSettings  # noqa: E402
from easyr1.protocol import Batch  # noqa: E402


PROMPTS = [[3, 17, 42, 99, 7], [5, 8, 13, 21, 34, 55, 89, 144], [11, 12]]
SAMPLING = SamplingSettings(temperature=1.0, top_p=1.0, top_k=-1, max_tokens=16)


def prompt_rows(prompts: list[list[int]], pad_id: int) -> Batch:
    """Left-padded text prompts as the dataset makes them (no vision placeholders, so raw ids = ids)."""
    width = max(len(ids) for ids in prompts)
    input_ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, ids in enumerate(prompts):
        input_ids[row, width - len(ids) :] = torch.tensor(ids)
        attention_mask[row, width - len(ids) :] = 1
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    return Batch(
        tensors={"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids},
        non_tensors={"raw_prompt_ids": [list(ids) for ids in prompts]},
    )


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    """A one-rank NCCL process group and a bf16 vLLM engine on the tiny qwen2 text model."""
    import torch.distributed as dist

    from easyr1.engines.vllm_engine import VLLMEngine

    model_dir = tiny_model_dir("qwen2")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    rollout = VLLMEngine(
        str(model_dir),
        str(model_dir),
        dtype=torch.bfloat16,
        max_model_len=64,
        tensor_parallel_size=1,
        seed=1,
        pad_token_id=0,
        banned_token_ids=[],
        gpu_memory_utilization=0.3,
        enforce_eager=True,
    )
    yield model_dir, rollout
    dist.destroy_process_group()


def test_engine_runs_the_validated_model_runner(engine):
    _, rollout = engine
    assert os.environ["VLLM_USE_V2_MODEL_RUNNER"] == "0"
    assert not rollout.llm.llm_engine.vllm_config.use_v2_model_runner


def test_level_two_sleep_frees_the_engine_memory(engine):
    _, rollout = engine
    assert rollout.sleep_supported
    torch.cuda.synchronize()
    free_awake, total = torch.cuda.mem_get_info()
    rollout.sleep()
    torch.cuda.synchronize()
    free_asleep, _ = torch.cuda.mem_get_info()
    assert rollout.weights_discarded
    # gpu_memory_utilization=0.3 gave the engine ~30% of the device, nearly all of it KV cache; level 2 frees it all
    freed = free_asleep - free_awake
    assert freed > 0.2 * total, f"sleep freed {freed / 2**30:.2f} GiB of {total / 2**30:.1f}"
    rollout.wake_weights()
    rollout.wake_kv_cache()
    torch.cuda.synchronize()
    assert torch.cuda.mem_get_info()[0] < free_asleep - 0.2 * total  # awake again: the memory is back in use


@torch.no_grad()
def test_wake_sync_generate_after_sleep_matches_the_pushed_weights(engine):
    from transformers import AutoModelForCausalLM

    model_dir, rollout = engine
    actor = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).cuda().eval()
    generator = torch.Generator(device="cuda").manual_seed(0)
    for parameter in actor.parameters():  # weights the checkpoint does not have
        parameter.add_(0.02 * torch.randn(parameter.shape, generator=generator, device="cuda", dtype=parameter.dtype))

    rollout.sleep()  # level 2: the engine's weights are gone
    rollout.wake_weights()
    rollout.sync_weights(actor.named_parameters())
    rollout.wake_kv_cache()
    output = rollout.generate(prompt_rows(PROMPTS, pad_id=0), SAMPLING, seeds=[1, 2, 3])
    rollout.sleep()

    gaps = []
    for row, prompt in enumerate(PROMPTS):
        length = int(output["response_mask"][row].sum())
        assert length > 0
        response = output["responses"][row, :length].cuda()
        ids = torch.cat([torch.tensor(prompt, device="cuda"), response])
        logits = actor(input_ids=ids[None]).logits[0, len(prompt) - 1 : -1].float() / SAMPLING.temperature
        actor_log_probs = torch.log_softmax(logits, dim=-1).gather(-1, response[:, None])[:, 0]
        gaps.append((actor_log_probs.cpu() - output["rollout_log_probs"][row, :length]).abs())
    gap = torch.cat(gaps)
    # bf16 on both sides: the kernels differ, the weights must not
    assert gap.mean() < 1e-2, f"mean gap {gap.mean():.4f}, max {gap.max():.4f}"
