"""TIGER and TrieRec: the code trie, the batched constrained beam search against its
per-user reference, TAE only on history tokens, TRE's table indices."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from seqrec.batch import PAD_ID, SeqBatch
from seqrec.config import ConfigError
from seqrec.models import build_model, build_model_config
from seqrec.models.tiger import TIGER, sequential_codes
from seqrec.nn.beam_search import constrained_beam_search
from seqrec.nn.code_trie import CodeTrie
from seqrec.nn.trie_encodings import TrieRelativeBias
from tests.tiny import NUM_ITEMS, tiny_model


def make(name: str = "tiger", **changes: object) -> TIGER:
    model = tiny_model(name, **changes)
    assert isinstance(model, TIGER)
    return model.eval()


def clustered_codes(seed: int = 0) -> torch.Tensor:
    """37 of the 40 paths of the tiny codebooks (4, 5, 2), shuffled: unique, uneven fan-out."""
    generator = torch.Generator().manual_seed(seed)
    all_paths = torch.cartesian_prod(torch.arange(4), torch.arange(5), torch.arange(2))
    chosen = all_paths[torch.randperm(len(all_paths), generator=generator)[:NUM_ITEMS]]
    codes = torch.full((NUM_ITEMS + 1, 3), -1)
    codes[1:] = chosen
    return codes


def histories(seed: int = 1, batch: int = 5, length: int = 7) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, NUM_ITEMS + 1, (batch, length), generator=generator)
    ids[0, :3] = PAD_ID  # a left-padded row
    ids[1, :] = ids[1, 0]  # one item repeated: excluded once, not counted twice
    return ids


# --- the trie ---------------------------------------------------------------------------------


def test_trie_children_follow_the_code_paths() -> None:
    codes = clustered_codes()
    trie = CodeTrie.build(codes)
    for item in range(1, NUM_ITEMS + 1):
        path = codes[item].tolist()
        node = 0
        for level, code in enumerate(path):
            children = trie.children(torch.tensor([node]))[0]
            valid = {c for c in range(trie.vocab_size) if children[c] >= 0}
            expected = {
                p[level] for p in codes[1:].tolist() if p[:level] == path[:level]
            }  # every code that continues this prefix
            assert valid == expected
            node = int(children[code])
        assert int(trie.leaf_item[node]) == item
    assert torch.equal(trie.node_of_path(codes[1:]), trie.item_path[1:, -1])
    assert int(trie.node_of_path(torch.tensor([3, 4, 1]))) in (-1, *trie.item_path[1:, -1].tolist())


def test_trie_rejects_shared_paths() -> None:
    codes = clustered_codes()
    codes[2] = codes[1]
    with pytest.raises(ValueError, match="share a code path"):
        CodeTrie.build(codes)


# --- beam search ------------------------------------------------------------------------------


@pytest.mark.parametrize("exclude_seen", [True, False])
@pytest.mark.parametrize("name", ["tiger", "trierec"])
def test_batched_beam_search_equals_the_per_user_reference(name: str, exclude_seen: bool) -> None:
    torch.manual_seed(0)
    model = make(name)
    model.set_semantic_ids(clustered_codes())
    input_ids = histories()
    users = torch.arange(input_ids.size(0))
    fast = model.recommend(input_ids, k=6, exclude_seen=exclude_seen, users=users)
    slow = model.recommend_reference(input_ids, k=6, exclude_seen=exclude_seen, users=users)
    assert torch.equal(fast, slow)


def test_codes_no_item_uses_at_the_top_of_the_codebooks_change_nothing() -> None:
    """The trie's width was its largest code + 1, the log-probabilities' the largest
    codebook: with the top codes unused (few distinct item embeddings) recommend failed."""
    torch.manual_seed(0)
    model = make(codebook_sizes=(6, 6, 2))
    model.set_semantic_ids(clustered_codes())  # codes below (4, 5, 2): 5 and 4, 5 unused
    input_ids = histories()
    fast = model.recommend(input_ids, k=6)
    assert torch.equal(fast, model.recommend_reference(input_ids, k=6))


@pytest.mark.parametrize("num_users", [0, 2, 100])
def test_a_history_without_a_user_reads_the_mean_trained_user_token(num_users: int) -> None:
    """Not the vocabulary's "unknown user" row, nor buckets no user reaches: training never
    gets to them (num_users 0: the data's count unknown, every bucket)."""
    model = TIGER(dataclasses.replace(make().config, user_buckets=3, num_users=num_users)).eval()
    offset, buckets = model.user_offset, model.config.user_buckets
    reached = min(buckets, num_users) if num_users else buckets
    with torch.no_grad():
        model.embedding.weight[offset : offset + reached] = torch.randn(model.config.hidden_size)
        model.embedding.weight[offset + reached : offset + buckets + 1] = 100.0  # untrained
    input_ids = histories()
    anonymous, _ = model.encode(input_ids)
    known, _ = model.encode(input_ids, users=torch.zeros(input_ids.size(0), dtype=torch.long))
    torch.testing.assert_close(anonymous, known)  # every trained bucket is the same vector


def test_recommendations_are_real_unseen_items_in_the_trie() -> None:
    torch.manual_seed(1)
    model = make(beam_size=4)
    codes = clustered_codes(2)
    model.set_semantic_ids(codes)
    input_ids = histories(seed=3)
    top = model.recommend(input_ids, k=NUM_ITEMS - 8)  # wider than the beam, most of the catalogue
    assert top.shape == (input_ids.size(0), NUM_ITEMS - 8)
    for row, items in zip(input_ids.tolist(), top.tolist(), strict=True):
        assert PAD_ID not in items
        assert len(set(items)) == len(items)
        assert not set(items) & set(row)
    paths = codes[top]  # every item decodes from a path of the trie
    assert torch.equal(model.trie.leaf_item[model.trie.node_of_path(paths)], top)


def test_a_prefix_whose_items_are_all_excluded_takes_no_beam() -> None:
    # Items 1..4 under code 0; the history holds all four, so code 0 must be pruned even
    # though the model prefers it.
    codes = torch.tensor([[-1, -1], [0, 0], [0, 1], [0, 2], [0, 3], [1, 0], [1, 1], [2, 0]])
    trie = CodeTrie.build(codes)

    def step(paths: torch.Tensor) -> torch.Tensor:  # prefers low codes, no ties
        B, b, t = paths.shape
        logits = torch.tensor([[0.0, -2.0, -3.5, -6.0], [0.0, -1.0, -1.5, -4.0]])[t]
        return logits.expand(B, b, 4)

    result = constrained_beam_search(step, trie, 1, 3, exclude=torch.tensor([[1, 2, 3, 4]]))
    assert result.items.tolist() == [[5, 6, 7]]
    kept = constrained_beam_search(step, trie, 1, 3)
    assert kept.items.tolist() == [[1, 2, 3]]


@pytest.mark.parametrize("name", ["tiger", "trierec"])
def test_a_k_beyond_the_catalogue_is_answered_with_k_columns(name: str) -> None:
    """It returned N columns for k > N, which the evaluator and recommend refuse as a wrong
    shape (a scoring model answers such a k)."""
    torch.manual_seed(0)
    model = make(name)
    model.set_semantic_ids(clustered_codes())
    input_ids = histories()
    for recommend in (model.recommend, model.recommend_reference):
        top = recommend(input_ids, k=NUM_ITEMS + 5, exclude_seen=False)
        assert top.shape == (input_ids.size(0), NUM_ITEMS + 5)
        assert sorted(top[0, :NUM_ITEMS].tolist()) == list(range(1, NUM_ITEMS + 1))
        assert (top[:, NUM_ITEMS:] == PAD_ID).all()


def test_too_few_valid_items_end_in_padding() -> None:
    codes = torch.tensor([[-1, -1], [0, 0], [0, 1], [1, 0]])
    trie = CodeTrie.build(codes)

    def step(paths: torch.Tensor) -> torch.Tensor:
        return torch.zeros(*paths.shape[:2], 2)

    result = constrained_beam_search(step, trie, 2, 3, exclude=torch.tensor([[1, 0], [0, 0]]))
    assert sorted(result.items[0].tolist()) == [PAD_ID, 2, 3]
    assert sorted(result.items[1].tolist()) == [1, 2, 3]
    assert torch.isinf(result.scores[0][result.items[0] == PAD_ID]).all()


# --- training ---------------------------------------------------------------------------------


def test_loss_is_the_teacher_forced_code_likelihood() -> None:
    model = make()
    model.set_semantic_ids(clustered_codes())
    input_ids = histories()
    labels = torch.zeros_like(input_ids)
    labels[:, -1] = torch.tensor([3, 9, 11, 20, 37])
    batch = SeqBatch(input_ids=input_ids, labels=labels, users=torch.arange(5))
    loss = model(batch).loss
    # the same number from the decoder's per-level log-probabilities at the true prefixes
    memory, real = model.encode(input_ids, torch.arange(5))
    cross = model.cross_keys(memory)
    codes = model.item_codes[labels[:, -1]]
    total = torch.zeros(5)
    for level in range(3):
        log_probs = model._step_log_probs(codes[:, None, :level], cross, real)[:, 0]
        total -= log_probs.gather(1, codes[:, level : level + 1]).squeeze(1)
    assert loss.item() == pytest.approx(total.mean().item() / 3, rel=1e-5)


def test_set_semantic_ids_checks_shape_codebooks_and_uniqueness() -> None:
    model = make()
    with pytest.raises(ConfigError, match="do not fit"):
        model.set_semantic_ids(torch.zeros(NUM_ITEMS, 3, dtype=torch.long))
    codes = clustered_codes()
    codes[5, 1] = 7  # level 2 has 5 codes
    with pytest.raises(ConfigError, match="outside the codebooks"):
        model.set_semantic_ids(codes)
    codes = clustered_codes()
    codes[4] = codes[3]
    with pytest.raises(ValueError, match="share a code path"):
        model.set_semantic_ids(codes)


def test_codes_travel_with_the_state_dict_and_the_trie_follows() -> None:
    model = make()
    codes = clustered_codes()
    model.set_semantic_ids(codes)
    clone = make()
    assert not torch.equal(clone.item_codes, codes)
    old_trie = clone.trie
    clone.load_state_dict(model.state_dict())
    assert torch.equal(clone.item_codes, codes)
    assert clone.trie is not old_trie
    assert torch.equal(clone.trie.item_path, CodeTrie.build(codes).item_path)


def test_model_without_semantic_ids_says_where_they_come_from() -> None:
    config = build_model_config({"name": "tiger"}, num_items=NUM_ITEMS)
    with pytest.raises(ConfigError, match="tokenizer section"):
        build_model(config)
    assert sequential_codes(5, (2, 3))[1:].tolist() == [[0, 0], [0, 1], [0, 2], [1, 0], [1, 1]]
    with pytest.raises(ConfigError, match="6 code paths for 7 items"):
        sequential_codes(7, (2, 3))


# --- TrieRec's encodings ----------------------------------------------------------------------


def test_tae_changes_only_history_tokens() -> None:
    torch.manual_seed(2)
    model = make("trierec")
    model.set_semantic_ids(clustered_codes())
    inputs: list[torch.Tensor] = []
    model.encoder[0].register_forward_pre_hook(lambda _m, args: inputs.append(args[0]))
    input_ids = histories()
    model.encode(input_ids, torch.arange(5))
    with_tae = inputs.pop()
    model.tae = None
    model.encode(input_ids, torch.arange(5))
    without = inputs.pop()
    changed = (with_tae - without).abs().sum(-1) > 0  # (B, 1 + L*M)
    history = (input_ids != PAD_ID).repeat_interleave(3, dim=1)
    assert not changed[:, 0].any()  # the user token
    assert torch.equal(changed[:, 1:], history)  # every real history token, no padding
    # the decoder never sees TAE: its output does not depend on the module
    assert model.decode.__code__.co_names.count("tae") == 0


def test_tre_indexes_lca_depth_and_the_depths_below_it() -> None:
    tre = TrieRelativeBias(num_levels=3, variant="full")
    # item A = (0, 1, 0), item B = (0, 2, 0): they share the root's child 0 (depth 1)
    codes = torch.tensor([[[0, 1, 0], [0, 2, 0]]])
    index = tre.index(codes, torch.tensor([[True, True]]))[0]  # (6, 6); token (i, l) at i*3+l
    n = 4

    def triple(i: int) -> tuple[int, int, int]:
        return (i // (n * n), i // n % n, i % n)

    assert triple(int(index[2, 5])) == (1, 2, 2)  # A's depth 3 vs B's depth 3: LCA depth 1
    assert triple(int(index[0, 4])) == (1, 0, 1)  # A's depth 1 (the LCA itself) vs B's depth 2
    assert triple(int(index[1, 2])) == (2, 0, 1)  # same item: the shallower token is the LCA
    assert triple(int(index[4, 4])) == (2, 0, 0)
    assert index[2, 5] != index[5, 1]  # asymmetric pairs differ
    no_lca = TrieRelativeBias(3, "no_lca").index(codes, torch.tensor([[True, True]]))[0]
    assert triple(int(no_lca[2, 5])) == (0, 2, 2)
    no_delta = TrieRelativeBias(3, "no_delta").index(codes, torch.tensor([[True, True]]))[0]
    assert triple(int(no_delta[2, 5])) == (1, 0, 0)
    padded = tre.index(codes, torch.tensor([[False, True]]))[0]
    assert (padded[:3] == n**3).all()
    assert (padded[:, :3] == n**3).all()


def test_tre_bias_reaches_every_encoder_layer_once_per_sequence() -> None:
    torch.manual_seed(3)
    model = make("trierec")
    model.set_semantic_ids(clustered_codes())
    assert model.tre is not None
    with torch.no_grad():
        model.tre.table.weight.normal_()
    calls: list[int] = []
    model.tre.register_forward_hook(lambda *_: calls.append(1))
    biases: list[tuple[torch.Tensor, ...]] = []
    for layer in model.encoder:
        layer.register_forward_pre_hook(lambda _m, args: biases.append(args[1]))
    model.encode(histories(), None)
    assert len(calls) == 1
    assert len(biases) == len(model.encoder)
    assert all(b is biases[0] for b in biases)  # the positions, the padding and the TRE
    tokens = 1 + 7 * 3
    assert biases[0][-1].shape == (5, 1, tokens, tokens)  # one scalar per triple, all heads
    assert sum(biases[0]).shape == (5, model.config.num_heads, tokens, tokens)


@pytest.mark.parametrize(
    ("tae", "tre"), [("blocked", "none"), ("prefix", "no_lca"), ("none", "no_delta")]
)
def test_ablation_switches_train(tae: str, tre: str) -> None:
    model = make("trierec", tae=tae, tre=tre).train()
    model.set_semantic_ids(clustered_codes())
    labels = torch.zeros_like(histories())
    labels[:, -1] = 5
    loss = model(SeqBatch(input_ids=histories(), labels=labels)).loss
    loss.backward()
    assert torch.isfinite(loss)
    assert (tae == "none") == (model.tae is None)
    assert dataclasses.asdict(model.config)["tre"] == tre


@pytest.mark.parametrize("variant", ["full", "no_lca", "no_delta"])
def test_tre_bias_is_the_table_at_the_pair_indices(variant: str) -> None:
    torch.manual_seed(4)
    tre = TrieRelativeBias(num_levels=3, variant=variant)  # type: ignore[arg-type]
    with torch.no_grad():
        tre.table.weight.normal_()
    codes = torch.randint(0, 2, (4, 5, 3))  # small codebooks: many shared prefixes
    real = torch.rand(4, 5) > 0.3
    bias = tre(codes, real, prefix_tokens=1)[:, 0]  # (B, 1 + 15, 1 + 15)
    index = tre.index(codes, real)
    weights = tre.table.weight.squeeze(-1)
    assert torch.allclose(bias[:, 1:, 1:], weights[index])
    outside = weights[-1]
    assert torch.allclose(bias[:, 0, :], outside.expand(4, 16))
    assert torch.allclose(bias[:, :, 0], outside.expand(4, 16))


@pytest.mark.parametrize(("buckets", "max_distance"), [(2, 128), (32, 16), (32, 8)])
def test_relative_buckets_that_cannot_be_computed_are_config_errors(
    buckets: int, max_distance: int
) -> None:
    """T5's log buckets divide by log(max_distance / exact): a distance at or inside the
    exact range would make every far bucket NaN or infinite."""
    with pytest.raises(ConfigError, match="relative_max_distance"):
        build_model_config(
            {"name": "tiger", "relative_buckets": buckets, "relative_max_distance": max_distance},
            num_items=NUM_ITEMS,
        )
    build_model_config(
        {"name": "tiger", "relative_buckets": 32, "relative_max_distance": 17}, num_items=NUM_ITEMS
    )
