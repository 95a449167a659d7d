"""A draft model with another tokenizer: greedy output equal to plain decoding token for token
(universal assisted generation), sampling distributed as the target's (token-level
intersection), the shared vocabulary measured, and `specpipe check` saying which applies.

The tokenizers are real byte-level BPE vocabularies trained in the test on small corpora; the
"permuted" draft is the target itself behind the same vocabulary with shuffled ids (it guesses
the target's tokens through a genuinely different id space), the "foreign" one a random model
on a BPE trained on other text.
"""

from __future__ import annotations

import json

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from specpipe.controllers.fixed import FixedGamma
from specpipe.drafts import DraftBatch
from specpipe.models.loader import LoadedModel
from specpipe.pipeline import Pipeline
from specpipe.proposers.cross_tokenizer import CrossDrafter, SharedVocab, token_texts
from specpipe.sampling import SamplingParams
from specpipe.verifiers.greedy import GreedyVerifier
from specpipe.verifiers.rejection import RejectionVerifier
from conftest import reference_probs
from test_rejection import critical, chi_square, first_two
from test_step import Recording, WorkClock, proposer_cache

PROSE = ["the quick brown fox jumps over the lazy dog", "speculative decoding drafts tokens cheaply",
         "a target model verifies every draft token in one forward pass", "the dog sleeps while the fox runs"]
CODE = ["def add(a, b): return a + b", "for i in range(10): print(i)", "class Fox: pass", "x = [i * i for i in y]"]
GREEDY = SamplingParams(temperature=0.0)


def bpe(corpus: list[str], size: int, shuffle: int | None = None) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus * 20, trainers.BpeTrainer(
        vocab_size=size, special_tokens=["<eos>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    if shuffle is not None:  # the same vocabulary and merges, other ids
        spec = json.loads(tok.to_str())["model"]
        order = torch.randperm(len(spec["vocab"]), generator=torch.Generator().manual_seed(shuffle)).tolist()
        vocab = {token: order[index] for token, index in spec["vocab"].items()}
        permuted = Tokenizer(models.BPE(vocab=vocab, merges=[tuple(m) for m in spec["merges"]]))
        permuted.pre_tokenizer, permuted.decoder = tok.pre_tokenizer, tok.decoder
        permuted.add_special_tokens(["<eos>"])
        tok = permuted
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")


def llama(vocab: int, seed: int) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         tie_word_embeddings=False)
    model = LlamaForCausalLM(config).to(torch.float64).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)  # sharp predictions: varied greedy continuations
    return model


@pytest.fixture(scope="module")
def pair():
    """(target, {name: (draft model, draft tokenizer)})."""
    tokenizer = bpe(PROSE, 300)
    model = llama(len(tokenizer), seed=0)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    permuted_tok = bpe(PROSE, 300, shuffle=1)
    to_permuted = torch.tensor([permuted_tok.convert_tokens_to_ids(t) for t in tokenizer.convert_ids_to_tokens(
        list(range(len(tokenizer))))])  # target id -> permuted id
    permuted = llama(len(tokenizer), seed=0)
    with torch.no_grad():  # the target's weights, rows moved to the permuted ids
        permuted.model.embed_tokens.weight[to_permuted] = model.model.embed_tokens.weight
        permuted.lm_head.weight[to_permuted] = model.lm_head.weight
    foreign_tok = bpe(CODE, 320)
    drafts = {"permuted": (permuted, permuted_tok), "foreign": (llama(len(foreign_tok), seed=5), foreign_tok)}
    return LoadedModel("tiny-bpe", model, tokenizer), drafts


def drafter(pair, name, sampling=GREEDY) -> CrossDrafter:
    """The shared tokens' drafter (the text's has tests of its own; `auto` takes it on the CPU)."""
    target, drafts = pair
    model, tokenizer = drafts[name]
    return CrossDrafter(model, sampling, target.tokenizer, tokenizer, translate="shared")


PROMPTS = ["the quick brown", "def add(a, b):", "a target model verifies", "fox"]


@pytest.mark.parametrize("name", ["permuted", "foreign"])
@pytest.mark.parametrize("gamma", [1, 3, 6])
def test_greedy_equals_plain(pair, name, gamma):
    target, _ = pair
    plain = Pipeline(target, None, GreedyVerifier(), None)
    pipe = Pipeline(target, drafter(pair, name), GreedyVerifier(), FixedGamma(gamma))
    accepted = drafted = 0
    for prompt in PROMPTS:
        for max_new in (1, 5, 30):
            expected = plain.run(prompt, max_new_tokens=max_new, speculative=False)
            got = pipe.run(prompt, max_new_tokens=max_new)
            assert got.token_ids == expected.token_ids, (prompt, max_new)
            assert got.finish_reason == expected.finish_reason
            accepted, drafted = accepted + got.stats.accepted, drafted + got.stats.drafted
    if name == "permuted":  # the target's own guesses through another id space, kept where the random
        # model's byte soup re-tokenises as it was generated (measured: 9-27% of drafted tokens)
        assert accepted > 0.05 * drafted > 0


def test_the_drafts_cache_fill_is_timed_apart(pair, monkeypatch):
    """The first draft fills the draft's cache with the prompt's text in draft ids (`fill_s`);
    later steps feed what the last verdict committed with the draft itself. The step clock is
    scripted: it moves a second for each draft id the fill feeds the draft's cache."""
    from specpipe.decode import timing

    clock = WorkClock()
    monkeypatch.setattr(timing, "time", clock)
    target, _ = pair
    controller = Recording(3)
    pipe = Pipeline(target, drafter(pair, "permuted"), GreedyVerifier(), controller)
    fill, fed = pipe.proposer.fill, []

    def counted(rows, gammas):
        before = proposer_cache(pipe.proposer)
        fill(rows, gammas)
        fed.append(proposer_cache(pipe.proposer) - before)
        clock.now += max(fed[-1], 0)

    monkeypatch.setattr(pipe.proposer, "fill", counted)
    prompt = " ".join(PROSE * 2)
    got = pipe.run(prompt, max_new_tokens=12)
    assert got.token_ids == pipe.run(prompt, max_new_tokens=12, speculative=False).token_ids
    first, *later = controller.timings
    assert fed[0] > 10 and all(n <= 0 for n in fed[1:]), fed  # the prompt's text once, then nothing
    assert first.fill_s >= fed[0] and all(t.fill_s < 1e-3 for t in later), [t.fill_s for t in controller.timings]
    assert got.stats.accepted > 0  # the target's own guesses, in another id space: the fill kept them


def test_the_shared_vocabulary_is_matched_by_text(pair):
    target, drafts = pair
    permuted = SharedVocab(target.tokenizer, drafts["permuted"][1])
    assert permuted.size == len(target.tokenizer)  # every token, under other ids
    same_text = [target.tokenizer.convert_ids_to_tokens(int(t)) == drafts["permuted"][1].convert_ids_to_tokens(int(d))
                 for d, t in zip(permuted.draft_ids, permuted.target_ids)]
    assert all(same_text) and not torch.equal(permuted.draft_ids, permuted.target_ids)
    foreign = SharedVocab(target.tokenizer, drafts["foreign"][1])
    assert 256 < foreign.size < len(drafts["foreign"][1])  # the byte alphabet and some merges, not all
    assert token_texts(target.tokenizer)[target.tokenizer.eos_token_id] == ("special", "<eos>")


def test_sentencepiece_spellings_compare_as_bytes():
    from tokenizers import models as m

    vocab = {"<eos>": 0, "\u2581the": 1, "<0x0A>": 2, "fox": 3}
    sp = Tokenizer(m.WordLevel(vocab=vocab, unk_token="fox"))
    tok = PreTrainedTokenizerFast(tokenizer_object=sp, eos_token="<eos>")
    texts = token_texts(tok)
    assert texts[1] == ("text", b" the") and texts[2] == ("text", b"\n") and texts[3] == ("text", b"fox")


def test_rejection_with_a_draft_on_the_shared_vocabulary_keeps_the_target_distribution():
    """The draft's distribution lives on part of the target's vocabulary only (tokens 0-4 of 8):
    rejection sampling still emits the target's distribution (tokens 5-7 via the residual), as
    transformers' warpers give it."""
    target_logits = torch.randn(3, 8, generator=torch.Generator().manual_seed(3)) * 1.5  # γ = 2, plus the bonus row
    shared = torch.tensor([0, 1, 2, 3, 4])
    draft_probs = torch.zeros(2, 8)
    draft_probs[:, shared] = torch.softmax(torch.randn(2, 5, generator=torch.Generator().manual_seed(4)), -1)
    counts, _ = first_two(RejectionVerifier(SamplingParams(temperature=1.0)), target_logits, draft_probs, 40_000)
    target_probs = reference_probs(target_logits)
    assert chi_square(counts, target_probs[0]) < critical(target_probs[0])
    assert counts[5:].sum() > 0.1 * counts.sum()  # tokens the draft never proposes are emitted too


@pytest.mark.parametrize("name", ["permuted", "foreign"])
def test_sampling_drafts_only_shared_tokens_with_their_probabilities(pair, name):
    target, drafts = pair
    sampling = SamplingParams(temperature=0.8, top_k=20)
    proposer = drafter(pair, name, sampling)
    pipe = Pipeline(target, proposer, RejectionVerifier(sampling), FixedGamma(4), sampling)
    from conftest import one_row

    prompt = target.tokenizer.encode("the quick")
    proposer.prefill(0, prompt, None)
    batch: DraftBatch = proposer.propose(one_row(prompt), [4])
    tokens, probs, gamma = batch.tokens[0], batch.probs[0], batch.width  # the one row's draft
    assert probs.shape == (gamma, pipe.runner.vocab_size) and batch.num_draft.tolist() == [gamma]
    shared = set(proposer.shared.target_ids.tolist())
    assert set(tokens.tolist()) <= shared
    outside = torch.ones(pipe.runner.vocab_size, dtype=torch.bool)
    outside[proposer.shared.target_ids] = False
    assert float(probs[:, outside].sum()) == 0.0  # no mass outside the shared vocabulary
    assert torch.allclose(probs.sum(-1), torch.ones(gamma))
    assert (probs > 0).sum(-1).max() <= 20  # top_k applied on the draft's side too
    for seed in range(5):  # and the whole loop runs: sampled output of the requested length
        assert len(pipe.run("the quick", max_new_tokens=12, seed=seed).token_ids) >= 1


@pytest.mark.parametrize("name", ["permuted", "foreign"])
def test_greedy_equals_plain_with_the_text_translated(pair, name):
    """`translate="text"` (universal assisted generation): the draft's text re-encoded in target
    tokens, still the target's own greedy output."""
    target, drafts = pair
    model, tokenizer = drafts[name]
    plain = Pipeline(target, None, GreedyVerifier(), None)
    pipe = Pipeline(target, CrossDrafter(model, GREEDY, target.tokenizer, tokenizer, translate="text"),
                    GreedyVerifier(), FixedGamma(3))
    drafted = 0
    for prompt in PROMPTS:
        got = pipe.run(prompt, max_new_tokens=30)
        assert got.token_ids == plain.run(prompt, max_new_tokens=30, speculative=False).token_ids, prompt
        drafted += got.stats.drafted
    assert drafted > 0


def test_an_unknown_translation_is_refused(pair):
    from specpipe.errors import SpecpipeError

    target, drafts = pair
    model, tokenizer = drafts["foreign"]
    with pytest.raises(SpecpipeError, match="proposer.translate='bytes'"):
        CrossDrafter(model, GREEDY, target.tokenizer, tokenizer, translate="bytes")


@pytest.mark.parametrize("translate", ["shared", "text"])
@pytest.mark.parametrize("sampling", [GREEDY, SamplingParams(temperature=0.8, top_k=20)], ids=["greedy", "sampled"])
@pytest.mark.parametrize("name", ["permuted", "foreign"])
def test_the_drafts_cache_holds_what_it_says(pair, name, sampling, translate, monkeypatch):
    """After every verdict `cached` is exactly the draft ids the draft's cache was fed and kept:
    with the shared table, learnt from the verdict's accepted target ids alone (no read of the
    drafted ids), so a wrong inverse would feed the draft a context it never saw."""
    target, drafts = pair
    model, tokenizer = drafts[name]
    proposer = CrossDrafter(model, sampling, target.tokenizer, tokenizer, translate=translate)
    runner, held, checked = proposer.runner, [], []
    prefill, forward, crop, reset, commit = runner.prefill, runner.forward, runner.crop, runner.reset, proposer.commit

    def fed_prefill(row, ids, **options):
        held.extend(ids)
        return prefill(row, ids, **options)

    def fed_forward(ids, **options):
        held.extend(ids.reshape(-1).tolist())  # every forward here is kept (`commit([1])`)
        return forward(ids, **options)

    def cropped(row, length):
        del held[length:]
        return crop(row, length)

    def emptied(row=None):
        held.clear()
        return reset(row)

    def committed(verdict, host, out):
        commit(verdict, host, out)
        assert proposer.cached == held and runner.lengths[0] == len(held)
        checked.append(host[0].n_accepted)

    for attr, fn in [("prefill", fed_prefill), ("forward", fed_forward), ("crop", cropped), ("reset", emptied)]:
        monkeypatch.setattr(runner, attr, fn)
    monkeypatch.setattr(proposer, "commit", committed)
    verifier = GreedyVerifier() if sampling.greedy else RejectionVerifier(sampling)
    pipe = Pipeline(target, proposer, verifier, FixedGamma(4), sampling)
    for prompt in PROMPTS:
        pipe.run(prompt, max_new_tokens=24)
    assert len(checked) > 8  # many verdicts
    assert sum(checked) > 0 or name == "foreign"  # the target's own guesses are kept (the random draft's may not be)


def test_a_text_the_draft_spells_twice_is_one_shared_token():
    """SentencePiece spells a space both "▁" and, as a byte fallback, "<0x20>": the shared
    vocabulary keeps one draft id for it (the spelling of running text), so a drafted target id
    has one probability entry and one draft id."""
    from tokenizers import models as m

    def word_level(vocab):
        return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(m.WordLevel(vocab=vocab, unk_token="fox")),
                                       eos_token="<eos>")

    draft = word_level({"<eos>": 0, "<0x20>": 1, "\u2581": 2, "\u2581the": 3, "fox": 4})
    target = word_level({"<eos>": 0, "\u2581": 1, "fox": 2, "\u2581the": 3})
    shared = SharedVocab(target, draft)
    assert shared.to_draft == {0: 0, 1: 2, 2: 4, 3: 3}
    assert shared.draft_ids.tolist() == [0, 2, 3, 4] and shared.target_ids.tolist() == [0, 1, 3, 2]
