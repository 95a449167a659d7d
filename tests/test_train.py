"""`specpipe train proposer=medusa|eagle|eagle3`: features cached once, loss decreases, resume, recipe out."""

from __future__ import annotations

import json
import random

import pytest
import torch

from conftest import PINNED, tiny_model, tiny_tokenizer
from specpipe.engine import make_runner
from specpipe.commands import train as train_command
from specpipe.config import compose
from specpipe.heads.eagle import EagleHead, EagleShape
from specpipe.heads.medusa import MedusaHeads
from specpipe.pipeline import Pipeline
from specpipe.recipe import load_recipe
from specpipe.train import data, features
from specpipe.train.eagle import EagleTrainer, Rows
from specpipe.train.medusa import Examples, Trainer


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A tiny target saved to disk, and a corpus in its vocabulary with learnable repeats."""
    root = tmp_path_factory.mktemp("train")
    tokenizer = tiny_tokenizer()
    model = tiny_model(0, dtype=torch.float32)
    model.save_pretrained(root / "target")
    tokenizer.save_pretrained(root / "target")
    rng = random.Random(0)
    phrases = [" ".join(f"w{rng.randrange(2, 64)}" for _ in range(6)) for _ in range(8)]
    (root / "corpus.txt").write_text(" ".join(rng.choice(phrases) for _ in range(700)))
    prompts = [{"id": str(i), "category": "c", "messages": [{"role": "user", "content": rng.choice(phrases)}]}
               for i in range(40)]
    (root / "prompts.jsonl").write_text("\n".join(json.dumps(p) for p in prompts))
    return root


def args(setup, tmp_path, *extra, proposer="medusa"):
    """Corpus text plus self-distillation: the target's own answers to 40 prompts."""
    return compose([f"model={setup / 'target'}", f"proposer={proposer}", f"sources=[{setup / 'corpus.txt'}]",
                    "tokens=1024", "seq_len=64", "batch=64", "lr=0.003", "distill=40", "distill_tokens=48",
                    f"distill_prompts={setup / 'prompts.jsonl'}", f"out={tmp_path / 'recipes'}", *extra], "train")


def test_training_loss_decreases_within_a_few_steps(setup, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECPIPE_CACHE", str(tmp_path / "cache"))
    target = tiny_model(0, dtype=torch.float32)
    seqs = data.sequences(tiny_tokenizer(), [str(setup / "corpus.txt")], 64, 2048)
    folder = features.compute(make_runner(target), seqs, tmp_path / "features")
    cached = features.load(folder)
    assert len(cached) == len(seqs) and cached[0]["features"].shape == (64, 32)
    ex = Examples(cached, 3)
    weight = target.get_output_embeddings().weight.detach()
    trainer = Trainer(MedusaHeads(32, 64, 3), weight, features.frequent_labels(ex.argmax, 64), lr=0.003)
    gen = torch.Generator().manual_seed(0)
    losses = [trainer.step(ex, ex.positions[torch.randperm(len(ex), generator=gen)[:64]]) for _ in range(30)]
    assert sum(losses[-5:]) / 5 < 0.92 * sum(losses[:5]) / 5  # measured here: 14.1 -> 12.5


def test_train_writes_heads_and_a_recipe_and_resumes(setup, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECPIPE_CACHE", str(tmp_path / "cache"))
    checkpoint = tmp_path / "recipes" / "target" / ".medusa-checkpoint"
    real_step = Trainer.step
    seen = {"epoch_one": 0, "after": 0}

    def dies_in_epoch_two(self, ex, batch):
        if not (checkpoint / "trainer.pt").exists():
            seen["epoch_one"] += 1
        else:
            seen["after"] += 1
            if seen["after"] == 5:
                raise KeyboardInterrupt  # killed in the middle of the second epoch
        return real_step(self, ex, batch)

    monkeypatch.setattr(Trainer, "step", dies_in_epoch_two)
    with pytest.raises(KeyboardInterrupt):
        train_command.run(args(setup, tmp_path, "epochs=3"))
    assert torch.load(checkpoint / "trainer.pt")["epoch"] == 0

    steps = {"n": 0}
    monkeypatch.setattr(Trainer, "step", lambda self, ex, b: steps.__setitem__("n", steps["n"] + 1) or real_step(self, ex, b))
    assert train_command.run(args(setup, tmp_path, "epochs=3")) == 0
    assert steps["n"] == 2 * seen["epoch_one"]  # resumed: epochs 2 and 3 only
    assert not checkpoint.exists()

    recipe = load_recipe(tmp_path / "recipes" / "target" / "medusa.yaml")
    assert (recipe.strategy["controller"], recipe.strategy["gamma"]) == ("fixed", 4)  # one guess per head
    assert "proposer.lookup" not in recipe.strategy  # Medusa's proposer takes no lookup
    accuracy = recipe.measured["held_out_top1_per_head"]
    # held out: the target's own answers; chance is 1/64 (measured here: 0.20 with the native
    # engine's batched answers, 0.30 with transformers' on the hf engine: fp16 near-ties part a few)
    assert len(accuracy) == 4 and accuracy[0] > 0.1
    cfg = compose([f"recipe={recipe.path}", f"model={setup / 'target'}", "gamma=3", *PINNED])
    pipeline = Pipeline.from_config(cfg)
    prompt = json.loads((setup / "prompts.jsonl").read_text().splitlines()[0])["messages"]
    spec = pipeline.run(prompt, max_new_tokens=40)
    assert spec.token_ids == pipeline.run(prompt, max_new_tokens=40, speculative=False).token_ids
    assert spec.stats.accepted > 0  # trained on the target's own answers, the heads guess right


def test_eagle_training_loss_decreases_within_a_few_steps(setup, tmp_path):
    target = tiny_model(0, dtype=torch.float32)
    seqs = data.sequences(tiny_tokenizer(), [str(setup / "corpus.txt")], 64, 2048)
    rows = Rows(features.load(features.compute(make_runner(target), seqs, tmp_path / "features")))
    head = EagleHead(EagleShape.of_target(target.config))
    trainer = EagleTrainer(head, target.get_input_embeddings().weight.detach(),
                           target.get_output_embeddings().weight.detach(), torch.arange(64), lr=0.003)
    gen = torch.Generator().manual_seed(0)
    losses = [trainer.step(rows, batch) for _ in range(3) for batch in rows.batches(256, gen)][:30]
    assert sum(losses[-5:]) / 5 < 0.8 * sum(losses[:5]) / 5


@pytest.mark.parametrize("proposer, epochs", [("eagle", 2), ("eagle3", 4)])  # EAGLE-3 has no feature target: slower
def test_train_eagle_writes_a_head_and_a_recipe_that_decodes_losslessly(setup, tmp_path, monkeypatch, proposer,
                                                                        epochs):
    monkeypatch.setenv("SPECPIPE_CACHE", str(tmp_path / "cache"))
    assert train_command.run(args(setup, tmp_path, f"epochs={epochs}", proposer=proposer)) == 0
    recipe = load_recipe(tmp_path / "recipes" / "target" / f"{proposer}.yaml")
    accuracy = recipe.measured["held_out_top1_per_position"]
    assert len(accuracy) == 4 and accuracy[0] > 0.2 and accuracy == sorted(accuracy, reverse=True)
    assert recipe.strategy["controller"] == "confidence"  # the head's confidence gates its drafting
    assert recipe.strategy["proposer.lookup"] is True  # prompt lookup first, the head where nothing matches
    for tree in ([], ["proposer.tree={top_k: 2, nodes: 6}"]):
        pipeline = Pipeline.from_config(compose([f"recipe={recipe.path}", f"model={setup / 'target'}", "gamma=3", *PINNED,
                                                 *tree]))
        prompt = json.loads((setup / "prompts.jsonl").read_text().splitlines()[0])["messages"]
        spec = pipeline.run(prompt, max_new_tokens=40)
        assert spec.token_ids == pipeline.run(prompt, max_new_tokens=40, speculative=False).token_ids
        assert spec.stats.accepted > 0  # trained on the target's own answers, the head guesses right


def test_only_trainable_heads_are_accepted(setup, tmp_path):
    from specpipe.errors import SpecpipeError

    with pytest.raises(SpecpipeError, match="nothing to train .* the trained proposers are dflash, eagle, eagle3, medusa"):
        train_command.run(compose([f"model={setup / 'target'}", "proposer=ngram"], "train"))


def test_tune_tries_the_trained_heads_beside_its_recipe(setup, tmp_path, monkeypatch):
    from specpipe.commands import tune

    monkeypatch.setenv("SPECPIPE_CACHE", str(tmp_path / "cache"))
    assert train_command.run(args(setup, tmp_path, "epochs=2")) == 0
    lines = (setup / "prompts.jsonl").read_text().splitlines()  # chosen on the first 3, reported on 3 others
    chosen = {json.dumps(json.loads(line)["messages"]) for line in lines[:3]}
    others = [line for line in lines[3:] if json.dumps(json.loads(line)["messages"]) not in chosen][:3]
    (tmp_path / "report.jsonl").write_text("\n".join(others))
    cfg = compose([f"model={setup / 'target'}", f"prompts={setup / 'prompts.jsonl'}", "limit=3", "max_new_tokens=24",
                   "warmup=0", "strategies=[ngram]", "gammas=[3]", f"report_on={tmp_path / 'report.jsonl'}",
                   f"out={tmp_path / 'recipes'}", f"work={tmp_path / 'work'}"], "tune")
    assert tune.run(cfg) == 0
    recipe = load_recipe(tmp_path / "recipes" / "target" / "specpipe.yaml")
    measured = recipe.measured
    assert set(measured["choose_on"]["speedup"]) == {"ngram-g3", "medusa"}
    assert set(measured["report_on"]["speedup"]) == {"ngram-g3"} | ({measured["chosen"]} - {"plain"})
    if measured["chosen"] == "medusa":  # the head ships only if it beat ngram on the report split
        report = measured["report_on"]["speedup"]
        margin = report["medusa"]["median"] - report["ngram-g3"]["median"]  # figures rounded to 3 places
        if abs(margin) > 1e-3 or not report["medusa"]["exact"]:
            assert measured["winner"] == ("medusa" if report["medusa"]["exact"] and margin > 0 else "ngram-g3")
    if measured["winner"] == "medusa":  # the heads travel with the recipe, by relative path
        assert recipe.artifacts == {"heads": "medusa"} and recipe.strategy["proposer.heads"] == "artifact:heads"
    compose([f"recipe={recipe.path}", f"model={setup / 'target'}"])  # whichever won, the recipe loads


def test_distilled_answers_are_batched_by_length_and_read_back_in_prompt_order(tmp_path):
    from specpipe.train import distill

    model, tokenizer = tiny_model(0, dtype=torch.float32), tiny_tokenizer()
    rng = random.Random(1)
    prompts = [" ".join(f"w{rng.randrange(2, 64)}" for _ in range(rng.randrange(1, 12))) for _ in range(7)]
    path = tmp_path / "answers.jsonl"
    got = distill.answers(model, tokenizer, prompts, 6, path, batch=2)
    alone = [distill.generate(model, tokenizer, [p], 6)[0] for p in prompts]
    assert got == alone  # each row is its own prompt's answer, whatever batch it was made in
    written = [json.loads(line)["index"] for line in path.read_text().splitlines()]
    assert sorted(written) == list(range(7)) and written != list(range(7))  # shortest prompts went first
    # an older file (lines in prompt order, no index) whose last line an interruption cut
    lines = [json.dumps({"ids": ids, "start": start}) for ids, start in got[:3]]
    path.write_text("\n".join(lines) + '\n{"ids": [5, 6')
    assert distill.answers(model, tokenizer, prompts, 6, path, batch=2) == got
    assert len(path.read_text().splitlines()) == 7  # 3 kept, the cut line dropped, 4 generated


def test_batched_native_distillation_gives_each_prompt_its_own_answer(tmp_path):
    """The native engine's batched decoder (continuous batching, 3 rows): every answer is that
    prompt's plain greedy answer decoded alone, in the layout of transformers' path."""
    from specpipe.engine import make_runner
    from specpipe.train import distill

    model, tokenizer = tiny_model(0, dtype=torch.float64), tiny_tokenizer()
    rng = random.Random(2)
    prompts = [" ".join(f"w{rng.randrange(2, 64)}" for _ in range(rng.randrange(1, 12))) for _ in range(7)]
    decode = distill.batched_decoder(make_runner(model, engine="native"), model, tokenizer, concurrency=3)
    got = distill.answers(model, tokenizer, prompts, 6, tmp_path / "answers.jsonl", batch=4, decode=decode)
    assert got == [distill.generate(model, tokenizer, [p], 6)[0] for p in prompts]


def test_a_growing_sequence_list_reuses_its_feature_shards(setup, tmp_path, monkeypatch):
    monkeypatch.setattr(features, "SHARD", 4)
    target = tiny_model(0, dtype=torch.float32)
    seqs = data.sequences(tiny_tokenizer(), [str(setup / "corpus.txt")], 16, 16 * 16)
    written, write = [], features._write_shard  # which shards a run writes (not file times: a rewrite in
    # the same clock tick as the first write keeps its mtime)

    def recorded(target, shard, starts, path, *rest, **options):
        written.append(path.name)
        return write(target, shard, starts, path, *rest, **options)

    monkeypatch.setattr(features, "_write_shard", recorded)
    folder = features.compute(make_runner(target), seqs[:10], tmp_path / "features")  # shards of 4, 4 and 2
    assert written == [f"shard-{i:05d}.safetensors" for i in range(3)]
    written.clear()
    features.compute(make_runner(target), seqs, folder)  # 16: shards 0-1 kept, shard 2 completed, shard 3 new
    assert written == [f"shard-{i:05d}.safetensors" for i in (2, 3)]
    grown = features.load(folder, 16)
    assert [s["tokens"].tolist() for s in grown] == seqs
    assert len(features.load(folder, 10)) == 10  # a shorter run reads only its own sequences
    edited = seqs[:5] + [seqs[5][:-1] + [seqs[5][-1] ^ 1]] + seqs[6:]  # one answer of shard 1 changed
    written.clear()
    features.compute(make_runner(target), edited, folder)
    assert written == ["shard-00001.safetensors"]
    assert [s["tokens"].tolist() for s in features.load(folder, 16)] == edited


def test_an_edited_or_added_prompt_is_answered_and_the_others_are_read_back(tmp_path):
    """The answers' cache checks each prompt's text (train/distill.py): a list that grows or has
    one prompt edited decodes only what is new."""
    from specpipe.train import distill

    model, tokenizer = tiny_model(0, dtype=torch.float32), tiny_tokenizer()
    prompts = [f"w{i} w{i + 3} w{i + 7}" for i in range(2, 8)]
    path = tmp_path / "answers.jsonl"
    decoded = []

    def decode(texts, tokens):
        decoded.extend(texts)
        return distill.generate(model, tokenizer, texts, tokens)

    first = distill.answers(model, tokenizer, prompts[:4], 6, path, batch=2, decode=decode)
    edited = prompts[:1] + ["w9 w9 w9"] + prompts[2:]  # the second edited, two added
    decoded.clear()
    got = distill.answers(model, tokenizer, edited, 6, path, batch=2, decode=decode)
    assert sorted(decoded) == sorted(["w9 w9 w9", *prompts[4:]])
    assert got[0] == first[0] and got[2:4] == first[2:4]
    assert got == [distill.generate(model, tokenizer, [p], 6)[0] for p in edited]
    assert distill.answers(model, tokenizer, prompts[:4], 6, path, batch=2, decode=decode)[1] == first[1]  # edited back


def test_the_learning_rate_warms_up_then_decays_to_zero():
    factors = [train_command._cosine(p / 100) for p in range(101)]
    peak = factors.index(max(factors))
    assert 0 < factors[0] < 0.1 and 0.99 < max(factors) <= 1 and peak <= 3
    assert factors[peak:] == sorted(factors[peak:], reverse=True) and factors[-1] < 1e-9


def test_init_trains_heads_further_from_where_they_are(setup, tmp_path, monkeypatch):
    """init=DIR starts from trained heads: at a vanishing learning rate they come out as they went in."""
    from safetensors.torch import load_file

    from specpipe.errors import SpecpipeError

    monkeypatch.setenv("SPECPIPE_CACHE", str(tmp_path / "cache"))
    assert train_command.run(args(setup, tmp_path, "epochs=1", proposer="eagle3")) == 0
    first = tmp_path / "recipes" / "target" / "eagle3"
    again = args(setup, tmp_path / "again", "epochs=1", f"init={first}", "lr=1e-12", proposer="eagle3")
    assert train_command.run(again) == 0
    second = tmp_path / "again" / "recipes" / "target" / "eagle3"
    before, after = (load_file(str(folder / "model.safetensors")) for folder in (first, second))
    assert set(before) == set(after) and all(torch.allclose(before[k].float(), after[k].float(), atol=1e-6) for k in before)
    with pytest.raises(SpecpipeError, match="init=.*no config.json"):
        train_command.run(args(setup, tmp_path, f"init={tmp_path / 'nowhere'}", proposer="eagle3"))


def test_runners_are_built_only_when_a_cache_misses():
    """`specpipe train` with every answer and feature shard cached builds no runner (OnFirstUse)."""
    made = []

    def make():
        made.append(1)
        return torch.nn.Identity()

    lazy = train_command.OnFirstUse(make)
    assert made == []  # nothing built until used
    assert torch.equal(lazy(torch.ones(2)), torch.ones(2)) and lazy.training is True
    assert made == [1]  # built once, then reused


def test_init_with_a_larger_vocab_subset_grows_the_draft_vocabulary(setup, tmp_path, monkeypatch):
    """init= with vocab_subset above the head's draft vocabulary adds the most frequent tokens it
    lacks: its own rows kept, the added rows the target's LM-head rows, everything else as it was."""
    from specpipe.heads.speculators import load_eagle3

    monkeypatch.setenv("SPECPIPE_CACHE", str(tmp_path / "cache"))
    assert train_command.run(args(setup, tmp_path, "epochs=1", "vocab_subset=8", proposer="eagle3")) == 0
    first = load_eagle3(tmp_path / "recipes" / "target" / "eagle3")
    again = args(setup, tmp_path / "again", "epochs=1", "vocab_subset=20", "lr=1e-12",
                 f"init={tmp_path / 'recipes' / 'target' / 'eagle3'}", proposer="eagle3")
    assert train_command.run(again) == 0
    second = load_eagle3(tmp_path / "again" / "recipes" / "target" / "eagle3")
    old, new = first.draft_ids, second.draft_ids
    assert len(old) == 8 and len(new) == 20 and bool(second.t2d[old].all()) and int(second.t2d.sum()) == 20
    lm = setup_lm_head(setup)
    at_old = torch.searchsorted(new, old)
    added = torch.ones(20, dtype=torch.bool).index_fill_(0, at_old, False)
    assert torch.allclose(second.lm_head.weight[at_old].float(), first.lm_head.weight.float(), atol=1e-6)
    assert torch.allclose(second.lm_head.weight[added].float(), lm[new[added]].to(first.lm_head.weight.dtype).float(), atol=1e-6)
    assert torch.allclose(second.fc.weight.float(), first.fc.weight.float(), atol=1e-6)


def setup_lm_head(setup) -> torch.Tensor:
    """[V, H] the tiny target's LM head, as the trainer reads it."""
    from specpipe.models.loader import resolve

    return train_command._target_weights(resolve(str(setup / "target"))).lm
