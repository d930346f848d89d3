"""On a GPU: offload frees and restores device memory; fp32 master weights with bf16 compute (and the contrast).

One-rank process group (``cpu:gloo,cuda:nccl``) in this process, a tiny text model sharded with FSDP2; no Ray, no
vLLM. The CPU suite checks the same mechanics' contracts (``tests/test_offload.py``, ``tests/test_precision.py``);
here the device memory and the CUDA numerics are measured.
"""

from __future__ import annotations

import socket
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist


pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

FP32, BF16 = torch.float32, torch.bfloat16
PROBE = "model.layers.0.self_attn.q_proj"


@pytest.fixture(scope="module")
def cuda_group():
    """A one-rank process group on GPU 0 (reused if the session already has one)."""
    torch.cuda.set_device(0)
    created = not dist.is_initialized()
    if created:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        dist.init_process_group("cpu:gloo,cuda:nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield
    if created:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def text_model_dir(tmp_path_factory):
    from easyr1.tools.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("gpu_memory") / "qwen2", family="qwen2", seed=0)


def sharded(model_dir, precision) -> torch.nn.Module:
    from easyr1.distributed.fsdp import data_parallel_mesh, shard_model
    from easyr1.models.loading import load_model

    torch.manual_seed(0)
    model = load_model(str(model_dir), precision.storage, attn_implementation="sdpa")
    return shard_model(model, data_parallel_mesh("cuda"), mp_policy=precision.mixed_precision_policy())


def loss_of(model: torch.nn.Module) -> torch.Tensor:
    ids = torch.randint(0, 300, (2, 12), generator=torch.Generator().manual_seed(1)).cuda()
    logits = model(input_ids=ids, use_cache=False).logits
    return torch.nn.functional.cross_entropy(logits[:, :-1].float().flatten(0, 1), ids[:, 1:].flatten())


def local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def resident_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Bytes of this rank's shards, gradients and optimizer states (step counters live on the host)."""
    tensors = [local(param) for param in model.parameters()]
    tensors += [local(param.grad) for param in model.parameters() if param.grad is not None]
    tensors += [local(value) for state in optimizer.state.values() for key, value in state.items() if key != "step"]
    return sum(tensor.numel() * tensor.element_size() for tensor in tensors)


def test_offload_frees_device_memory_and_restores_the_same_state(cuda_group, text_model_dir):
    from easyr1.distributed.fsdp import full_tensor
    from easyr1.distributed.offload import Residency, model_devices, optimizer_devices
    from easyr1.distributed.precision import Precision

    model = sharded(text_model_dir, Precision(FP32, FP32, FP32))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss_of(model).backward()
    optimizer.step()
    loss_of(model).backward()  # keep gradients, so they are offloaded too
    torch.cuda.synchronize()
    expected = resident_bytes(model, optimizer)
    snapshot = {name: full_tensor(param.detach()).clone() for name, param in model.named_parameters()}
    parameters = list(model.parameters())

    residency = Residency(model, optimizer, "cuda", offload_params=True, offload_optimizer=True)
    before = torch.cuda.memory_allocated()
    residency.release()
    offloaded = torch.cuda.memory_allocated()
    assert model_devices(model) == {torch.device("cpu")}
    assert optimizer_devices(optimizer) == {torch.device("cpu")}
    print(f"offload: {expected / 2**20:.2f} MiB of shards, grads and states; allocated {before} -> {offloaded}")
    assert before - offloaded >= 0.95 * expected

    with residency.on_device(optimizer=True):
        restored = torch.cuda.memory_allocated()
        assert restored - offloaded >= 0.95 * expected
        assert {device.type for device in model_devices(model)} == {"cuda"}
        assert {device.type for device in optimizer_devices(optimizer)} == {"cuda"}
        assert all(mine is theirs for mine, theirs in zip(model.parameters(), parameters))
        for name, param in model.named_parameters():
            assert torch.equal(full_tensor(param.detach()).cpu(), snapshot[name].cpu()), name
        optimizer.step()  # the optimizer still updates the model's own (moved) parameters
        probe = dict(model.named_parameters())[f"{PROBE}.weight"]
        assert not torch.equal(full_tensor(probe.detach()).cpu(), snapshot[f"{PROBE}.weight"].cpu())
        optimizer.zero_grad(set_to_none=True)
        loss_of(model).backward()  # forward and backward work after the round trip
    assert torch.cuda.memory_allocated() < restored


def default_gpu_step(model_dir, fsdp: SimpleNamespace, strategy: str = "adamw") -> dict:
    """One lr=1e-6 step under the precision EasyR1's keys resolve to on CUDA; dtypes seen along the way."""
    from easyr1.config import OptimConfig
    from easyr1.distributed.fsdp import full_tensor
    from easyr1.distributed.precision import resolve_precision
    from easyr1.workers.optim import build_optimizer

    precision = resolve_precision(fsdp, "cuda", "actor")
    model = sharded(model_dir, precision)
    seen = {}

    def record(module, args):
        seen["weight"], seen["input"] = module.weight.dtype, args[0].dtype

    model.get_submodule(PROBE).register_forward_pre_hook(record)
    optim = OptimConfig(strategy=strategy, lr=1e-6, weight_decay=0.0)
    optimizer = build_optimizer(model.parameters(), optim)
    probe = dict(model.named_parameters())[f"{PROBE}.weight"]
    before = full_tensor(probe.detach()).clone()
    loss_of(model).backward()
    grads = {param.grad.dtype for param in model.parameters() if param.grad is not None}
    optimizer.step()
    after = full_tensor(probe.detach()).clone()
    return {
        "precision": precision,
        "compute": seen,
        "params": {param.dtype for param in model.parameters()},
        "grads": grads,
        "states": {v.dtype for s in optimizer.state.values() for k, v in s.items() if k != "step"},
        "changed": (after != before).float().mean().item(),
    }


def test_cuda_default_is_fp32_master_with_bf16_compute(cuda_group, text_model_dir):
    fsdp = SimpleNamespace(torch_dtype=None, mp_param_dtype=None, mp_reduce_dtype=None)
    result = default_gpu_step(text_model_dir, fsdp)
    print(f"fp32 master, bf16 compute: {result['changed']:.3f} of the probe's weights changed at lr 1e-6")
    assert result["compute"] == {"weight": BF16, "input": BF16}
    assert result["params"] == result["grads"] == result["states"] == {FP32}
    assert result["changed"] > 0.9

    compact = default_gpu_step(text_model_dir, fsdp, strategy="adamw_bf16")
    assert compact["params"] == {FP32} and compact["states"] == {BF16}
    assert compact["changed"] > 0.9

    bf16_master = default_gpu_step(
        text_model_dir, SimpleNamespace(torch_dtype="bf16", mp_param_dtype=None, mp_reduce_dtype="bf16")
    )
    print(f"bf16 master: {bf16_master['changed']:.3f} changed")
    assert bf16_master["params"] == bf16_master["states"] == {BF16}
    assert bf16_master["changed"] < 0.05  # the update is rounded away: why the master weights are fp32
