"""CUDA against CPU for the same weights (skipped without a GPU; run with -m gpu)."""

from __future__ import annotations

import copy

import pytest
import torch

from seqrec.batch import SeqBatch
from seqrec.losses import full_ce_reference, fused_full_ce
from seqrec.models.sasrec import SASRec, SASRecConfig
from tests.tiny import NUM_ITEMS, L


@pytest.mark.gpu
@pytest.mark.parametrize("loss", ["bce", "ce"])
def test_sasrec_on_cuda_matches_cpu(loss: str, batch: SeqBatch) -> None:
    torch.manual_seed(0)
    config = SASRecConfig(
        num_items=NUM_ITEMS, max_seq_len=L, hidden_size=16, loss=loss, dropout=0.0
    )
    cpu = SASRec(config).eval()
    gpu = copy.deepcopy(cpu).cuda()
    torch.testing.assert_close(
        gpu.score(batch.input_ids.cuda()).cpu(), cpu.score(batch.input_ids), atol=1e-4, rtol=1e-4
    )
    cpu_loss, gpu_loss = cpu(batch).loss, gpu(batch.to("cuda")).loss
    cpu_loss.backward()
    gpu_loss.backward()
    torch.testing.assert_close(gpu_loss.cpu(), cpu_loss, atol=1e-4, rtol=1e-4)
    for (name, p_cpu), p_gpu in zip(cpu.named_parameters(), gpu.parameters(), strict=True):
        assert p_cpu.grad is not None, name
        torch.testing.assert_close(p_gpu.grad.cpu(), p_cpu.grad, atol=1e-4, rtol=1e-3, msg=name)  # type: ignore[union-attr]


@pytest.mark.gpu
def test_fused_ce_on_cuda_matches_reference() -> None:
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(513, 24, generator=g).cuda().requires_grad_()
    items = torch.randn(1001, 24, generator=g).cuda().requires_grad_()
    labels = torch.randint(1, 1001, (513,), generator=g).cuda()
    expected = full_ce_reference(hidden, items, labels)
    grads = torch.autograd.grad(expected, (hidden, items))
    fused = fused_full_ce(hidden, items, labels)
    fused_grads = torch.autograd.grad(fused, (hidden, items))
    torch.testing.assert_close(fused, expected, atol=1e-4, rtol=1e-4)
    for a, b in zip(fused_grads, grads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
