"""Overlapped plain decoding (decode/loop.py): each plain step is queued before the last one's
verdict is read, fed from that verdict on the device, and decodes exactly what the sequential
loop decodes: the same tokens, text and finish reason for every request, alone or in a batch
whose rows stop at different steps (EOS, budgets, stop strings) and whose freed slots take new
requests, greedy and sampled, eager and static steps. In a speculative pipeline, the plain
steps its controller holds whatever the step in flight shows (the guard's pauses, a schedule's
γ 0) are queued the same way, and the controller decides the same γ at every step. Tiny
float64 models, exact equality.
"""

from __future__ import annotations

import pytest
import torch

from conftest import PROMPT, tiny_target
from specpipe.controllers.fixed import FixedGamma
from specpipe.decode.loop import Decoder, Request, overlaps
from specpipe.decode.syncs import per_step
from specpipe.engine import make_runner
from specpipe.pipeline import Pipeline
from specpipe.proposers.ngram import NgramProposer
from specpipe.sampling import SamplingParams
from specpipe.types import StepTiming
from specpipe.verifiers.greedy import GreedyVerifier
from specpipe.verifiers.rejection import RejectionVerifier
from test_batch import EOS, requests

SAMPLED = SamplingParams(temperature=1.0)
# on a GPU the overlapped step really runs ahead of the host: what these tests check there
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"))]


def plain(overlap: str, graphs: str = "off", sampling: SamplingParams = SamplingParams(),
          device: str = "cpu") -> Pipeline:
    target = tiny_target(seed=0, eos=EOS)
    verifier = RejectionVerifier(sampling) if sampling.temperature else GreedyVerifier()
    runner = make_runner(target.model, graphs=graphs, device=device)
    return Pipeline(target, None, verifier, None, sampling, runner=runner, overlap=overlap)


def served(pipe: Pipeline, reqs: list[Request], concurrency: int) -> list[tuple]:
    """Each request's (tokens, text, finish reason), from the event stream."""
    tokens = {i: [] for i in range(len(reqs))}
    text = {i: "" for i in range(len(reqs))}
    reasons = {}
    for event in pipe.serve(reqs, concurrency=concurrency, speculative=False):
        assert event.index not in reasons, "a finished request emitted again"
        tokens[event.index] += event.tokens
        text[event.index] += event.text
        if event.finish_reason is not None:
            reasons[event.index] = event.finish_reason
    return [(tokens[i], text[i], reasons[i]) for i in range(len(reqs))]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("graphs", ["off", "on"])
@pytest.mark.parametrize("stop", [(), ("w32", "w18 w49")])
def test_overlapped_rows_decode_what_the_sequential_loop_decodes(graphs, stop, device):
    reqs = requests(stop)
    sequential = served(plain("off", graphs, device=device), reqs, 1)
    reasons = [reason for _, _, reason in sequential]
    # rows stop on a token and on their budget
    assert {"stop_string" if stop else "eos", "length"} <= set(reasons), reasons
    overlapped = plain("on", graphs, device=device)
    assert Decoder(overlapped, 1, speculative=False).overlap
    for concurrency in (1, 2, 3, 8):  # freed slots take new requests while a step is queued
        assert served(overlapped, reqs, concurrency) == sequential, concurrency


@pytest.mark.parametrize("device", DEVICES)
def test_overlapped_sampled_rows_draw_what_the_sequential_loop_draws(device):
    """Each row's draws are seeded by its request and step, so queuing a step early changes none."""
    reqs = [Request(PROMPT, 20, seed=s) for s in range(6)]
    sequential = served(plain("off", sampling=SAMPLED, device=device), reqs, 3)
    assert len({tuple(tokens) for tokens, _, _ in sequential}) > 3  # different seeds, different samples
    overlapped = plain("on", "on", SAMPLED, device)
    assert served(overlapped, reqs, 3) == served(plain("off", "on", SAMPLED, device), reqs, 3)
    assert served(plain("on", sampling=SAMPLED, device=device), reqs, 3) == sequential
    assert served(plain("on", sampling=SAMPLED, device=device), reqs, 2) == sequential


def test_each_step_is_queued_before_the_last_is_read():
    """The order of the loop's calls: launch 1, launch 2, read 1, launch 3, read 2, ...; a request
    that stops on its budget has no step dropped, one that stops on EOS has one (sequentially, none)."""
    cases = [("on", [3, 60, 22], 12, "length", 12), ("on", PROMPT, 60, "eos", 13), ("off", PROMPT, 60, "eos", 12)]
    for overlap, prompt, budget, reason, steps in cases:
        decoder = Decoder(plain(overlap), 1, speculative=False)
        calls = []
        launch, settle = decoder._launch, decoder._settle

        def launched(*args, launch=launch, calls=calls):
            step = launch(*args)
            calls.append(("launch", step))
            return step

        def settled(step, settle=settle, calls=calls):
            calls.append(("read", step))
            return settle(step)

        decoder._launch, decoder._settle = launched, settled
        events = list(decoder.run([Request(prompt, budget)]))
        launches = [step for kind, step in calls if kind == "launch"]
        expected = []
        for i, step in enumerate(launches):
            expected.append(("launch", step))
            if overlap == "off" or i:
                expected.append(("read", step if overlap == "off" else launches[i - 1]))
        if overlap == "on":
            expected.append(("read", launches[-1]))
        assert calls == expected, overlap
        assert events[-1].finish_reason == reason and len(launches) == steps
        assert sum(len(event.tokens) for event in events) == 12


def test_an_overlapped_step_reads_the_host_once():
    pipe = plain("on", graphs="on")
    counts = per_step(Decoder(pipe, 2, speculative=False), [Request(PROMPT, 9), Request([3, 60, 22], 6)])
    assert len(counts) >= 9 and [count.reads for count in counts] == [1] * len(counts)


def test_overlap_is_on_where_the_device_runs_asynchronously():
    assert overlaps("auto", "cuda") and not overlaps("auto", "cpu")
    assert overlaps("on", "cpu") and not overlaps("off", "cuda")
    # a speculative step drafts from the tokens the host reads: a controller that does not know
    # the next γ before the step in flight is read (every one but the guard's pause) never overlaps
    target = tiny_target(seed=0, eos=EOS)
    pipe = Pipeline(target, NgramProposer(4, 1), GreedyVerifier(), FixedGamma(3), overlap="on")
    decoder = Decoder(pipe, 1)
    launch, ahead = decoder._launch, []
    decoder._launch = lambda busy, pending=None: ahead.append(pending) or launch(busy, pending)
    assert list(decoder.run([Request(PROMPT, 30)])) and ahead and not any(ahead)
    assert pipe.controller.overlapped  # the guard prices plain steps as queued ahead
    pipe.overlap = "off"
    assert not Decoder(pipe, 1).overlap and not pipe.controller.overlapped


def test_rows_the_guard_holds_are_queued_ahead_and_decide_as_read_step_by_step(monkeypatch):
    """Speculation that does not pay (scripted timings: a draft token costs half a plain step,
    an unrelated draft model): the guard pauses the rows, and their held steps are queued before
    the last is read. The guard is asked in the same order either way, so it decides the same
    γ at every step; every row is the plain target's output. Rows stop on EOS while held, and a
    finished row's slot takes the next request only once the step queued after its last is read
    (the proposer's commit of that step comes before the new request's prefill)."""
    from test_guard import ScriptedClock, scripted  # noqa: F401 (the fixture's clock)
    from specpipe.controllers.guard import Guard
    from specpipe.proposers.model_drafter import ModelDrafter
    from conftest import tiny_model

    monkeypatch.setattr("specpipe.decode.step.Clock", ScriptedClock)
    prompts = [PROMPT, [62, 54, 21], [3, 60, 22], [28, 21], [58, 44, 4], [30, 62], [12, 40]]  # EOS at 12-46
    runs = {}
    for overlap in ("off", "on"):
        target = tiny_target(seed=0, eos=EOS)
        pipe = Pipeline(target, ModelDrafter(tiny_model(seed=7, layers=1), SamplingParams()), GreedyVerifier(),
                        Guard(FixedGamma(4)), overlap=overlap)
        forward = pipe.runner.forward

        def measured(block, forward=forward, **kwargs):
            ScriptedClock.width = block.shape[1]
            return forward(block, **kwargs)

        pipe.runner.forward = measured
        decoder = Decoder(pipe, 2)
        launch, ahead = decoder._launch, []

        def launched(busy, pending=None, launch=launch, ahead=ahead):
            ahead.append(pending is not None)
            return launch(busy, pending)

        settle, admit, unread = decoder._settle, decoder._admit, []

        def settled(step, settle=settle, unread=unread):
            unread.remove(step)
            return settle(step)

        def admitted(slot, *args, admit=admit, unread=unread):
            assert not any(step.rows[slot].done for step in unread if slot < len(step.rows) and step.rows[slot])
            return admit(slot, *args)

        def launched_(*args, launched=launched, unread=unread):
            step = launched(*args)
            unread.append(step)
            return step

        decoder._launch, decoder._settle, decoder._admit = launched_, settled, admitted
        traces = {i: ([], [], 0) for i in range(len(prompts))}
        for event in decoder.run([Request(p, 60) for p in prompts]):
            tokens, gammas, held = traces[event.index]
            traces[event.index] = (tokens + event.tokens, gammas + [event.gamma], held + event.held)
        runs[overlap] = (traces, sum(ahead))
        alone = [pipe.run(p, max_new_tokens=60, speculative=False).token_ids for p in prompts]
        assert [traces[i][0] for i in range(len(prompts))] == alone
        assert sum(tokens[-1] == EOS for tokens in alone) >= 4
    assert runs["on"][0] == runs["off"][0]  # the same tokens, γ and holds at every step
    assert runs["off"][1] == 0 and runs["on"][1] > 100, runs["on"][1]  # 151 batch steps queued ahead
    assert sum(held for _, _, held in runs["on"][0].values()) > 200  # 261 of 269 row steps held


@pytest.mark.parametrize("overlap", ["on", "off"])
def test_a_speculative_steps_events_wait_until_the_next_step_is_queued(overlap):
    """Overlapped, a step's text and events (the consumer's work too) come after the next step
    is launched, before it is read, so they run beside the device's step; a finished request's
    last event comes before the next request's prefill. Off (a synchronous device: nothing to
    overlap), each step's events come before the next launch. Tokens are the plain target's."""
    target = tiny_target(seed=0, eos=EOS)
    pipe = Pipeline(target, NgramProposer(4, 1), GreedyVerifier(), FixedGamma(3), overlap=overlap)
    reqs = [Request(PROMPT, 20), Request([3, 60, 22], 20)]
    alone = [pipe.run(r.prompt, max_new_tokens=r.max_new_tokens, speculative=False).token_ids for r in reqs]
    decoder = Decoder(pipe, 1)
    calls, out = [], {0: [], 1: []}
    for name in ("_launch", "_settle", "_admit"):
        method = getattr(decoder, name)
        setattr(decoder, name, lambda *args, method=method, name=name: calls.append(name) or method(*args))
    for event in decoder.run(reqs):
        calls.append("end" if event.finish_reason else "event")
        out[event.index] += event.tokens
    assert [out[0], out[1]] == alone
    steps = [calls.count("_launch") - calls[calls.index("end"):].count("_launch"), None]
    steps[1] = calls.count("_launch") - steps[0]
    if overlap == "on":
        one, other = (["_launch", "_settle"] + ["_launch", "event", "_settle"] * (n - 1) + ["end"] for n in steps)
    else:
        one, other = (["_launch", "_settle", "event"] * (n - 1) + ["_launch", "_settle", "end"] for n in steps)
    assert calls == ["_admit", *one, "_admit", *other] and min(steps) > 2, calls


def test_an_interrupted_launch_still_delivers_the_settled_steps_events():
    """Overlapped, a step's events wait for the next launch; if that launch raises (an interrupt,
    a device error), they are yielded first, then the error: nothing decoded is lost."""
    target = tiny_target(seed=0, eos=EOS)
    pipe = Pipeline(target, NgramProposer(4, 1), GreedyVerifier(), FixedGamma(3), overlap="on")
    decoder = Decoder(pipe, 1)
    launch, launches = decoder._launch, []

    def interrupted(*args):
        launches.append(None)
        if len(launches) == 4:
            raise KeyboardInterrupt
        return launch(*args)

    decoder._launch = interrupted
    got = []
    with pytest.raises(KeyboardInterrupt):
        for event in decoder.run([Request(PROMPT, 30)]):
            got += event.tokens
    plain = pipe.run(PROMPT, max_new_tokens=30, speculative=False).token_ids
    assert len(got) >= 3 and got == plain[: len(got)]
    assert len(got) == sum(step.emitted for step in decoder.steps)  # every settled step's tokens


def test_streamed_text_is_the_same_however_tokens_are_grouped_into_steps():
    """Overlapped and sequential loops (and the guard's pauses) group tokens into steps
    differently: the text streamed must not depend on it. A skipped special token pushed alone
    leaves the window where it was, so the next token is decoded in context (its space)."""
    from conftest import tiny_tokenizer
    from specpipe.decode.text import TextStream

    tokenizer = tiny_tokenizer(EOS)
    ids = [49, 46, 46, 0, 32, 18, 0, 0, 7]  # 0: a special token, skipped in text
    whole = tokenizer.decode(ids, skip_special_tokens=True)
    for cuts in ([2, 3, 4, 5, 6, 7, 8], [2, 3, 5], [1, 4, 6, 8], list(range(1, len(ids)))):
        stream, text = TextStream(tokenizer), ""
        for start, end in zip([0, *cuts], [*cuts, len(ids)]):
            text += stream.push(ids[start:end], final=end == len(ids))
        assert text == whole, cuts


class HostClock:
    """Scripted step timings: every step's device time is a plain step's; a step not queued
    ahead waits 0.3 of one for the host's work between steps (the decoder's `_launch` sets
    `queued` before it starts the step's clock)."""

    queued = False
    end = None

    def __init__(self, device, since=None):
        self.host_s = 0.0 if HostClock.queued else 0.003

    def mark(self) -> None:
        pass

    def timing(self) -> StepTiming:
        return StepTiming(0.0, 0.010, host_s=self.host_s)


def test_rows_whose_lookups_keep_missing_are_paused_and_queued_ahead(monkeypatch):
    """A lookup that finds nothing leaves a plain step that is read before the next is queued:
    where plain steps are queued ahead it costs the host's time on top, so the guard pauses the
    rows whose lookups keep missing (a 64-gram never recurs in these short requests) and their
    held steps are queued ahead. Read step by step, a miss costs a plain step and nothing is
    paused. Every row is the plain target's either way."""
    from specpipe.controllers.guard import Guard

    monkeypatch.setattr("specpipe.decode.step.Clock", HostClock)
    reqs = requests()
    ahead = {}
    for overlap in ("off", "on"):
        target = tiny_target(seed=0, eos=EOS)
        pipe = Pipeline(target, NgramProposer(64, 64), GreedyVerifier(), Guard(FixedGamma(4)), overlap=overlap)
        alone = [pipe.run(r.prompt, max_new_tokens=r.max_new_tokens, speculative=False).token_ids for r in reqs]
        decoder = Decoder(pipe, 2)
        launch, queued = decoder._launch, []

        def launched(busy, pending=None, launch=launch, queued=queued):
            HostClock.queued = pending is not None
            queued.append(HostClock.queued)
            return launch(busy, pending)

        decoder._launch = launched
        out, held = {i: [] for i in range(len(reqs))}, 0
        for event in decoder.run(reqs):
            out[event.index] += event.tokens
            held += event.held
        assert [out[i] for i in range(len(reqs))] == alone
        ahead[overlap] = (sum(queued), len(queued), held)
    assert ahead["off"][0] == 0 and ahead["off"][2] <= len(reqs)  # each request's first-step probe only
    queued, steps, held = ahead["on"]
    assert queued > steps // 2 and held > steps // 2, ahead["on"]


def test_a_batch_size_scheduled_plain_is_queued_ahead_and_drafts_again_below_it():
    """`batch_schedule={2: 0}`: steps of two or more rows are plain whatever a step shows, so
    they are queued ahead; a row alone speculates again. Every row is the plain target's."""
    target = tiny_target(seed=0, eos=EOS)
    controller = FixedGamma(3)
    controller.schedule = {2: 0}
    pipe = Pipeline(target, NgramProposer(4, 1), GreedyVerifier(), controller, overlap="on")
    reqs = requests()
    alone = [pipe.run(r.prompt, max_new_tokens=r.max_new_tokens, speculative=False).token_ids for r in reqs]
    decoder = Decoder(pipe, 2)
    launch, ahead = decoder._launch, []
    decoder._launch = lambda busy, pending=None: ahead.append((len(busy), pending is not None)) or launch(busy, pending)
    out = {i: [] for i in range(len(reqs))}
    drafted = 0
    for event in decoder.run(reqs):
        out[event.index] += event.tokens
        drafted += event.gamma
    assert [out[i] for i in range(len(reqs))] == alone
    assert sum(queued for _, queued in ahead) > 20 and all(rows == 2 for rows, queued in ahead if queued)
    assert drafted > 0  # the last request, alone, drafts


def test_the_guard_holds_a_batch_size_it_paused():
    """The batch size's own pause (speculation at that size did not pay), as the guard keeps it:
    held whatever the step in flight shows while more than one held step is left to wait."""
    from specpipe.controllers.guard import Guard, RowGuard

    guard = Guard(FixedGamma(3))
    for slot in range(4):
        guard.admit(slot)
    guard._sizes[4] = RowGuard(paused=True, wait=3, size=True)
    assert guard.holds([0, 1, 2, 3], 4) and not guard.holds([0, 1], 2)
    guard._sizes[4].wait = 1  # the step in flight may be the last held one: the next may be a trial
    assert not guard.holds([0, 1, 2, 3], 4)


def test_an_unknown_overlap_is_refused_in_one_sentence():
    from specpipe.checks.validate import check_settings
    from specpipe.config import compose

    assert check_settings(compose(["overlap=on"])).status == "ok"
    check = check_settings(compose(["overlap=sometimes"]))
    assert check.status == "refuse" and "overlap=sometimes is not a choice (use one of auto, on, off" in check.why


def test_check_names_the_overlap_where_it_is_on():
    from specpipe.checks.target import check_engine
    from specpipe.config import compose
    from specpipe.settings import resolve

    def named(overrides: list[str]) -> list[str]:
        return [c.why for c in check_engine(resolve(compose(["proposer=ngram", *overrides]), fetch=False))
                if c.name == "overlap"]

    assert named([]) == [] and named(["overlap=off"]) == []  # the CPU's default: steps read one by one
    (why,) = named(["overlap=on"])
    assert "queued on the device before the last one's tokens are read" in why and "nothing to gain" in why
