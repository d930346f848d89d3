"""``worker.actor.use_torch_compile``: compiled log-prob chunks on CUDA only; on CPU one notice, then eager."""

from __future__ import annotations

import logging

import pytest
import torch

from easyr1.algorithms import logits
from easyr1.algorithms.logits import compile_allowed, entropy_from_logits, log_probs_from_logits


@pytest.fixture
def fresh_notice(monkeypatch):
    monkeypatch.setattr(logits, "_CPU_NOTICE_GIVEN", False)


def test_compiling_is_for_cuda_only(fresh_notice):
    assert compile_allowed(True, "cuda") is True
    assert compile_allowed(True, torch.device("cuda", 0)) is True
    assert compile_allowed(False, "cuda") is False
    assert compile_allowed(True, "cpu") is False


def test_cpu_notice_is_given_once_per_process(fresh_notice, caplog):
    with caplog.at_level(logging.WARNING, logger=logits.__name__):
        for _ in range(3):
            compile_allowed(True, "cpu")
        compile_allowed(False, "cpu")
    notices = [record for record in caplog.records if "use_torch_compile" in record.getMessage()]
    assert len(notices) == 1


def test_no_notice_when_not_requested(fresh_notice, caplog):
    with caplog.at_level(logging.WARNING, logger=logits.__name__):
        compile_allowed(False, "cpu")
    assert not caplog.records


def test_eager_chunks_equal_one_piece_reference():
    # the chunked kernels, with a last chunk shorter than the others, against the textbook formulas in float64
    generator = torch.Generator().manual_seed(0)
    scores = torch.randn(3, 7, 50, generator=generator, dtype=torch.float64) * 4
    labels = torch.randint(0, 50, (3, 7), generator=generator)
    reference = torch.log_softmax(scores, dim=-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(log_probs_from_logits(scores, labels, chunk_tokens=4), reference, rtol=0, atol=1e-12)
    probs = torch.softmax(scores, dim=-1)
    entropy = -(probs * torch.log_softmax(scores, dim=-1)).sum(-1)
    torch.testing.assert_close(entropy_from_logits(scores, chunk_tokens=4), entropy, rtol=0, atol=1e-12)
