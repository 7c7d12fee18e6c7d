"""`update_step` on the real tiny model, with a real PEFT LoRA adapter or full fine-tuning.

What a user would observe: a rewarded response becomes likelier, a punished one less likely, a
teacher that prefers the response pulls it up, micro-batching changes nothing but memory (under
each loss aggregation), the KL
term pulls a drifted policy back to the reference, and top-K distillation moves the policy's
distribution onto the teacher's; one step per batch never clips, several (epochs, mini-batches)
do. Gradients are also checked against an independent computation (one unpadded forward per
sample).
"""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer

from clawrl.config import LossConfig
from clawrl.model.scoring import can_share_prefix
from clawrl.train.policy import enable_activation_checkpointing
from clawrl.train.update import advantages, micro_batches, pack_examples, packed_tokens, split_batch, update_step
from clawrl.types import Sample, TrainingExample
from tests.helpers import random_ids, random_tree_prompts, turn

torch.set_num_threads(1)

CONVERSATIONS = [
    ("Hello there, how are you today?", "I am fine, thanks for asking."),
    ("Write one short line about the sea.", "The sea hums softly at night."),
    ("What is two plus two?", "Four."),
]


def load_policy(model_dir: Path, lora: bool = True) -> torch.nn.Module:
    torch.manual_seed(0)  # the LoRA A matrices are initialised at random
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if lora:
        model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", lora_dropout=0.0))
    return model


def encode(model_dir: Path, user: str, answer: str) -> tuple[list[int], list[int]]:
    """Prompt and response ids as the engine would have them (chat template, then the answer)."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    messages = [{"role": "user", "content": user}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return (
        tokenizer.encode(prompt, add_special_tokens=False),
        tokenizer.encode(answer + "<|im_end|>", add_special_tokens=False),
    )


def logprobs_of(model: torch.nn.Module, prompt: list[int], response: list[int]) -> torch.Tensor:
    """log π(response_t | prompt, response_<t) from one plain, unpadded forward pass."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + response])).logits[0, len(prompt) - 1 : -1]
    return torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(response).unsqueeze(-1)).squeeze(-1)


def training_example(turn_id: str, prompt: list[int], response: list[int], behaviour: list[float], reward: float, **teacher) -> TrainingExample:
    """A ready sample of a turn that produced `response` after `prompt` with `behaviour` log-probs at version 0."""
    answered = turn(turn_id, "s", [], "", prompt_token_ids=prompt, response_token_ids=response, response_logprobs=behaviour)
    return TrainingExample(answered, Sample(turn_id, "ready", "rl", reward, 0, **teacher))


def on_policy_sample(model: torch.nn.Module, model_dir: Path, index: int, reward: float, **teacher) -> TrainingExample:
    """A sample whose behaviour log-probs are the model's own (as if it had just generated it)."""
    prompt, response = encode(model_dir, *CONVERSATIONS[index])
    behaviour = logprobs_of(model, prompt, response).tolist()
    return training_example(f"turn-{index}", prompt, response, behaviour, reward, **teacher)


def train(model: torch.nn.Module, samples: list[TrainingExample], config: LossConfig, steps: int, lr: float = 1e-2, **options):
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    return [update_step(model, optimizer, samples, config, micro_batch_size=2, **options) for _ in range(steps)]


@pytest.mark.parametrize("reward", [1.0, -1.0])
def test_reward_moves_the_response_log_prob_its_way(tiny_model_dir: Path, reward: float) -> None:
    model = load_policy(tiny_model_dir)
    example = on_policy_sample(model, tiny_model_dir, 0, reward)
    before = logprobs_of(model, example.turn.prompt_token_ids, example.turn.response_token_ids).sum().item()
    metrics = train(model, [example], LossConfig(method="rl"), steps=3)
    after = logprobs_of(model, example.turn.prompt_token_ids, example.turn.response_token_ids).sum().item()
    assert (after - before) * reward > 1.0
    first = metrics[0]
    assert first.num_samples == 1 and first.num_tokens == len(example.turn.response_token_ids)
    assert first.mean_reward == reward and first.mean_advantage == pytest.approx(reward)
    assert first.logprob_drift == pytest.approx(0.0, abs=1e-5) and first.mean_is_weight == pytest.approx(1.0, abs=1e-5)
    assert first.grad_norm > 0 and first.tokens_per_s > 0 and first.skipped_step == 0
    assert first.entropy > 0 and first.clip_fraction == 0.0 and first.kl_to_reference == 0.0


@pytest.mark.parametrize("teacher_shift", [0.5, -0.5])
def test_opd_follows_the_teacher(tiny_model_dir: Path, teacher_shift: float) -> None:
    model = load_policy(tiny_model_dir)
    probe = on_policy_sample(model, tiny_model_dir, 1, 0.0)
    teacher = [logprob + teacher_shift for logprob in probe.turn.response_logprobs]
    example = on_policy_sample(model, tiny_model_dir, 1, 0.0, teacher_logprobs=teacher)
    before = logprobs_of(model, example.turn.prompt_token_ids, example.turn.response_token_ids).sum().item()
    metrics = train(model, [example], LossConfig(method="opd"), steps=3)
    after = logprobs_of(model, example.turn.prompt_token_ids, example.turn.response_token_ids).sum().item()
    assert (after - before) * teacher_shift > 1.0
    assert metrics[0].mean_advantage == pytest.approx(teacher_shift, abs=1e-5)
    assert metrics[0].opd_fraction == 1.0


def mixed_samples(model: torch.nn.Module, model_dir: Path) -> list[TrainingExample]:
    """Different lengths, rewards, a teacher, and behaviour log-probs off the current policy."""
    samples = [on_policy_sample(model, model_dir, index, reward) for index, reward in enumerate([1.0, -1.0, 1.0])]
    samples[0].turn.response_logprobs = [logprob - 0.4 for logprob in samples[0].turn.response_logprobs]
    samples[1].turn.response_logprobs = [logprob + 0.3 for logprob in samples[1].turn.response_logprobs]
    samples[2].sample.teacher_logprobs = [logprob + 0.7 for logprob in samples[2].turn.response_logprobs]
    return samples


def sgd_delta(model: torch.nn.Module, samples: list[TrainingExample], config: LossConfig, micro_batch_size: int, **options: Any):
    """Parameter change of one plain SGD step (lr 1, no clipping): minus the gradient."""
    trainable = {name: p for name, p in model.named_parameters() if p.requires_grad}
    before = {name: p.detach().clone() for name, p in trainable.items()}
    update_step(
        model, torch.optim.SGD(trainable.values(), lr=1.0), samples, config,
        micro_batch_size=micro_batch_size, grad_clip=math.inf, **options,
    )
    return {name: trainable[name].detach() - before[name] for name in trainable}


def independent_gradient(model: torch.nn.Module, samples: list[TrainingExample], config: LossConfig) -> dict[str, torch.Tensor]:
    """The gradient written out directly: at ρ = 1 the PPO loss's gradient is −Σ_i Σ_t w_t A_t ∇log π(a_t) / D_i,
    computed here one unpadded example at a time, with D_i = N (token-mean: the batch's token count),
    len_i · B (seq-mean: the mean of each response, then of the B responses) or C · B (constant)."""
    trainable = {name: p for name, p in model.named_parameters() if p.requires_grad}
    total = sum(len(example.turn.response_token_ids) for example in samples)
    divisor = {
        "token-mean": lambda length: total,
        "seq-mean": lambda length: length * len(samples),
        "constant": lambda length: config.loss_agg_tokens * len(samples),
    }[config.loss_agg]
    model.zero_grad()
    for example in samples:
        prompt, response = example.turn.prompt_token_ids, example.turn.response_token_ids
        logits = model(input_ids=torch.tensor([prompt + response])).logits[0, len(prompt) - 1 : -1]
        logprobs = torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(response).unsqueeze(-1)).squeeze(-1)
        old = logprobs.detach()
        weights = torch.exp(old - torch.tensor(example.turn.response_logprobs)).clamp(max=config.is_cap)
        advantage = torch.full_like(old, config.w_rl * example.sample.reward)
        if example.sample.teacher_logprobs is not None:
            teacher = torch.tensor(example.sample.teacher_logprobs)
            advantage += config.w_opd * (teacher - old).clamp(-config.opd_clip, config.opd_clip)
        (-(weights * advantage * logprobs).sum() / divisor(len(response))).backward()
    gradient = {name: p.grad.detach().clone() for name, p in trainable.items()}
    model.zero_grad()
    return gradient


@pytest.mark.parametrize("loss_agg", ["token-mean", "seq-mean", "constant"])
def test_micro_batching_gives_the_gradient_of_one_batch(tiny_model_dir: Path, loss_agg: str) -> None:
    policy = load_policy(tiny_model_dir)
    # A first step so that the LoRA B matrices are non-zero and every adapter weight gets a gradient.
    train(policy, [on_policy_sample(policy, tiny_model_dir, 0, 1.0)], LossConfig(method="rl"), steps=1)
    samples = mixed_samples(policy, tiny_model_dir)
    assert len({len(example.turn.response_token_ids) for example in samples}) == 3  # uneven lengths
    # C = 16: of the order of these responses' lengths, so the gradients are of the same size in every mode
    config = LossConfig(method="combine", loss_agg=loss_agg, loss_agg_tokens=16)
    expected = independent_gradient(policy, samples, config)
    deltas = [sgd_delta(copy.deepcopy(policy), samples, config, size) for size in (3, 2, 1)]
    # micro-batches by a token budget, and the output layer's logits a few positions at a time
    longest = max(len(example.turn.prompt_token_ids) + len(example.turn.response_token_ids) for example in samples)
    deltas += [sgd_delta(copy.deepcopy(policy), samples, config, 3, micro_batch_tokens=budget, logit_chunk_tokens=chunk)
               for budget, chunk in ((2 * longest, 3), (1, 1))]  # fmt: skip
    # the prompts' common prefix (the chat template's opening) computed once
    deltas.append(sgd_delta(copy.deepcopy(policy), samples, config, 3, share_prefix=True))
    for name, gradient in expected.items():
        assert gradient.abs().max() > 0, name
        for delta in deltas:
            torch.testing.assert_close(delta[name], -gradient, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("loss_agg", ["token-mean", "seq-mean", "constant"])
def test_metrics_report_drift_and_importance_weights(tiny_model_dir: Path, loss_agg: str) -> None:
    model = load_policy(tiny_model_dir)
    stale = on_policy_sample(model, tiny_model_dir, 0, 1.0)
    stale.turn.response_logprobs = [logprob - 1.0 for logprob in stale.turn.response_logprobs]  # π_old/π_b = e > cap
    fresh = on_policy_sample(model, tiny_model_dir, 2, -1.0)
    fresh.turn.response_logprobs = [logprob + 0.5 for logprob in fresh.turn.response_logprobs]  # π_old/π_b = e^-0.5
    metrics = train(model, [stale, fresh], LossConfig(method="rl", loss_agg=loss_agg), steps=1)[0]
    n_stale, n_fresh = len(stale.turn.response_token_ids), len(fresh.turn.response_token_ids)
    total = n_stale + n_fresh
    assert n_stale != n_fresh
    # Statistics are means under the loss's weights: over tokens, or over responses under seq-mean
    # (the constant normaliser weighs every token the same, so its means are token means).
    stale_share = 0.5 if loss_agg == "seq-mean" else n_stale / total
    fresh_share = 1 - stale_share
    assert metrics.logprob_drift == pytest.approx(1.0 * stale_share + 0.5 * fresh_share, rel=1e-4)
    assert metrics.mean_is_weight == pytest.approx(2.0 * stale_share + math.exp(-0.5) * fresh_share, rel=1e-4)
    assert metrics.mean_advantage == pytest.approx(stale_share - fresh_share, abs=1e-5)
    assert metrics.mean_reward == 0.0 and metrics.num_tokens == total
    # the loss itself is the optimised value: at ρ = 1 it is −Σ a·w·A, which under `constant` is
    # the token mean scaled by N / (B · C)
    scale = total / (2 * 512) if loss_agg == "constant" else 1.0
    expected_loss = -(2.0 * stale_share - math.exp(-0.5) * fresh_share) * scale
    assert metrics.loss == pytest.approx(expected_loss, rel=1e-4)


def test_a_sample_without_teacher_log_probs_contributes_the_rl_term(tiny_model_dir: Path) -> None:
    model = load_policy(tiny_model_dir)
    with_teacher = on_policy_sample(model, tiny_model_dir, 0, 1.0)
    with_teacher.sample.teacher_logprobs = [logprob + 3.0 for logprob in with_teacher.turn.response_logprobs]  # clipped to +C
    without = on_policy_sample(model, tiny_model_dir, 1, -1.0)
    batch = pack_examples([with_teacher, without], LossConfig(), torch.device("cpu"))
    old = batch.behaviour_logprobs  # on-policy: π_old = π_behaviour
    expected = {"rl": (2.0, -2.0), "opd": (0.5 * 1.0, -2.0), "combine": (2.0 + 0.5, -2.0)}
    for method, (first, second) in expected.items():
        config = LossConfig(method=method, w_rl=2.0, w_opd=0.5)
        values = advantages(pack_examples([with_teacher, without], config, torch.device("cpu")), old, config)
        assert torch.allclose(values[0][batch.mask[0]], torch.tensor(first)), method
        assert torch.allclose(values[1][batch.mask[1]], torch.tensor(second)), method


def test_full_fine_tuning_and_the_kl_pull_to_the_reference(tiny_model_dir: Path) -> None:
    reference = load_policy(tiny_model_dir, lora=False).eval()
    policy = load_policy(tiny_model_dir, lora=False)
    example = on_policy_sample(policy, tiny_model_dir, 0, 1.0)
    start = logprobs_of(policy, example.turn.prompt_token_ids, example.turn.response_token_ids).sum().item()
    train(policy, [example], LossConfig(method="rl"), steps=3, lr=3e-3)  # kl_beta 0: no reference needed
    drifted = logprobs_of(policy, example.turn.prompt_token_ids, example.turn.response_token_ids).sum().item()
    assert drifted - start > 1.0
    with pytest.raises(ValueError, match="reference"):
        train(policy, [example], LossConfig(method="rl", kl_beta=1.0), steps=1)
    neutral = training_example(example.turn.id, example.turn.prompt_token_ids, example.turn.response_token_ids,
                      example.turn.response_logprobs, reward=0.0)  # no reward: only the KL acts
    kl_only = LossConfig(method="rl", kl_beta=1.0)
    metrics = train(policy, [neutral], kl_only, steps=4, lr=3e-3, reference_model=reference)
    pulled = logprobs_of(policy, example.turn.prompt_token_ids, example.turn.response_token_ids).sum().item()
    assert metrics[0].kl_to_reference > 0.05
    assert metrics[-1].kl_to_reference < 0.5 * metrics[0].kl_to_reference
    assert abs(pulled - start) < 0.5 * abs(drifted - start)


def test_lora_reference_is_the_model_without_its_adapter(tiny_model_dir: Path) -> None:
    model = load_policy(tiny_model_dir)
    example = on_policy_sample(model, tiny_model_dir, 1, 1.0)
    metrics = train(model, [example], LossConfig(method="rl", kl_beta=0.1), steps=3)
    assert metrics[0].kl_to_reference == pytest.approx(0.0, abs=1e-6)  # a fresh adapter changes nothing
    assert metrics[-1].kl_to_reference > 1e-3
    with model.disable_adapter():
        base = logprobs_of(model, example.turn.prompt_token_ids, example.turn.response_token_ids)
    assert torch.allclose(base, torch.tensor(example.turn.response_logprobs), atol=1e-5)  # the base never trains


def test_topk_opd_moves_the_policy_onto_the_teacher_distribution(tiny_model_dir: Path) -> None:
    k = 4
    # Full fine-tuning: the teacher's top 4 are random ids at every position, far from anything
    # the random tiny model predicts, and a LoRA adapter on it moves the output layer too slowly.
    model = load_policy(tiny_model_dir, lora=False)
    example = on_policy_sample(model, tiny_model_dir, 2, 0.0)
    generator = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    ids = [torch.randperm(vocab, generator=generator)[:k].tolist() for _ in example.turn.response_token_ids]
    example.sample.teacher_topk_ids = ids
    example.sample.teacher_topk_logprobs = [[math.log(0.9 / k)] * k for _ in ids]  # 90% on its top 4, 10% tail

    def teacher_mass() -> float:
        prompt, response = example.turn.prompt_token_ids, example.turn.response_token_ids
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([prompt + response])).logits[0, len(prompt) - 1 : -1]
        return torch.softmax(logits, -1).gather(-1, torch.tensor(ids)).sum(-1).mean().item()

    before = teacher_mass()
    metrics = train(model, [example], LossConfig(method="opd", opd_topk=k), steps=10)
    assert before < 0.05
    assert teacher_mass() > 0.3
    assert metrics[-1].topk_reverse_kl < 0.5 * metrics[0].topk_reverse_kl
    assert metrics[0].mean_advantage == 0.0  # the top-K term replaces the token-level OPD advantage


def test_entropy_bonus_broadens_a_sharpened_policy(tiny_model_dir: Path) -> None:
    # Full fine-tuning: the random tiny model is near-uniform, and only full weights move it fast.
    model = load_policy(tiny_model_dir, lora=False)
    example = on_policy_sample(model, tiny_model_dir, 0, 1.0)

    def entropy() -> float:
        prompt, response = example.turn.prompt_token_ids, example.turn.response_token_ids
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([prompt + response])).logits[0, len(prompt) - 1 : -1]
        return torch.distributions.Categorical(logits=logits).entropy().mean().item()

    start = entropy()
    train(model, [example], LossConfig(method="rl"), steps=4)  # reward +1 sharpens the policy
    sharpened = entropy()
    example.sample.reward = 0.0  # now only the bonus acts
    metrics = train(model, [example], LossConfig(method="rl", entropy_coef=1.0), steps=4)
    assert sharpened < start - 0.3
    assert entropy() > sharpened + 0.3
    assert metrics[-1].entropy > metrics[0].entropy


def test_bfloat16_weights_train_in_float32_loss_math(tiny_model_dir: Path) -> None:
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.bfloat16)
    model = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", lora_dropout=0.0))
    example = on_policy_sample(model, tiny_model_dir, 0, 1.0)
    example.sample.teacher_logprobs = [logprob + 0.3 for logprob in example.turn.response_logprobs]
    before = logprobs_of(model, example.turn.prompt_token_ids, example.turn.response_token_ids).sum().item()
    metrics = train(model, [example], LossConfig(kl_beta=0.1, entropy_coef=0.01), steps=3)
    after = logprobs_of(model, example.turn.prompt_token_ids, example.turn.response_token_ids).sum().item()
    assert after > before + 1.0
    assert all(math.isfinite(value) for value in (metrics[-1].loss, metrics[-1].grad_norm, metrics[-1].kl_to_reference))


def test_nothing_to_train_leaves_the_weights_alone(tiny_model_dir: Path) -> None:
    model = load_policy(tiny_model_dir)
    before = [p.detach().clone() for p in model.parameters()]
    prompt, _ = encode(tiny_model_dir, *CONVERSATIONS[0])
    empty = training_example("empty", prompt, [], [], reward=1.0)
    for samples in ([], [empty]):
        metrics = train(model, samples, LossConfig(), steps=1)[0]
        assert metrics.num_tokens == 0 and metrics.loss == 0.0
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_update_is_deterministic(tiny_model_dir: Path) -> None:
    results = []
    for _ in range(2):
        model = load_policy(tiny_model_dir)
        metrics = train(model, mixed_samples(model, tiny_model_dir), LossConfig(), steps=2)
        results.append(([p.detach().clone() for p in model.parameters() if p.requires_grad], metrics))
    assert all(torch.equal(a, b) for a, b in zip(results[0][0], results[1][0]))
    assert [m.loss for m in results[0][1]] == [m.loss for m in results[1][1]]


def test_mismatched_lengths_are_refused(tiny_model_dir: Path) -> None:
    prompt, response = encode(tiny_model_dir, *CONVERSATIONS[0])
    broken = training_example("broken", prompt, response, [0.0] * (len(response) - 1), reward=1.0)
    with pytest.raises(ValueError, match="behaviour log-probs"):
        pack_examples([broken], LossConfig(), torch.device("cpu"))


def test_micro_batches_keep_to_a_token_budget(tiny_model_dir: Path) -> None:
    policy = load_policy(tiny_model_dir)
    samples = mixed_samples(policy, tiny_model_dir) + [on_policy_sample(policy, tiny_model_dir, 0, -1.0)]

    def packed(chunk: list[TrainingExample]) -> int:
        return len(chunk) * (max(len(e.turn.prompt_token_ids) for e in chunk) + max(len(e.turn.response_token_ids) for e in chunk))

    longest = max(packed([example]) for example in samples)
    for budget in (1, longest, 2 * longest, 10 * longest):
        chunks = list(micro_batches(samples, 3, budget))
        assert sorted(id(e) for chunk in chunks for e in chunk) == sorted(id(e) for e in samples)  # each once
        assert all(len(chunk) <= 3 and (len(chunk) == 1 or packed(chunk) <= budget) for chunk in chunks)
    assert [len(chunk) for chunk in micro_batches(samples, 3, 1)] == [1, 1, 1, 1]  # every sample alone, none lost
    assert [len(chunk) for chunk in micro_batches(samples, 3, 10 * longest)] == [3, 1]  # the count still applies


def test_micro_batches_put_examples_that_share_a_prefix_together(tiny_model_dir: Path) -> None:
    """Ordered by length alone, two sessions' turns interleave; by their first tokens, each session's
    turns are one micro-batch, whose packed size counts the shared prefix once."""
    system_a, system_b = list(range(100, 180)), list(range(300, 380))
    examples = [training_example(f"{name}{index}", system + [7] * (index + 1), [5, 6], [-1.0, -1.0], 1.0)
                for index in range(2) for name, system in (("a", system_a), ("b", system_b))]  # fmt: skip
    by_length = [[example.turn.id for example in chunk] for chunk in micro_batches(examples, 2)]
    assert by_length == [["a0", "b0"], ["a1", "b1"]]
    shared = [[example.turn.id for example in chunk] for chunk in micro_batches(examples, 2, share_prefix=True)]
    assert sorted(shared) == [["a0", "a1"], ["b0", "b1"]]
    assert packed_tokens(examples[::2], share_prefix=True) == 80 + 2 * (2 + 2)  # the prefix once, then each row's rest
    assert packed_tokens(examples[::2], share_prefix=False) == 2 * (82 + 2)
    # with a budget that only sharing meets, the session's turns still share one forward pass
    assert [len(chunk) for chunk in micro_batches(examples, 2, max_tokens=90, share_prefix=True)] == [2, 2]


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_prefix_trees_give_the_step_of_unshared_samples(tiny_model_dir: Path, lora: bool, float64_norms: None) -> None:
    """A batch of random prefix trees (a session's turns, a group's equal prompts, rows that share
    nothing), each sample with its own reward, behaviour log-probs and teacher (token log-probs or
    top-K) and the KL pull to the reference: in float64, training with every shared prefix computed
    once takes the step that training the samples unshared takes."""
    torch.manual_seed(0)
    policy = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64)
    reference = None
    if lora:
        policy = get_peft_model(policy, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False))
    else:
        reference = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64).eval()
        with torch.no_grad():  # a policy that has drifted from its reference, so the KL term has a gradient
            for parameter in policy.parameters():
                parameter.add_(0.02 * torch.randn_like(parameter))
    k, generator = 3, torch.Generator().manual_seed(1)
    examples = []
    for row, prompt in enumerate(random_tree_prompts(seed=7, rows=8)):
        response = random_ids(2 + row % 4, seed=500 + row)
        behaviour = (-3.0 + torch.rand(len(response), generator=generator)).tolist()
        teacher: dict[str, Any] = {}
        if row % 3 == 1:
            teacher["teacher_logprobs"] = [logprob + 0.5 for logprob in behaviour]
        elif row % 3 == 2:
            teacher["teacher_topk_ids"] = torch.randint(0, 2048, (len(response), k), generator=generator).tolist()
            teacher["teacher_topk_logprobs"] = [[math.log(0.3)] * k for _ in response]
        examples.append(training_example(f"t{row}", prompt, response, behaviour, 1.0 if row % 2 else -1.0, **teacher))
    config = LossConfig(method="combine", kl_beta=0.5, entropy_coef=0.01, opd_topk=k)
    assert can_share_prefix(policy) and pack_examples(examples, config, torch.device("cpu"), share_prefix=True).rows.shares_prefix
    trainable = [parameter for parameter in policy.parameters() if parameter.requires_grad]
    steps = {}
    for share in (False, True):
        model = copy.deepcopy(policy)
        steps[share] = sgd_delta(model, examples, config, micro_batch_size=8, share_prefix=share, reference_model=reference)
    assert len(steps[True]) == len(trainable)
    for name, delta in steps[False].items():
        assert delta.abs().max() > 0, name
        torch.testing.assert_close(steps[True][name], delta, rtol=1e-9, atol=1e-12)


def test_activation_checkpointing_takes_the_same_step_without_sharing(tiny_model_dir: Path) -> None:
    """Checkpointed layers recompute in the backward pass, after a prefix tree's attention was
    switched back to the model's own, so a model trained that way trains its samples unshared: the
    same step."""
    policy = load_policy(tiny_model_dir)
    train(policy, [on_policy_sample(policy, tiny_model_dir, 0, 1.0)], LossConfig(method="rl"), steps=1)
    prefix = random_ids(40, seed=9)
    examples = [training_example(f"t{row}", prefix + random_ids(3, seed=row), random_ids(4, seed=20 + row), [-2.0] * 4,
                                 1.0 if row % 2 else -1.0) for row in range(4)]  # fmt: skip
    config = LossConfig(method="rl")
    expected = sgd_delta(copy.deepcopy(policy), examples, config, 4, share_prefix=True)
    checkpointed = copy.deepcopy(policy)
    enable_activation_checkpointing(checkpointed.base_model.model)
    assert can_share_prefix(policy) and not can_share_prefix(checkpointed)
    for name, delta in sgd_delta(checkpointed, examples, config, 4, share_prefix=True).items():
        torch.testing.assert_close(delta, expected[name], rtol=1e-4, atol=1e-7)


class RecordingSGD(torch.optim.SGD):
    """Plain SGD that keeps a copy of the trainable weights after each of its steps."""

    def __init__(self, model: torch.nn.Module, lr: float) -> None:
        self.named = {name: p for name, p in model.named_parameters() if p.requires_grad}
        super().__init__(self.named.values(), lr=lr)
        self.after: list[dict[str, torch.Tensor]] = []

    def step(self, closure: Any = None) -> Any:
        loss = super().step(closure)
        self.after.append({name: p.detach().clone() for name, p in self.named.items()})
        return loss


def test_one_step_never_clips_and_a_second_epoch_does(tiny_model_dir: Path) -> None:
    """One step per batch (the default) takes π_old from its own forward pass: ρ = 1, so clip
    fraction and KL read 0 and the ε's change nothing, bit for bit. With two epochs π_old is held
    from before the first step, so the second step's ratios have moved: the metrics read the clip
    and the KL, and the ε's change the weights."""
    policy = load_policy(tiny_model_dir)
    samples = mixed_samples(policy, tiny_model_dir)
    wide = {"eps_low": 0.99, "eps_high": 100.0}  # a clip that no ratio here reaches

    def run(config: LossConfig, **options: Any) -> tuple[Any, list[torch.Tensor]]:
        model = copy.deepcopy(policy)
        metrics = train(model, samples, config, steps=1, **options)[0]
        return metrics, [p.detach().clone() for p in model.parameters() if p.requires_grad]

    default, default_weights = run(LossConfig())
    for config, options in ((LossConfig(), {"ppo_epochs": 1, "mini_batches": 1}), (LossConfig(**wide), {})):
        metrics, weights = run(config, **options)
        assert all(torch.equal(a, b) for a, b in zip(default_weights, weights))
        assert metrics.loss == default.loss and metrics.grad_norm == default.grad_norm
    assert default.clip_fraction == 0.0 and default.approx_kl == 0.0 and default.optimizer_steps == 1
    two, two_weights = run(LossConfig(), ppo_epochs=2)
    two_wide, two_wide_weights = run(LossConfig(**wide), ppo_epochs=2)
    # means over the two steps, the first at ρ = 1: the second step's own figures are twice these
    assert two.optimizer_steps == 2 and two.skipped_step == 0
    assert two.clip_fraction > 0.05 and two.approx_kl > 1e-3
    assert two_wide.clip_fraction == 0.0 and two_wide.approx_kl > 1e-3
    assert max((a - b).abs().max().item() for a, b in zip(two_weights, two_wide_weights)) > 1e-4  # the clip acted


def test_the_first_of_several_steps_is_the_single_step(tiny_model_dir: Path) -> None:
    """π_old (and π_ref) computed in the pass before the first step are what that step's own
    forward pass gives, so the first of two epochs takes the default step; the second, from π_old
    held, takes another."""
    policy = load_policy(tiny_model_dir)
    train(policy, [on_policy_sample(policy, tiny_model_dir, 0, 1.0)], LossConfig(method="rl"), steps=1)
    samples = mixed_samples(policy, tiny_model_dir)
    config = LossConfig(kl_beta=0.5)  # a drifted adapter: the KL term has a gradient too
    optimizers = {}
    for epochs in (1, 2):
        model = copy.deepcopy(policy)
        optimizers[epochs] = RecordingSGD(model, lr=1.0)
        update_step(model, optimizers[epochs], samples, config, micro_batch_size=2, grad_clip=math.inf,
                    ppo_epochs=epochs)
    assert len(optimizers[1].after) == 1 and len(optimizers[2].after) == 2
    for name, weight in optimizers[1].after[0].items():
        torch.testing.assert_close(optimizers[2].after[0][name], weight, rtol=1e-6, atol=1e-9)
    second = optimizers[2].after[1]
    assert any(not torch.allclose(second[name], weight) for name, weight in optimizers[1].after[0].items())


@pytest.mark.parametrize("loss_agg", ["token-mean", "seq-mean", "constant"])
def test_each_mini_batch_steps_as_a_batch_of_its_own(tiny_model_dir: Path, loss_agg: str) -> None:
    """Two mini-batches: the batch's halves in its order, one step each; the first step is the
    gradient of the first half's loss weighted as a batch of its own, and the second half's
    ratios have moved by then."""
    policy = load_policy(tiny_model_dir)
    train(policy, [on_policy_sample(policy, tiny_model_dir, 0, 1.0)], LossConfig(method="rl"), steps=1)
    samples = mixed_samples(policy, tiny_model_dir) + [on_policy_sample(policy, tiny_model_dir, 0, -1.0)]
    first, second = split_batch(samples, 2)
    assert first == samples[:2] and second == samples[2:]
    assert [len(part) for part in split_batch(samples, 3)] == [2, 1, 1] and len(split_batch(samples, 9)) == 4
    config = LossConfig(method="combine", loss_agg=loss_agg, loss_agg_tokens=16)
    model = copy.deepcopy(policy)
    optimizer = RecordingSGD(model, lr=1.0)
    metrics = update_step(model, optimizer, samples, config, micro_batch_size=1, grad_clip=math.inf, mini_batches=2)
    assert metrics.optimizer_steps == 2 and metrics.approx_kl > 0
    before = {name: p.detach() for name, p in policy.named_parameters() if p.requires_grad}
    for name, gradient in independent_gradient(policy, first, config).items():
        assert gradient.abs().max() > 0, name
        torch.testing.assert_close(optimizer.after[0][name] - before[name], -gradient, rtol=1e-4, atol=1e-7)


def test_a_response_decoded_under_a_grammar_is_trained_under_its_masks(tiny_model_dir: Path) -> None:
    """The behaviour log-probs of a constrained turn are the masked distribution's; scored under the same
    masks the drift is 0 and the importance weights 1 (unmasked they would not be), and a position the
    grammar forced moves nothing."""
    model = load_policy(tiny_model_dir)
    prompt, response = encode(tiny_model_dir, *CONVERSATIONS[1])
    vocab = model.config.vocab_size
    allowed = torch.rand(len(response), vocab, generator=torch.Generator().manual_seed(3)) < 0.2
    allowed[torch.arange(len(response)), torch.tensor(response)] = True
    words = (allowed.reshape(len(response), vocab // 32, 32).int() << torch.arange(32, dtype=torch.int32)).sum(-1, dtype=torch.int32)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + response])).logits[0, len(prompt) - 1 : -1].float()
    masked = torch.log_softmax(logits.masked_fill(~allowed, float("-inf")), -1).gather(-1, torch.tensor(response)[:, None])[:, 0]
    constrained = training_example("turn-g", prompt, response, masked.tolist(), 1.0)
    constrained.allowed_bits = words
    (metrics,) = train(model, [constrained], LossConfig(method="rl"), steps=1, lr=0.0)
    assert metrics.logprob_drift == pytest.approx(0.0, abs=1e-5) and metrics.mean_is_weight == pytest.approx(1.0, abs=1e-5)
    unmasked = training_example("turn-g", prompt, response, masked.tolist(), 1.0)
    (drifted,) = train(model, [unmasked], LossConfig(method="rl"), steps=1, lr=0.0)
    assert drifted.logprob_drift > 0.1  # scored without the masks, the same turn looks off-policy
    batch = pack_examples([constrained, on_policy_sample(model, tiny_model_dir, 0, 1.0)], LossConfig(method="rl"), torch.device("cpu"))
    assert batch.allowed_bits is not None and batch.allowed_bits.shape[:2] == batch.response_ids.shape
    assert (batch.allowed_bits[1] == -1).all()  # the unconstrained row: every token allowed


def test_a_turn_served_with_notes_trains_without_them_weighted_for_the_prompt_it_was_sampled_under(tiny_model_dir: Path) -> None:
    """A note-served turn trains its student on the request without the notes (`student_prompt_token_ids`),
    while its behaviour log-probs were taken with them: the step is the float64 reference's
    −Σ_t min(π_old(a_t | no notes) / π_b(a_t | notes), cap) · A_t · ∇log π(a_t | no notes) / N, and its
    importance weights are those ratios."""
    policy = load_policy(tiny_model_dir).double()
    train(policy, [on_policy_sample(policy, tiny_model_dir, 0, 1.0)], LossConfig(method="rl"), steps=1)  # B ≠ 0
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    question, answer = CONVERSATIONS[1]
    bare_prompt, response = encode(tiny_model_dir, question, answer)
    noted_messages = [{"role": "system", "content": "Notes:\n- Answer in one short line.\n- Mention the sea."},
                      {"role": "user", "content": question}]  # fmt: skip
    noted_prompt = tokenizer.encode(tokenizer.apply_chat_template(noted_messages, add_generation_prompt=True, tokenize=False),
                                    add_special_tokens=False)  # fmt: skip
    # sampled with the notes; float32, as the trainer packs behaviour and teacher log-probs
    behaviour = logprobs_of(policy, noted_prompt, response).float().double()
    teacher = (behaviour + 0.2).float().double().tolist()
    example = training_example("noted", noted_prompt, response, behaviour.tolist(), 1.0, teacher_logprobs=teacher,
                               student_prompt_token_ids=bare_prompt)  # fmt: skip
    config = LossConfig(method="combine", is_cap=1.5)
    # the reference: one unpadded float64 forward of the bare prompt, the gradient written out
    trainable = {name: p for name, p in policy.named_parameters() if p.requires_grad}
    policy.zero_grad()
    logits = policy(input_ids=torch.tensor([bare_prompt + response])).logits[0, len(bare_prompt) - 1 : -1]
    student = torch.log_softmax(logits, -1).gather(-1, torch.tensor(response).unsqueeze(-1)).squeeze(-1)
    old = student.detach()
    weights = torch.exp(old - behaviour).clamp(max=config.is_cap)
    advantage = config.w_rl * 1.0 + config.w_opd * (torch.tensor(teacher, dtype=torch.float64) - old).clamp(-config.opd_clip, config.opd_clip)
    (-(weights * advantage * student).sum() / len(response)).backward()
    expected = {name: p.grad.detach().clone() for name, p in trainable.items()}
    policy.zero_grad()
    assert not torch.allclose(weights, torch.ones_like(weights), atol=1e-3)  # the notes moved the behaviour log-probs
    metrics = update_step(copy.deepcopy(policy), torch.optim.SGD([torch.zeros(1)], lr=1.0), [example], config, micro_batch_size=1)
    # (the step's statistics are float32 sums)
    assert metrics.mean_is_weight == pytest.approx(weights.mean().item(), rel=1e-6)
    assert metrics.logprob_drift == pytest.approx((old - behaviour).abs().mean().item(), rel=1e-6)
    delta = sgd_delta(policy, [example], config, 1)
    for name, gradient in expected.items():
        assert gradient.abs().max() > 0, name
        # to float32 rounding of the packed log-probs, relative to the gradient's size
        torch.testing.assert_close(delta[name], -gradient, rtol=1e-5, atol=1e-7 * gradient.abs().max().item())
