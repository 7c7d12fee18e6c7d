"""Teacher-forced scoring (`clawrl.model.scoring`) against an independent float64 reference.

The reference runs the tiny model in float64 on the plain prompt + response (no padding, every
position's logits) and reads response token t from the log-softmax at position t - 1. The scoring
code under test works in float32 on left-padded batches with `logits_to_keep`, so agreement to
1e-5 checks the one-token shift, the padding and the top-K selection together.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch
from torch import Tensor
from transformers import AutoModelForCausalLM

from clawrl.model import prefix_attention
from clawrl.model.constraints import unpack_bits
from clawrl.model.prefix_attention import ATTENTION_NAME, TreePass, tree_attention
from clawrl.model.scoring import (
    PrefixNode,
    can_share_prefix,
    flat_tree,
    pack_rows,
    packed_positions,
    prefix_tree,
    response_hidden_states,
    response_logits,
    response_scores,
    score_response,
    token_logprobs,
)
from clawrl.types import ScoredResponse
from tests.helpers import random_ids, random_tree_prompts

torch.set_num_threads(1)

ATOL = 1e-5  # float32 against float64 on the tiny model; wrong positions differ by ~1


@pytest.fixture(scope="module")
def models(tiny_model_dir: Path) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The tiny model in float32 (under test) and in float64 (the reference)."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    return model, AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64).eval()


def all_logprobs(model64: torch.nn.Module, ids: list[int]) -> Tensor:
    """[T, V] float64 log-probs of one unpadded forward pass; row i is the distribution after ids[: i + 1]."""
    with torch.no_grad():
        logits = model64(input_ids=torch.tensor([ids])).logits[0]
    return torch.log_softmax(logits.double(), dim=-1)


def reference(model64: torch.nn.Module, prompt: list[int], response: list[int]) -> Tensor:
    """[R, V]: row t is the distribution that response token t is drawn from (position t - 1)."""
    return all_logprobs(model64, prompt + response)[len(prompt) - 1 : len(prompt) + len(response) - 1]


def chosen(logprobs: Tensor, response: list[int]) -> Tensor:
    return logprobs.gather(-1, torch.tensor(response).unsqueeze(-1)).squeeze(-1)


def test_each_response_token_is_scored_by_the_position_before_it(models: tuple[torch.nn.Module, ...]) -> None:
    model, model64 = models
    prompt, response = random_ids(7, seed=1), random_ids(6, seed=2)
    scored = torch.tensor(score_response(model, prompt, response, top_k=0).logprobs, dtype=torch.float64)
    torch.testing.assert_close(scored, chosen(reference(model64, prompt, response), response), rtol=0, atol=ATOL)
    # Reading token t at its own position instead would be far off: the check above can fail.
    unshifted = all_logprobs(model64, prompt + response)[len(prompt) :]
    assert (scored - chosen(unshifted, response)).abs().max() > 1000 * ATOL


def test_a_left_padded_batch_scores_every_row_as_if_it_were_alone(models: tuple[torch.nn.Module, ...]) -> None:
    model, model64 = models
    prompts = [random_ids(length, seed) for length, seed in ((3, 10), (9, 11), (6, 12), (5, 13))]
    responses = [random_ids(length, seed) for length, seed in ((5, 20), (1, 21), (0, 22), (8, 23))]
    rows = pack_rows(prompts, responses, torch.device("cpu"))
    with torch.no_grad():
        logits = response_logits(model, rows)
    assert logits.dtype == torch.float32 and logits.shape == (4, 8, model.config.vocab_size)
    assert rows.mask.sum(dim=1).tolist() == [len(response) for response in responses]
    assert rows.root.alone.attention_mask[0, :6].tolist() == [0] * 6  # the shortest prompt really is padded
    logprobs = token_logprobs(logits, rows.response_ids)
    for row, (prompt, response) in enumerate(zip(prompts, responses)):
        if not response:
            continue
        batched = logprobs[row, : len(response)]
        expected = chosen(reference(model64, prompt, response), response)
        torch.testing.assert_close(batched.double(), expected, rtol=0, atol=ATOL)
        alone = torch.tensor(score_response(model, prompt, response, top_k=0).logprobs)
        torch.testing.assert_close(batched, alone, rtol=0, atol=ATOL)


def test_top_k_lists_the_most_likely_tokens_best_first(models: tuple[torch.nn.Module, ...]) -> None:
    model, model64 = models
    prompt, response = random_ids(5, seed=30), random_ids(4, seed=31)
    expected = reference(model64, prompt, response)
    scored = score_response(model, prompt, response, top_k=5)
    values, ids = expected.topk(5, dim=-1)
    assert scored.top_token_ids == ids.tolist()
    torch.testing.assert_close(torch.tensor(scored.top_logprobs, dtype=torch.float64), values, rtol=0, atol=ATOL)

    without = score_response(model, prompt, response, top_k=0)
    assert without.logprobs == scored.logprobs
    assert without.top_token_ids == without.top_logprobs == [[], [], [], []]

    vocab = model.config.vocab_size
    everything = score_response(model, prompt, response, top_k=vocab + 100)
    assert [sorted(position) for position in everything.top_token_ids] == [list(range(vocab))] * 4
    total = torch.logsumexp(torch.tensor(everything.top_logprobs, dtype=torch.float64), dim=-1)
    torch.testing.assert_close(total, torch.zeros(4, dtype=torch.float64), rtol=0, atol=ATOL)


def test_an_empty_response_scores_nothing_and_a_response_needs_a_prompt(models: tuple[torch.nn.Module, ...]) -> None:
    model, _ = models
    assert score_response(model, random_ids(4, seed=40), [], top_k=3) == ScoredResponse([], [], [])
    with pytest.raises(ValueError, match="at least one prompt token"):
        score_response(model, [], random_ids(3, seed=41), top_k=0)
    with pytest.raises(ValueError, match="no response token"):
        response_logits(model, pack_rows([random_ids(4, seed=42)], [[]], torch.device("cpu")))


def plain_scores(model: torch.nn.Module, rows, extra_ids: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The same three figures from the full [B, R, V] logits: what `response_scores` must equal."""
    logits = response_logits(model, rows)
    full = torch.log_softmax(logits, dim=-1)
    entropy = -(full.exp() * full).sum(-1)
    return full.gather(-1, rows.response_ids.unsqueeze(-1)).squeeze(-1), entropy, full.gather(-1, extra_ids)


@pytest.mark.parametrize("adapter", [False, True], ids=["full", "lora"])
def test_chunked_scores_and_their_gradients_equal_the_full_logits_ones(tiny_model_dir: Path, adapter: bool) -> None:
    """In float64, chunks of 1, 5 and more positions than the batch has give the full logits' log-probs,
    entropies and top-K log-probs, and the same gradient of a loss over all three."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64)
    if adapter:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False))
    prompts = [random_ids(length, seed) for length, seed in ((3, 30), (9, 31), (6, 32))]
    responses = [random_ids(length, seed) for length, seed in ((5, 40), (1, 41), (7, 42))]
    rows = pack_rows(prompts, responses, torch.device("cpu"))
    extra_ids = torch.randint(0, 2048, (*rows.response_ids.shape, 3), generator=torch.Generator().manual_seed(5))
    mixing = torch.randn(3, *rows.response_ids.shape, generator=torch.Generator().manual_seed(6), dtype=torch.float64)

    def loss_and_grads(figures: tuple[Tensor, Tensor, Tensor]) -> tuple[list[Tensor], list[Tensor]]:
        logprobs, entropy, at_ids = figures
        loss = (mixing[0] * logprobs).sum() + (mixing[1] * entropy).sum() + (mixing[2] * at_ids.sum(-1)).sum()
        trainable = [parameter for parameter in model.parameters() if parameter.requires_grad]
        return [logprobs.detach(), entropy.detach(), at_ids.detach()], list(torch.autograd.grad(loss, trainable))

    expected_values, expected_grads = loss_and_grads(plain_scores(model, rows, extra_ids))
    for chunk_tokens in (1, 5, 1000):
        scores = response_scores(model, rows, extra_ids, chunk_tokens=chunk_tokens)
        values, grads = loss_and_grads((scores.logprobs, scores.entropy, scores.at_ids))
        for got, expected in zip(values + grads, expected_values + expected_grads, strict=True):
            torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)


def test_chunked_scores_need_no_gradient_and_refuse_an_empty_response(models: tuple[torch.nn.Module, ...]) -> None:
    model, _ = models
    rows = pack_rows([random_ids(4, seed=50)], [random_ids(3, seed=51)], torch.device("cpu"))
    with torch.no_grad():
        scores = response_scores(model, rows, chunk_tokens=2)
        torch.testing.assert_close(scores.logprobs, token_logprobs(response_logits(model, rows), rows.response_ids))
    assert scores.at_ids is None and not scores.logprobs.requires_grad
    with pytest.raises(ValueError, match="no response token"):
        response_scores(model, pack_rows([random_ids(4, seed=52)], [[]], torch.device("cpu")))


def tree_depth(node: PrefixNode) -> int:
    return 1 + max((tree_depth(child) for child in node.children), default=0)


@pytest.fixture(params=["one block", "blocks of 3 keys"])
def attention_blocks(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Prefix-tree attention over one block of keys (the tiny prompts fit in one), or over many."""
    if request.param == "blocks of 3 keys":
        monkeypatch.setattr(prefix_attention, "BLOCK_ELEMENTS", 1)
        monkeypatch.setattr(prefix_attention, "MIN_BLOCK_KEYS", 3)


@pytest.mark.parametrize("adapter", [False, True], ids=["full", "lora"])
def test_prefix_trees_give_the_same_scores_and_gradients(
    tiny_model_dir: Path, adapter: bool, float64_norms: None, attention_blocks: None
) -> None:
    """On random prefix trees (a session's turns, a group's equal prompts, rows that share nothing),
    in float64: each shared prefix computed once gives the log-probs, entropies, top-K log-probs
    and every gradient of the rows packed whole, whether the attention takes the keys in one block
    or in many."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64)
    if adapter:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False))
    trainable = [parameter for parameter in model.parameters() if parameter.requires_grad]
    depths = []
    for seed in range(4):
        prompts = random_tree_prompts(seed)
        responses = [random_ids(1 + row % 5, seed * 100 + 50 + row) for row in range(len(prompts))]
        whole = pack_rows(prompts, responses, torch.device("cpu"))
        shared = pack_rows(prompts, responses, torch.device("cpu"), share_prefix=True)
        assert not whole.shares_prefix
        depths.append(tree_depth(shared.root) if shared.shares_prefix else 0)
        generator = torch.Generator().manual_seed(seed)
        extra_ids = torch.randint(0, 2048, (*whole.response_ids.shape, 3), generator=generator)
        # a loss over the real response tokens (what lies past a row's response is padding, never read)
        mixing = torch.randn(3, *whole.response_ids.shape, generator=generator, dtype=torch.float64) * whole.mask

        def figures_and_grads(rows, chunk_tokens: int) -> list[Tensor]:
            scores = response_scores(model, rows, extra_ids, chunk_tokens=chunk_tokens)
            figures = [scores.logprobs, scores.entropy, scores.at_ids.sum(-1)]
            loss = sum((weights * figure).sum() for weights, figure in zip(mixing, figures))
            return [figure.detach()[whole.mask] for figure in figures] + list(torch.autograd.grad(loss, trainable))

        for got, want in zip(figures_and_grads(shared, 4), figures_and_grads(whole, 1000), strict=True):
            torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-11)
    assert max(depths) >= 3  # nodes under nodes, not one common prefix


def test_the_prefix_tree_shares_what_rows_have_in_common_and_leaves_each_a_token() -> None:
    system, history, other = list(range(100, 120)), list(range(200, 220)), list(range(300, 320))
    prompts = [system + history + [1, 2], system + history + [3], system + [4, 5], other + [6], other + [6]]
    root = prefix_tree(prompts)
    assert (root.start, root.end, root.alone) == (0, 0, ())  # nothing is common to all five
    by_members = {child.members: child for child in root.children}
    turns, group = by_members[(2, 1, 0)], by_members[(3, 4)]  # members in their prompts' order
    assert (turns.end, turns.alone) == (20, (2,))  # the system prompt, then the third row goes alone
    assert [(child.start, child.end, child.alone) for child in turns.children] == [(20, 40, (0, 1))]
    assert (group.end, group.alone) == (20, (3, 4))  # equal prompts share all but their last token
    responses = [[9]] * 5
    # each node's tokens once, then the alone rows padded: 20 + 20 + 2*(2+1) + 1*(2+1) + 20 + 2*(1+1)
    assert packed_positions(prompts, responses, root) == 20 + 20 + 6 + 3 + 20 + 4
    assert packed_positions(prompts, responses, flat_tree(5)) == 5 * (42 + 1)
    assert prefix_tree([[1, 2, 3]]).end == 0  # one row: nothing to share
    assert prefix_tree([[1] * 40 + [2], [1] * 40 + [3]], min_shared=50).end == 0  # too little to be worth a pass
    assert not pack_rows([[1, 2, 3], [7, 8]], [[4], [9]], torch.device("cpu"), share_prefix=True).shares_prefix


def test_whole_logits_refuse_shared_rows(models: tuple[torch.nn.Module, ...]) -> None:
    prompts = [list(range(1, 30)) + [40], list(range(1, 30)) + [41]]
    shared = pack_rows(prompts, [[5], [6]], torch.device("cpu"), share_prefix=True)
    assert shared.shares_prefix
    with pytest.raises(ValueError, match="unshared"):
        response_logits(models[0], shared)


def plain_attention(query: Tensor, key: Tensor, value: Tensor, real: Tensor | None, above: list[Tensor]) -> Tensor:
    """The reference: softmax over every ancestor's keys and the pass's own, each row with its own copy of them.

    A query sees every ancestor key, and own key j when j ≤ i and j is real (or j = i: a padding
    position sees itself). [B, L, H, D], as transformers' attention functions return.
    """
    batch, heads, length, _ = query.shape
    groups = heads // key.shape[1]
    keys = torch.cat([tensor.expand(batch, -1, -1, -1) for tensor in above[0::2]] + [key], dim=2)
    values = torch.cat([tensor.expand(batch, -1, -1, -1) for tensor in above[1::2]] + [value], dim=2)
    positions = torch.arange(length)
    own = (positions.unsqueeze(0) <= positions.unsqueeze(1)).expand(batch, -1, -1)
    if real is not None:
        own = own & (real.unsqueeze(1) | torch.eye(length, dtype=torch.bool))
    seen = torch.cat([torch.ones(batch, length, keys.shape[2] - length, dtype=torch.bool), own], dim=-1)
    scores = query @ keys.repeat_interleave(groups, 1).transpose(-1, -2) * query.shape[-1] ** -0.5
    weights = torch.softmax(scores.masked_fill(~seen.unsqueeze(1), float("-inf")), dim=-1)
    return (weights @ values.repeat_interleave(groups, 1)).transpose(1, 2)


@pytest.mark.parametrize(
    ("ancestors", "batch", "length", "padded"),
    [
        ((), 3, 6, True),  # rows that share nothing, padded
        ((9,), 1, 7, False),  # a node under the root
        ((9, 5, 12), 1, 4, False),  # a node three deep
        ((40,), 4, 7, True),  # rows under one prefix, left- and right-padded, of different lengths
        ((7, 3, 20), 2, 9, True),  # rows under a path of three nodes
    ],
)
@pytest.mark.parametrize("block_keys", [3, 128])
def test_tree_attention_is_softmax_attention_over_the_path_and_its_gradient_too(
    ancestors: tuple[int, ...], batch: int, length: int, padded: bool, block_keys: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In float64, the blockwise attention of a pass (its ancestors' keys once for every row, its own
    masked, the blocks merged through their log-sum-exps) equals a softmax over all the keys with a
    copy per row, and so do the gradients of every input, the ancestors' summed over the rows."""
    monkeypatch.setattr(prefix_attention, "BLOCK_ELEMENTS", 1)
    monkeypatch.setattr(prefix_attention, "MIN_BLOCK_KEYS", block_keys)
    generator = torch.Generator().manual_seed(len(ancestors) * 100 + batch * 10 + length)
    kv_heads, groups, dim = 2, 3, 8

    def draw(*shape: int) -> Tensor:
        return torch.randn(*shape, generator=generator, dtype=torch.float64).requires_grad_()

    query, key, value = draw(batch, kv_heads * groups, length, dim), draw(batch, kv_heads, length, dim), draw(batch, kv_heads, length, dim)
    above = [draw(1, kv_heads, count, dim) for count in ancestors for _ in range(2)]
    real = None
    if padded:  # row b: b tokens of left padding, then (b + 1) % 3 of right padding
        real = torch.ones(batch, length, dtype=torch.bool)
        for row in range(batch):
            real[row, :row] = False
            real[row, length - (row + 1) % 3 :] = False
    inputs = [query, key, value, *above]
    tree_pass = TreePass(tuple({0: (keys, values)} for keys, values in zip(above[0::2], above[1::2])), real)
    module = torch.nn.Module()
    module.layer_idx = 0
    got, _ = prefix_attention.tree_attention_forward(module, query, key, value, None, dim**-0.5, tree_pass=tree_pass)
    expected = plain_attention(query, key, value, real, above)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)
    weights = torch.randn(expected.shape, generator=generator, dtype=torch.float64)
    for got_grad, expected_grad in zip(
        torch.autograd.grad((got * weights).sum(), inputs), torch.autograd.grad((expected * weights).sum(), inputs), strict=True
    ):
        torch.testing.assert_close(got_grad, expected_grad, rtol=0, atol=1e-12)
    assert tree_pass.made[0][0] is key  # what a node makes, the passes below it read as they are


def saved_bytes(model: torch.nn.Module, rows) -> int:
    """Bytes autograd keeps for the backward pass of `response_hidden_states` (each storage once)."""
    storages: dict[int, int] = {}

    def pack(tensor: Tensor) -> Tensor:
        storages[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        response_hidden_states(model, rows)
    return sum(storages.values())


def test_a_shared_prefix_is_kept_once_however_many_rows_read_it(models: tuple[torch.nn.Module, ...]) -> None:
    """Six more rows under a 600-token prefix keep their own few tokens' activations for the
    backward pass, not a copy each of the prefix's keys and values (which the rows once read
    through a cache repeated per row)."""
    model = models[0]
    prefix = random_ids(600, seed=60)
    config = model.config
    prefix_keys_values = 600 * config.num_hidden_layers * 2 * config.num_key_value_heads * 32 * 4  # float32, head_dim 32

    def kept(count: int) -> int:
        prompts = [prefix + random_ids(3, seed=61 + row) for row in range(count)]
        rows = pack_rows(prompts, [random_ids(2, seed=70 + row) for row in range(count)], torch.device("cpu"), share_prefix=True)
        return saved_bytes(model, rows)

    per_row = (kept(8) - kept(2)) / 6
    assert per_row < prefix_keys_values / 4, (per_row, prefix_keys_values)


def test_a_model_whose_attention_does_not_dispatch_by_name_cannot_run_a_tree_pass(
    models: tuple[torch.nn.Module, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model that attends its own way would let its rows ignore their prefix: the pass refuses,
    and the model's attention is its own again afterwards."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    model = models[0]
    decoder = model.get_decoder()
    before = decoder.config._attn_implementation
    monkeypatch.setitem(ALL_ATTENTION_FUNCTIONS._global_mapping, ATTENTION_NAME, sdpa_attention_forward)
    tree_pass = TreePass(({},), real=None)
    with pytest.raises(RuntimeError, match="cannot share prompt prefixes"):
        with tree_attention(decoder, tree_pass) as attention:
            decoder(input_ids=torch.tensor([[5, 6, 7]]), position_ids=torch.tensor([[3, 4, 5]]), use_cache=False, **attention)
    assert decoder.config._attn_implementation == before


def test_a_model_with_attention_dropout_cannot_share_prefixes(tiny_model_dir: Path) -> None:
    """The tree's attention has no dropout: such a model trains its rows unshared."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32, attention_dropout=0.1)
    assert not can_share_prefix(model)
    model.config.attention_dropout = 0.0
    assert can_share_prefix(model)


def test_scores_under_a_grammar_are_the_masked_distributions_and_so_are_their_gradients(tiny_model_dir: Path) -> None:
    """In float64: with a grammar's masks, log-probs and entropies are those of the model's distribution
    restricted to the allowed tokens and renormalised, from the full logits masked by hand; their
    gradients too; a position where the grammar allows one token scores 0 with no gradient; and rows
    without a mask score as before."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64)
    prompts = [random_ids(length, seed) for length, seed in ((4, 50), (7, 51))]
    responses = [random_ids(length, seed) for length, seed in ((6, 60), (3, 61))]
    rows = pack_rows(prompts, responses, torch.device("cpu"))
    vocab = model.config.vocab_size
    generator = torch.Generator().manual_seed(7)
    allowed = torch.rand(2, rows.response_ids.shape[1], vocab, generator=generator) < 0.3
    allowed.scatter_(-1, rows.response_ids.unsqueeze(-1), True)  # the sampled token was allowed
    allowed[0, 2] = False
    allowed[0, 2, rows.response_ids[0, 2]] = True  # forced: the only token allowed
    allowed[1] = True  # the second row was not constrained
    words = (allowed.reshape(2, -1, vocab // 32, 32).int() << torch.arange(32, dtype=torch.int32)).sum(-1, dtype=torch.int32)
    assert torch.equal(unpack_bits(words, vocab), allowed)

    logits = response_logits(model, rows)
    masked = torch.log_softmax(logits.masked_fill(~allowed, float("-inf")), dim=-1)
    expected = masked.gather(-1, rows.response_ids.unsqueeze(-1)).squeeze(-1)
    expected_entropy = -(masked.exp() * masked.masked_fill(~allowed, 0.0)).sum(-1)
    mixing = torch.randn(2, *rows.response_ids.shape, generator=generator, dtype=torch.float64) * rows.mask
    trainable = [parameter for parameter in model.parameters() if parameter.requires_grad]
    expected_grads = torch.autograd.grad((mixing[0] * expected).sum() + (mixing[1] * expected_entropy).sum(), trainable)
    for chunk_tokens in (1, 4, 1000):
        scores = response_scores(model, rows, chunk_tokens=chunk_tokens, allowed_bits=words)
        torch.testing.assert_close(scores.logprobs, expected, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(scores.entropy, expected_entropy, rtol=1e-10, atol=1e-12)
        grads = torch.autograd.grad((mixing[0] * scores.logprobs).sum() + (mixing[1] * scores.entropy).sum(), trainable)
        for got, want in zip(grads, expected_grads, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    forced = response_scores(model, rows, allowed_bits=words)
    assert forced.logprobs[0, 2].item() == 0.0 and forced.entropy[0, 2].item() == 0.0
    (gradient,) = torch.autograd.grad(forced.logprobs[0, 2], [model.lm_head.weight], allow_unused=True)
    assert gradient is None or not gradient.any()
    free = response_scores(model, rows)
    torch.testing.assert_close(forced.logprobs[1], free.logprobs[1], rtol=0, atol=0)
    assert (forced.logprobs[0] >= free.logprobs[0] - 1e-12).all()  # a mask only ever raises a kept token's share
    scored = score_response(model, prompts[0], responses[0], top_k=0, allowed_bits=words[0, :6])
    torch.testing.assert_close(torch.tensor(scored.logprobs, dtype=torch.float64), expected[0, :6], rtol=0, atol=1e-12)


def test_a_lazy_grammar_turn_is_replayed_to_the_masks_it_was_sampled_under(tool_model_dir: Path) -> None:
    """A strict tool under `tool_choice` auto (`text_or_calls_grammar`), sampled by the hf engine (the
    tool model, which calls get_weather): the trainer's replay of the grammar over the response ids
    (`allowed_bits`) gives the masks the engine sampled under. Scored under them in float64, the
    chunked scorer equals the full logits masked by hand, and both the log-probs the engine recorded
    (float32); the masks leave free text nearly whole and narrow the call to few tokens, often one."""
    from transformers import AutoTokenizer

    from clawrl.engines.base import SamplingParams
    from clawrl.model.chat import render_prompt
    from clawrl.model.constraints import GrammarVocabulary, allowed_bits, text_or_calls_grammar
    from tests.helpers import WEATHER_QUESTION, running_hf_engine

    tokenizer = AutoTokenizer.from_pretrained(tool_model_dir)
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "required": ["city", "days"],
              "properties": {"city": {"enum": ["Paris", "Lima"]}, "days": {"type": "integer", "minimum": 1, "maximum": 9}}}}}]  # fmt: skip
    grammar = text_or_calls_grammar(tokenizer, tools, {"get_weather"})
    prompt = render_prompt(tokenizer, [{"role": "user", "content": WEATHER_QUESTION}], tools)
    opening = tokenizer.convert_tokens_to_ids("<tool_call>")

    async def sampled() -> list[tuple[int, float]]:
        async with running_hf_engine(tool_model_dir) as engine:
            for seed in range(8):
                sampling = SamplingParams(temperature=1.0, max_tokens=60, seed=seed, grammar=grammar)
                steps = [(step.token_id, step.logprob) async for step in engine.generate(prompt, sampling)]
                if opening in [token_id for token_id, _ in steps]:
                    return steps
        raise AssertionError("the tool model made no call in 8 seeds")

    steps = asyncio.run(sampled())
    response, recorded = [token_id for token_id, _ in steps], torch.tensor([logprob for _, logprob in steps], dtype=torch.float64)
    model64 = AutoModelForCausalLM.from_pretrained(tool_model_dir, dtype=torch.float64).eval()
    vocab = model64.config.vocab_size
    masks = allowed_bits(grammar, GrammarVocabulary.of(tokenizer, vocab), response)
    allowed = unpack_bits(masks, vocab)
    by_hand = torch.log_softmax(reference(model64, prompt, response).masked_fill(~allowed, float("-inf")), dim=-1)
    expected = chosen(by_hand, response)
    rows = pack_rows([prompt], [response], torch.device("cpu"))
    with torch.no_grad():
        scored = response_scores(model64, rows, chunk_tokens=4, allowed_bits=masks.unsqueeze(0)).logprobs[0]
    torch.testing.assert_close(scored, expected, rtol=0, atol=1e-10)
    torch.testing.assert_close(recorded, expected, rtol=0, atol=1e-4)  # the engine's masks were these
    counts = allowed.sum(-1)
    call_starts = response.index(opening)
    assert (counts[: call_starts + 1] > vocab - 100).all()  # free text, up to the marker: nearly whole
    assert (counts[call_starts + 1 :] == 1).any() and (counts[call_starts + 1 :] < 100).all()
    unmasked = chosen(reference(model64, prompt, response), response)
    assert not torch.allclose(expected, unmasked, atol=1e-2)  # the call's masks mattered
