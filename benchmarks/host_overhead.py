"""A plain decode step's host cost: ms a step of plain greedy decoding on a tiny random Llama
(2 layers, hidden 32), whose forward is small enough that the step's Python and tensor
operations around it show. On a GPU each of those operations is a launch besides the target's
graph, so what this measures on the CPU is what a GPU step pays beside its kernels.

    python benchmarks/host_overhead.py --tokens 200 --repeats 7

Prints, for eager steps (`graphs=off`) and static steps (`graphs=on`), the best and median ms
a step over the repeats, and the eager forward alone. Then, for graphed steps of plain, ngram
and suffix decoding (γ 4, a repeating prompt), the host ms a step outside the graphed
computations (the step's wall time less the time inside `Graphs.run`), and the median span
from a step's read of its verdict to the next step's first replay: on a GPU the device waits
through that span (the commit, the tokens' emission, the proposer's search, the buffers'
fill). Plain decoding is measured both ways: `overlap=off`, and `overlap=on` (a GPU's
default), where each step is queued before the last is read, so no replay waits for a read
(the span is not measured: the device waits only where a step's kernels take less than the
host's time a step). Speculative steps run with `overlap=on`, as on a GPU: their text and
events wait for the next launch. `--real STRATEGY` adds the same span on a real model (its
tokenizer's text, its proposer's search or heads; 48 tokens of three dev prompts, `graphs=on`,
`overlap=on`), e.g. `--real "recipe=recipes/smollm2-135m model.quantize=bf16"`. One thread;
run it alone on the machine.
"""

from __future__ import annotations

import argparse
import statistics
import time
from contextlib import contextmanager
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from specpipe.controllers.fixed import FixedGamma
from specpipe.engine import make_runner
from specpipe.engine.graphs import Graphs
from specpipe.models.loader import LoadedModel
from specpipe.pipeline import Pipeline
from specpipe.proposers.ngram import NgramProposer
from specpipe.proposers.suffix import build as suffix
from specpipe.types import HostCopy
from specpipe.verifiers.greedy import GreedyVerifier

PROMPT = [5, 6, 7, 8, 9, 10, 11, 12]


def tiny() -> LoadedModel:
    """A random 2-layer Llama of vocabulary 64, no end-of-sequence token to stop it."""
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    model = LlamaForCausalLM(config).eval()
    model.generation_config.eos_token_id = None
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(Path(__file__).parent / "shapes" / "tiny-tokenizer.json"))
    return LoadedModel("tiny", model, tokenizer)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--real", action="append", default=[], metavar="STRATEGY",
                        help="also the read-to-replay span on a real model, e.g. "
                             "'recipe=recipes/smollm2-135m model.quantize=bf16' (repeatable; needs the model)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    target = tiny()
    for graphs in ("off", "on"):
        pipe = Pipeline(target, None, GreedyVerifier(), None, runner=make_runner(target.model, graphs=graphs))
        pipe.run(PROMPT, max_new_tokens=50, speculative=False)  # warm-up
        per_step = []
        for _ in range(args.repeats):
            stats = pipe.run(PROMPT, max_new_tokens=args.tokens, speculative=False).stats
            per_step.append(stats.decode_s / stats.steps * 1000)
        print(f"graphs={graphs}: {min(per_step):.3f} ms a step (median {statistics.median(per_step):.3f}, "
              f"{stats.steps} steps)")
    runner = make_runner(target.model, graphs="off")
    runner.prefill(0, PROMPT)
    block = torch.tensor([[5]])
    started = time.perf_counter()
    for _ in range(args.tokens):
        runner.forward(block)
        runner.commit([1])
    print(f"the eager forward alone: {(time.perf_counter() - started) / args.tokens * 1000:.3f} ms")
    # speculative steps as on a GPU (overlap on): their text and events wait for the next launch
    for name, proposer, overlap in (("plain", None, "off"), ("plain", None, "on"), ("ngram", NgramProposer(), "on"),
                                    ("suffix", suffix(context=None), "on")):
        best, median, steps, span = outside_graphs(target, proposer, args, overlap)
        print(f"{name}, graphs=on, overlap={overlap}: {best:.3f} ms a step outside graphs (median {median:.3f}, "
              f"{steps} steps); " + ("queued before the last step's read" if span is None else
                                     f"{span:.3f} ms from the verdict's read to the next replay (median)"))
    real_spans(args.real, 48)


def outside_graphs(target: LoadedModel, proposer, args, overlap: str) -> tuple[float, float, int, float | None]:
    """(best, median) host ms a step outside `Graphs.run` over the repeats, the steps, and the
    median ms from a verdict's read (`HostCopy.rows`) to the next `Graphs.run` (None overlapped)."""
    pipe = Pipeline(target, proposer, GreedyVerifier(), FixedGamma(4) if proposer else None,
                    runner=make_runner(target.model, graphs="on"), overlap=overlap)
    prompt = PROMPT * 4  # repeats: the proposers find matches
    with timed_graphs() as (inside, read, spans):
        pipe.run(prompt, max_new_tokens=50)  # warm-up
        per_step = []
        spans.clear()
        for _ in range(args.repeats):
            inside[0], read[0] = 0.0, None
            started = time.perf_counter()
            stats = pipe.run(prompt, max_new_tokens=args.tokens).stats
            per_step.append((time.perf_counter() - started - inside[0]) / stats.steps * 1000)
    # plain steps overlapped: a read is followed by the replay of a step queued before it (no gap)
    span = None if overlap == "on" and proposer is None else statistics.median(spans) * 1000
    return min(per_step), statistics.median(per_step), stats.steps, span


def real_spans(strategies: list[str], tokens: int) -> None:
    """The median span from a verdict's read to the next replay on the real model of each
    strategy (its own tokenizer's text, its proposer's search or heads), over three dev prompts."""
    from specpipe.config import compose
    from specpipe.prompts import load_prompts

    messages = [prompt["messages"] for prompt in load_prompts("dev")[:3]]
    for strategy in strategies:
        pipe = Pipeline.from_config(compose([*strategy.split(), "graphs=on", "overlap=on"]))
        if pipe.proposer is None:  # overlapped plain steps: a read is followed by a step queued before it
            print(f"{strategy}: every step queued before the last's read")
            continue
        pipe.run(messages[0], max_new_tokens=8)  # warm-up: the graphs' first forward
        with timed_graphs() as (_, read, spans):
            spans.clear()
            steps = 0
            for message in messages:
                read[0] = None
                steps += pipe.run(message, max_new_tokens=tokens).stats.steps
        print(f"{strategy}: {statistics.median(spans) * 1000:.3f} ms from the verdict's read to the next replay "
              f"(median, {steps} steps)")


@contextmanager
def timed_graphs():
    """Hooks on `Graphs.run` and `HostCopy.rows`: yields ([seconds inside graphs], [the last
    read's time or None], [spans from a read to the next replay])."""
    inside, read, spans = [0.0], [None], []
    run, rows = Graphs.run, HostCopy.rows

    def timed(graphs, key, compute):
        started = time.perf_counter()
        if read[0] is not None:
            spans.append(started - read[0])
            read[0] = None
        try:
            return run(graphs, key, compute)
        finally:
            inside[0] += time.perf_counter() - started

    def reading(copy):
        host = rows(copy)
        read[0] = time.perf_counter()
        return host

    Graphs.run, HostCopy.rows = timed, reading
    try:
        yield inside, read, spans
    finally:
        Graphs.run, HostCopy.rows = run, rows


if __name__ == "__main__":
    main()
