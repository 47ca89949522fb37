"""Mamba4Rec properties: causality, padding invariance, the incremental state, scan choice,
the residual structure and every ablation switch."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from seqrec.batch import PAD_ID, SeqBatch
from seqrec.config import ConfigError, experiment_from_raw
from seqrec.data.idmap import IdMap
from seqrec.models import build_model_config
from seqrec.models.base import with_inference_settings
from seqrec.models.mamba4rec import Mamba4Rec, Mamba4RecConfig
from seqrec.nn import selective_scan as scan_module
from seqrec.serving.predictor import Predictor
from seqrec.training.loop import check_train_config
from tests.tiny import NUM_ITEMS, L, assert_causal

CONFIG = Mamba4RecConfig(
    num_items=NUM_ITEMS, max_seq_len=L, hidden_size=18, state_size=5, conv_kernel=3
)


def build(**changes: object) -> Mamba4Rec:
    torch.manual_seed(0)
    model = Mamba4Rec(dataclasses.replace(CONFIG, **changes)).eval()
    with torch.no_grad():  # the reference init leaves Delta ~ 0.69 and tiny weights: shake them
        for name, p in model.named_parameters():
            if name.endswith("weight") and p.ndim == 2 and "emb" not in name:
                p.normal_(0.0, 0.3)
            if name.endswith("dt_proj.bias"):
                p.normal_(-1.0, 1.0)
    return model


def histories(rows: int, width: int, lengths: list[int], seed: int = 0) -> torch.Tensor:
    """(rows, width) left-padded random histories with the given real lengths."""
    g = torch.Generator().manual_seed(seed)
    items = torch.randint(1, NUM_ITEMS + 1, (rows, width), generator=g)
    real = torch.arange(width) >= (width - torch.tensor(lengths)).unsqueeze(1)
    return torch.where(real, items, PAD_ID)


@pytest.mark.parametrize("scan", ["auto", "fast", "reference"])
def test_causal_future_items_do_not_change_the_past(scan: str) -> None:
    """Every scan: ``auto`` takes the fused CPU block, the others PyTorch's convolution."""
    model = build(num_layers=2, scan=scan)
    assert_causal(lambda ids: model.encode(ids)[0])


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"num_layers": 2},
        {"positional_embedding": True},
        {"scan": "fast", "num_layers": 2},
        {"scan": "reference", "num_layers": 2},
    ],
    ids=str,
)
def test_extra_left_padding_changes_nothing(changes: dict[str, object]) -> None:
    model = build(**changes)
    ids = histories(4, L, [7, 5, 2, 1])
    extra = 40  # more than a segment of the compiled scan, which skips whole padded ones
    wider = F.pad(ids, (extra, 0), value=PAD_ID)
    torch.testing.assert_close(model.score(wider[:, -L:]), model.score(ids))
    hidden, _ = model.encode(ids)
    hidden_wide, _ = model.encode(wider)
    real = ids != PAD_ID
    torch.testing.assert_close(hidden_wide[:, extra:][real], hidden[real])


def test_defaults_are_the_papers() -> None:
    config = Mamba4RecConfig(num_items=5)
    expected = {
        "hidden_size": 64,
        "state_size": 32,  # N
        "conv_kernel": 4,  # K
        "expand": 2,  # E
        "num_layers": 1,
        "dropout": 0.2,  # ML-1M
        "positional_embedding": False,
        "ffn": True,
    }
    assert {key: getattr(config, key) for key in expected} == expected


def test_embeddings_are_layer_normalised_before_the_first_block() -> None:
    model = build(num_layers=2)
    with torch.no_grad():
        model.emb_norm.weight.normal_(1.0, 0.3)  # not the identity's ones and zeros
        model.emb_norm.bias.normal_(0.0, 0.3)
    seen: list[torch.Tensor] = []
    model.layers[0].register_forward_pre_hook(lambda _, args: seen.append(args[0]))
    ids = histories(3, L, [7, 4, 1])
    model.encode(ids)
    real = ids != PAD_ID
    norm = model.emb_norm
    expected = F.layer_norm(model.item_emb(ids), (18,), norm.weight, norm.bias, eps=norm.eps)
    torch.testing.assert_close(seen[0][real], expected[real])


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "modules"])
def test_the_ffn_is_gelu_at_four_times_the_width_then_residual_and_layernorm(
    fused: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    from seqrec.models import mamba4rec

    if not fused:
        monkeypatch.setattr(mamba4rec, "fused_ffn_applies", lambda x: False)
    ffn = build().layers[0].ffn
    assert ffn is not None
    assert ffn.w_1.weight.shape == (4 * 18, 18)
    h = torch.randn(2, 3, 18)
    expected = ffn.norm(ffn.w_2(F.gelu(ffn.w_1(h))) + h)
    torch.testing.assert_close(ffn(h), expected)
    assert not torch.allclose(ffn(h), ffn.norm(ffn.w_2(F.relu(ffn.w_1(h))) + h))


def test_padding_embedding_and_conv_bias_do_not_leak() -> None:
    """Whatever sits in the padding row, scores of real histories do not move."""
    model = build()
    ids = histories(3, L, [6, 3, 1])
    scores = model.score(ids)
    with torch.no_grad():
        model.item_emb.weight[PAD_ID] = torch.randn(CONFIG.hidden_size)
    torch.testing.assert_close(model.score(ids)[:, 1:], scores[:, 1:])


@pytest.mark.parametrize(
    "changes", [{}, {"num_layers": 2}, {"positional_embedding": True}, {"conv_kernel": 1}]
)
def test_incremental_steps_equal_reencoding(changes: dict[str, object]) -> None:
    """init_state on prefixes of different lengths, then one item at a time for everyone."""
    model = build(**changes)
    ids = histories(4, L, [7, 6, 4, 3])
    start = L - 3  # rows keep 4, 3, 1 and 0 prefix items
    state, scores = model.init_state(ids[:, :start])
    torch.testing.assert_close(scores, model.score(ids[:, :start]), rtol=1e-4, atol=1e-5)
    for t in range(start, L):
        state, scores = model.step(state, ids[:, t])
        torch.testing.assert_close(scores, model.score(ids[:, : t + 1]), rtol=1e-4, atol=1e-5)
        again, reencoded = model.init_state(ids[:, : t + 1])
        torch.testing.assert_close(scores, reencoded, rtol=1e-4, atol=1e-5)
        for mine, theirs in zip(state.conv + state.ssm, again.conv + again.ssm, strict=True):
            torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-5)
    assert state.length.tolist() == [7, 6, 4, 3]
    assert len(state.ssm) == model.config.num_layers
    assert state.ssm[0].shape == (4, 2 * CONFIG.hidden_size, CONFIG.state_size)


def test_incremental_state_is_not_truncated() -> None:
    """Past max_seq_len the state keeps everything; score sees only the last max_seq_len."""
    model = build()
    ids = histories(2, 2 * L, [2 * L, L + 3])
    state, _ = model.init_state(ids[:, :-1])
    _, stepped = model.step(state, ids[:, -1])
    _, full = model.init_state(ids)
    assert not torch.allclose(full, model.score(ids))  # score truncates, the state does not
    torch.testing.assert_close(stepped, full, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(model.score(ids), model.score(ids[:, -L:]))


@pytest.mark.parametrize(
    "changes",
    [{}, {"num_layers": 2}, {"ffn": False}, {"positional_embedding": True}, {"conv_kernel": 1}],
    ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()) or "default",
)
def test_compiled_step_equals_the_pytorch_step(changes: dict[str, object]) -> None:
    """scan numba steps with seqrec.nn.step_kernel; scan fast with PyTorch ops (the reference)."""
    compiled, reference = build(**changes, scan="numba"), build(**changes, scan="fast")
    ids = histories(3, L, [L, 4, 1])
    state, _ = compiled.init_state(ids[:, :-1])
    assert compiled._step_compiles(state, ids[:, -1])
    assert not reference._step_compiles(state, ids[:, -1])
    before = [t.clone() for t in state.conv + state.ssm]
    stepped, scores = compiled.step(state, ids[:, -1])
    stepped_ref, scores_ref = reference.step(state, ids[:, -1])
    torch.testing.assert_close(scores, scores_ref, rtol=1e-4, atol=1e-5)
    states, states_ref = stepped.conv + stepped.ssm, stepped_ref.conv + stepped_ref.ssm
    for mine, theirs in zip(states, states_ref, strict=True):
        torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-5)
    assert all(torch.equal(a, b) for a, b in zip(before, state.conv + state.ssm, strict=True))
    assert stepped.length.tolist() == (state.length + 1).tolist()


def test_compiled_step_sees_changed_and_replaced_weights() -> None:
    model, other = build(scan="numba"), build(scan="numba", hidden_size=CONFIG.hidden_size)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(0.1 * torch.randn_like(p))
    ids = histories(2, L, [L, 3])
    state, _ = model.init_state(ids[:, :-1])
    model.step(state, ids[:, -1])  # builds the kernel's cached weights
    with torch.no_grad():  # in place, as an optimizer step or load_state_dict does
        for mine, theirs in zip(model.parameters(), other.parameters(), strict=True):
            mine.copy_(theirs)
    _, scores = model.step(state, ids[:, -1])
    torch.testing.assert_close(scores, other.step(state, ids[:, -1])[1])
    model.load_state_dict(build(scan="numba").state_dict(), assign=True)  # new tensors
    _, scores = model.step(state, ids[:, -1])
    torch.testing.assert_close(
        scores, build(scan="fast").step(state, ids[:, -1])[1], rtol=1e-4, atol=1e-5
    )
    model.train()
    assert not model._step_compiles(state, ids[:, -1])  # dropout is the PyTorch path's business


def test_step_rejects_padding_and_positions_past_the_table() -> None:
    model = build(positional_embedding=True)
    ids = histories(2, L, [L, 2])
    state, _ = model.init_state(ids)
    with pytest.raises(ValueError, match="real item"):
        model.step(state, torch.tensor([3, PAD_ID]))
    with pytest.raises(ValueError, match="positional_embedding covers"):
        model.step(state, torch.tensor([3, 4]))  # row 0 would be item L + 1


def test_last_only_scoring_equals_the_full_encoding(batch: SeqBatch) -> None:
    model = build(num_layers=2)
    hidden, _ = model.encode(batch.input_ids)
    last, _ = model.encode(batch.input_ids, last_only=True)
    assert last.shape == (batch.input_ids.size(0), 1, CONFIG.hidden_size)
    torch.testing.assert_close(last[:, 0], hidden[:, -1])


@pytest.mark.parametrize("scan", ["fast", "numba"])
def test_scan_implementations_agree_on_loss_and_gradients(batch: SeqBatch, scan: str) -> None:
    results = []
    for impl in ("reference", scan):
        model = build(scan=impl, dropout=0.0, num_layers=2)
        loss = model.train()(batch).loss
        loss.backward()
        grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
        results.append((loss, grads, model.eval().score(batch.input_ids)))
    (loss_ref, grads_ref, scores_ref), (loss_other, grads_other, scores_other) = results
    torch.testing.assert_close(loss_other, loss_ref)
    torch.testing.assert_close(scores_other, scores_ref, rtol=1e-4, atol=1e-5)
    assert grads_other.keys() == grads_ref.keys()
    for name, grad in grads_ref.items():
        torch.testing.assert_close(grads_other[name], grad, rtol=1e-4, atol=1e-5, msg=name)


def test_cuda_scan_without_the_kernel_fails_at_construction(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(scan_module, "_mamba_kernel", lambda: None)
    with pytest.raises(ConfigError, match=r"^model\.scan 'cuda': .*pip install 'seqrec\[mamba\]'"):
        build(scan="cuda")
    with pytest.raises(ConfigError, match="scan: 'triton' is not one of"):
        build_model_config({"name": "mamba4rec", "scan": "triton"}, num_items=NUM_ITEMS)


def test_a_scan_for_another_device_is_refused_before_training() -> None:
    """It failed at the first batch, after the data was prepared."""
    with pytest.raises(ConfigError, match="'numba' runs on cpu tensors, and this model is on cuda"):
        dataclasses.replace(CONFIG, scan="numba").check_runnable("cuda")
    config = experiment_from_raw(
        {"model": {"name": "mamba4rec", "scan": "cuda"}, "train": {"device": "cpu"}}
    )
    with pytest.raises(ConfigError, match="'cuda' runs on cuda tensors, and this model is on cpu"):
        check_train_config(config)
    dataclasses.replace(CONFIG, scan="fast").check_runnable("cpu")  # any device
    # served: refused when loaded, not by a RuntimeError (a 500) inside the first request
    id_map = IdMap(users=["u"], items=[str(i) for i in range(1, NUM_ITEMS + 1)])
    numba_model = Mamba4Rec(dataclasses.replace(CONFIG, scan="numba"))
    with pytest.raises(ConfigError, match="'numba' runs on cpu tensors, and this model is on cuda"):
        Predictor(numba_model, id_map, device="cuda")
    predictor = Predictor(numba_model, id_map)
    with pytest.raises(ConfigError, match="model.scan 'cuda'"):  # a 400 when served
        predictor.recommend([["1", "2"]], settings={"scan": "cuda"})


def test_the_scan_is_an_inference_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    """A run trained with the CUDA kernel could not be loaded where it is missing: the scan
    is how the block computes, so evaluate/recommend/serve may choose another."""
    monkeypatch.setattr(scan_module, "_mamba_kernel", lambda: None)
    trained = dataclasses.replace(CONFIG, scan="cuda")  # as config.json holds it
    with pytest.raises(ConfigError, match=r"served here with --set model\.scan=auto"):
        Mamba4Rec(trained)
    here = with_inference_settings(trained, {"scan": "auto"})
    assert here.scan == "auto"
    assert Mamba4Rec(here).config.scan == "auto"
    with pytest.raises(ConfigError, match="needs the mamba-ssm kernel"):  # as a 400, served
        with_inference_settings(CONFIG, {"scan": "cuda"})


def test_one_layer_has_no_residual_around_the_block_two_layers_do() -> None:
    """Silence every Mamba block: with one layer nothing of the history gets through
    (LayerNorm(0) and the PFFN of a constant); with two, the residuals carry it."""
    ids = histories(2, L, [7, 7], seed=1)
    for layers, depends_on_history in ((1, False), (2, True)):
        model = build(num_layers=layers)
        with torch.no_grad():
            for layer in model.layers:
                layer.mamba.out_proj.weight.zero_()
        scores = model.score(ids)
        assert torch.allclose(scores[0], scores[1]) is not depends_on_history, layers


def test_the_ffn_keeps_its_residual_with_one_layer() -> None:
    """The reference's FeedForward: LayerNorm(Dropout(W2 GELU(W1 h)) + h)."""
    model = build()
    layer = model.layers[0]
    assert layer.ffn is not None
    with torch.no_grad():
        layer.ffn.w_2.weight.zero_()
        layer.ffn.w_2.bias.zero_()
    h = torch.randn(2, 3, CONFIG.hidden_size)
    torch.testing.assert_close(layer.ffn(h), layer.ffn.norm(h))


def test_the_chunked_ffn_equals_the_plain_operations() -> None:
    """float32 CPU runs ``gelu_ffn_residual``; float64 the module's own operations."""
    ffn = build().layers[0].ffn
    assert ffn is not None
    h = torch.randn(2, 5, CONFIG.hidden_size, requires_grad=True)
    fused = ffn.eval()(h)
    (g_fused,) = torch.autograd.grad(fused.square().sum(), h)
    plain = ffn.double()(h.double())
    (g_plain,) = torch.autograd.grad(plain.square().sum(), h)
    torch.testing.assert_close(fused, plain.float(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(g_fused, g_plain.float(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    "changes",
    [
        {"positional_embedding": True},
        {"ffn": False},
        {"num_layers": 3},
        {"expand": 1, "state_size": 1, "conv_kernel": 1},
        {"scan": "reference"},
    ],
    ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()),
)
def test_every_switch_builds_trains_and_scores(changes: dict[str, object], batch: SeqBatch) -> None:
    model = build(**changes).train()
    loss = model(batch).loss
    loss.backward()
    assert torch.isfinite(loss)
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
    scores = model.eval().score(batch.input_ids)
    assert scores.shape == (batch.input_ids.size(0), NUM_ITEMS + 1)


def test_switches_change_the_parameter_set() -> None:
    names = lambda m: {n for n, _ in m.named_parameters()}  # noqa: E731
    assert "pos_emb.weight" not in names(build())
    assert "pos_emb.weight" in names(build(positional_embedding=True))
    assert not any(".ffn." in n for n in names(build(ffn=False)))
    inner = 2 * CONFIG.hidden_size
    block = build().layers[0].mamba
    assert block.A_log.shape == (inner, CONFIG.state_size)
    assert block.dt_proj.in_features == 2  # ceil(18 / 16)
    torch.testing.assert_close(block.A_log.exp()[0], torch.arange(1.0, CONFIG.state_size + 1))


def test_ce_loss_is_softmax_over_the_catalogue_at_real_positions(batch: SeqBatch) -> None:
    model = build()
    hidden, _ = model.encode(batch.input_ids)
    real = batch.labels != PAD_ID
    logits = hidden[real] @ model.item_emb.weight[1:].T  # padding column excluded
    expected = F.cross_entropy(logits, batch.labels[real] - 1)
    torch.testing.assert_close(model(batch).loss, expected)


def test_reference_initialisation() -> None:
    model = Mamba4Rec(CONFIG)
    block = model.layers[0].mamba
    assert (block.dt_proj.bias == 0).all()  # RecBole's init zeroes every Linear bias
    assert (model.item_emb.weight[PAD_ID] == 0).all()
    assert 0.01 < float(model.item_emb.weight[1:].detach().std()) < 0.03
    torch.testing.assert_close(block.D.detach(), torch.ones(2 * CONFIG.hidden_size))


@pytest.mark.gpu
def test_on_cuda_matches_cpu(batch: SeqBatch) -> None:
    """scan auto: the mamba-ssm kernel when installed, the fast path otherwise."""
    cpu = build(dropout=0.0, num_layers=2)
    gpu = Mamba4Rec(cpu.config).cuda().eval()
    gpu.load_state_dict(cpu.state_dict())
    torch.testing.assert_close(
        gpu.score(batch.input_ids.cuda()).cpu(), cpu.score(batch.input_ids), rtol=1e-3, atol=1e-3
    )
    cpu_loss, gpu_loss = cpu.train()(batch).loss, gpu.train()(batch.to("cuda")).loss
    torch.testing.assert_close(gpu_loss.cpu(), cpu_loss, rtol=1e-4, atol=1e-4)
