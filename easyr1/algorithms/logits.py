"""Token log-probabilities and entropies from model logits, computed in float32 a chunk of tokens at a time.

Logits are the largest tensor of a training step ((B, T, V) with V ~ 150k for Qwen). Upcasting bf16 logits to
float32 all at once, or materialising a full log-softmax, doubles or triples that; these helpers flatten the
leading dimensions (so packed (1, N, V) inputs are chunked too) and process ``chunk_tokens`` positions at a time,
bounding the extra memory by ``chunk_tokens * V`` floats.

With ``compiled=True`` the per-chunk arithmetic runs through ``torch.compile`` (``worker.actor.use_torch_compile``),
which fuses the upcast, gather and log-sum-exp into a few kernels instead of materialising the float32 chunk; values
equal the eager path up to float32 rounding. :func:`compile_allowed` decides where compiling is worth it: CUDA only.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

import torch


DEFAULT_CHUNK_TOKENS = 1024

logger = logging.getLogger(__name__)


# Vision placeholder tokens are never sampled: a generated ``<|image_pad|>`` would make the next forward see more
# image tokens than images. Rollout engines add this bias to their logits, and so does the actor, so that both
# score the same distribution (vLLM clamps logit biases to [-100, 100]).
BANNED_TOKEN_BIAS = -100.0


def banned_token_bias(vocab_size: int, banned_token_ids: list[int], dtype: torch.dtype) -> torch.Tensor | None:
    """(V,) additive logit bias that rules out ``banned_token_ids`` (``None`` when there are none)."""
    if not banned_token_ids:
        return None
    bias = torch.zeros(vocab_size, dtype=dtype)
    bias[list(banned_token_ids)] = BANNED_TOKEN_BIAS
    return bias


def _compute_dtype(logits: torch.Tensor) -> torch.dtype:
    # Half-precision logits are upcast; float64 stays float64 so that references in tests can be exact.
    return torch.float64 if logits.dtype == torch.float64 else torch.float32


def _chunk_log_probs(rows: torch.Tensor, labels: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(N,) log-probs of ``labels`` (N, 1) under the (N, V) scores ``rows``, computed in ``dtype``."""
    rows = rows.to(dtype)
    return rows.gather(-1, labels).squeeze(-1) - torch.logsumexp(rows, dim=-1)


def _chunk_entropy(rows: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(N,) entropies of the softmax of the (N, V) scores ``rows``, computed in ``dtype``."""
    rows = rows.to(dtype)
    return torch.logsumexp(rows, dim=-1) - (torch.softmax(rows, dim=-1) * rows).sum(dim=-1)


@functools.cache
def _compiled(function: Callable) -> Callable:
    # dynamic shapes: the last chunk and every micro-batch differ in length, which must not recompile each time
    return torch.compile(function, dynamic=True)


def _kernel(function: Callable, compiled: bool) -> Callable:
    return _compiled(function) if compiled else function


_CPU_NOTICE_GIVEN = False


def compile_allowed(requested: bool, device: torch.device | str) -> bool:
    """Whether to compile the log-prob and entropy chunks on ``device`` when ``requested``.

    CUDA only. On CPU compiling needs a C++ toolchain and took 35 s for the first shape plus 5 s for each new one
    (measured on a 2-core machine) with nothing gained at the sizes CPU runs use, so it stays off there, with one
    notice per process.
    """
    global _CPU_NOTICE_GIVEN
    if not requested:
        return False
    if torch.device(device).type == "cuda":
        return True
    if not _CPU_NOTICE_GIVEN:
        logger.warning("worker.actor.use_torch_compile=true has no effect on %s: log-probs run eagerly", device)
        _CPU_NOTICE_GIVEN = True
    return False


def log_probs_from_logits(
    logits: torch.Tensor, labels: torch.Tensor, chunk_tokens: int = DEFAULT_CHUNK_TOKENS, compiled: bool = False
) -> torch.Tensor:
    """Log-probability of each label token: ``logits[..., label] - logsumexp(logits)``, in float32.

    Args:
        logits: (B, T, V) (or any (..., V)) unnormalised scores of any float dtype.
        labels: (B, T) (the leading dims of ``logits``) token ids in ``[0, V)``.
        chunk_tokens: positions processed at once.
        compiled: run each chunk through ``torch.compile`` (see :func:`compile_allowed`).

    Returns:
        (B, T) float32 (float64 for float64 logits) log-probabilities, differentiable w.r.t. ``logits``.
    """
    if logits.shape[:-1] != labels.shape:
        raise ValueError(f"logits {tuple(logits.shape)} and labels {tuple(labels.shape)} disagree on leading dims")
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    dtype = _compute_dtype(logits)
    flat_logits = logits.reshape(-1, logits.shape[-1])
    flat_labels = labels.reshape(-1, 1).long()
    chunk = _kernel(_chunk_log_probs, compiled)
    pieces = []
    for start in range(0, flat_logits.shape[0], chunk_tokens):
        stop = start + chunk_tokens
        pieces.append(chunk(flat_logits[start:stop], flat_labels[start:stop], dtype))
    if not pieces:
        return logits.new_zeros(labels.shape, dtype=dtype)
    return torch.cat(pieces).reshape(labels.shape)


def entropy_from_logits(
    logits: torch.Tensor, chunk_tokens: int = DEFAULT_CHUNK_TOKENS, compiled: bool = False
) -> torch.Tensor:
    """Entropy of the softmax distribution: ``logsumexp(z) - sum_v softmax(z)_v * z_v``, in float32.

    Stable for large logits (softmax and logsumexp shift by the maximum). Logits must be finite (no ``-inf``
    masking: ``0 * -inf`` is nan).

    Args:
        logits: (..., V) unnormalised scores, e.g. (B, T, V).
        chunk_tokens: positions processed at once.
        compiled: run each chunk through ``torch.compile`` (see :func:`compile_allowed`).

    Returns:
        (...) float32 (float64 for float64 logits) entropies, differentiable w.r.t. ``logits``.
    """
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    dtype = _compute_dtype(logits)
    flat_logits = logits.reshape(-1, logits.shape[-1])
    chunk = _kernel(_chunk_entropy, compiled)
    pieces = []
    for start in range(0, flat_logits.shape[0], chunk_tokens):
        pieces.append(chunk(flat_logits[start : start + chunk_tokens], dtype))
    if not pieces:
        return logits.new_zeros(logits.shape[:-1], dtype=dtype)
    return torch.cat(pieces).reshape(logits.shape[:-1])
