"""`instructions=requests`: the written training requests (prompts/requests.jsonl), disjoint
from the dev prompts, each bank's kinds in turn, then the templates; the caches check each request's text."""

from __future__ import annotations

import json
import re

from specpipe.prompts import BUILTIN, load_prompts
from specpipe.train import prompts, requests
from test_self_instruct import chat_target

KINDS = ("code", "code-edit", "chat", "summarize", "math")


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9_]+", text.lower())


def _ngrams(text: str, n: int) -> set[tuple[str, ...]]:
    words = _words(text)
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


def test_the_requests_cover_the_five_kinds_and_share_no_passage_with_the_dev_prompts():
    dev = set().union(*(_ngrams(m["content"], 8) for p in load_prompts("dev") for m in p["messages"]))
    texts = []
    for name in requests.BANKS:
        bank = load_prompts(name)
        counts = {kind: sum(p["category"] == kind for p in bank) for kind in KINDS}
        assert set(p["category"] for p in bank) == set(KINDS) and min(counts.values()) >= 35, (name, counts)
        texts += [p["messages"][-1]["content"] for p in bank]
    assert len(set(texts)) == len(texts)  # no request twice, in a bank or across them
    shared = [t[:60] for t in texts if _ngrams(t, 8) & dev]  # 8 words in a row: a copied sentence or snippet
    assert not shared, shared


def test_the_kinds_come_in_turn_bank_after_bank_then_the_templates():
    first = requests.instructions(5)
    kinds = {p["messages"][-1]["content"]: p["category"] for name in requests.BANKS for p in load_prompts(name)}
    assert [kinds[r] for r in first] == list(KINDS)  # any first count is balanced
    one = len(load_prompts(requests.BANKS[0]))
    assert [kinds[r] for r in requests.instructions(one + 5)[one:]] == list(KINDS)  # and the next bank's too
    assert set(requests.instructions(one)) == {p["messages"][-1]["content"] for p in load_prompts(requests.BANKS[0])}
    total = len(kinds)
    longer = requests.instructions(total + 7, seed=3)
    assert longer[:total] == requests.instructions(total) and set(longer[:total]) == set(kinds)
    assert longer[total:] == prompts.instructions(7, 3)  # past the banks: the seed's templates


def test_train_answers_the_requests_and_answers_again_only_what_is_new_or_edited(tmp_path, monkeypatch):
    from specpipe.commands import train as train_command
    from specpipe.config import compose
    from specpipe.recipe import load_recipe

    monkeypatch.setenv("SPECPIPE_CACHE", str(tmp_path / "cache"))
    path = chat_target(tmp_path)
    seen = []
    real = train_command.distill.answers
    monkeypatch.setattr(train_command.distill, "answers", lambda m, t, p, *a, **k: seen.append(p) or real(m, t, p, *a, **k))
    settings = [f"model={path}", "proposer=eagle3", "tokens=0", "distill=6", "distill_tokens=8", "seq_len=8",
                "batch=16", "epochs=1", "ttt=2", "instructions=requests", f"out={tmp_path / 'recipes'}"]
    assert train_command.run(compose(settings, "train")) == 0
    assert seen[0] == requests.instructions(6)
    recipe = load_recipe(tmp_path / "recipes" / "chat-target" / "eagle3.yaml")
    assert recipe.measured["instructions"] == "requests"
    config = json.loads((tmp_path / "recipes" / "chat-target" / "eagle3" / "config.json").read_text())
    assert config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 2  # the ttt it trained
    answers = next((tmp_path / "cache" / "distill").glob("chat-target-*.jsonl"))
    assert len(answers.read_text().splitlines()) == 6

    grown = [*settings[:3], "distill=8", *settings[4:]]  # two more requests, the second edited
    second = requests.instructions(2)[1]
    rows = [json.loads(line) for line in BUILTIN["requests"].read_text().splitlines()]
    for row in rows:
        if row["messages"][-1]["content"] == second:
            row["messages"][-1]["content"] = "Please: " + second
    edited = tmp_path / "requests.jsonl"
    edited.write_text("".join(json.dumps(row) + "\n" for row in rows))
    monkeypatch.setitem(BUILTIN, "requests", edited)
    assert train_command.run(compose([*grown, "overwrite=true"], "train")) == 0  # replaces the first run's heads
    assert seen[1] == requests.instructions(8) and seen[1][1] == "Please: " + second
    assert next((tmp_path / "cache" / "distill").glob("chat-target-*.jsonl")) == answers  # one cache: no digest
    assert len(answers.read_text().splitlines()) == 6 + 3  # the edited request and the two new ones answered


def test_a_functions_source_is_cut_as_ast_cuts_it():
    """The templates' function sources are cut from lines split once (train/prompts.py): the same text
    as ast.get_source_segment, with CRLF and lone CR line ends, a form feed and non-ASCII text."""
    import ast

    source = ('"""m"""\r\ndef f(a):\r\n    """Doc é."""\r\n    x = "\x0c"  # ünï\r\n    return a\r\n'
              'def g(b): return b  # one line\rdef h():\n    """h."""\n    pass')
    lines = prompts._SOURCE_LINES.findall(source)
    nodes = ast.parse(source).body[1:]
    assert [prompts._segment(lines, n) for n in nodes] == [ast.get_source_segment(source, n) for n in nodes]
