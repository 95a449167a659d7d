"""Overlapped plain decoding (decode/loop.py): each plain step is queued before the last one's
verdict is read, fed from that verdict on the device, and decodes exactly what the sequential
loop decodes: the same tokens, text and finish reason for every request, alone or in a batch
whose rows stop at different steps (EOS, budgets, stop strings) and whose freed slots take new
requests, greedy and sampled, eager and static steps. Tiny float64 models, exact equality.
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
    # speculative decoding drafts from the tokens the host reads: only a plain decoder overlaps
    target = tiny_target(seed=0, eos=EOS)
    pipe = Pipeline(target, NgramProposer(4, 1), GreedyVerifier(), FixedGamma(3), overlap="on")
    assert not Decoder(pipe, 1).overlap and Decoder(pipe, 1, speculative=False).overlap
