"""The cross-tokenizer draft keeps its drafting loop on the device and a step reads the host
ONCE, the verdict's copy, greedy or sampled: a drafted token's target id is a table lookup on
the device, and the draft's own cache learns what it keeps from the verdict's accepted target
ids (one draft id each), never from a read of its drafted ids. Counted on the CPU and on a
simulated GPU (tests/cuda_sim.py), where the controller's early stop is a mask on the device
and what was drafted past it is cropped; each greedy run is also checked against plain
decoding, on the same run that was counted.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

from cuda_sim import simulated_cuda
from specpipe.controllers.confidence import ConfidenceGamma
from specpipe.controllers.fixed import FixedGamma
from specpipe.decode.loop import Decoder
from specpipe.decode.syncs import host_reads, reads_per_step
from specpipe.engine import make_runner
from specpipe.pipeline import Pipeline, Request
from specpipe.proposers.cross_tokenizer import CrossDrafter
from specpipe.sampling import SamplingParams
from specpipe.verifiers.greedy import GreedyVerifier
from specpipe.verifiers.rejection import RejectionVerifier
from test_cross_tokenizer import PROMPTS, pair  # noqa: F401 (pair: a fixture, built anew for this module)

GREEDY, SAMPLED = SamplingParams(temperature=0.0), SamplingParams(temperature=0.8, top_k=20)
TOKENS = 24
CONTROLLERS = {"fixed": lambda: FixedGamma(4), "confidence": lambda: ConfidenceGamma(5, gamma_max=5, threshold=0.5)}


def one_read() -> int:
    """What one `.tolist()` counts as: 1, or 2 under the simulation (its mode sees the counted
    call again), so the test counts in reads whatever the device."""
    with host_reads() as seen:
        torch.zeros(1).tolist()
    return len(seen)


def counted(pipe: Pipeline, prompt: str) -> tuple[list[int], list[int], int]:
    """Decode `prompt` alone: (host reads of each step, the tokens emitted, tokens drafted)."""
    decoder, events = Decoder(pipe, 1), []
    run = decoder.run
    decoder.run = lambda requests: (events.append(event) or event for event in run(requests))
    reads = reads_per_step(decoder, [Request(prompt, TOKENS)])
    return reads, [token for event in events for token in event.tokens], events[-1].stats.drafted


@pytest.mark.parametrize("controller", list(CONTROLLERS))
@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
@pytest.mark.parametrize("device", ["cpu", "cuda"])  # cuda: simulated
def test_a_cross_tokenizer_step_reads_the_host_once(pair, device, sampling, controller):  # noqa: F811
    if device == "cpu" and controller == "confidence":
        pytest.skip("on the CPU an early stop is read each position, where reading is free (`still_drafting`)")
    target, drafts = pair
    model, tokenizer = drafts["permuted"]
    verifier = GreedyVerifier() if sampling.greedy else RejectionVerifier(sampling)
    with simulated_cuda() if device == "cuda" else contextlib.nullcontext([]) as refused:
        unit = one_read()
        translate = "shared" if device == "cpu" else "auto"  # auto: shared on a GPU, text on the CPU (a free read)
        pipe = Pipeline(target, CrossDrafter(model, sampling, target.tokenizer, tokenizer, device=device,
                                             translate=translate), verifier,
                        CONTROLLERS[controller](), sampling, runner=make_runner(target.model, device=device))
        runs = [counted(pipe, prompt) for prompt in PROMPTS]
        plain = [pipe.run(prompt, max_new_tokens=TOKENS, speculative=False).token_ids for prompt in PROMPTS]
    assert refused == []
    reads = [count / unit for steps, _, _ in runs for count in steps]
    assert len(reads) > 2 and max(reads) == 1, reads  # the verdict's copy, and nothing else
    assert sum(drafted for _, _, drafted in runs) > 0  # it really drafted
    if sampling.greedy:
        assert [tokens for _, tokens, _ in runs] == plain


def test_translating_the_text_reads_the_drafted_ids_once_more(pair):  # noqa: F811
    """`translate="text"` (universal assisted generation) reads the drafted ids before the
    target's forward, their text going through both tokenizers on the host: two reads a step,
    never one a drafted token."""
    target, drafts = pair
    model, tokenizer = drafts["permuted"]
    proposer = CrossDrafter(model, GREEDY, target.tokenizer, tokenizer, translate="text")
    pipe = Pipeline(target, proposer, GreedyVerifier(), FixedGamma(4), GREEDY)
    runs = [counted(pipe, prompt) for prompt in PROMPTS]
    reads = [count for steps, _, drafted in runs for count in steps]
    assert max(reads) == 2 and sum(drafted for _, _, drafted in runs) > 0, reads
    assert [tokens for _, tokens, _ in runs] == [pipe.run(p, max_new_tokens=TOKENS, speculative=False).token_ids
                                                for p in PROMPTS]


def test_auto_translates_the_text_on_the_cpu_and_keeps_the_shared_tokens_on_a_gpu(pair):  # noqa: F811
    """`translate="auto"`: the second read is free on the CPU, where the text reaches more target
    tokens; on a (simulated) GPU a read is a sync, so the shared tokens' table."""
    from specpipe.proposers.cross_tokenizer import translation

    target, drafts = pair
    model, tokenizer = drafts["permuted"]
    assert CrossDrafter(model, GREEDY, target.tokenizer, tokenizer).text  # the default, on the CPU
    assert not CrossDrafter(model, SAMPLED, target.tokenizer, tokenizer).text  # sampling: always shared
    assert translation("auto", torch.device("cpu")) == "text"
    assert translation("auto", torch.device("cuda")) == "shared"
    assert translation("shared", torch.device("cpu")) == "shared"
