"""`instructions=requests`: the written training requests (prompts/requests.jsonl), disjoint
from the dev prompts, the kinds in turn, then the templates; cache keys carry the file's digest."""

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
    bank = load_prompts("requests")
    counts = {kind: sum(p["category"] == kind for p in bank) for kind in KINDS}
    assert set(p["category"] for p in bank) == set(KINDS) and min(counts.values()) >= 45, counts
    texts = [p["messages"][-1]["content"] for p in bank]
    assert len(set(texts)) == len(texts)
    dev = set().union(*(_ngrams(m["content"], 8) for p in load_prompts("dev") for m in p["messages"]))
    shared = [t[:60] for t in texts if _ngrams(t, 8) & dev]  # 8 words in a row: a copied sentence or snippet
    assert not shared, shared


def test_the_kinds_come_in_turn_then_the_templates():
    first = requests.instructions(5)
    kinds = {p["messages"][-1]["content"]: p["category"] for p in load_prompts("requests")}
    assert [kinds[r] for r in first] == list(KINDS)  # any first count is balanced
    total = len(kinds)
    longer = requests.instructions(total + 7, seed=3)
    assert longer[:total] == requests.instructions(total) and set(longer[:total]) == set(kinds)
    assert longer[total:] == prompts.instructions(7, 3)  # past the file: the seed's templates


def test_train_answers_the_requests_and_keys_its_caches_by_the_files_digest(tmp_path, monkeypatch):
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
    key = train_command._source(compose(settings, "train"))
    assert key == f"instructions-requests-{requests.digest()}"

    edited = tmp_path / "requests.jsonl"  # another file, another digest: its answers are not the old ones
    edited.write_text(BUILTIN["requests"].read_text().replace("Write", "Please write", 1))
    monkeypatch.setitem(BUILTIN, "requests", edited)
    assert train_command._source(compose(settings, "train")) != key


def test_a_functions_source_is_cut_as_ast_cuts_it():
    """The templates' function sources are cut from lines split once (train/prompts.py): the same text
    as ast.get_source_segment, with CRLF and lone CR line ends, a form feed and non-ASCII text."""
    import ast

    source = ('"""m"""\r\ndef f(a):\r\n    """Doc é."""\r\n    x = "\x0c"  # ünï\r\n    return a\r\n'
              'def g(b): return b  # one line\rdef h():\n    """h."""\n    pass')
    lines = prompts._SOURCE_LINES.findall(source)
    nodes = ast.parse(source).body[1:]
    assert [prompts._segment(lines, n) for n in nodes] == [ast.get_source_segment(source, n) for n in nodes]
