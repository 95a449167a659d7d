"""Bad prompt files and prompts too long for the context, refused (or capped) before any decoding.

Every JSONL prompt reader goes through `specpipe.prompts.load_prompts`: a bad record is a user
error naming the file's physical line (blank lines counted) and the field. Every decode path
(`Pipeline.generate`/`run`, `serve`/`generate_batch`) passes through `Pipeline.fit`: a prompt
that leaves no room for output is refused before the first forward; one whose max_new_tokens
would overflow the KV cache is capped, with a ContextWarning saying so.
"""

from __future__ import annotations

import json
import warnings

import pytest
import torch

from conftest import PROMPT, tiny_model, tiny_target, tiny_tokenizer
from specpipe import cli
from specpipe.pipeline import Request
from specpipe.controllers.fixed import FixedGamma
from specpipe.engine import make_runner
from specpipe.errors import SpecpipeError
from specpipe.models.loader import LoadedModel
from specpipe.context import ContextWarning, check_fits
from specpipe.pipeline import Pipeline, encode
from specpipe.prompts import load_prompts
from specpipe.proposers.medusa import MedusaProposer
from specpipe.proposers.model_drafter import ModelDrafter
from specpipe.proposers.ngram import NgramProposer
from specpipe.sampling import SamplingParams
from specpipe.verifiers.greedy import GreedyVerifier
from test_cli import assert_user_error, specpipe
from test_medusa import random_heads

GOOD = b'{"id": "a", "messages": [{"role": "user", "content": "w5 w6"}]}'
LONG = " ".join(f"w{2 + i % 8}" for i in range(40))  # 40 tokens of the tiny tokenizer
WIDE_TREE = [[0], [1], [2], [3], [0, 0], [1, 0], [2, 0], [0, 0, 0], [0, 1], [0, 0, 0, 0]]


def record(**fields) -> bytes:
    return json.dumps(fields).encode()


def message(**fields) -> bytes:
    return record(messages=[fields])


# name: (the file's bytes, the line the message must name, words it must contain)
BAD = {
    "latin-1 é": (GOOD + b'\n\n{"prompt": "caf\xe9"}\n', 3, ["UTF-8", "0xe9"]),
    "random bytes": (b"\n" + bytes(range(200, 256)) * 3, 2, ["UTF-8"]),
    "utf-16": ('{"prompt": "w5"}'.encode("utf-16"), 1, ["UTF-16"]),
    "content 5": (message(role="user", content=5), 1, ['"content"', "string", "number"]),
    "content null": (GOOD + b"\n" + message(role="user", content=None), 2, ['"content"', "null"]),
    "content list": (message(role="user", content=["a"]), 1, ['"content"', "array"]),
    "content object": (message(role="user", content={"x": 1}), 1, ['"content"', "object"]),
    "no content": (message(role="user"), 1, ['"content"']),
    "role 3": (message(role=3, content="w5"), 1, ['"role"', "number"]),
    "role null": (message(role=None, content="w5"), 1, ['"role"', "null"]),
    "messages []": (record(messages=[]), 1, ['"messages"', "empty"]),
    "messages text": (record(messages="text"), 1, ['"messages"', "string"]),
    "messages [1]": (record(messages=[1]), 1, ['"messages"[0]', "number"]),
    "id 7": (GOOD + b"\n\n\n" + record(id=7, prompt="w5"), 4, ['"id"', '"7"']),
    "category null": (record(category=None, prompt="w5"), 1, ['"category"', "null"]),
    "max_new_tokens ten": (record(max_new_tokens="ten", prompt="w5"), 1, ['"max_new_tokens"', '"ten"']),
    "max_new_tokens 0": (record(max_new_tokens=0, prompt="w5"), 1, ['"max_new_tokens"', "0"]),
    "max_new_tokens -1": (record(max_new_tokens=-1, prompt="w5"), 1, ['"max_new_tokens"', "-1"]),
    "max_new_tokens true": (record(max_new_tokens=True, prompt="w5"), 1, ['"max_new_tokens"', "true"]),
    "max_new_tokens 2.5": (record(max_new_tokens=2.5, prompt="w5"), 1, ['"max_new_tokens"', "2.5"]),
    "prompt null": (record(prompt=None), 1, ['"prompt"', "null"]),
    "prompt and messages": (record(prompt="w5", messages=[{"role": "user", "content": "w6"}]), 1, ["both"]),
    "neither": (record(id="x"), 1, ['"messages"']),
    "no text": (record(prompt="   "), 1, ["no text"]),
    "top-level array": (b"\n[1, 2]", 2, ["array", "not an object"]),
    "top-level number": (b"5", 1, ["number", "not an object"]),
    "top-level string": (GOOD + b'\n"hello"', 2, ["string", "not an object"]),
    "not JSON": (b'{"prompt": "w5",}', 1, ["not JSON", "column"]),
    "truncated JSON": (GOOD + b'\n{"prompt": "w5"', 2, ["not JSON"]),
    "nested too deeply": (b"[" * 100_000 + b"]" * 100_000, 1, ["cannot be read"]),
    "lone surrogate": (b'{"prompt": "w5 \\ud800"}', 1, ["surrogate"]),
    "duplicate id": (GOOD + b"\n\n" + GOOD, 3, ['"a"', "line 1"]),
}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("prompt-files")
    tokenizer, model = tiny_tokenizer(), tiny_model(0, dtype=torch.float32)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(root / "target")
    tokenizer.save_pretrained(root / "target")
    return root / "target"


def user_error(capsys, *argv: str) -> str:
    """The real CLI in this process: exit code 2 and its message, whitespace-normalised."""
    assert cli.main(list(argv)) == 2
    return " ".join(capsys.readouterr().err.split())


@pytest.mark.parametrize("case", BAD)
def test_a_bad_prompt_file_is_refused_with_its_line(case, tmp_path, model_dir, capsys):
    data, line, words = BAD[case]
    path = tmp_path / "prompts.jsonl"
    path.write_bytes(data)
    message = user_error(capsys, "bench", f"prompts={path}", f"model={model_dir}", "warmup=0")
    for word in [str(path), f"line {line}", *words]:
        assert word in message, message


@pytest.mark.parametrize("data", [b"", b"\n  \n\t\n\n"], ids=["empty", "blank lines"])
def test_a_file_without_prompts_is_refused(data, tmp_path, model_dir, capsys):
    path = tmp_path / "prompts.jsonl"
    path.write_bytes(data)
    assert "has no prompts" in user_error(capsys, "bench", f"prompts={path}", f"model={model_dir}")


def test_train_distill_prompts_goes_through_the_same_validator(tmp_path, model_dir, capsys):
    path = tmp_path / "distill.jsonl"
    path.write_bytes(GOOD + b"\n\n" + message(role="user", content=None))
    message_ = user_error(capsys, "train", f"model={model_dir}", "proposer=medusa", "tokens=0", "distill=2",
                          f"distill_prompts={path}", f"out={tmp_path / 'out'}")
    assert "line 3" in message_ and '"content"' in message_


def test_good_files_in_other_dress_are_read(tmp_path):
    """A UTF-8 BOM, CRLF line ends, a U+2028 inside a string (not a line break): all fine, and
    default ids name the physical line (blank lines counted)."""
    path = tmp_path / "prompts.jsonl"
    text = ('\ufeff{"prompt": "w5\u2028w6"}\r\n\r\n'
            '{"messages": [{"role": "user", "content": "w7"}], "max_new_tokens": 4}\r\n')
    path.write_bytes(text.encode("utf-8"))
    prompts = load_prompts(str(path))
    assert [p["id"] for p in prompts] == ["prompt-1", "prompt-3"]
    assert prompts[0]["messages"] == [{"role": "user", "content": "w5\u2028w6"}]
    assert prompts[1]["max_new_tokens"] == 4 and prompts[1]["category"] == "default"
    path.write_bytes(text.encode("utf-8") + b'{"prompt": 5}\n')
    with pytest.raises(SpecpipeError, match="line 4"):  # U+2028 did not shift the count
        load_prompts(str(path))


def test_a_bad_file_through_the_real_cli_has_no_traceback(tmp_path, model_dir):
    path = tmp_path / "prompts.jsonl"
    path.write_bytes(GOOD + b'\n{"prompt": "caf\xe9"}\n')
    assert_user_error(specpipe("bench", f"prompts={path}", f"model={model_dir}"), "line 2", "UTF-8")


# --- the context -----------------------------------------------------------------------------

def pipeline(proposer=None, *, engine="native", cache_len=32, gamma=4, target=None) -> Pipeline:
    target = target or tiny_target()
    pipe = Pipeline(target, proposer, GreedyVerifier(), FixedGamma(gamma),
                    runner=make_runner(target.model, engine=engine, cache_len=cache_len))
    pipe.eos_ids = set()  # decode to the length limit: the last steps are the ones near a full cache
    return pipe


def no_forward(pipe: Pipeline, monkeypatch) -> None:
    """Any forward of the runner (a prompt's prefill or a step) fails the test."""
    def forward(*args, **kwargs):
        raise AssertionError("a forward ran before the prompt was refused")

    for name in ("forward", "prefill"):
        monkeypatch.setattr(pipe.runner, name, forward, raising=False)


@pytest.mark.parametrize("engine, words", [("native", ["cache_len=32", "larger cache_len="]),
                                            ("hf", ["max_position_embeddings", "256"])])
def test_a_prompt_longer_than_the_context_is_refused_before_any_forward(engine, words, monkeypatch):
    pipe = pipeline(engine=engine)
    no_forward(pipe, monkeypatch)
    length = 40 if engine == "native" else 260  # the tiny model's max_position_embeddings is 256
    with pytest.raises(SpecpipeError) as err:
        pipe.run([2 + i % 8 for i in range(length)], max_new_tokens=4)
    for word in [f"{length} tokens", "no room", *words]:
        assert word in str(err.value)


def test_a_prompt_that_fits_without_its_output_is_capped_with_a_warning():
    pipe = pipeline()
    with pytest.warns(ContextWarning, match=r"7 tokens and max_new_tokens=100.*at most 26 new tokens"):
        out = pipe.run(PROMPT, max_new_tokens=100, speculative=False)
    assert len(out.token_ids) == 26 and out.finish_reason == "length"  # 7 + 26 - 1 = 32 cache slots


def test_a_draft_with_a_shorter_context_is_the_bound():
    draft = tiny_model(3)
    draft.config.max_position_embeddings = 16
    pipe = pipeline(ModelDrafter(draft, SamplingParams(), engine="hf"))
    with pytest.raises(SpecpipeError, match="draft model's context is 16"):
        pipe.run(list(range(2, 20)), max_new_tokens=4)


PROPOSERS = {"medusa wide tree": lambda t: MedusaProposer(random_heads(0, scale=0.0), SamplingParams(), WIDE_TREE),
             "ngram": lambda t: NgramProposer(ngram_max=4, ngram_min=1),
             "draft": lambda t: ModelDrafter(t.model, SamplingParams(), engine="native", cache_len=32)}


@pytest.mark.parametrize("proposer", PROPOSERS)
def test_a_prompt_that_exactly_fits_decodes_to_the_last_slot(proposer):
    """prompt + max_new_tokens - 1 = cache_len: the last steps' verify blocks (a tree's nodes, a
    batch padded to its widest draft, a freed slot riding along) must not run past the cache."""
    target = tiny_target()
    plain = pipeline(target=target)
    requests = [Request(PROMPT, 26), Request([7, 8, 9, 10, 7, 8, 9, 10, 7, 8], 23), Request([44], 32),
                Request([5, 5, 5, 5], 29)]
    alone = [plain.run(r.prompt, max_new_tokens=r.max_new_tokens, speculative=False).token_ids for r in requests]
    spec = pipeline(PROPOSERS[proposer](target), target=target)
    assert spec.run(PROMPT, max_new_tokens=26).token_ids == alone[0]
    if spec.batch_refusal(spec.proposer):
        return  # a tree decodes one sequence at a time: nothing more to see in a batch
    tokens: list[list[int]] = [[] for _ in requests]
    for event in spec.serve(requests, concurrency=4):
        tokens[event.index] += event.tokens
    assert tokens == alone


def test_a_batch_names_every_prompt_that_does_not_fit_before_decoding(monkeypatch):
    pipe = pipeline(NgramProposer())
    no_forward(pipe, monkeypatch)
    with pytest.raises(SpecpipeError, match=r"2 of 3 prompts.*Prompt #2 \(40 tokens\), Prompt #3 \(33 tokens\)"):
        pipe.generate_batch([PROMPT, [3] * 40, [3] * 33], max_new_tokens=4)
    with pytest.warns(ContextWarning, match="Prompt #1"):
        outs = pipeline().generate_batch([PROMPT, [3, 4]], max_new_tokens=30, speculative=False)
    assert [len(o.token_ids) for o in outs] == [26, 30]


def test_check_fits_names_a_prompt_sets_ids_and_warns_once(tmp_path):
    path = tmp_path / "prompts.jsonl"
    records = [{"id": "short", "prompt": "w5 w6 w7"}, {"id": "long", "prompt": LONG}]
    path.write_text("\n".join(json.dumps(r) for r in records))
    pipe = pipeline()
    with pytest.raises(SpecpipeError, match=r"1 of 2 prompts.*cache_len=32.*Prompt 'long' \(40 tokens\)"):
        check_fits(pipe, load_prompts(str(path)), max_new_tokens=8)
    prompts = load_prompts(str(path))[:1]
    with pytest.warns(ContextWarning, match="Prompt 'short'.*at most 30 new tokens"):
        assert check_fits(pipe, prompts, max_new_tokens=64) == [30]
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        pipe.run(pipe.encode(prompts[0]["messages"]), max_new_tokens=64, speculative=False)
    assert not [w for w in seen if issubclass(w.category, ContextWarning)]  # its runs do not warn again


def test_an_empty_prompt_and_a_refusing_chat_template_are_user_errors():
    with pytest.raises(SpecpipeError, match="empty"):
        pipeline().run("", max_new_tokens=4)
    tok = tiny_tokenizer()
    tok.chat_template = ("{% for m in messages %}{% if m['role'] != 'user' %}{{ raise_exception('Unknown role: ' "
                         "+ m['role']) }}{% endif %}{{ m['content'] }} {% endfor %}")
    with pytest.raises(SpecpipeError, match="Unknown role: robot"):
        encode(tok, [{"role": "robot", "content": "w5"}], chat=True)
    tok.chat_template = "{{ messages[0].content.upper( }}"
    with pytest.raises(SpecpipeError, match="cannot be read"):
        encode(tok, "w5", chat=True)


def test_chat_template_tokens_count_in_the_fit():
    tok = tiny_tokenizer()
    tok.chat_template = "{% for m in messages %}w9 w9 w9 {{ m['content'] }} {% endfor %}"
    target = tiny_target()
    pipe = pipeline(target=LoadedModel("tiny", target.model, tok))
    assert pipe.chat
    with pytest.warns(ContextWarning, match=r"10 tokens \(after the chat template\)"):
        assert pipe.fit(pipe.encode(" ".join(["w5"] * 7)), 100) == 23


def test_cli_bench_refuses_a_prompt_longer_than_the_cache(tmp_path, model_dir):
    path = tmp_path / "prompts.jsonl"
    path.write_text(json.dumps({"id": "long", "prompt": LONG}) + "\n" + json.dumps({"id": "short", "prompt": "w5"}))
    result = specpipe("bench", f"prompts={path}", f"model={model_dir}", "cache_len=32", "max_new_tokens=4",
                      "warmup=0", f"out={tmp_path / 'out'}")
    assert_user_error(result, "40 tokens", "cache_len=32")


def test_cli_generate_warns_when_max_new_tokens_is_capped(model_dir, capsys):
    with pytest.warns(ContextWarning, match="at most 29 new tokens"):
        assert cli.main(["generate", f"model={model_dir}", "cache_len=32", "max_new_tokens=100", "baseline=false",
                         "prompt=w5 w6 w7 w8", "output=json"]) in (0, None)
    assert json.loads(capsys.readouterr().out)["new_tokens"] <= 29
