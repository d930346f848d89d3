"""The typed configuration of a training run, and its loading from YAML files and command-line overrides.

A run is described by one :class:`PPOConfig`: a tree of dataclasses (data, algorithm, worker, trainer) whose key
names and defaults follow EasyR1, so an EasyR1 YAML file loads as it is. Every field has a default, a type hint and
a one-line help text in ``field(metadata={"help": ...})``; :func:`describe` prints them all.

:func:`load_config` merges, in this order, the dataclass defaults, any ``config=FILE.yaml`` files and dot-list
overrides such as ``worker.actor.optim.lr=1e-6`` or ``trainer.logger=[console,file]``. It rejects unknown keys
(naming the closest valid one) and values of the wrong type, fills the derived fields (mirrors such as
``worker.rollout.prompt_length``, default paths, absolute local paths) and runs the cross-field checks of
:meth:`PPOConfig.validate` -- all before any model is loaded. :func:`check_against_model` adds the checks that need
the model's ``config.json``.
"""

import copy
import dataclasses
import difflib
import functools
import json
import os
import re
import typing
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from easyr1.algorithms.advantage import ADV_ESTIMATORS as ADV_ESTIMATOR_REGISTRY
from easyr1.algorithms.advantage import EstimatorNeeds, estimator_needs
from easyr1.errors import ConfigError


# Names accepted by the registries of the algorithms and workers. Kept here so that a typo fails at load time.
ADV_ESTIMATORS = (
    "grpo",
    "grpo_passk",
    "rloo",
    "reinforce_plus_plus",
    "reinforce_plus_plus_baseline",
    "remax",
    "gae",
)
LOSS_TYPES = ("ppo", "gspo", "gspo_token", "cispo", "sapo")
LOSS_AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
KL_PENALTIES = ("kl", "abs", "mse", "low_var_kl", "full")
KL_TYPES = ("fixed", "adaptive")
ROLLOUT_CORRECTIONS = ("token_tis", "seq_tis")
ROLLOUT_ENGINES = ("vllm", "hf")
REWARD_TYPES = ("batch", "sequential")
LOGGERS = ("console", "file", "wandb", "swanlab", "tensorboard", "mlflow")
DEVICES = ("auto", "cpu", "cuda")
STRATEGIES = ("fsdp",)
OPTIMIZERS = ("adamw", "adamw_bf16")
LR_SCHEDULERS = ("constant", "cosine")

# EasyR1's older `loss_avg_mode` values and the `loss_agg_mode` each one means.
LOSS_AVG_MODE_ALIASES = {"token": "token-mean", "seq": "seq-mean-token-mean"}
# EasyR1 calls the plain clipped PPO loss "default".
LOSS_TYPE_ALIASES = {"default": "ppo"}

# Precision names accepted wherever a dtype is configured (the names easyr1.models.loading understands).
DTYPE_NAMES = ("bf16", "bfloat16", "fp16", "float16", "fp32", "float32")

# Keys that EasyR1 renamed at some point: an old YAML gets pointed at the new name.
_RENAMED_KEYS = {
    "trainer.total_episodes": "trainer.total_epochs",
    "worker.actor.ulysses_sequence_parallel_size": "worker.actor.ulysses_size",
    "worker.reward.score_function": "worker.reward.reward_function",
    "worker.reward.score_function_kwargs": "worker.reward.reward_function_kwargs",
}


def _option(default: Any, doc: str) -> Any:
    """A dataclass field with a default (copied per instance when mutable) and a one-line help text."""
    if isinstance(default, (list, dict)):
        return field(default_factory=functools.partial(copy.deepcopy, default), metadata={"help": doc})
    return field(default=default, metadata={"help": doc})


def _section(cls: type, doc: str) -> Any:
    """A nested config section with a one-line help text."""
    return field(default_factory=cls, metadata={"help": doc})


def _mirror(default: Any, source: str) -> Any:
    """A field copied from ``source`` when the config is built; setting it to another value is an error."""
    return _option(default, f"derived: copied from {source}; set that key instead")


@dataclass
class DataConfig:
    """Where the prompts come from and how they are turned into model inputs."""

    train_files: str = _option(
        "hiyouga/geometry3k@train",
        "training data: a local .jsonl/.json/.parquet file or directory, or 'hub_name@split'",
    )
    val_files: str = _option("hiyouga/geometry3k@test", "validation data, in the same forms as train_files")
    prompt_key: str = _option("problem", "row key of the prompt text; '<image>' / '<video>' mark the vision inputs")
    answer_key: str = _option("answer", "row key of the ground truth given to the reward function")
    image_key: str = _option("images", "row key of the images (paths, bytes or PIL images)")
    video_key: str = _option("videos", "row key of the videos (paths or lists of frames)")
    image_dir: str | None = _option(None, "directory of relative image/video paths (null: the data file's directory)")
    video_fps: float = _option(2.0, "frames per second sampled from videos")
    max_prompt_length: int = _option(512, "longest prompt in tokens, vision tokens included")
    max_response_length: int = _option(512, "most tokens generated per response")
    rollout_batch_size: int = _option(512, "prompts per training step; each is sampled worker.rollout.n times")
    mini_rollout_batch_size: int | None = _option(
        None, "prompts per generation round when online filtering refills a step (null: rollout_batch_size)"
    )
    val_batch_size: int = _option(-1, "prompts per validation generation round (-1: the whole validation set)")
    format_prompt: str | None = _option(None, "Jinja template (.jinja file) around each prompt: '{{ content }}'")
    override_chat_template: str | None = _option(None, "chat template used instead of the tokenizer's (file path)")
    shuffle: bool = _option(True, "shuffle the training data every epoch")
    seed: int = _option(1, "seed of the training data order")
    min_pixels: int | None = _option(262144, "smallest image area in pixels after resizing (null: processor default)")
    max_pixels: int | None = _option(4194304, "largest image area in pixels after resizing (null: processor default)")
    filter_overlong_prompts: bool = _option(True, "drop prompts longer than max_prompt_length when loading the data")
    skip_bad_rows: bool = _option(
        False, "drop rows that cannot be used (counted and reported) instead of stopping with an error"
    )
    filter_overlong_prompts_workers: int = _option(16, "processes used to find overlong prompts")
    dataloader_num_workers: int = _option(0, "worker processes of the training dataloader (0: load in the driver)")


@dataclass
class AlgorithmConfig:
    """The RL algorithm: advantage estimator, KL regularisation and online filtering."""

    gamma: float = _option(1.0, "discount factor (gae, reinforce_plus_plus)")
    lam: float = _option(1.0, "lambda of GAE")
    adv_estimator: str = _option("grpo", f"advantage estimator: {', '.join(ADV_ESTIMATORS)}")
    disable_kl: bool = _option(False, "no reference model and no KL term at all (wins over use_kl_loss)")
    use_kl_loss: bool = _option(False, "put the KL in the policy loss (true) or subtract it from the reward (false)")
    kl_penalty: str = _option("kl", "KL estimator: kl (k1), abs, mse (k2), low_var_kl (k3), full")
    kl_coef: float = _option(1e-3, "KL coefficient (the starting value for the adaptive controller)")
    kl_type: str = _option("fixed", "controller of the in-reward KL coefficient: fixed or adaptive")
    kl_horizon: float = _option(10000.0, "horizon of the adaptive KL controller")
    kl_target: float = _option(0.1, "target KL of the adaptive KL controller")
    online_filtering: bool = _option(False, "DAPO dynamic sampling: drop groups whose mean score is out of range")
    filter_key: str = _option("overall", "score key that online filtering looks at")
    filter_low: float = _option(0.01, "online filtering keeps groups whose mean score is above this")
    filter_high: float = _option(0.99, "online filtering keeps groups whose mean score is below this")
    norm_adv_by_std: bool = _option(True, "divide group-relative advantages by the group's std (false: Dr.GRPO)")
    rollout_correction: str | None = _option(
        None, "truncated importance sampling against the rollout engine's log-probs: null (off), token_tis, seq_tis"
    )
    rollout_correction_threshold: float = _option(2.0, "cap of the rollout-correction importance weights")


@dataclass
class LoraConfig:
    """Low-rank adapters instead of full fine-tuning."""

    rank: int = _option(0, "LoRA rank (0: train all weights, no adapters)")
    alpha: int = _option(64, "LoRA scaling factor")
    target_modules: str = _option("all-linear", "modules given adapters: 'all-linear' or comma-separated names")
    exclude_modules: str | None = _option(None, "regex of module names kept without adapters, e.g. '.*visual.*'")


@dataclass
class ModelConfig:
    """Which model the actor (and the reference policy) loads."""

    model_path: str | None = _option(None, "model directory or hub id (required)")
    tokenizer_path: str | None = _option(None, "tokenizer / processor directory (null: model_path)")
    override_config: dict[str, Any] = _option({}, "values that replace entries of the model's config.json")
    enable_gradient_checkpointing: bool = _option(True, "recompute activations in the backward pass to save memory")
    trust_remote_code: bool = _option(False, "allow model code shipped in the model directory")
    freeze_vision_tower: bool = _option(False, "keep the vision encoder's weights fixed")
    lora: LoraConfig = _section(LoraConfig, "LoRA adapters")


@dataclass
class OptimConfig:
    """The optimizer and learning-rate schedule."""

    lr: float = _option(1e-6, "learning rate")
    betas: tuple[float, float] = _option((0.9, 0.999), "AdamW betas")
    weight_decay: float = _option(1e-2, "AdamW weight decay")
    strategy: str = _option("adamw", f"optimizer: {', '.join(OPTIMIZERS)}")
    lr_warmup_ratio: float = _option(0.0, "fraction of the training steps spent in linear warmup")
    lr_warmup_steps: int | None = _option(None, "warmup steps (overrides lr_warmup_ratio when set)")
    min_lr_ratio: float | None = _option(None, "final lr as a fraction of lr for the cosine schedule (null: 0)")
    lr_scheduler_type: str = _option("constant", f"schedule after warmup: {', '.join(LR_SCHEDULERS)}")
    training_steps: int = _option(-1, "total optimizer steps; filled in by the trainer")


@dataclass
class FSDPConfig:
    """How a model is sharded with FSDP2."""

    enable_full_shard: bool = _option(True, "shard parameters, gradients and optimizer states (false: replicate)")
    enable_cpu_offload: bool = _option(
        False, "FSDP keeps parameters, gradients and optimizer states in host memory (a no-op on a CPU device)"
    )
    enable_rank0_init: bool = _option(False, "load weights on rank 0 only and broadcast them")
    torch_dtype: str | None = _option(
        None,
        "dtype of the stored (master) weights, gradients and optimizer states (null: fp32 for actor and critic; "
        "the reference bf16 on GPU, fp32 on CPU)",
    )
    mp_param_dtype: str | None = _option(
        None, "dtype of the weights and activations in compute (null: bf16 on GPU, torch_dtype on CPU)"
    )
    mp_reduce_dtype: str | None = _option(None, "dtype of the gradient reduction (null: fp32)")
    mp_buffer_dtype: str = _option(
        "fp32", "dtype of the buffers: fp32 only (FSDP2 does not cast buffers; rotary inv_freq is computed in fp32)"
    )
    fsdp_size: int = _option(-1, "workers per FSDP shard group (-1: all workers)")


@dataclass
class OffloadConfig:
    """What is moved to the CPU while the rollout engine runs."""

    offload_params: bool = _option(
        False, "keep parameters (and gradients) in host memory between the phases that use them"
    )
    offload_optimizer: bool = _option(False, "keep optimizer states in host memory between updates")


@dataclass
class ActorConfig:
    """The policy being trained."""

    strategy: str = _option("fsdp", f"training backend: {', '.join(STRATEGIES)}")
    global_batch_size: int = _option(256, "prompts per policy update; an update uses global_batch_size * n samples")
    micro_batch_size_per_device_for_update: int = _option(4, "samples per forward/backward pass in the update")
    micro_batch_size_per_device_for_experience: int = _option(16, "samples per forward pass computing log-probs")
    max_grad_norm: float = _option(1.0, "gradient norm clipping threshold")
    clip_ratio_low: float = _option(0.2, "PPO clip range below 1 (ratio >= 1 - clip_ratio_low)")
    clip_ratio_high: float = _option(0.3, "PPO clip range above 1 (ratio <= 1 + clip_ratio_high; DAPO clip-higher)")
    clip_ratio_dual: float = _option(3.0, "dual-clip constant C: the loss of negative advantages is capped at C")
    loss_type: str = _option("ppo", f"policy loss: {', '.join(LOSS_TYPES)} ('default' is read as 'ppo')")
    loss_agg_mode: str = _option("token-mean", f"how token losses are averaged: {', '.join(LOSS_AGG_MODES)}")
    loss_avg_mode: str | None = _option(
        None, "EasyR1's older name: 'token' sets loss_agg_mode=token-mean, 'seq' sets seq-mean-token-mean"
    )
    ppo_epochs: int = _option(1, "passes over each rollout batch")
    reuse_update_log_probs: bool = _option(
        True,
        "when a rollout batch feeds exactly one optimizer step (ppo_epochs=1, one mini-batch) and no KL is in the "
        "reward, take the old log-probs from the update's own forward instead of a separate pass (false: always run "
        "the separate pass)",
    )
    padding_free: bool = _option(False, "pack each micro-batch into one row without padding (same values)")
    share_prompt: bool = _option(
        True,
        "lay out the prompt of a micro-batch's samples that share it once (implies padding_free's packing; same "
        "values; sdpa or eager attention, else padding-free packing)",
    )
    dynamic_batching: bool = _option(
        False, "micro-batches of near-equal token count, as many as micro_batch_size full-length rows would need"
    )
    ulysses_size: int = _option(1, "Ulysses sequence-parallel group size: only 1 (not implemented)")
    use_torch_compile: bool = _option(False, "compile the log-prob computation with torch.compile")
    entropy_coeff: float = _option(0.0, "weight of the entropy bonus in the policy loss")
    tau_positive: float = _option(1.0, "SAPO gate temperature for tokens with a non-negative advantage")
    tau_negative: float = _option(1.05, "SAPO gate temperature for tokens with a negative advantage")
    model: ModelConfig = _section(ModelConfig, "the model")
    optim: OptimConfig = _section(OptimConfig, "the optimizer")
    fsdp: FSDPConfig = _section(FSDPConfig, "FSDP sharding of the actor")
    offload: OffloadConfig = _section(OffloadConfig, "CPU offloading of the actor")
    disable_kl: bool = _mirror(False, "algorithm.disable_kl")
    use_kl_loss: bool = _mirror(False, "algorithm.use_kl_loss")
    kl_penalty: str = _mirror("kl", "algorithm.kl_penalty")
    kl_coef: float = _mirror(1e-3, "algorithm.kl_coef")


@dataclass
class RefConfig:
    """The frozen reference policy; it loads worker.actor.model (same path, same settings)."""

    strategy: str = _option("fsdp", f"backend: {', '.join(STRATEGIES)}")
    fsdp: FSDPConfig = _section(FSDPConfig, "FSDP sharding of the reference model")
    offload: OffloadConfig = _section(OffloadConfig, "CPU offloading of the reference model")
    micro_batch_size_per_device_for_experience: int = _mirror(
        16, "worker.actor.micro_batch_size_per_device_for_experience"
    )
    padding_free: bool = _mirror(False, "worker.actor.padding_free")
    share_prompt: bool = _mirror(True, "worker.actor.share_prompt")
    dynamic_batching: bool = _mirror(False, "worker.actor.dynamic_batching")
    ulysses_size: int = _mirror(1, "worker.actor.ulysses_size")
    use_torch_compile: bool = _mirror(False, "worker.actor.use_torch_compile")


@dataclass
class RolloutConfig:
    """The generation engine that samples responses."""

    name: str = _option("vllm", f"engine: {', '.join(ROLLOUT_ENGINES)}")
    n: int = _option(5, "responses sampled per prompt")
    temperature: float = _option(1.0, "sampling temperature")
    top_p: float = _option(1.0, "nucleus sampling threshold")
    top_k: int = _option(-1, "sample from the k most likely tokens (-1: all)")
    seed: int = _option(1, "sampling seed")
    limit_images: int = _option(0, "most images per prompt the engine accepts (0: no limit)")
    dtype: str | None = _option(
        None, "dtype of the engine's weights (null: the actor's compute dtype, mixed-precision param dtype if any)"
    )
    gpu_memory_utilization: float = _option(0.6, "fraction of GPU memory vLLM may use")
    ignore_eos: bool = _option(False, "keep generating after the end-of-sequence token")
    enforce_eager: bool = _option(
        False,
        "run vLLM's model without compiling it: no CUDA graphs on GPU, no torch.compile on CPU (starts ~25 s sooner "
        "on CPU, generates ~20-30% slower)",
    )
    enable_chunked_prefill: bool = _option(False, "let vLLM split long prefills into chunks")
    tensor_parallel_size: int = _option(2, "workers sharing one engine by tensor parallelism")
    max_model_len: int | None = _option(None, "longest prompt + response the engine handles (null: from lengths)")
    max_num_batched_tokens: int = _option(8192, "most tokens vLLM processes in one scheduler step")
    disable_log_stats: bool = _option(True, "silence vLLM's periodic statistics")
    disable_tqdm: bool = _option(False, "hide the generation progress bar")
    val_override_config: dict[str, Any] = _option({}, "rollout keys changed for validation, e.g. {temperature: 0.6}")
    cpu_kv_cache_gb: float | None = _option(
        None,
        "GiB of KV cache for vLLM on CPU (null: sized for one engine's share of a rollout batch at max_model_len; "
        "a larger batch, e.g. validation, then waits in vLLM's queue)",
    )
    trust_remote_code: bool = _mirror(False, "worker.actor.model.trust_remote_code")
    prompt_length: int = _mirror(512, "data.max_prompt_length")
    response_length: int = _mirror(512, "data.max_response_length")


@dataclass
class RewardConfig:
    """The reward function that scores responses."""

    reward_type: str | None = _option(None, "batch or sequential (null: the reward file's REWARD_TYPE, else batch)")
    reward_function: str | None = _option(
        None, "'path/to/file.py:function' (required; a path without ':function' means compute_score)"
    )
    reward_function_kwargs: dict[str, Any] = _option({}, "extra keyword arguments passed to the reward function")
    skip_special_tokens: bool = _option(True, "drop special tokens when decoding responses for scoring")
    num_cpus: int = _option(1, "CPUs reserved for the reward computation")


@dataclass
class CriticConfig:
    """The value model of PPO with GAE; built only when algorithm.adv_estimator=gae."""

    strategy: str = _option("fsdp", f"training backend: {', '.join(STRATEGIES)}")
    global_batch_size: int | None = _option(
        None, "prompts per critic update (null: worker.actor.global_batch_size); uses global_batch_size * n samples"
    )
    micro_batch_size_per_device_for_update: int = _option(4, "samples per forward/backward pass in the update")
    micro_batch_size_per_device_for_experience: int = _option(16, "samples per forward pass computing values")
    max_grad_norm: float = _option(1.0, "gradient norm clipping threshold")
    cliprange_value: float = _option(0.5, "values may move at most this far from the rollout's values per update")
    ppo_epochs: int = _option(1, "passes over each rollout batch")
    model: ModelConfig = _section(ModelConfig, "the value model's backbone (null model_path: the actor's)")
    optim: OptimConfig = _section(OptimConfig, "the critic's optimizer")
    fsdp: FSDPConfig = _section(FSDPConfig, "FSDP sharding of the critic")
    offload: OffloadConfig = _section(OffloadConfig, "CPU offloading of the critic")


@dataclass
class WorkerConfig:
    """Everything that runs on the workers."""

    actor: ActorConfig = _section(ActorConfig, "the policy being trained")
    critic: CriticConfig = _section(CriticConfig, "the value model (PPO with GAE only)")
    ref: RefConfig = _section(RefConfig, "the reference policy")
    rollout: RolloutConfig = _section(RolloutConfig, "the generation engine")
    reward: RewardConfig = _section(RewardConfig, "the reward function")


@dataclass
class TrainerConfig:
    """The training loop: length, workers, logging, validation and checkpoints."""

    total_epochs: int = _option(15, "passes over the training data")
    max_steps: int | None = _option(None, "stop after this many steps (null: total_epochs decides)")
    project_name: str = _option("easy_r1", "project name for loggers and the checkpoint path")
    experiment_name: str = _option("easyr1", "experiment name for loggers and the checkpoint path")
    logger: list[str] = _option(["console", "file"], f"loggers: any of {', '.join(LOGGERS)}")
    nnodes: int = _option(1, "number of machines")
    n_gpus_per_node: int = _option(8, "workers per machine: one per GPU, or CPU worker processes on a CPU machine")
    max_try_make_batch: int = _option(20, "online filtering: most generation rounds per step (-1: no limit)")
    critic_warmup: int = _option(0, "steps that train only the critic")
    balance_batch: bool = _option(True, "reorder each step's samples so every worker gets a similar token count")
    cache_sample_tensors: bool = _option(
        True,
        "send each sample's vision and token tensors to a worker once per step (not to vLLM, which reads the images) "
        "and reuse them there; false: every call sends its own copy",
    )
    val_freq: int = _option(-1, "validate every this many steps (-1: never)")
    val_before_train: bool = _option(True, "validate before the first step")
    val_only: bool = _option(False, "validate and stop without training")
    val_generations_to_log: int = _option(3, "validation samples shown in the logs")
    rollouts_to_log: int = _option(2, "prompts (with all their responses and images) kept for the report's viewer")
    rollout_log_freq: int = _option(10, "keep rollouts every this many steps (and at the first step)")
    save_freq: int = _option(-1, "save a checkpoint every this many steps (-1: only after the last step)")
    save_limit: int = _option(-1, "newest checkpoints kept on disk, plus the best by validation reward (-1: all)")
    save_model_only: bool = _option(False, "save the model weights only (smaller, but training cannot resume from it)")
    save_checkpoint_path: str | None = _option(None, "checkpoint directory (null: checkpoints/<project>/<experiment>)")
    load_checkpoint_path: str | None = _option(None, "a global_step_N directory to resume from")
    find_last_checkpoint: bool = _option(True, "resume from the latest checkpoint in save_checkpoint_path if any")
    device: str = _option("auto", f"device: {', '.join(DEVICES)} (auto: cuda when available)")
    peak_flops_per_device: float | None = _option(
        None,
        "peak FLOP/s of one worker's device for perf/mfu (null: the GPU's data-sheet bf16 figure, or on CPU a "
        "matmul timing at the actor's compute dtype taken once per worker)",
    )
    seed: int = _option(1, "global seed of torch, numpy and python")
    log_dir: str | None = _option(None, "directory of the file logger (null: save_checkpoint_path)")


# Derived key -> the key it is copied from.
_MIRRORS = {
    "worker.actor.disable_kl": "algorithm.disable_kl",
    "worker.actor.use_kl_loss": "algorithm.use_kl_loss",
    "worker.actor.kl_penalty": "algorithm.kl_penalty",
    "worker.actor.kl_coef": "algorithm.kl_coef",
    "worker.ref.micro_batch_size_per_device_for_experience": "worker.actor.micro_batch_size_per_device_for_experience",
    "worker.ref.padding_free": "worker.actor.padding_free",
    "worker.ref.share_prompt": "worker.actor.share_prompt",
    "worker.ref.dynamic_batching": "worker.actor.dynamic_batching",
    "worker.ref.ulysses_size": "worker.actor.ulysses_size",
    "worker.ref.use_torch_compile": "worker.actor.use_torch_compile",
    "worker.rollout.trust_remote_code": "worker.actor.model.trust_remote_code",
    "worker.rollout.prompt_length": "data.max_prompt_length",
    "worker.rollout.response_length": "data.max_response_length",
}


@dataclass
class PPOConfig:
    """The whole configuration of a training run."""

    data: DataConfig = _section(DataConfig, "the prompts")
    algorithm: AlgorithmConfig = _section(AlgorithmConfig, "the RL algorithm")
    worker: WorkerConfig = _section(WorkerConfig, "actor, reference, rollout and reward")
    trainer: TrainerConfig = _section(TrainerConfig, "the training loop")

    def __post_init__(self) -> None:
        self.fill_derived()

    @property
    def world_size(self) -> int:
        """The number of workers: ``trainer.nnodes * trainer.n_gpus_per_node``."""
        return self.trainer.nnodes * self.trainer.n_gpus_per_node

    def fill_derived(self) -> None:
        """Fill the derived fields: mirrors, aliases, default names and absolute local paths.

        Runs when the config is built; call it again after changing fields in code. It is idempotent.
        """
        actor = self.worker.actor
        if actor.loss_avg_mode is not None:
            if actor.loss_avg_mode not in LOSS_AVG_MODE_ALIASES:
                raise ConfigError(
                    f"worker.actor.loss_avg_mode={actor.loss_avg_mode!r} is not supported; use 'token' or 'seq', "
                    f"or set worker.actor.loss_agg_mode to one of {', '.join(LOSS_AGG_MODES)}"
                )
            actor.loss_agg_mode = LOSS_AVG_MODE_ALIASES[actor.loss_avg_mode]
            # Consumed: the dumped config then shows only the effective loss_agg_mode.
            actor.loss_avg_mode = None
        actor.loss_type = LOSS_TYPE_ALIASES.get(actor.loss_type, actor.loss_type)

        for derived, source in _MIRRORS.items():
            _set_key(self, derived, _get_key(self, source))

        data, model, reward, trainer = self.data, actor.model, self.worker.reward, self.trainer
        data.train_files = _resolve_dataset(data.train_files)
        data.val_files = _resolve_dataset(data.val_files)
        data.format_prompt = _resolve_path(data.format_prompt)
        data.override_chat_template = _resolve_path(data.override_chat_template)
        data.image_dir = _absolute(data.image_dir)
        model.model_path = _resolve_path(model.model_path)
        model.tokenizer_path = _resolve_path(model.tokenizer_path) if model.tokenizer_path else model.model_path
        reward.reward_function = _resolve_function(reward.reward_function)
        if self.worker.critic.global_batch_size is None:
            self.worker.critic.global_batch_size = actor.global_batch_size
        critic_model = self.worker.critic.model
        critic_model.model_path = (
            _resolve_path(critic_model.model_path) if critic_model.model_path else model.model_path
        )
        critic_model.tokenizer_path = critic_model.tokenizer_path or model.tokenizer_path
        if trainer.save_checkpoint_path is None:
            trainer.save_checkpoint_path = os.path.join("checkpoints", trainer.project_name, trainer.experiment_name)
        trainer.save_checkpoint_path = _absolute(trainer.save_checkpoint_path)
        trainer.load_checkpoint_path = _absolute(trainer.load_checkpoint_path)
        trainer.log_dir = _absolute(trainer.log_dir) if trainer.log_dir else trainer.save_checkpoint_path

    def validate(self, num_workers: int | None = None) -> None:
        """Check the values and their combinations; raise :class:`ConfigError` listing every problem found.

        ``num_workers`` replaces ``trainer.nnodes * trainer.n_gpus_per_node`` when the caller knows the real count.
        """
        problems = _validate(self, num_workers)
        if len(problems) == 1:
            raise ConfigError(problems[0])
        if problems:
            raise ConfigError("invalid configuration:\n" + "\n".join(f"  - {problem}" for problem in problems))


# ----------------------------------------------------------------------------------------------------------------
# Local paths


_LOCAL_SUFFIXES = (".json", ".jsonl", ".parquet", ".arrow", ".csv", ".py", ".jinja", ".yaml", ".yml", ".txt")


def _looks_local(path: str) -> bool:
    """Whether a string names a local path rather than a hub id such as ``Qwen/Qwen2.5-VL-7B-Instruct``."""
    # Files of the CPU demo are created on first use, so existence alone cannot decide.
    return (
        path.startswith((".", "/", "~"))
        or path.lower().endswith(_LOCAL_SUFFIXES)
        or os.path.exists(os.path.expanduser(path))
    )


def _absolute(path: str | None) -> str | None:
    """The absolute form of a local path (Ray workers may run in another directory)."""
    return None if path is None else os.path.abspath(os.path.expanduser(path))


def _resolve_path(path: str | None) -> str | None:
    """Make a local path absolute; leave hub ids and None unchanged."""
    if path is None or not _looks_local(path):
        return path
    return _absolute(path)


def _resolve_dataset(spec: str) -> str:
    """Make the path part of ``path[@split]`` absolute when it is local."""
    base, at, split = spec.rpartition("@")
    if not at or "/" in split:  # no split suffix, or the '@' belongs to a directory name
        return _resolve_path(spec)
    return f"{_resolve_path(base)}@{split}" if _looks_local(base) else spec


def _resolve_function(spec: str | None) -> str | None:
    """Make the file part of ``file.py[:function]`` absolute."""
    if spec is None:
        return None
    base, colon, name = spec.rpartition(":")
    if colon and name.isidentifier():
        return f"{_absolute(base)}:{name}"
    return _absolute(spec)


# ----------------------------------------------------------------------------------------------------------------
# Walking the dataclass tree


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    """The resolved type hints of a config dataclass."""
    return typing.get_type_hints(cls)


def _is_section(hint: Any) -> bool:
    return isinstance(hint, type) and dataclasses.is_dataclass(hint)


def _iter_fields(cls: type | None = None, prefix: str = "") -> Iterator[tuple[str, dataclasses.Field, Any]]:
    """Yield ``(dotted key, field, type hint)`` for every field of the tree, sections before their contents."""
    cls = cls or PPOConfig
    for item in dataclasses.fields(cls):
        hint = _hints(cls)[item.name]
        yield prefix + item.name, item, hint
        if _is_section(hint):
            yield from _iter_fields(hint, f"{prefix}{item.name}.")


@functools.cache
def _all_keys() -> tuple[str, ...]:
    return tuple(key for key, _, _ in _iter_fields())


def _get_key(obj: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def _set_key(obj: Any, dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    for part in parents:
        obj = getattr(obj, part)
    setattr(obj, last, value)


def _type_name(hint: Any) -> str:
    if isinstance(hint, type) and not typing.get_args(hint):
        return hint.__name__
    return str(hint).replace("typing.", "")


def describe() -> str:
    """Every config key with its type, default and help text, one per line (sections as headers)."""
    lines = []
    for key, item, hint in _iter_fields():
        doc = item.metadata.get("help", "")
        if _is_section(hint):
            lines.append(f"{key}:  # {doc}")
            continue
        default = item.default if item.default is not dataclasses.MISSING else item.default_factory()
        lines.append(f"{key}: {_type_name(hint)} = {default!r}  # {doc}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------------------------
# Loading


def _suggestion(dotted: str, section: type, prefix: str) -> str:
    """The tail of an unknown-key message: the closest valid key, or the valid keys of the section."""
    if dotted in _RENAMED_KEYS:
        return f"; it is now called '{_RENAMED_KEYS[dotted]}'"
    name = dotted.rpartition(".")[2]
    siblings = [item.name for item in dataclasses.fields(section)]
    close = difflib.get_close_matches(name, siblings, n=1, cutoff=0.6)
    if close:
        return f"; did you mean '{prefix}{close[0]}'?"
    # A key put in the wrong section, e.g. worker.actor.n for worker.rollout.n.
    elsewhere = [key for key in _all_keys() if key.rpartition(".")[2] == name]
    if elsewhere:
        return f"; did you mean '{elsewhere[0]}'?"
    close = difflib.get_close_matches(dotted, _all_keys(), n=1, cutoff=0.8)
    if close:
        return f"; did you mean '{close[0]}'?"
    where = f"under '{prefix[:-1]}'" if prefix else "at the top level"
    return f"; valid keys {where}: {', '.join(siblings)}"


def _leaves(data: Mapping, section: type, prefix: str, source: str) -> Iterator[tuple[str, Any, Any]]:
    """Yield ``(dotted key, value, type hint)`` for every value given in ``data``, checking that each key exists."""
    hints = _hints(section)
    for name, value in data.items():
        dotted = f"{prefix}{name}"
        if name not in hints:
            raise ConfigError(f"unknown config key '{dotted}' ({source}){_suggestion(dotted, section, prefix)}")
        hint = hints[name]
        if not _is_section(hint):
            yield dotted, value, hint
        elif isinstance(value, Mapping):
            yield from _leaves(value, hint, f"{dotted}.", source)
        elif value is not None:  # an empty section in YAML reads as null
            raise ConfigError(
                f"config key '{dotted}' ({source}) is a section, not a value; set the keys inside it, "
                f"e.g. {dotted}.{dataclasses.fields(hint)[0].name}=..."
            )


def _apply(merged: DictConfig, data: Mapping, source: str, explicit: dict[str, str]) -> None:
    """Merge one source (a YAML file or one override) into ``merged``, one key at a time for precise errors."""
    for dotted, value, hint in _leaves(data, PPOConfig, "", source):
        try:
            OmegaConf.update(merged, dotted, value, merge=True)
        except OmegaConfBaseException:
            given = "null" if value is None else f"{value!r} ({type(value).__name__})"
            advice = ""
            if value is None:
                advice = " (this key cannot be null)"
            elif typing.get_origin(hint) in (list, tuple):
                advice = " (write a list, e.g. [a, b])"
            raise ConfigError(
                f"config key '{dotted}' ({source}) got {given}; expected {_type_name(hint)}{advice}"
            ) from None
        explicit[dotted] = source


def _read_yaml(path: str) -> Mapping:
    """The mapping in a YAML config file."""
    if not os.path.isfile(path):
        where = "" if os.path.isabs(path) else f" (looked for {os.path.abspath(path)})"
        raise ConfigError(f"config file '{path}' not found{where}; check config=PATH")
    try:
        loaded = OmegaConf.load(path)
    except (yaml.YAMLError, OmegaConfBaseException, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file '{path}' is not valid YAML: {exc}") from None
    if not isinstance(loaded, DictConfig):
        raise ConfigError(f"config file '{path}' must hold a mapping of sections (data, algorithm, worker, trainer)")
    return OmegaConf.to_container(loaded, resolve=False)


def _parse_override(item: str) -> Mapping:
    """The nested mapping of one ``a.b.c=value`` override."""
    key, equals, _ = item.partition("=")
    if item.startswith("-"):
        raise ConfigError(f"command-line argument '{item}': write overrides as key=value without leading dashes")
    if not equals or not key.strip():
        raise ConfigError(f"command-line argument '{item}' is not key=value (e.g. trainer.nnodes=2 or config=x.yaml)")
    try:
        return OmegaConf.to_container(OmegaConf.from_dotlist([item]), resolve=False)
    except (yaml.YAMLError, OmegaConfBaseException, ValueError) as exc:
        raise ConfigError(f"cannot parse command-line override '{item}': {exc}") from None


def _check_explicit_derived(merged: DictConfig, explicit: dict[str, str]) -> None:
    """Reject derived keys set to values that disagree with the keys they are copied from."""
    for derived, source_key in _MIRRORS.items():
        if derived in explicit:
            given, wanted = OmegaConf.select(merged, derived), OmegaConf.select(merged, source_key)
            if given != wanted:
                raise ConfigError(
                    f"config key '{derived}' ({explicit[derived]}) is copied from '{source_key}' and cannot be set "
                    f"on its own: got {given!r} but {source_key}={wanted!r}; set '{source_key}' instead"
                )
    avg_key, agg_key = "worker.actor.loss_avg_mode", "worker.actor.loss_agg_mode"
    if avg_key in explicit and agg_key in explicit:
        avg, agg = OmegaConf.select(merged, avg_key), OmegaConf.select(merged, agg_key)
        if avg is not None and LOSS_AVG_MODE_ALIASES.get(avg) != agg:
            raise ConfigError(
                f"{avg_key}={avg!r} ({explicit[avg_key]}) contradicts {agg_key}={agg!r} ({explicit[agg_key]}); "
                f"loss_avg_mode is EasyR1's older name for loss_agg_mode: set only {agg_key}"
            )


@functools.cache
def _defaults() -> DictConfig:
    """The typed OmegaConf tree of the defaults, built once: building it costs ~0.1 s, copying it ~0.02 s."""
    return OmegaConf.structured(PPOConfig)


def load_config(argv: Sequence[str], *, validate: bool = True) -> PPOConfig:
    """Build a :class:`PPOConfig` from ``config=FILE.yaml`` items and ``a.b.c=value`` overrides.

    Precedence: dataclass defaults < YAML files (in the order given) < overrides (in the order given). Derived
    fields are filled, and with ``validate`` the cross-field checks run. Every problem raises :class:`ConfigError`.
    """
    merged = copy.deepcopy(_defaults())
    explicit: dict[str, str] = {}  # keys set by the user -> where they were set
    files = [item.partition("=")[2] for item in argv if item.startswith("config=")]
    overrides = [item for item in argv if not item.startswith("config=")]
    for path in files:
        _apply(merged, _read_yaml(path), f"from {path}", explicit)
    for item in overrides:
        _apply(merged, _parse_override(item), "from the command line", explicit)
    _check_explicit_derived(merged, explicit)
    try:
        config = OmegaConf.to_object(merged)
    except OmegaConfBaseException as exc:  # e.g. an interpolation ${...} that points nowhere
        raise ConfigError(f"cannot build the configuration: {exc}") from None
    if validate:
        config.validate()
    return config


# ----------------------------------------------------------------------------------------------------------------
# Validation


def _one_of(problems: list[str], key: str, value: Any, choices: Sequence[str]) -> None:
    """Record a problem when ``value`` is not among ``choices``."""
    if value in choices:
        return
    close = difflib.get_close_matches(str(value), choices, n=1) if isinstance(value, str) else []
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    problems.append(f"{key}={value!r} is not supported{hint}; valid values: {', '.join(choices)}")


def _largest_divisor_up_to(number: int, limit: int) -> int:
    """The largest divisor of ``number`` that is at most ``limit`` (used to suggest a batch size)."""
    return max(d for d in range(1, max(1, min(number, limit)) + 1) if number % d == 0)


# Value rules: (test, what the value must be).
_AT_LEAST_ONE = (lambda v: v >= 1, "at least 1")
_AT_LEAST_ONE_OR_NULL = (lambda v: v is None or v >= 1, "at least 1 or null")
_MINUS_ONE_OR_AT_LEAST_ONE = (lambda v: v == -1 or v >= 1, "-1 or at least 1")
_NON_NEGATIVE = (lambda v: v >= 0, "non-negative")
_NON_NEGATIVE_OR_NULL = (lambda v: v is None or v >= 0, "non-negative or null")
_POSITIVE = (lambda v: v > 0, "positive")
_UNIT = (lambda v: 0 <= v <= 1, "in [0, 1]")
_UNIT_OR_NULL = (lambda v: v is None or 0 <= v <= 1, "in [0, 1] or null")
_OPEN_UNIT = (lambda v: 0 < v <= 1, "in (0, 1]")

_POSITIVE_OR_NULL = (lambda v: v is None or v > 0, "positive or null")

_RANGES = {
    "trainer.peak_flops_per_device": _POSITIVE_OR_NULL,
    "data.max_prompt_length": _AT_LEAST_ONE,
    "data.max_response_length": _AT_LEAST_ONE,
    "data.rollout_batch_size": _AT_LEAST_ONE,
    "data.mini_rollout_batch_size": _AT_LEAST_ONE_OR_NULL,
    "data.val_batch_size": _MINUS_ONE_OR_AT_LEAST_ONE,
    "data.video_fps": _POSITIVE,
    "data.min_pixels": _AT_LEAST_ONE_OR_NULL,
    "data.max_pixels": _AT_LEAST_ONE_OR_NULL,
    "data.filter_overlong_prompts_workers": _AT_LEAST_ONE,
    "data.dataloader_num_workers": _NON_NEGATIVE,
    "algorithm.gamma": _UNIT,
    "algorithm.lam": _UNIT,
    "algorithm.kl_coef": _NON_NEGATIVE,
    "algorithm.kl_horizon": _POSITIVE,
    "algorithm.kl_target": _POSITIVE,
    "algorithm.rollout_correction_threshold": _POSITIVE,
    "worker.actor.global_batch_size": _AT_LEAST_ONE,
    "worker.actor.micro_batch_size_per_device_for_update": _AT_LEAST_ONE,
    "worker.actor.micro_batch_size_per_device_for_experience": _AT_LEAST_ONE,
    "worker.actor.max_grad_norm": _POSITIVE,
    "worker.actor.clip_ratio_low": _UNIT,
    "worker.actor.clip_ratio_high": _NON_NEGATIVE,
    "worker.actor.clip_ratio_dual": (lambda v: v > 1, "greater than 1"),
    "worker.actor.ppo_epochs": _AT_LEAST_ONE,
    "worker.actor.tau_positive": _POSITIVE,
    "worker.actor.tau_negative": _POSITIVE,
    "worker.actor.ulysses_size": _AT_LEAST_ONE,
    "worker.actor.model.lora.rank": _NON_NEGATIVE,
    "worker.actor.optim.lr": _POSITIVE,
    "worker.actor.optim.betas": (lambda v: all(0 <= b < 1 for b in v), "in [0, 1)"),
    "worker.actor.optim.weight_decay": _NON_NEGATIVE,
    "worker.actor.optim.lr_warmup_ratio": _UNIT,
    "worker.actor.optim.lr_warmup_steps": _NON_NEGATIVE_OR_NULL,
    "worker.actor.optim.min_lr_ratio": _UNIT_OR_NULL,
    "worker.rollout.n": _AT_LEAST_ONE,
    "worker.rollout.temperature": (lambda v: v > 0, "positive for training (greedy validation: val_override_config)"),
    "worker.rollout.top_p": _OPEN_UNIT,
    "worker.rollout.top_k": _MINUS_ONE_OR_AT_LEAST_ONE,
    "worker.rollout.limit_images": _NON_NEGATIVE,
    "worker.rollout.gpu_memory_utilization": _OPEN_UNIT,
    "worker.rollout.tensor_parallel_size": _AT_LEAST_ONE,
    "worker.rollout.max_model_len": _AT_LEAST_ONE_OR_NULL,
    "worker.rollout.max_num_batched_tokens": _AT_LEAST_ONE,
    "worker.rollout.cpu_kv_cache_gb": _POSITIVE_OR_NULL,
    "worker.reward.num_cpus": _AT_LEAST_ONE,
    "trainer.total_epochs": _AT_LEAST_ONE,
    "trainer.max_steps": _AT_LEAST_ONE_OR_NULL,
    "trainer.nnodes": _AT_LEAST_ONE,
    "trainer.n_gpus_per_node": _AT_LEAST_ONE,
    "trainer.max_try_make_batch": _MINUS_ONE_OR_AT_LEAST_ONE,
    "trainer.critic_warmup": _NON_NEGATIVE,
    "trainer.val_generations_to_log": _NON_NEGATIVE,
    "trainer.rollouts_to_log": _NON_NEGATIVE,
    "trainer.rollout_log_freq": _AT_LEAST_ONE,
    "trainer.save_limit": _MINUS_ONE_OR_AT_LEAST_ONE,
}


def _check_ranges(config: PPOConfig, problems: list[str]) -> None:
    """Single values out of their valid range, and pairs of values in the wrong order."""
    for key, (test, requirement) in _RANGES.items():
        value = _get_key(config, key)
        if not test(value):
            shown = list(value) if isinstance(value, tuple) else value
            problems.append(f"{key}={shown!r} must be {requirement}")
    data, algo = config.data, config.algorithm
    if data.min_pixels is not None and data.max_pixels is not None and data.min_pixels > data.max_pixels:
        problems.append(f"data.min_pixels={data.min_pixels} is larger than data.max_pixels={data.max_pixels}")
    if algo.online_filtering and not algo.filter_low < algo.filter_high:
        problems.append(
            f"algorithm.filter_low={algo.filter_low} must be below algorithm.filter_high={algo.filter_high}: "
            "online filtering would drop every group"
        )


def _check_names(config: PPOConfig, problems: list[str]) -> None:
    """Names that must be known to a registry."""
    actor, rollout, fsdp = config.worker.actor, config.worker.rollout, config.worker.actor.fsdp
    _one_of(problems, "algorithm.adv_estimator", config.algorithm.adv_estimator, ADV_ESTIMATORS)
    _one_of(problems, "algorithm.kl_penalty", config.algorithm.kl_penalty, KL_PENALTIES)
    _one_of(problems, "algorithm.kl_type", config.algorithm.kl_type, KL_TYPES)
    if config.algorithm.rollout_correction is not None:
        _one_of(problems, "algorithm.rollout_correction", config.algorithm.rollout_correction, ROLLOUT_CORRECTIONS)
    _one_of(problems, "worker.actor.strategy", actor.strategy, STRATEGIES)
    _one_of(problems, "worker.ref.strategy", config.worker.ref.strategy, STRATEGIES)
    _one_of(problems, "worker.actor.loss_type", actor.loss_type, LOSS_TYPES)
    _one_of(problems, "worker.actor.loss_agg_mode", actor.loss_agg_mode, LOSS_AGG_MODES)
    _one_of(problems, "worker.actor.optim.strategy", actor.optim.strategy, OPTIMIZERS)
    _one_of(problems, "worker.actor.optim.lr_scheduler_type", actor.optim.lr_scheduler_type, LR_SCHEDULERS)
    _one_of(problems, "worker.rollout.name", rollout.name, ROLLOUT_ENGINES)
    if rollout.dtype is not None:
        _one_of(problems, "worker.rollout.dtype", rollout.dtype, DTYPE_NAMES)
    fsdp_sections = (
        ("worker.actor.fsdp", fsdp),
        ("worker.ref.fsdp", config.worker.ref.fsdp),
        ("worker.critic.fsdp", config.worker.critic.fsdp),
    )
    for section, value in fsdp_sections:
        for name in ("torch_dtype", "mp_param_dtype", "mp_reduce_dtype"):
            if getattr(value, name) is not None:
                _one_of(problems, f"{section}.{name}", getattr(value, name), DTYPE_NAMES)
        if value.mp_buffer_dtype not in ("fp32", "float32"):
            problems.append(
                f"{section}.mp_buffer_dtype={value.mp_buffer_dtype!r} cannot act: FSDP2 does not cast buffers, and "
                "the models' floating buffers (rotary inv_freq) are computed in fp32; set it to fp32 (or leave it "
                "out) and choose the compute dtype with mp_param_dtype"
            )
    if config.worker.reward.reward_type is not None:
        _one_of(problems, "worker.reward.reward_type", config.worker.reward.reward_type, REWARD_TYPES)
    _one_of(problems, "trainer.device", config.trainer.device, DEVICES)
    for name in config.trainer.logger:
        _one_of(problems, "trainer.logger entry", name, LOGGERS)
    derived = {key.rpartition(".")[2] for key in _MIRRORS if key.startswith("worker.rollout.")}
    rollout_keys = [item.name for item in dataclasses.fields(RolloutConfig) if item.name not in derived]
    for name in rollout.val_override_config:
        if name not in rollout_keys:
            close = difflib.get_close_matches(name, rollout_keys, n=1)
            hint = f"; did you mean '{close[0]}'?" if close else f"; valid keys: {', '.join(rollout_keys)}"
            problems.append(f"worker.rollout.val_override_config has unknown rollout key '{name}'{hint}")


def _check_required(config: PPOConfig, problems: list[str]) -> None:
    """Values without a usable default."""
    if config.worker.actor.model.model_path is None:
        problems.append("worker.actor.model.model_path is not set; pass worker.actor.model.model_path=PATH_OR_HUB_ID")
    function = config.worker.reward.reward_function
    if function is None:
        problems.append("worker.reward.reward_function is not set; pass worker.reward.reward_function=FILE.py:FUNC")
    elif not re.search(r"\.py(:\w+)?$", function):
        problems.append(f"worker.reward.reward_function={function!r} must name a python file: 'path/to/file.py:func'")


def _check_sizes(config: PPOConfig, num_workers: int | None, problems: list[str]) -> None:
    """Batch sizes that must split evenly over workers and micro-batches; parallel group sizes; lengths."""
    data, actor, rollout = config.data, config.worker.actor, config.worker.rollout
    if num_workers is None:
        workers = config.world_size
        trainer = config.trainer
        who = f"the {workers} workers (trainer.nnodes={trainer.nnodes} * trainer.n_gpus_per_node="
        who += f"{trainer.n_gpus_per_node})"
    else:
        workers, who = num_workers, f"the {num_workers} workers"
    n, rollout_size, global_size = rollout.n, data.rollout_batch_size, actor.global_batch_size
    if min(workers, n, rollout_size, global_size) < 1:
        return  # already reported as out of range; the arithmetic below would be meaningless

    if global_size > rollout_size:
        problems.append(
            f"worker.actor.global_batch_size={global_size} is larger than data.rollout_batch_size={rollout_size}: "
            f"an update cannot use more prompts than one step generates; set global_batch_size <= {rollout_size}"
        )
    elif rollout_size % global_size:
        problems.append(
            f"data.rollout_batch_size={rollout_size} is not a multiple of worker.actor.global_batch_size="
            f"{global_size}: each step is split into whole updates; use a global_batch_size that divides "
            f"{rollout_size} (e.g. {_largest_divisor_up_to(rollout_size, global_size)})"
        )

    per_batch = [
        ("data.rollout_batch_size", rollout_size, "worker.actor.micro_batch_size_per_device_for_experience"),
        ("worker.actor.global_batch_size", global_size, "worker.actor.micro_batch_size_per_device_for_update"),
    ]
    if data.mini_rollout_batch_size is not None and data.mini_rollout_batch_size >= 1:
        per_batch.append(("data.mini_rollout_batch_size", data.mini_rollout_batch_size, None))
        if rollout_size % data.mini_rollout_batch_size:
            problems.append(
                f"data.mini_rollout_batch_size={data.mini_rollout_batch_size} must divide data.rollout_batch_size="
                f"{rollout_size}: a step's prompts are drawn in whole generation rounds"
            )
    needs = _estimator_needs(config.algorithm.adv_estimator)
    if needs.critic:
        critic = config.worker.critic
        if critic.global_batch_size > rollout_size or rollout_size % max(critic.global_batch_size, 1):
            problems.append(
                f"worker.critic.global_batch_size={critic.global_batch_size} must divide "
                f"data.rollout_batch_size={rollout_size}"
            )
        per_batch.append(
            (
                "worker.critic.global_batch_size",
                critic.global_batch_size,
                "worker.critic.micro_batch_size_per_device_for_update",
            )
        )
    for key, prompts, micro_key in per_batch:
        samples = prompts * n
        if samples % workers:
            problems.append(
                f"{key} * worker.rollout.n = {prompts} * {n} = {samples} samples cannot be split evenly across "
                f"{who}; make {key} * n a multiple of {workers}"
            )
            continue
        micro = _get_key(config, micro_key) if micro_key else 1
        per_worker = samples // workers
        if 1 <= micro < per_worker and per_worker % micro:  # a micro-batch may hold a worker's whole share
            problems.append(
                f"each worker gets {key} * worker.rollout.n / workers = {samples} / {workers} = {per_worker} "
                f"samples, not a whole number of micro-batches of {micro_key}={micro}; use a micro-batch size "
                f"that divides {per_worker} (e.g. {_largest_divisor_up_to(per_worker, micro)})"
            )

    size = rollout.tensor_parallel_size
    if size >= 1 and workers % size:
        problems.append(
            f"worker.rollout.tensor_parallel_size={size} does not divide {who}: every group needs all its members; "
            f"use a size that divides {workers}"
        )
    if actor.ulysses_size > 1:
        problems.append(
            f"worker.actor.ulysses_size={actor.ulysses_size}: Ulysses sequence parallelism is not implemented; set "
            "ulysses_size=1 and fit long sequences with worker.actor.padding_free=true, smaller "
            "micro_batch_size_per_device_for_update / _for_experience, and "
            "worker.actor.model.enable_gradient_checkpointing=true"
        )
    nodes, per_node, tp = config.trainer.nnodes, config.trainer.n_gpus_per_node, rollout.tensor_parallel_size
    if nodes > 1 and per_node >= 1 and tp >= 1 and per_node % tp:
        problems.append(
            f"worker.rollout.tensor_parallel_size={tp} does not divide trainer.n_gpus_per_node={per_node}: with "
            f"trainer.nnodes={nodes} a tensor-parallel group would span two nodes; use a size that divides {per_node}"
        )
    if rollout.name == "hf" and rollout.tensor_parallel_size != 1:
        problems.append(
            f"worker.rollout.tensor_parallel_size={rollout.tensor_parallel_size} needs worker.rollout.name=vllm; "
            "the hf engine keeps a whole model per worker: set tensor_parallel_size=1"
        )

    total = data.max_prompt_length + data.max_response_length
    if rollout.max_model_len is not None and total > rollout.max_model_len:
        problems.append(
            f"data.max_prompt_length + data.max_response_length = {data.max_prompt_length} + "
            f"{data.max_response_length} = {total} exceeds worker.rollout.max_model_len={rollout.max_model_len}; "
            "raise max_model_len or lower the length limits"
        )

    estimator = config.algorithm.adv_estimator
    if needs.greedy_baseline and rollout_size % workers:
        problems.append(
            f"algorithm.adv_estimator={estimator} generates one greedy baseline per prompt, so "
            f"data.rollout_batch_size={rollout_size} must split evenly across {who}"
        )
    if n < needs.min_group_size:
        problems.append(
            f"algorithm.adv_estimator={estimator} compares responses to the same prompt and "
            f"needs worker.rollout.n >= {needs.min_group_size} (got {n})"
        )


def _estimator_needs(name: str) -> EstimatorNeeds:
    """The registered estimator's needs; none for an unknown name (reported by the name check)."""
    return estimator_needs(name) if name in ADV_ESTIMATOR_REGISTRY else EstimatorNeeds()


def _validate(config: PPOConfig, num_workers: int | None) -> list[str]:
    """Every problem of the config, as messages naming the keys and values involved."""
    if num_workers is not None and num_workers < 1:
        raise ValueError(f"num_workers must be at least 1, got {num_workers}")
    problems: list[str] = []
    _check_required(config, problems)
    _check_ranges(config, problems)
    _check_names(config, problems)
    _check_sizes(config, num_workers, problems)
    return problems


def _read_model_config(model_path: str | None) -> dict[str, Any] | None:
    """The parsed ``config.json`` of a local model directory, or None when there is none to read."""
    if model_path is None or not os.path.isfile(os.path.join(model_path, "config.json")):
        return None
    path = os.path.join(model_path, "config.json")
    try:
        with open(path, encoding="utf-8") as file:
            loaded = json.load(file)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read the model config {path}: {exc}") from None
    if not isinstance(loaded, dict):
        raise ConfigError(f"the model config {path} must hold a JSON object")
    return loaded


def _model_value(model_config: Mapping[str, Any], key: str) -> Any:
    """A language-model setting from config.json, which multimodal models nest under ``text_config``."""
    text_config = model_config.get("text_config")
    if isinstance(text_config, Mapping) and key in text_config:
        return text_config[key]
    return model_config.get(key)


def check_against_model(config: PPOConfig, model_config: Mapping[str, Any] | None = None) -> None:
    """Check the config against the model's ``config.json``; no weights are read.

    ``model_config`` is that file as a dict; when it is omitted, ``<model_path>/config.json`` is read if the model is
    a local directory (a hub id is skipped: nothing can be checked before download). Raises :class:`ConfigError`
    when the sequence lengths exceed ``max_position_embeddings``, when the tensor-parallel size does not divide the
    attention heads, or when a vision setting is used with a text-only model.
    """
    if model_config is None:
        model_config = _read_model_config(config.worker.actor.model.model_path)
        if model_config is None:
            return
    # The user's override_config wins over the file, as it does when the model is loaded.
    model_config = {**model_config, **config.worker.actor.model.override_config}
    problems = []
    model = config.worker.actor.model.model_path
    data, rollout = config.data, config.worker.rollout
    max_positions = _model_value(model_config, "max_position_embeddings")
    if max_positions is not None:
        total = data.max_prompt_length + data.max_response_length
        if total > max_positions:
            problems.append(
                f"data.max_prompt_length + data.max_response_length = {data.max_prompt_length} + "
                f"{data.max_response_length} = {total} exceeds the model's max_position_embeddings={max_positions} "
                f"({model}); lower the length limits"
            )
        if rollout.max_model_len is not None and rollout.max_model_len > max_positions:
            problems.append(
                f"worker.rollout.max_model_len={rollout.max_model_len} exceeds the model's max_position_embeddings="
                f"{max_positions} ({model}); set max_model_len <= {max_positions} or null"
            )
    heads = _model_value(model_config, "num_attention_heads")
    tp = rollout.tensor_parallel_size
    if rollout.name == "vllm" and heads is not None and tp >= 1 and heads % tp:
        problems.append(
            f"worker.rollout.tensor_parallel_size={tp} does not divide the model's num_attention_heads={heads} "
            f"({model}); use a tensor_parallel_size that divides {heads}"
        )
    if config.worker.actor.model.freeze_vision_tower and "vision_config" not in model_config:
        problems.append(
            f"worker.actor.model.freeze_vision_tower=true but the model ({model}) has no vision tower; set it to false"
        )
    if len(problems) == 1:
        raise ConfigError(problems[0])
    if problems:
        raise ConfigError("configuration does not fit the model:\n" + "\n".join(f"  - {p}" for p in problems))


# ----------------------------------------------------------------------------------------------------------------
# Output


def _plain(value: Any) -> Any:
    """Tuples as lists, recursively, so the result is plain YAML/JSON data."""
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value


def to_dict(config: PPOConfig) -> dict[str, Any]:
    """The config as nested plain dicts and lists (for loggers and JSON)."""
    return _plain(dataclasses.asdict(config))


def to_yaml(config: PPOConfig) -> str:
    """The config as YAML text that :func:`load_config` reads back to an equal config.

    Derived mirror keys are left out: they are recomputed on loading, and leaving them out lets a saved config be
    reused with overrides of the keys they are copied from.
    """
    tree = to_dict(config)
    for derived in _MIRRORS:
        *parents, last = derived.split(".")
        section = tree
        for part in parents:
            section = section[part]
        del section[last]
    return yaml.safe_dump(tree, sort_keys=False, allow_unicode=True)


# Settings this version accepts (so EasyR1 configs load) but does not act on yet, with their neutral values.
_NOT_YET_ACTIVE: dict[str, Any] = {}  # none at present; kept so a newly accepted key can be declared here


def inactive_settings(config: PPOConfig) -> list[str]:
    """Keys set to a value this version accepts but does not act on yet (printed as a warning at start-up)."""
    values = {key: _get_key(config, key) for key in _NOT_YET_ACTIVE}
    return [f"{key}={values[key]}" for key, neutral in _NOT_YET_ACTIVE.items() if values[key] != neutral]
