"""vLLM rollout engine, running in-process on every worker beside the FSDP actor (the hybrid engine).

The engine joins the worker's existing process group (``distributed_executor_backend="external_launcher"``);
with tensor parallelism the ranks of one TP group run one engine together and must be given the same prompts
(the hybrid worker gathers them, ``easyr1.distributed.tensor_parallel``). It gets the *unexpanded* prompt ids
(one image placeholder per image) plus the images, and expands the placeholders itself; the prompt ids it
reports back must equal the expanded ids the actor trains on, which is checked on every call.

On GPU the engine sleeps at level 2 between rollouts: weights and KV cache are freed and the weights' contents
are discarded, so every rollout after a sleep wakes the weights, reloads them from the actor, then wakes the
KV cache (``wake_weights`` -> ``sync_weights`` -> ``wake_kv_cache``).

On CPU, ``sync_weights`` loads through ``vllm_cpu_weight_sync``: the model's own ``load_weights`` into the live
tensors, then vLLM's own GEMM re-packing of each linear layer, the engine vLLM's ``reload_weights`` gives in 0.5-0.7
of its time; anywhere that path does not know (GPU, quantization, LoRA, unknown post-load processing) it is vLLM's
``reload_weights``, decided once at engine build and said in one log line.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import torch

import easyr1.engines.vllm_cpu_weight_sync as vllm_cpu_weight_sync
import easyr1.engines.vllm_dummy_load as vllm_dummy_load
import easyr1.engines.vllm_shm as vllm_shm
from easyr1.algorithms.logits import BANNED_TOKEN_BIAS
from easyr1.engines.base import SamplingSettings, StopRule, is_active, pack_continued, pack_responses, partial_of
from easyr1.engines.registry import EngineSetup, EngineTraits, register_engine
from easyr1.errors import UserError
from easyr1.models.families import family_of
from easyr1.protocol import Batch


def engine_multi_modal_data(multi_modal: dict[str, Any]) -> dict[str, Any]:
    """A dataset row's images and videos as vLLM takes them: videos as (frames, metadata) pairs, because the
    Qwen-VL processors place video tokens in time from the frames' fps and indices (frames are already sampled)."""
    data: dict[str, Any] = {}
    if multi_modal.get("images"):
        data["image"] = multi_modal["images"]
    if multi_modal.get("videos"):
        data["video"] = [
            (
                frames,
                {
                    **metadata,
                    "duration": metadata["total_num_frames"] / metadata["fps"],
                    "video_backend": "opencv",
                    "do_sample_frames": False,
                },
            )
            for frames, metadata in zip(multi_modal["videos"], multi_modal["video_metadata"])
        ]
    return data


def set_cpu_engine_environment(num_threads: int) -> None:
    """Environment vLLM's CPU backend reads at import: in-process engine, no thread pinning. (The KV cache size is
    an engine argument; an exported ``VLLM_CPU_KVCACHE_SPACE`` still overrides it.)"""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    os.environ.setdefault("OMP_NUM_THREADS", str(num_threads))
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")


# vLLM 0.32 sets up two all-reduce paths for every tensor-parallel group besides NCCL, torch symmetric memory and
# FlashInfer's, and ``disable_custom_all_reduce`` switches off neither. Both share GPU memory across processes
# through CUDA IPC, which is what broke the custom all-reduce between Ray actors that each see one GPU; they fall
# back on errors they catch, but a hang is possible. Off until tensor parallelism has run on GPUs: NCCL all-reduces.
IPC_ALL_REDUCE_VARIABLES = ("VLLM_ALLREDUCE_USE_SYMM_MEM", "VLLM_ALLREDUCE_USE_FLASHINFER")


def set_gpu_engine_environment() -> None:
    """Environment vLLM reads at import on GPU: the V1 model runner, the one whose log-probs were checked
    against the actor's (vLLM 0.32 otherwise picks its V2 runner wherever Triton is present), and no CUDA-IPC
    all-reduce for tensor-parallel groups (:data:`IPC_ALL_REDUCE_VARIABLES`). A value exported by the user wins:
    ``VLLM_USE_V2_MODEL_RUNNER=1`` to try V2 anyway, ``VLLM_ALLREDUCE_USE_SYMM_MEM=1`` to try symmetric memory."""
    os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")
    for variable in IPC_ALL_REDUCE_VARIABLES:
        os.environ.setdefault(variable, "0")


# vLLM's CPU attention takes blocks of a multiple of 32 tokens and picks 128. vLLM shares a prompt's whole blocks
# between the requests of its n samples (prefix caching, within one scheduler step too), so with 128 a prompt shorter
# than 128 tokens is prefilled once per sample; with 32 all but its last partial block is prefilled once. That was
# 0.79x the generate time of 4 prompts x 8 samples of 38 tokens at 14.9 M parameters, 0.94x at 0.64 M, with the same
# tokens (bench/README.md).
CPU_BLOCK_SIZE = 32


def cpu_block_size(block_size: int | None) -> int:
    """The engine's KV-cache block size on CPU: ``worker.rollout.block_size``, or :data:`CPU_BLOCK_SIZE` when null;
    a ``UserError`` when vLLM's CPU attention cannot take it (the driver asks before any worker starts)."""
    if block_size is None:
        return CPU_BLOCK_SIZE
    if block_size % CPU_BLOCK_SIZE:
        raise UserError(
            f"worker.rollout.block_size={block_size}: vLLM's CPU attention takes blocks of a multiple of "
            f"{CPU_BLOCK_SIZE} tokens; set it to {CPU_BLOCK_SIZE} or a multiple, or null"
        )
    return block_size


def cpu_kv_cache_bytes(text_config: Any, rows: int, max_model_len: int, dtype: torch.dtype) -> int:
    """KV-cache bytes for ``rows`` sequences of ``max_model_len`` tokens: keys and values of every layer, plus a
    margin for vLLM's block rounding. vLLM-CPU touches its whole cache at start-up (resident memory), so a cache
    sized for the work, not a fixed GiB, is what keeps a small model's worker small."""
    heads = text_config.num_key_value_heads or text_config.num_attention_heads
    head_dim = getattr(text_config, "head_dim", None) or text_config.hidden_size // text_config.num_attention_heads
    per_token = text_config.num_hidden_layers * 2 * heads * head_dim * torch.finfo(dtype).bits // 8
    needed = rows * (max_model_len + 128) * per_token * 5 // 4  # up to one 128-token block more per sequence
    return max(needed, 32 * 2**20)


def sample_groups(prompts: Batch, seeds: list[int]) -> list[tuple[int, int]]:
    """Runs of consecutive rows that are samples of one prompt, as (first row, rows): the same prompt ids, the same
    images (the same objects, or the same ``uid``: the driver's id of a prompt's group of samples), and seeds that
    count up by one from the first row's."""
    ids = prompts["raw_prompt_ids"]
    multi_modal = prompts["multi_modal_data"] if "multi_modal_data" in prompts else None
    uids = prompts["uid"] if "uid" in prompts else None
    groups: list[tuple[int, int]] = []
    for row in range(len(prompts)):
        if groups:
            first, count = groups[-1]
            same_images = multi_modal is None or multi_modal[row] is multi_modal[first]
            same_group = uids is not None and uids[row] == uids[first]
            if (
                seeds[row] == seeds[first] + count
                and (same_images or same_group)
                and list(ids[row]) == list(ids[first])
            ):
                groups[-1] = (first, count + 1)
                continue
        groups.append((row, 1))
    return groups


class VLLMEngine:
    """Generate with ``vllm.LLM``; weights are pushed in from the actor before each rollout."""

    def __init__(
        self,
        model_path: str,
        tokenizer_path: str,
        *,
        dtype: torch.dtype,
        max_model_len: int,
        tensor_parallel_size: int,
        seed: int,
        pad_token_id: int,
        banned_token_ids: list[int],
        limit_images: int = 0,
        gpu_memory_utilization: float = 0.6,
        enforce_eager: bool = False,
        enable_chunked_prefill: bool = False,
        max_num_batched_tokens: int = 8192,
        block_size: int | None = None,
        cpu_kv_cache_bytes: int = 2**30,
        trust_remote_code: bool = False,
        disable_log_stats: bool = True,
        override_config: dict[str, Any] | None = None,
        show_progress: bool = False,
        load_format: str = "auto",
    ) -> None:
        on_gpu = torch.cuda.is_available()
        if on_gpu:
            set_gpu_engine_environment()
        else:
            set_cpu_engine_environment(torch.get_num_threads())
        from vllm import LLM

        extra: dict[str, Any] = {}
        if not on_gpu:
            extra["kv_cache_memory_bytes"] = cpu_kv_cache_bytes
            block_size = cpu_block_size(block_size)
        if block_size:
            extra["block_size"] = block_size
        if limit_images:
            extra["limit_mm_per_prompt"] = {"image": limit_images}
        if override_config:
            # the actor's model.override_config; vLLM updates nested configs (text_config, ...) as the actor does
            extra["hf_overrides"] = dict(override_config)
        self.show_progress = show_progress
        self.shm_tag = None
        if not on_gpu and tensor_parallel_size > 1:
            # unique shared-memory names for this engine (vLLM's own are the same for every run on the machine)
            self.shm_tag = vllm_shm.agree_on_tag()
            os.environ[vllm_shm.TAG_VARIABLE] = self.shm_tag
            extra["worker_cls"] = "easyr1.engines.vllm_cpu_shm_worker.TaggedShmCPUWorker"
        self.dtype = dtype
        from easyr1.models.loading import load_model_config

        # the weights it loads are named as the family's checkpoints name them (Family.checkpoint_name)
        model_config = load_model_config(model_path, trust_remote_code, override_config)
        self.family = family_of(model_config)
        self.load_format = load_format
        if load_format == "dummy":
            reason = vllm_dummy_load.needs_checkpoint(model_path, model_config)
            if reason is None:  # vLLM's dummy load, buffers kept, first sync checked (vllm_dummy_load)
                vllm_dummy_load.register()
                load_format = vllm_dummy_load.LOAD_FORMAT
            else:
                self.load_format = "auto"
                if not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0:
                    print(f"easyr1: vLLM loads the checkpoint at start (not load_format=dummy): {reason}")
        self.llm = LLM(
            model=model_path,
            tokenizer=tokenizer_path,
            dtype=dtype,  # explicit: vLLM would otherwise run an fp32 checkpoint in bf16
            seed=seed,
            tensor_parallel_size=tensor_parallel_size,
            distributed_executor_backend="external_launcher",
            # each Ray actor sees only its own GPU, so the custom all-reduce's peer-to-peer set-up cannot work
            disable_custom_all_reduce=True,
            max_model_len=max_model_len,
            max_num_batched_tokens=max(max_num_batched_tokens, max_model_len),
            enable_chunked_prefill=enable_chunked_prefill,
            gpu_memory_utilization=gpu_memory_utilization,
            enforce_eager=enforce_eager,  # on CPU too: vLLM compiles its CPU model with torch.compile
            enable_sleep_mode=on_gpu,  # the CPU platform refuses sleep mode
            trust_remote_code=trust_remote_code,
            disable_log_stats=disable_log_stats,
            use_tqdm_on_load=False,  # one loading bar per worker is noise
            logprobs_mode="processed_logprobs",  # after temperature, like the actor's logits / temperature
            load_format=load_format,
            **extra,
        )
        if tensor_parallel_size > 1:  # only groups of several ranks share memory
            vllm_shm.release_names(self.shm_tag)
        self.sleep_supported = on_gpu
        # the engine starts awake with the checkpoint's weights, or (dummy load) with random ones the sync replaces
        self.weights_discarded = self.load_format != "auto"
        self.sleeping: set[str] = set()  # what sleep released and no wake has re-allocated yet
        self.reload_reason: str | None = None
        self.stepwise_calls = 0  # numbers the requests of each step-driven call (ids unique per engine)
        self.choose_weight_sync()
        self.pad_token_id = pad_token_id
        self.logit_bias = {token: BANNED_TOKEN_BIAS for token in banned_token_ids} or None
        # placeholder ids vLLM writes where the processor writes others (InternVL's video frames), for the check
        hf_config = self.llm.llm_engine.model_config.hf_config
        token_map = self.family.engine_token_map
        self.engine_token_map = token_map(hf_config, self.llm.get_tokenizer()) if token_map is not None else {}

    def choose_weight_sync(self) -> None:
        """Decide once how :meth:`sync_weights` loads: easyr1's CPU path (``reload_reason`` None) or vLLM's
        ``reload_weights`` (``reload_reason`` says why); one log line says which."""
        self.reload_reason = self.llm.collective_rpc(vllm_cpu_weight_sync.prepare)[0]
        if torch.distributed.is_initialized() and torch.distributed.get_rank() != 0:
            return
        if self.reload_reason is None:
            print(
                f"easyr1: vLLM weight sync: the CPU path ({self.llm.collective_rpc(vllm_cpu_weight_sync.describe)[0]})"
            )
        else:
            print(f"easyr1: vLLM weight sync: vLLM's reload_weights, because of {self.reload_reason}")

    def tensor_parallel_ranks(self) -> list[int]:
        """The world ranks vLLM put in this rank's tensor-parallel group."""
        from vllm.distributed.parallel_state import get_tp_group

        return list(get_tp_group().ranks)

    def generate(
        self, prompts: Batch, sampling: SamplingSettings, seeds: list[int], stop: StopRule | None = None
    ) -> Batch:
        """One response per prompt row, with the sampled tokens' log-probs.

        Consecutive rows of one prompt with consecutive seeds (a prompt's n samples, as the driver repeats them) go
        to vLLM as one request with ``n`` samples: it renders the prompt and its images once instead of n times, and
        gives sample k the seed ``seed + k``, the seed the row has, so the tokens are those of one request per row.
        Rows that continue partial responses, padding rows, or a ``stop`` rule take :meth:`_generate_stepwise`.
        """
        if self.weights_discarded:  # random (dummy load) or freed (level-2 sleep) weights: nothing to sample from
            raise RuntimeError("the vLLM engine holds no weights (dummy load or level-2 sleep): sync_weights first")
        if stop is not None or "partial_ids" in prompts or "active" in prompts:
            return self._generate_stepwise(prompts, sampling, seeds, stop)
        from vllm import SamplingParams

        # vLLM refuses n > 1 for greedy sampling (its samples would be equal anyway)
        groups = [(row, 1) for row in range(len(prompts))] if sampling.greedy else sample_groups(prompts, seeds)
        requests = []
        for row, _ in groups:
            request = {"prompt_token_ids": list(prompts["raw_prompt_ids"][row])}
            multi_modal = prompts["multi_modal_data"][row] if "multi_modal_data" in prompts else None
            if multi_modal:
                request["multi_modal_data"] = engine_multi_modal_data(multi_modal)
            requests.append(request)
        params = [
            SamplingParams(
                n=count,
                temperature=0.0 if sampling.greedy else sampling.temperature,
                top_p=1.0 if sampling.greedy else sampling.top_p,
                top_k=-1 if sampling.greedy else sampling.top_k,
                max_tokens=sampling.max_tokens,
                ignore_eos=sampling.ignore_eos,
                logprobs=0,
                seed=seeds[row],
                detokenize=False,
                logit_bias=self.logit_bias,
            )
            for row, count in groups
        ]
        outputs = self.llm.generate(requests, params, use_tqdm=self.show_progress)
        self._check_prompt_ids(prompts, [output.prompt_token_ids for output in outputs for _ in output.outputs])
        response_ids, response_log_probs = [], []
        for output in outputs:
            for completion in output.outputs:  # in sample order (vLLM orders them by index)
                ids = list(completion.token_ids)
                response_ids.append(ids)
                response_log_probs.append([step[token].logprob for step, token in zip(completion.logprobs, ids)])
        return pack_responses(prompts, response_ids, response_log_probs, sampling.max_tokens, self.pad_token_id)

    def _generate_stepwise(
        self, prompts: Batch, sampling: SamplingSettings, seeds: list[int], stop: StopRule | None
    ) -> Batch:
        """One request per active row, driven engine step by engine step, so that the call can stop early.

        A row continuing a partial response is sent as its prompt followed by the partial tokens (the same images),
        with the rest of the token budget; vLLM prefills it under the current weights. After each engine step the
        rows that finished are counted by group (``uid``); once ``stop.groups`` groups and every ``must_finish`` row
        are finished, the rows still running are aborted and come back with the tokens they have. Every request has
        its own seed, so a row's tokens do not depend on the others'; the stop point is the same on every rank of a
        tensor-parallel group, which add the same requests in the same order.
        """
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        engine = self.llm.llm_engine
        self.stepwise_calls += 1
        uids = [str(uid) for uid in prompts["uid"]] if "uid" in prompts else [str(row) for row in range(len(prompts))]
        must = prompts["must_finish"].tolist() if "must_finish" in prompts else [False] * len(prompts)
        new_ids: list[list[int]] = [[] for _ in range(len(prompts))]
        new_log_probs: list[list[float]] = [[] for _ in range(len(prompts))]
        ended = [False] * len(prompts)
        open_rows: dict[str, int] = {}  # request id -> row, for the requests still running
        running_in_group: dict[str, int] = {}  # uid -> its rows still running
        for row in range(len(prompts)):
            partial_ids, _ = partial_of(prompts, row)
            budget = sampling.max_tokens - len(partial_ids)
            if not is_active(prompts, row) or budget <= 0:
                ended[row] = budget <= 0
                continue
            request = {"prompt_token_ids": list(prompts["raw_prompt_ids"][row]) + partial_ids}
            multi_modal = prompts["multi_modal_data"][row] if "multi_modal_data" in prompts else None
            if multi_modal:
                request["multi_modal_data"] = engine_multi_modal_data(multi_modal)
            params = SamplingParams(
                n=1,
                temperature=0.0 if sampling.greedy else sampling.temperature,
                top_p=1.0 if sampling.greedy else sampling.top_p,
                top_k=-1 if sampling.greedy else sampling.top_k,
                max_tokens=budget,
                ignore_eos=sampling.ignore_eos,
                logprobs=0,
                seed=seeds[row],
                detokenize=False,
                logit_bias=self.logit_bias,
                output_kind=RequestOutputKind.CUMULATIVE,  # the tokens so far of every running request, each step
            )
            request_id = f"easyr1-{self.stepwise_calls}-{row}"
            engine.add_request(request_id, self.llm._preprocess_cmpl_one(request), params)
            open_rows[request_id] = row
            running_in_group[uids[row]] = running_in_group.get(uids[row], 0) + 1
        complete_groups = 0
        must_left = sum(1 for row in open_rows.values() if must[row])
        engine_prompts: dict[int, list[int]] = {}
        while open_rows:
            for output in engine.step():
                row = open_rows.get(output.request_id)
                if row is None:
                    continue
                completion = output.outputs[0]
                new_ids[row] = list(completion.token_ids)
                new_log_probs[row] = [step[token].logprob for step, token in zip(completion.logprobs, new_ids[row])]
                engine_prompts[row] = list(output.prompt_token_ids)
                if output.finished:
                    del open_rows[output.request_id]
                    ended[row] = True
                    must_left -= int(must[row])
                    running_in_group[uids[row]] -= 1
                    complete_groups += int(running_in_group[uids[row]] == 0)
            if stop is not None and complete_groups >= stop.groups and must_left == 0:
                break
        if open_rows:
            engine.abort_request(list(open_rows))
        for row, engine_ids in engine_prompts.items():
            partial_ids, _ = partial_of(prompts, row)
            if engine_ids[len(engine_ids) - len(partial_ids) :] != partial_ids:
                raise RuntimeError(f"row {row}: vLLM's prompt does not end with the partial response it continues")
            self._check_prompt_ids(
                prompts.index([row]), [engine_ids[: len(engine_ids) - len(partial_ids)]], first_row=row
            )
        return pack_continued(prompts, new_ids, new_log_probs, ended, sampling.max_tokens, self.pad_token_id)

    def _check_prompt_ids(self, prompts: Batch, engine_prompt_ids: list[list[int]], first_row: int = 0) -> None:
        """The prompt vLLM sampled from must be the one the actor will score, token for token."""
        for row, engine_ids in enumerate(engine_prompt_ids):
            trainer_ids = prompts["input_ids"][row][prompts["attention_mask"][row].bool()].tolist()
            if self.engine_token_map:
                engine_ids = [self.engine_token_map.get(token, token) for token in engine_ids]
            if list(engine_ids) != trainer_ids:
                raise UserError(
                    f"prompt {first_row + row}: vLLM expanded the prompt to {len(engine_ids)} tokens but the "
                    f"trainer's prompt has {len(trainer_ids)}; the processor's vision-token expansion disagrees with "
                    "vLLM's. Check that data.min_pixels / data.max_pixels match the processor and that images are "
                    "not resized twice."
                )

    def sync_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Reload every weight in place (cast to the engine's dtype, under the checkpoint's names and in its layouts:
        ``Family.engine_weights``), then drop caches computed with the old ones.

        The weights must be awake (:meth:`wake_weights`): writing into a sleeping engine's unmapped memory
        faults, or is overwritten by the stale backup when it wakes.
        """
        cast = (
            (name, tensor.to(self.dtype) if tensor.is_floating_point() else tensor)
            for name, tensor in self.family.engine_weights(named_tensors)
        )
        if self.reload_reason is None:
            self.llm.collective_rpc(vllm_cpu_weight_sync.load, args=(cast,))
        else:
            self.llm.collective_rpc(vllm_dummy_load.reload_weights, args=(cast,))
            # vLLM-CPU's reload leaves mixture-of-experts weights unpacked for its kernel (see the function)
            self.llm.collective_rpc(vllm_cpu_weight_sync.repack_cpu_experts)
        self.llm.reset_prefix_cache()
        self.llm.llm_engine.reset_encoder_cache()  # else the next image request fails with an encoder cache miss
        self.weights_discarded = False

    def sleep(self) -> None:
        """Free weights and KV cache on GPU, discarding the weights (level 2); a no-op on CPU.

        Level 2 keeps no host copy: the actor pushes its weights before every rollout that follows a sleep.
        """
        if self.sleep_supported and not self.sleeping:
            self.llm.sleep(level=2)
            self.sleeping = {"weights", "kv_cache"}
            self.weights_discarded = True

    def wake_weights(self) -> None:
        """Re-allocate the weights' memory, before the weight sync writes into it."""
        self._wake("weights")

    def _wake(self, tag: str) -> None:
        if tag in self.sleeping:  # vLLM warns about waking what is awake (the first rollout)
            torch.cuda.empty_cache()  # hand the allocator's cached blocks back, so vLLM can map its pool
            self.llm.wake_up(tags=[tag])
            self.sleeping.discard(tag)

    def wake_kv_cache(self) -> None:
        """Re-allocate the KV cache, after the weight sync (whose gathered tensors are freed by then)."""
        self._wake("kv_cache")

    def close(self) -> None:
        """Drop the engine and vLLM's parallel state (its groups, and the process group it joined)."""
        from vllm.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel

        del self.llm
        destroy_model_parallel()
        destroy_distributed_environment()


def kv_cache_bytes(config: Any, dtype: torch.dtype) -> int:
    """The CPU engine's KV cache: ``worker.rollout.cpu_kv_cache_gb``, or (null) enough for one engine's share of
    the responses generating at once at ``max_model_len`` (a rollout batch, or partial_rollout's pool; shared by the
    engines: every worker, or a split placement's generators; pooled over a tensor-parallel group)."""
    from easyr1.config.schedule import generating_prompts, generating_workers

    rollout = config.worker.rollout
    if rollout.cpu_kv_cache_gb is not None:
        return int(rollout.cpu_kv_cache_gb * 2**30)
    rows = -(-generating_prompts(config) * rollout.n // generating_workers(config)) * rollout.tensor_parallel_size
    from easyr1.models.loading import load_model_config

    model = config.worker.actor.model
    model_config = load_model_config(model.model_path, model.trust_remote_code, model.override_config)
    text_config = getattr(model_config, "text_config", None) or model_config
    return cpu_kv_cache_bytes(text_config, rows, max_model_len(config), dtype)


def max_model_len(config: Any) -> int:
    """The longest prompt + response the engine handles: ``worker.rollout.max_model_len``, else the two limits."""
    return config.worker.rollout.max_model_len or (config.data.max_prompt_length + config.data.max_response_length)


def check_vllm_settings(config: Any, device: str) -> None:
    """On CPU, the KV-cache block size vLLM's CPU attention can take, for a model with linear-attention layers a
    bf16 engine, and for a mixture-of-experts model an expert width per tensor-parallel rank that vLLM-CPU does not
    pad (a ``UserError`` before any worker starts)."""
    if device == "cpu":
        cpu_block_size(config.worker.rollout.block_size)
        check_cpu_linear_attention_dtype(config)
        check_cpu_moe_tensor_parallel(config)


def check_cpu_linear_attention_dtype(config: Any) -> None:
    """vLLM-CPU's GatedDeltaNet kernel asserts bf16 inputs, at the first real request: a model with linear-attention
    layers (Qwen3.5) and an engine dtype other than bf16 is a ``ConfigError`` here instead."""
    from easyr1.distributed.precision import resolve_precision
    from easyr1.errors import ConfigError
    from easyr1.models.linear_attention import has_linear_attention
    from easyr1.models.loading import load_model_config, resolve_dtype

    model, rollout = config.worker.actor.model, config.worker.rollout
    try:
        model_config = load_model_config(model.model_path, model.trust_remote_code, model.override_config)
    except (OSError, ValueError):
        return  # an unreadable config.json is reported by the checks against the model, before this one
    if not has_linear_attention(model_config):
        return
    # the engine's dtype as the worker resolves it: worker.rollout.dtype, else the actor's compute dtype
    actor_compute = resolve_precision(config.worker.actor.fsdp, "cpu", "actor").compute
    dtype = resolve_dtype(rollout.dtype, "cpu") if rollout.dtype else actor_compute
    if dtype != torch.bfloat16:
        raise ConfigError(
            f"the model ({model.model_path}) has linear-attention layers (model_type={model_config.model_type}), "
            f"which vLLM-CPU runs in bf16 only, but the engine would run in {str(dtype).removeprefix('torch.')}; "
            "set worker.rollout.dtype=bfloat16 (or worker.rollout.name=hf)"
        )


# vLLM-CPU's MoE kernel pads each rank's expert width (moe_intermediate_size / tensor_parallel_size) up to a multiple
# of this (experts/cpu_moe.py: CPUUnquantizedExperts._intermediate_alignment)
CPU_MOE_ALIGNMENT = 32


def check_cpu_moe_tensor_parallel(config: Any) -> None:
    """vLLM-CPU pads a mixture-of-experts layer's per-rank expert width to a multiple of 32 when it builds the engine,
    but its weight reload (every sync: the fast CPU path declines MoE layers) loads the unpadded width into the
    padded kernel tensors and fails ("The size of tensor a (128) must match the size of tensor b (96)", the tiny
    Qwen3-VL-MoE at worker.rollout.tensor_parallel_size=2): a ``ConfigError`` here instead, for a model whose
    width per rank is not a multiple of 32."""
    from easyr1.errors import ConfigError
    from easyr1.models.loading import load_model_config

    model, rollout = config.worker.actor.model, config.worker.rollout
    try:
        model_config = load_model_config(model.model_path, model.trust_remote_code, model.override_config)
    except (OSError, ValueError):
        return  # an unreadable config.json is reported by the checks against the model, before this one
    text_config = getattr(model_config, "text_config", None) or model_config
    width = getattr(text_config, "moe_intermediate_size", None)
    tp = rollout.tensor_parallel_size
    if not width or not getattr(text_config, "num_experts", None) or tp < 1 or (width // tp) % CPU_MOE_ALIGNMENT == 0:
        return
    good = [size for size in range(1, 9) if width % size == 0 and (width // size) % CPU_MOE_ALIGNMENT == 0]
    raise ConfigError(
        f"the model ({model.model_path}) has mixture-of-experts layers of width moe_intermediate_size={width}, "
        f"{width // tp} per rank at worker.rollout.tensor_parallel_size={tp}; vLLM-CPU pads that to a multiple of "
        f"{CPU_MOE_ALIGNMENT} and then cannot reload the weights the actor syncs into it; use a "
        f"tensor_parallel_size of {', '.join(map(str, good)) or 'none here'} (or worker.rollout.name=hf)"
    )


def probe_cpu_vector_isa(config: Any, device: str) -> None:
    """Before the worker loads anything: torch inductor's choice of the CPU's vector instructions, which a compiled
    CPU engine (``enforce_eager=false``) needs when vLLM compiles its model.

    Inductor makes it once per process: it compiles a test kernel for each instruction set the CPU lists and loads
    it in a child Python that maps libtorch (~120 MB resident). Made here, that child runs beside a worker that holds
    only its imports, not beside the actor, the engine's weights and vLLM's compilation: the host-memory peak of a
    run on 0.64 M parameters fell by ~0.1 GB (bench/README.md). The choice is cached for the process, so the compile
    reuses it."""
    if device != "cpu" or config.worker.rollout.enforce_eager:
        return
    from torch._inductor import cpu_vec_isa

    cpu_vec_isa.pick_vec_isa()


@register_engine(
    "vllm",
    EngineTraits(reads_images=True, tensor_parallel=True, check=check_vllm_settings, prepare=probe_cpu_vector_isa),
)
def build_vllm_engine(setup: EngineSetup) -> VLLMEngine:
    """``worker.rollout.name=vllm``: ``vllm.LLM`` in this process, joined to the workers' process group."""
    config = setup.config
    rollout, model = config.worker.rollout, config.worker.actor.model
    return VLLMEngine(
        model.model_path,
        model.tokenizer_path,
        dtype=setup.dtype,
        max_model_len=max_model_len(config),
        tensor_parallel_size=rollout.tensor_parallel_size,
        seed=rollout.seed,
        pad_token_id=setup.pad_token_id,
        banned_token_ids=setup.banned_token_ids,
        limit_images=rollout.limit_images,
        gpu_memory_utilization=rollout.gpu_memory_utilization,
        enforce_eager=rollout.enforce_eager,
        enable_chunked_prefill=rollout.enable_chunked_prefill,
        max_num_batched_tokens=rollout.max_num_batched_tokens,
        block_size=rollout.block_size,
        cpu_kv_cache_bytes=kv_cache_bytes(config, setup.dtype) if setup.device == "cpu" else 0,
        trust_remote_code=rollout.trust_remote_code,
        disable_log_stats=rollout.disable_log_stats,
        override_config=model.override_config,
        show_progress=setup.show_progress,
        # the worker syncs the actor's weights before the first generate (weights_discarded), so by default no
        # checkpoint is read here
        load_format=rollout.load_format,
    )
