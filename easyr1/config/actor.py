"""The model-holding sections: ``worker.actor``, ``worker.ref``, ``worker.critic`` and the sections they share
(model, LoRA, optimizer, FSDP, offload), with the checks of their fields.

Policy losses and loss aggregation modes are checked against their registries in :mod:`easyr1.algorithms`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from easyr1.algorithms.aggregation import LOSS_AGGREGATIONS
from easyr1.algorithms.policy_loss import POLICY_LOSSES
from easyr1.config.fields import mirror, option, section
from easyr1.config.rules import (
    AT_LEAST_ONE,
    DTYPE_NAMES,
    NON_NEGATIVE,
    NON_NEGATIVE_OR_NULL,
    POSITIVE,
    UNIT,
    UNIT_OR_NULL,
    one_of,
)
from easyr1.errors import ConfigError


STRATEGIES = ("fsdp",)
OPTIMIZERS = ("adamw", "adamw_bf16")
# torch AdamW's kernels: fused (one kernel over all parameters, in place), foreach (one op per step of the update over
# the list of parameters: the for-loop's result bit for bit), for-loop (ops per parameter; torch's default on CPU)
ADAMW_IMPLEMENTATIONS = ("fused", "foreach", "for-loop")
LR_SCHEDULERS = ("constant", "cosine")

# EasyR1's older `loss_avg_mode` values and the `loss_agg_mode` each one means.
LOSS_AVG_MODE_ALIASES = {"token": "token-mean", "seq": "seq-mean-token-mean"}
# EasyR1 calls the plain clipped PPO loss "default".
LOSS_TYPE_ALIASES = {"default": "ppo"}


@dataclass
class LoraConfig:
    """Low-rank adapters instead of full fine-tuning."""

    rank: int = option(0, "LoRA rank (0: train all weights, no adapters)")
    alpha: int = option(64, "LoRA scaling factor")
    target_modules: str = option("all-linear", "modules given adapters: 'all-linear' or comma-separated names")
    exclude_modules: str | None = option(None, "regex of module names kept without adapters, e.g. '.*visual.*'")


@dataclass
class ModelConfig:
    """Which model the actor (and the reference policy) loads."""

    model_path: str | None = option(None, "model directory or hub id (required)")
    tokenizer_path: str | None = option(None, "tokenizer / processor directory (null: model_path)")
    override_config: dict[str, Any] = option(
        {},
        "values that replace entries of the model's config.json (actor, reference and rollout engines; a dict for a "
        "nested config such as text_config updates it)",
    )
    enable_gradient_checkpointing: bool = option(True, "recompute activations in the backward pass to save memory")
    trust_remote_code: bool = option(False, "allow model code shipped in the model directory")
    freeze_vision_tower: bool = option(False, "keep the vision encoder's weights fixed")
    router_aux_loss_coef: float = option(
        0.0,
        "mixture-of-experts models (qwen3_vl_moe): weight of the routers' load-balancing loss added to the actor's "
        "loss (0: off, as EasyR1; transformers' pre-training default is 0.001)",
    )
    lora: LoraConfig = section(LoraConfig, "LoRA adapters")


@dataclass
class OptimConfig:
    """The optimizer and learning-rate schedule."""

    lr: float = option(1e-6, "learning rate")
    betas: tuple[float, float] = option((0.9, 0.999), "AdamW betas")
    weight_decay: float = option(1e-2, "AdamW weight decay")
    strategy: str = option("adamw", f"optimizer: {', '.join(OPTIMIZERS)}")
    implementation: str = option(
        "fused",
        f"torch AdamW's kernels for strategy=adamw: {', '.join(ADAMW_IMPLEMENTATIONS)} (fused: one in-place kernel "
        "over all parameters, the fastest and no temporaries; foreach: bit for bit the for-loop's result)",
    )
    lr_warmup_ratio: float = option(0.0, "fraction of the training steps spent in linear warmup")
    lr_warmup_steps: int | None = option(None, "warmup steps (overrides lr_warmup_ratio when set)")
    min_lr_ratio: float | None = option(None, "final lr as a fraction of lr for the cosine schedule (null: 0)")
    lr_scheduler_type: str = option("constant", f"schedule after warmup: {', '.join(LR_SCHEDULERS)}")
    training_steps: int = option(-1, "total optimizer steps; filled in by the trainer")


@dataclass
class FSDPConfig:
    """How a model is sharded with FSDP2."""

    enable_full_shard: bool = option(
        True,
        "true: reshard each block's parameters after its forward; false: keep them gathered until its backward "
        "(ZeRO-2); gradients and optimizer states are sharded either way",
    )
    enable_cpu_offload: bool = option(
        False, "FSDP keeps parameters, gradients and optimizer states in host memory (a no-op on a CPU device)"
    )
    enable_rank0_init: bool = option(True, "load weights on rank 0 only and broadcast them")
    use_orig_params: bool = option(
        False,
        "EasyR1's FSDP1 switch from flat parameters to the original ones (it sets it itself for a frozen vision "
        "tower); FSDP2 always shards the original parameters",
        compatibility_only=True,
    )
    torch_dtype: str | None = option(
        None,
        "dtype of the stored (master) weights, gradients and optimizer states (null: fp32 for actor and critic; "
        "the reference bf16 on GPU, fp32 on CPU)",
    )
    mp_param_dtype: str | None = option(
        None, "dtype of the weights and activations in compute (null: bf16 on GPU, torch_dtype on CPU)"
    )
    mp_reduce_dtype: str | None = option(None, "dtype of the gradient reduction (null: fp32)")
    mp_buffer_dtype: str = option(
        "fp32",
        "dtype of the buffers: fp32 only (FSDP2 does not cast buffers; rotary inv_freq is computed in fp32)",
        compatibility_only=True,
    )
    fsdp_size: int = option(
        -1, "workers per FSDP shard group: -1 or the world size only (hybrid sharding is not implemented)"
    )


@dataclass
class OffloadConfig:
    """What is moved to the CPU while the rollout engine runs."""

    offload_params: bool = option(
        False, "keep parameters (and gradients) in host memory between the phases that use them"
    )
    offload_optimizer: bool = option(False, "keep optimizer states in host memory between updates")


@dataclass
class ActorConfig:
    """The policy being trained."""

    strategy: str = option(
        "fsdp", f"training backend: {', '.join(STRATEGIES)} (the only one)", compatibility_only=True
    )
    global_batch_size: int = option(256, "prompts per policy update; an update uses global_batch_size * n samples")
    micro_batch_size_per_device_for_update: int = option(4, "samples per forward/backward pass in the update")
    micro_batch_size_per_device_for_experience: int = option(
        16, "samples per forward pass computing log-probs; also the rows of one generate of the hf engine"
    )
    max_grad_norm: float = option(1.0, "gradient norm clipping threshold")
    clip_ratio_low: float = option(0.2, "PPO clip range below 1 (ratio >= 1 - clip_ratio_low)")
    clip_ratio_high: float = option(0.3, "PPO clip range above 1 (ratio <= 1 + clip_ratio_high; DAPO clip-higher)")
    clip_ratio_dual: float = option(3.0, "dual-clip constant C: the loss of negative advantages is capped at C")
    loss_type: str = option("ppo", f"policy loss: {', '.join(POLICY_LOSSES.names())} ('default' is read as 'ppo')")
    loss_agg_mode: str = option("token-mean", f"how token losses are averaged: {', '.join(LOSS_AGGREGATIONS.names())}")
    loss_avg_mode: str | None = option(
        None,
        "EasyR1's older name: 'token' sets loss_agg_mode=token-mean, 'seq' sets seq-mean-token-mean",
        alias_for="worker.actor.loss_agg_mode",
    )
    ppo_epochs: int = option(1, "passes over each rollout batch")
    reuse_update_log_probs: bool = option(
        True,
        "when a rollout batch feeds exactly one optimizer step (ppo_epochs=1, one mini-batch) and no KL is in the "
        "reward, take the old log-probs from the update's own forward instead of a separate pass (false: always run "
        "the separate pass)",
    )
    padding_free: bool = option(True, "pack each micro-batch into one row without padding (same values)")
    share_prompt: bool = option(
        True,
        "lay out the prompt of a micro-batch's samples that share it once (implies padding_free's packing; same "
        "values; sdpa or eager attention, else padding-free packing)",
    )
    dynamic_batching: bool = option(
        True, "micro-batches of near-equal token count, as many as micro_batch_size full-length rows would need"
    )
    ulysses_size: int = option(
        1,
        "Ulysses sequence-parallel group size: ranks that split each packed sequence (long videos, long answers); "
        "divides the workers and the model's attention heads; implies padding_free's packing",
    )
    use_torch_compile: bool = option(
        True, "compile the log-prob computation with torch.compile (CUDA only; on CPU a notice, then eager)"
    )
    entropy_coeff: float = option(0.0, "weight of the entropy bonus in the policy loss")
    tau_positive: float = option(1.0, "SAPO gate temperature for tokens with a non-negative advantage")
    tau_negative: float = option(1.05, "SAPO gate temperature for tokens with a negative advantage")
    model: ModelConfig = section(ModelConfig, "the model")
    optim: OptimConfig = section(OptimConfig, "the optimizer")
    fsdp: FSDPConfig = section(FSDPConfig, "FSDP sharding of the actor")
    offload: OffloadConfig = section(OffloadConfig, "CPU offloading of the actor")
    global_batch_size_per_device: int = option(
        -1,
        "EasyR1's samples per worker in one update, set by its workers (-1 in its dumps); here always "
        "global_batch_size * n / workers",
        compatibility_only=True,
    )
    disable_kl: bool = mirror(False, "algorithm.disable_kl")
    use_kl_loss: bool = mirror(False, "algorithm.use_kl_loss")
    kl_penalty: str = mirror("kl", "algorithm.kl_penalty")
    kl_coef: float = mirror(1e-3, "algorithm.kl_coef")


@dataclass
class RefConfig:
    """The frozen reference policy; it loads worker.actor.model (same path, same settings)."""

    strategy: str = option("fsdp", f"backend: {', '.join(STRATEGIES)} (the only one)", compatibility_only=True)
    fsdp: FSDPConfig = section(FSDPConfig, "FSDP sharding of the reference model")
    offload: OffloadConfig = section(OffloadConfig, "CPU offloading of the reference model")
    micro_batch_size_per_device_for_experience: int = mirror(
        16, "worker.actor.micro_batch_size_per_device_for_experience"
    )
    padding_free: bool = mirror(True, "worker.actor.padding_free")
    share_prompt: bool = mirror(True, "worker.actor.share_prompt")
    dynamic_batching: bool = mirror(True, "worker.actor.dynamic_batching")
    ulysses_size: int = mirror(1, "worker.actor.ulysses_size")
    use_torch_compile: bool = mirror(True, "worker.actor.use_torch_compile")


@dataclass
class CriticConfig:
    """The value model of PPO; built only for estimators that need a critic (algorithm.adv_estimator=gae, turn_gae)."""

    strategy: str = option(
        "fsdp", f"training backend: {', '.join(STRATEGIES)} (the only one)", compatibility_only=True
    )
    global_batch_size: int | None = option(
        None, "prompts per critic update (null: worker.actor.global_batch_size); uses global_batch_size * n samples"
    )
    micro_batch_size_per_device_for_update: int = option(4, "samples per forward/backward pass in the update")
    micro_batch_size_per_device_for_experience: int = option(16, "samples per forward pass computing values")
    max_grad_norm: float = option(1.0, "gradient norm clipping threshold")
    cliprange_value: float = option(0.5, "values may move at most this far from the rollout's values per update")
    loss_avg_mode: str = option(
        "token",
        "EasyR1's averaging of the value loss (token or seq); the critic here always averages over tokens "
        "(token-mean, EasyR1's token)",
        compatibility_only=True,
    )
    ppo_epochs: int = option(1, "passes over each rollout batch")
    padding_free: bool = option(
        False,
        "EasyR1 packs the critic's micro-batches when true; the critic here pads them (same values), and packs them "
        "under ulysses_size > 1",
        compatibility_only=True,
    )
    dynamic_batching: bool = option(
        True,
        "EasyR1's token-count micro-batches for the critic; the critic here always splits fixed-size micro-batches",
        compatibility_only=True,
    )
    ulysses_size: int = option(
        1,
        "Ulysses sequence-parallel group size of the critic: ranks that split each packed sequence; divides the "
        "workers and the model's attention heads",
    )
    model: ModelConfig = section(ModelConfig, "the value model's backbone (null model_path: the actor's)")
    optim: OptimConfig = section(OptimConfig, "the critic's optimizer")
    fsdp: FSDPConfig = section(FSDPConfig, "FSDP sharding of the critic")
    offload: OffloadConfig = section(OffloadConfig, "CPU offloading of the critic")
    global_batch_size_per_device: int = option(
        -1,
        "EasyR1's samples per worker in one critic update, set by its workers (-1 in its dumps); here always "
        "global_batch_size * n / workers",
        compatibility_only=True,
    )


# Value rules of single keys, relative to ``worker.actor``.
ACTOR_RANGES = {
    "global_batch_size": AT_LEAST_ONE,
    "micro_batch_size_per_device_for_update": AT_LEAST_ONE,
    "micro_batch_size_per_device_for_experience": AT_LEAST_ONE,
    "max_grad_norm": POSITIVE,
    "clip_ratio_low": UNIT,
    "clip_ratio_high": NON_NEGATIVE,
    "clip_ratio_dual": (lambda v: v > 1, "greater than 1"),
    "ppo_epochs": AT_LEAST_ONE,
    "tau_positive": POSITIVE,
    "tau_negative": POSITIVE,
    "ulysses_size": AT_LEAST_ONE,
    "model.lora.rank": NON_NEGATIVE,
    "model.router_aux_loss_coef": NON_NEGATIVE,
    "optim.lr": POSITIVE,
    "optim.betas": (lambda v: all(0 <= b < 1 for b in v), "in [0, 1)"),
    "optim.weight_decay": NON_NEGATIVE,
    "optim.lr_warmup_ratio": UNIT,
    "optim.lr_warmup_steps": NON_NEGATIVE_OR_NULL,
    "optim.min_lr_ratio": UNIT_OR_NULL,
}


def resolve_loss_aliases(actor: ActorConfig) -> None:
    """Replace EasyR1's older spellings (``loss_avg_mode``, ``loss_type=default``) by the names they mean."""
    if actor.loss_avg_mode is not None:
        if actor.loss_avg_mode not in LOSS_AVG_MODE_ALIASES:
            raise ConfigError(
                f"worker.actor.loss_avg_mode={actor.loss_avg_mode!r} is not supported; use 'token' or 'seq', "
                f"or set worker.actor.loss_agg_mode to one of {', '.join(LOSS_AGGREGATIONS.names())}"
            )
        actor.loss_agg_mode = LOSS_AVG_MODE_ALIASES[actor.loss_avg_mode]
        # Consumed: the dumped config then shows only the effective loss_agg_mode.
        actor.loss_avg_mode = None
    actor.loss_type = LOSS_TYPE_ALIASES.get(actor.loss_type, actor.loss_type)


def check_model_names(actor: ActorConfig, ref: RefConfig, critic: CriticConfig, problems: list[str]) -> None:
    """Backends, losses and optimizer names of the actor, the reference and the critic."""
    one_of(problems, "worker.actor.strategy", actor.strategy, STRATEGIES)
    one_of(problems, "worker.ref.strategy", ref.strategy, STRATEGIES)
    one_of(problems, "worker.actor.loss_type", actor.loss_type, POLICY_LOSSES.names())
    one_of(problems, "worker.actor.loss_agg_mode", actor.loss_agg_mode, LOSS_AGGREGATIONS.names())
    for key, optim in (("worker.actor.optim", actor.optim), ("worker.critic.optim", critic.optim)):
        one_of(problems, f"{key}.strategy", optim.strategy, OPTIMIZERS)
        one_of(problems, f"{key}.implementation", optim.implementation, ADAMW_IMPLEMENTATIONS)
        one_of(problems, f"{key}.lr_scheduler_type", optim.lr_scheduler_type, LR_SCHEDULERS)


def check_fsdp_dtypes(sections: list[tuple[str, FSDPConfig]], problems: list[str]) -> None:
    """Dtype names of each ``(dotted key, fsdp section)``; buffers must stay fp32."""
    for key, fsdp in sections:
        for name in ("torch_dtype", "mp_param_dtype", "mp_reduce_dtype"):
            if getattr(fsdp, name) is not None:
                one_of(problems, f"{key}.{name}", getattr(fsdp, name), DTYPE_NAMES)
        if fsdp.mp_buffer_dtype not in ("fp32", "float32"):
            problems.append(
                f"{key}.mp_buffer_dtype={fsdp.mp_buffer_dtype!r} cannot act: FSDP2 does not cast buffers, and "
                "the models' floating buffers (rotary inv_freq) are computed in fp32; set it to fp32 (or leave it "
                "out) and choose the compute dtype with mp_param_dtype"
            )
