"""The dtype policy (fp32 master weights, bf16 compute, fp32 reduction) and the optimizers, on FSDP2 over gloo.

The GPU default policy is forced on the CPU here: FSDP2's mixed precision runs on gloo, so the dtypes of
parameters, gradients, optimizer states and compute can be checked without a GPU.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from helpers import REPO

from easyr1.config import OptimConfig, load_config
from easyr1.config.actor import ADAMW_IMPLEMENTATIONS
from easyr1.distributed.fsdp import data_parallel_mesh, full_tensor, shard_model
from easyr1.distributed.precision import Precision, resolve_precision
from easyr1.errors import ConfigError
from easyr1.models.loading import load_model
from easyr1.workers.optim import AdamWBf16, build_optimizer


FP32, BF16 = torch.float32, torch.bfloat16
PROBE = "model.layers.0.self_attn.q_proj"


def fsdp_section(**values):
    defaults = {"torch_dtype": None, "mp_param_dtype": None, "mp_reduce_dtype": None}
    return SimpleNamespace(**{**defaults, **values})


@pytest.mark.parametrize(
    ("device", "role", "expected"),
    [
        ("cuda", "actor", Precision(FP32, BF16, FP32)),
        ("cuda", "critic", Precision(FP32, BF16, FP32)),
        ("cuda", "ref", Precision(BF16, BF16, BF16)),
        ("cpu", "actor", Precision(FP32, FP32, FP32)),
        ("cpu", "critic", Precision(FP32, FP32, FP32)),
        ("cpu", "ref", Precision(FP32, FP32, FP32)),
    ],
)
def test_null_keys_resolve_by_device_and_role(device, role, expected):
    assert resolve_precision(fsdp_section(), device, role) == expected


def test_explicit_keys_act_on_any_device():
    cpu_bf16 = resolve_precision(fsdp_section(mp_param_dtype="bf16"), "cpu", "actor")
    assert cpu_bf16 == Precision(FP32, BF16, FP32)
    assert cpu_bf16.mixed_precision_policy().param_dtype == BF16
    bf16_master = resolve_precision(fsdp_section(torch_dtype="bf16", mp_reduce_dtype="bf16"), "cuda", "actor")
    assert bf16_master == Precision(BF16, BF16, BF16)
    assert bf16_master.mixed_precision_policy() is None  # everything in the storage dtype: no policy
    assert resolve_precision(fsdp_section(torch_dtype="fp32"), "cuda", "ref") == Precision(FP32, BF16, FP32)
    assert resolve_precision(fsdp_section(), "cpu", "actor").mixed_precision_policy() is None


def test_easyr1_yaml_gets_the_device_defaults():
    config = load_config([f"config={REPO / 'examples' / 'config.yaml'}"], validate=False)
    for section in (config.worker.actor.fsdp, config.worker.ref.fsdp, config.worker.critic.fsdp):
        assert (section.torch_dtype, section.mp_param_dtype, section.mp_reduce_dtype) == (None, None, None)
    assert resolve_precision(config.worker.actor.fsdp, "cuda", "actor") == Precision(FP32, BF16, FP32)
    assert resolve_precision(config.worker.ref.fsdp, "cuda", "ref") == Precision(BF16, BF16, BF16)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("worker.ref.fsdp.mp_buffer_dtype=bf16", "worker.ref.fsdp.mp_buffer_dtype='bf16' cannot act"),
        ("worker.critic.fsdp.mp_param_dtype=int8", "worker.critic.fsdp.mp_param_dtype"),
        ("worker.critic.optim.implementation=fast", "worker.critic.optim.implementation='fast' is not supported"),
        ("worker.critic.optim.strategy=adam", "worker.critic.optim.strategy='adam' is not supported"),
    ],
)
def test_keys_that_cannot_act_are_refused(tiny_model_dir, override, message):
    base = [
        f"config={REPO / 'examples' / 'config_cpu.yaml'}",
        f"worker.actor.model.model_path={tiny_model_dir('qwen2')}",
        f"worker.reward.reward_function={REPO / 'reward_function' / 'shape_color.py'}",
    ]
    with pytest.raises(ConfigError, match=message):
        load_config([*base, override])


# --------------------------------------------------------------------------------- FSDP2 on one gloo rank


def sharded_text_model(model_dir, precision: Precision) -> torch.nn.Module:
    torch.manual_seed(0)
    model = load_model(str(model_dir), precision.storage)
    return shard_model(model, data_parallel_mesh("cpu"), mp_policy=precision.mixed_precision_policy())


def loss_of(model: torch.nn.Module) -> torch.Tensor:
    ids = torch.randint(0, 300, (2, 12), generator=torch.Generator().manual_seed(1))
    logits = model(input_ids=ids, use_cache=False).logits
    return torch.nn.functional.cross_entropy(logits[:, :-1].float().flatten(0, 1), ids[:, 1:].flatten())


def one_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """The probe layer's full weight before and after one optimizer step."""
    probe = dict(model.named_parameters())[f"{PROBE}.weight"]
    before = full_tensor(probe.detach()).clone()
    loss_of(model).backward()
    optimizer.step()
    return {"before": before, "after": full_tensor(probe.detach()).clone()}


def test_gpu_policy_on_cpu_keeps_fp32_master_and_computes_in_bf16(tiny_model_dir, process_group):
    precision = resolve_precision(fsdp_section(mp_param_dtype="bf16"), "cpu", "actor")  # the CUDA default
    model = sharded_text_model(tiny_model_dir("qwen2"), precision)
    seen = {}

    def record(module, args):
        seen["weight"], seen["input"] = module.weight.dtype, args[0].dtype

    model.get_submodule(PROBE).register_forward_pre_hook(record)
    optimizer = build_optimizer(model.parameters(), OptimConfig(strategy="adamw", lr=1e-6, weight_decay=0.0))
    step = one_step(model, optimizer)
    assert seen == {"weight": BF16, "input": BF16}  # compute: unsharded weights and activations in bf16
    assert {param.dtype for param in model.parameters()} == {FP32}  # sharded master weights
    assert {param.grad.dtype for param in model.parameters() if param.grad is not None} == {FP32}
    states = [value for state in optimizer.state.values() for key, value in state.items() if key != "step"]
    assert states and {value.dtype for value in states} == {FP32}
    # lr 1e-6 moves (almost) every fp32 master weight of the probe
    changed = (step["after"] != step["before"]).float().mean().item()
    assert changed > 0.9


def test_bf16_master_weights_round_a_1e6_update_away(tiny_model_dir, process_group):
    """The contrast: the same step with bf16 master weights (the old CUDA default) leaves the weights as they were."""
    precision = resolve_precision(fsdp_section(torch_dtype="bf16"), "cpu", "actor")
    model = sharded_text_model(tiny_model_dir("qwen2"), precision)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6, weight_decay=0.0)
    step = one_step(model, optimizer)
    assert step["before"].dtype == BF16
    changed = (step["after"] != step["before"]).float().mean().item()
    assert changed < 0.05  # only weights below ~2.4e-4 in magnitude can move by 1e-6 in bf16


def test_adamw_bf16_on_fsdp_keeps_bf16_states_and_fp32_weights(tiny_model_dir, process_group):
    precision = resolve_precision(fsdp_section(mp_param_dtype="bf16"), "cpu", "actor")
    model = sharded_text_model(tiny_model_dir("qwen2"), precision)
    optimizer = build_optimizer(model.parameters(), OptimConfig(strategy="adamw_bf16", lr=1e-6, weight_decay=1e-2))
    assert isinstance(optimizer, AdamWBf16)
    step = one_step(model, optimizer)
    moments = [state[key] for state in optimizer.state.values() for key in ("exp_avg", "exp_avg_sq")]
    assert moments and {value.dtype for value in moments} == {BF16}
    assert {param.dtype for param in model.parameters()} == {FP32}
    assert (step["after"] != step["before"]).float().mean().item() > 0.9


@pytest.mark.parametrize("implementation", [name for name in ADAMW_IMPLEMENTATIONS if name != "for-loop"])
def test_adamw_kernels_match_the_for_loop_on_fsdp(tiny_model_dir, process_group, implementation):
    """On FSDP2's DTensors: foreach gives the for-loop's weights bit for bit; fused the same step to fp32 rounding."""
    precision = resolve_precision(fsdp_section(), "cpu", "actor")
    weights, optimizers = {}, {}
    for name in ("for-loop", implementation):
        model = sharded_text_model(tiny_model_dir("qwen2"), precision)
        weights[name] = [[full_tensor(param.detach()).clone() for param in model.parameters()]]
        optimizer = build_optimizer(model.parameters(), OptimConfig(implementation=name, lr=1e-3, weight_decay=1e-2))
        for _ in range(3):
            loss_of(model).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            weights[name].append([full_tensor(param.detach()).clone() for param in model.parameters()])
        optimizers[name] = optimizer
    assert optimizers[implementation].defaults[implementation] is True
    assert optimizers["for-loop"].defaults["foreach"] is False
    reference, ours = weights["for-loop"], weights[implementation]
    if implementation == "foreach":
        for step in range(1, 4):
            assert all(torch.equal(a, b) for a, b in zip(ours[step], reference[step]))
        return
    # step 1 starts from the same weights and gradients: the same update up to rounding (an update is ~lr = 1e-3)
    for a, b in zip(ours[1], reference[1]):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-9)
    # then the gradients differ by rounding, which Adam amplifies where a gradient is noise (|g| ~ eps): the two
    # stay within 1% of the distance the weights travelled
    for a, b, start in zip(ours[3], reference[3], reference[0]):
        travelled = (b - start).abs().max().item()
        assert travelled > 1e-3 and (a - b).abs().max().item() < 0.01 * travelled


def test_adamw_bf16_tracks_adamw():
    """Same parameters, same gradient sequence: the bf16-state update follows torch's AdamW closely."""
    generator = torch.Generator().manual_seed(0)
    start = torch.randn(4096, generator=generator) * 0.02
    exact = torch.nn.Parameter(start.clone())
    compact = torch.nn.Parameter(start.clone())
    settings = {"lr": 1e-3, "betas": (0.9, 0.999), "weight_decay": 1e-2}
    optimizers = [torch.optim.AdamW([exact], **settings), AdamWBf16([compact], **settings)]
    for _ in range(50):
        gradient = torch.randn(4096, generator=generator) * 1e-3 + 2e-4
        exact.grad, compact.grad = gradient.clone(), gradient.clone()
        for optimizer in optimizers:
            optimizer.step()
    travelled = (exact.detach() - start).abs().mean()
    gap = (compact.detach() - exact.detach()).abs().mean()
    assert travelled > 5e-3  # the comparison means something: the weights moved by about 10 lr
    assert gap / travelled < 5e-3  # measured 0.24%; bf16 keeps 8 significant bits (0.4% per stored value)
    assert optimizers[1].state[compact]["exp_avg"].dtype == BF16
