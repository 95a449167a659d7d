"""`instructions=self|mixed`: the target writes its own requests (Magpie), sampled, cached, resumable."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import tiny_target
from specpipe.engine import make_runner
from specpipe.errors import SpecpipeError
from specpipe.train import self_instruct


def tiny_sampler(batch: int = 4):
    target = tiny_target(0, eos=1, dtype=torch.float32)
    return self_instruct.sample_rows(make_runner(target.model, engine="native"), target, batch), target


def test_a_tokenizer_without_a_chat_template_is_refused():
    with pytest.raises(SpecpipeError, match="instructions=self needs a chat model"):
        self_instruct.user_turn_prefix(tiny_target().tokenizer)


def test_instructions_are_a_fixed_sequence_cached_and_resumed(tmp_path):
    sample, _ = tiny_sampler()
    path = tmp_path / "instruct.jsonl"
    first = self_instruct.instructions(sample, [5, 9, 2], 6, 0, path, batch=4, max_tokens=24)
    assert len(first) == 6 and len(set(first)) == 6  # distinct
    assert all(len(text.split()) >= self_instruct.MIN_WORDS for text in first)
    rounds = path.read_text().splitlines()
    kept_rows = sum(ended for line in rounds for _, ended in json.loads(line)["samples"])
    assert kept_rows >= 6 and len(rounds) >= 2  # samples that ran to max_tokens are not kept

    def never(*_):
        raise AssertionError("every round needed is in the file: nothing is sampled again")

    assert self_instruct.instructions(never, [5, 9, 2], 6, 0, path, batch=4, max_tokens=24) == first
    assert self_instruct.instructions(never, [5, 9, 2], 3, 0, path, batch=4, max_tokens=24) == first[:3]
    # an interruption cut the last line: that round is sampled again, to the same texts
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:-1]) + "\n" + lines[-1][: len(lines[-1]) // 2])
    assert self_instruct.instructions(sample, [5, 9, 2], 6, 0, path, batch=4, max_tokens=24) == first
    assert path.read_text().splitlines() == lines
    # another seed, other requests
    other = self_instruct.instructions(sample, [5, 9, 2], 6, 1, tmp_path / "seed1.jsonl", batch=4, max_tokens=24)
    assert other != first


def test_each_row_is_sampled_from_its_own_seed_whatever_its_batch(tmp_path):
    together, _ = tiny_sampler(batch=4)
    alone, _ = tiny_sampler(batch=1)
    seeds = [11, 12, 13, 14]
    assert together([5, 9, 2], 12, seeds) == alone([5, 9, 2], 12, seeds)
    assert len({text for text, _ in together([5, 9, 2], 12, seeds)}) > 1  # sampled, not one greedy answer


def test_a_model_that_never_ends_its_turn_is_refused_not_looped(tmp_path):
    def runs_on(prefix, max_tokens, seeds):
        return [("a request cut at the token limit", False) for _ in seeds]

    with pytest.raises(SpecpipeError, match="usable requests"):
        self_instruct.instructions(runs_on, [1], 8, 0, tmp_path / "x.jsonl", batch=4)


@pytest.mark.slow  # the real SmolLM2 (zoo)
@pytest.mark.full  # 19 s, for CI's time budget: the steps it takes are tested on tiny models above
def test_smollm2_writes_requests_like_a_users(tmp_path):
    from specpipe.models.loader import LoadedModel, load_model, load_tokenizer, resolve
    from specpipe.models.quantize import quantize_model
    from specpipe.prompts import load_prompts

    source = resolve("smollm2-135m")
    tokenizer, model = load_tokenizer(source), quantize_model(load_model(source), "fp16")
    prefix = self_instruct.user_turn_prefix(tokenizer)
    assert tokenizer.decode(prefix).endswith("<|im_start|>user\n")  # the system prompt, then the user's turn
    sample = self_instruct.sample_rows(make_runner(model, engine="native", precision="fp16"),
                                       LoadedModel("smollm2", model, tokenizer), 16)
    written = self_instruct.instructions(sample, prefix, 12, 0, tmp_path / "i.jsonl", batch=16, max_tokens=64)
    samples = [s for line in (tmp_path / "i.jsonl").read_text().splitlines() for s in json.loads(line)["samples"]]
    assert len(written) == 12 and sum(ended for _, ended in samples) >= len(samples) // 2  # most end their turn
    assert sum(text.rstrip().endswith(("?", ".")) for text in written) >= 9  # sentences: questions, requests
    dev = {p["messages"][-1]["content"] for p in load_prompts("dev")}
    assert not dev & set(written)


def chat_target(root):
    """The tiny target saved with a chat template (w3 starts a user turn, w5 the answer)."""
    target = tiny_target(0, eos=1, dtype=torch.float32)
    target.tokenizer.chat_template = ("{% for m in messages %}w3 {{ m['content'] }} w4 {% endfor %}"
                                      "{% if add_generation_prompt %}w5{% endif %}")
    target.model.save_pretrained(root / "chat-target")
    target.tokenizer.save_pretrained(root / "chat-target")
    return root / "chat-target"


def test_train_mixes_templated_and_self_written_instructions(tmp_path, monkeypatch):
    from specpipe.commands import train as train_command
    from specpipe.config import compose
    from specpipe.recipe import load_recipe
    from specpipe.train import prompts

    monkeypatch.setenv("SPECPIPE_CACHE", str(tmp_path / "cache"))
    path = chat_target(tmp_path)
    seen = []
    real = train_command.distill.answers
    monkeypatch.setattr(train_command.distill, "answers", lambda m, t, p, *a, **k: seen.append(p) or real(m, t, p, *a, **k))
    cfg = compose([f"model={path}", "proposer=eagle3", "tokens=0", "distill=8", "distill_tokens=8", "seq_len=8",
                   "batch=16", "epochs=1", "instructions=mixed", f"out={tmp_path / 'recipes'}"], "train")
    assert train_command.run(cfg) == 0
    templated, written = seen[0][0::2], seen[0][1::2]
    assert templated == prompts.instructions(4, 0)  # the templates' first four, at even indices
    assert len(set(written)) == 4 and not set(written) & set(templated)
    recipe = load_recipe(tmp_path / "recipes" / "chat-target" / "eagle3.yaml")
    assert recipe.measured["instructions"] == "mixed" and recipe.measured["distill"] == 8


@pytest.mark.parametrize("setting, message", [("instructions=self", "needs a chat model"),
                                              ("instructions=shared", "use templates")])
def test_train_refuses_instructions_it_cannot_make_before_any_work(tmp_path, monkeypatch, setting, message):
    from specpipe.commands import train as train_command
    from specpipe.config import compose

    monkeypatch.setenv("SPECPIPE_CACHE", str(tmp_path / "cache"))
    target = tiny_target(0, dtype=torch.float32)
    target.model.save_pretrained(tmp_path / "target")
    target.tokenizer.save_pretrained(tmp_path / "target")  # no chat template
    cfg = compose([f"model={tmp_path / 'target'}", "proposer=eagle3", "tokens=64", "seq_len=16", "distill=4",
                   setting, f"out={tmp_path / 'recipes'}"], "train")
    with pytest.raises(SpecpipeError, match=message):
        train_command.run(cfg)
    written = [p for p in (tmp_path / "recipes").rglob("*") if p.is_file()] if (tmp_path / "recipes").exists() else []
    assert not (tmp_path / "cache").exists() and not written  # nothing computed or written
