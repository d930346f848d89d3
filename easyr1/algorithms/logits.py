"""Token log-probabilities and entropies from model logits, computed in float32 a chunk of tokens at a time.

Logits are the largest tensor of a training step ((B, T, V) with V ~ 150k for Qwen). Upcasting bf16 logits to
float32 all at once, or materialising a full log-softmax, doubles or triples that; these helpers flatten the
leading dimensions (so packed (1, N, V) inputs are chunked too) and process ``chunk_tokens`` positions at a time,
bounding the extra memory by ``chunk_tokens * V`` floats.
"""

from __future__ import annotations

import torch


DEFAULT_CHUNK_TOKENS = 1024


def _compute_dtype(logits: torch.Tensor) -> torch.dtype:
    # Half-precision logits are upcast; float64 stays float64 so that references in tests can be exact.
    return torch.float64 if logits.dtype == torch.float64 else torch.float32


def log_probs_from_logits(
    logits: torch.Tensor, labels: torch.Tensor, chunk_tokens: int = DEFAULT_CHUNK_TOKENS
) -> torch.Tensor:
    """Log-probability of each label token: ``logits[..., label] - logsumexp(logits)``, in float32.

    Args:
        logits: (B, T, V) (or any (..., V)) unnormalised scores of any float dtype.
        labels: (B, T) (the leading dims of ``logits``) token ids in ``[0, V)``.
        chunk_tokens: positions processed at once.

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
    pieces = []
    for start in range(0, flat_logits.shape[0], chunk_tokens):
        rows = flat_logits[start : start + chunk_tokens].to(dtype)
        picked = rows.gather(-1, flat_labels[start : start + chunk_tokens]).squeeze(-1)
        pieces.append(picked - torch.logsumexp(rows, dim=-1))
    if not pieces:
        return logits.new_zeros(labels.shape, dtype=dtype)
    return torch.cat(pieces).reshape(labels.shape)


def entropy_from_logits(logits: torch.Tensor, chunk_tokens: int = DEFAULT_CHUNK_TOKENS) -> torch.Tensor:
    """Entropy of the softmax distribution: ``logsumexp(z) - sum_v softmax(z)_v * z_v``, in float32.

    Stable for large logits (softmax and logsumexp shift by the maximum). Logits must be finite (no ``-inf``
    masking: ``0 * -inf`` is nan).

    Args:
        logits: (..., V) unnormalised scores, e.g. (B, T, V).
        chunk_tokens: positions processed at once.

    Returns:
        (...) float32 (float64 for float64 logits) entropies, differentiable w.r.t. ``logits``.
    """
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    dtype = _compute_dtype(logits)
    flat_logits = logits.reshape(-1, logits.shape[-1])
    pieces = []
    for start in range(0, flat_logits.shape[0], chunk_tokens):
        rows = flat_logits[start : start + chunk_tokens].to(dtype)
        probs = torch.softmax(rows, dim=-1)
        pieces.append(torch.logsumexp(rows, dim=-1) - (probs * rows).sum(dim=-1))
    if not pieces:
        return logits.new_zeros(logits.shape[:-1], dtype=dtype)
    return torch.cat(pieces).reshape(logits.shape[:-1])
