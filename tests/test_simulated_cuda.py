"""`device=cuda` on a simulated CUDA device (tests/cuda_sim.py): the GPU code paths run here.

A GPU refuses an operation that mixes host and device tensors or runs a CPU-only kernel, and
such a bug shows only on a GPU (the first GPU run of this project crashed on fbgemm's fp16
packing of a head's LM-head rows). The simulation runs the code's GPU
branches on the CPU, with every tensor tagged by where a GPU would hold it, and records each
operation a GPU would refuse. Every proposer, verifier and step (eager and static) runs here
with `device=cuda`, the shipped recipes too, and none is refused; each greedy output is the
pipeline's own plain output (a float64 tiny model keeps exact in every step).
"""

from __future__ import annotations

import pytest
import torch

from conftest import PROMPT, tiny_model, tiny_target
from cuda_sim import on_device, simulated_cuda
from specpipe.controllers.fixed import FixedGamma
from specpipe.engine import make_runner
from specpipe.pipeline import Pipeline
from specpipe.proposers.eagle import TreeShape
from specpipe.proposers.medusa import MedusaProposer
from specpipe.proposers.model_drafter import ModelDrafter
from specpipe.proposers.ngram import NgramProposer
from specpipe.proposers.suffix import RequestCache, SuffixProposer
from specpipe.sampling import SamplingParams
from specpipe.verifiers.greedy import GreedyVerifier
from specpipe.verifiers.rejection import RejectionVerifier
from specpipe.verifiers.typical import TypicalVerifier
from test_medusa import random_heads
from test_static import GREEDY, REPEATING, eagle_heads

SAMPLED = SamplingParams(temperature=0.8, top_p=0.9)
PROMPTS = [REPEATING, PROMPT, [3, 60, 22]]


def test_the_simulation_refuses_what_a_gpu_refuses_and_passes_what_it_takes():
    with simulated_cuda() as refused:
        device, host = torch.zeros(3, device="cuda"), torch.arange(3)
        assert device.device == torch.device("cuda", 0) and host.device.type == "cpu" and torch.cuda.is_available()
        assert torch.empty(2, device="meta").device.type == "meta"  # (transformers builds models on meta first)
        moved = torch.nn.Linear(3, 2).to("cuda")
        assert on_device(moved.weight) and on_device(moved(device)) and not on_device(host)
        takes = [device[host], device * torch.tensor(2.0), device.cpu() + host, host.to(device.device) + device,
                 torch.zeros(2, device=device.device) + 1, device.new_zeros(2).copy_(host[:2])]
        assert [on_device(t) for t in takes] == [True, True, False, True, True, True]
        generator = torch.Generator(device.device)
        assert generator.device.type == "cuda"
        torch.empty_like(device).exponential_(1, generator=generator.manual_seed(0))
        assert refused == []
        device + host
        host[device.long()]
        torch.empty_like(device).exponential_(1, generator=torch.Generator().manual_seed(0))
        torch.cat([device, torch.tensor(1.0)[None]])
        torch.ops.quantized.linear_prepack_fp16(moved.weight, None)
    assert [why.split(": ", 1)[1] for why in refused] == [
        "mixes host tensors [(3,)] with device tensors", "indexes a host tensor by device indices",
        "draws into a device tensor from a host generator", "mixes host tensors [(1,)] with device tensors",
        "a CPU-only kernel on device tensors"]


def cases():
    """(name, target, proposer maker, verifier maker, sampling, runner options) of every proposer kind."""
    from test_eagle3 import target4

    target, head_target = tiny_target(seed=0), target4()
    yield "ngram", target, lambda _: NgramProposer(), GreedyVerifier, GREEDY, {}
    yield "suffix", target, lambda _: SuffixProposer(RequestCache(8, 16, 4096)), GreedyVerifier, GREEDY, {}
    yield "draft", target, lambda graphs: ModelDrafter(tiny_model(seed=0), GREEDY, device="cuda", graphs=graphs), \
        GreedyVerifier, GREEDY, {}
    yield "draft-sampled", target, \
        lambda graphs: ModelDrafter(tiny_model(seed=0), SAMPLED, device="cuda", graphs=graphs), \
        lambda: RejectionVerifier(SAMPLED), SAMPLED, {}
    yield "medusa", target, lambda _: MedusaProposer(random_heads(seed=1), GREEDY), GreedyVerifier, GREEDY, {}
    yield "medusa-typical", target, lambda _: MedusaProposer(random_heads(seed=1), SAMPLED), \
        lambda: TypicalVerifier(SAMPLED), SAMPLED, {}
    for name, make in eagle_heads().items():
        yield name, head_target, lambda _, make=make: make(), GreedyVerifier, GREEDY, {}
    for name, make in eagle_heads(sampling=SAMPLED).items():
        yield f"{name}-sampled", head_target, lambda _, make=make: make(), lambda: RejectionVerifier(SAMPLED), \
            SAMPLED, {}
    for name, make in eagle_heads(TreeShape(3, 8)).items():
        yield f"{name}-tree", head_target, lambda _, make=make: make(), GreedyVerifier, GREEDY, {"kernels": "fast"}


CASES = {case[0]: case for case in cases()}


@pytest.mark.parametrize("graphs", ["off", "on"])
@pytest.mark.parametrize("name", list(CASES))
def test_every_proposer_runs_on_a_simulated_gpu_without_mixing_host_and_device(name, graphs):
    """One sequence and a batch, eager and static steps (graphs: the static step's code, run
    eagerly here): no operation a GPU would refuse, every tensor of the step on the device, and
    greedy output equal to the pipeline's plain output."""
    _, target, proposer, verifier, sampling, options = CASES[name]
    with simulated_cuda() as refused:
        pipe = Pipeline(target, proposer(graphs), verifier(), FixedGamma(3), sampling=sampling,
                        runner=make_runner(target.model, device="cuda", graphs=graphs, **options))
        assert on_device(pipe.runner.cache.keys[0]) and pipe.runner.step == ("eager" if graphs == "off" else
                                                                            f"static {options.get('kernels', 'exact')}")
        runs = [pipe.run(p, max_new_tokens=16, seed=1) for p in PROMPTS]
        seeds = [1] * len(PROMPTS)  # each request's own: a row samples what it samples alone
        batch = [o.token_ids for o in pipe.generate_batch(PROMPTS, max_new_tokens=16, seeds=seeds)] \
            if pipe.batch_refusal() is None else None
        plain = [pipe.run(p, max_new_tokens=16, seed=1, speculative=False).token_ids for p in PROMPTS]
    assert refused == []
    assert sum(sum(run.stats.drafted_at) for run in runs) > 0  # the drafts ran
    if sampling.greedy:
        assert [run.token_ids for run in runs] == plain
    assert batch in (None, [run.token_ids for run in runs])


@pytest.mark.slow  # the real SmolLM2 (zoo)
@pytest.mark.parametrize("recipe", ["", "/eagle.yaml", "/eagle3.yaml", "/medusa.yaml",
                                    "/eagle3.yaml proposer.lookup=ngram",  # prompt lookup (the recipe's: suffix)
                                    "/eagle3.yaml kernels=fast proposer.lookup=false proposer.tree={top_k:4,nodes:8}"])
def test_the_shipped_recipes_run_on_a_simulated_gpu_without_mixing_host_and_device(recipe):
    """The recipes as `gpu_check` runs them (graphs=auto: the static step and graphed drafts on
    a GPU), speculation forced on (fixed γ, no guard) so every draft path runs: nothing a GPU
    would refuse, and their greedy outputs are plain's token for token (the static step's
    `exact`). A tree runs with `kernels=fast`, which promises plain's output within tolerance:
    there the tokens must equal plain's up to the first divergence, and that one only where the
    target's own top-2 logit gap is a near-tie (`specpipe.exactness`)."""
    from specpipe.config import compose
    from specpipe.exactness import first_divergence

    prompt = "Write a Python function that returns the sum of a list of numbers."
    path, *options = recipe.split(" ")
    tree = "kernels=fast" in options
    with simulated_cuda() as refused:
        pipe = Pipeline.from_config(compose(["device=cuda", f"recipe=recipes/smollm2-135m{path}",
                                             "controller=fixed", "gamma=3", "guard=false", *options]))
        searches = []  # the heads' graphed tree searches run (the real search, counted)
        if hasattr(pipe.proposer, "_graphed_tree"):
            search = pipe.proposer._graphed_tree
            pipe.proposer._graphed_tree = lambda *args: searches.append(1) or search(*args)
        ids = pipe.encode(prompt)
        run = pipe.run(ids, max_new_tokens=24)
        again = pipe.run(ids, max_new_tokens=24)  # the same request: a suffix lookup drafts the first answer
        plain = pipe.run(ids, max_new_tokens=24, speculative=False)
        divergences = [first_divergence(pipe.runner, ids, out.token_ids, plain.token_ids) for out in (run, again)]
    assert refused == [] and pipe.runner.step == ("static fast" if tree else "static exact")
    assert sum(run.stats.accepted_at) > 0 and len(run.token_ids) == len(plain.token_ids)  # drafts ran and were kept
    assert (len(searches) > 0) == tree  # a tree is searched only where one is set
    if tree:  # within tolerance: equal tokens, or the first difference at a near-tie
        assert all(d is None or d.near_tie for d in divergences), divergences
        return
    assert divergences == [None, None]
    assert run.token_ids == plain.token_ids and again.token_ids == plain.token_ids
    if isinstance(getattr(pipe.proposer, "lookup", None), SuffixProposer):
        # the suffix lookup's drafts ran on the device's step: whole blocks of the earlier answer kept
        assert again.stats.steps < run.stats.steps


def test_a_graphed_step_makes_few_launches_beside_its_graph():
    """What a step costs the host on a GPU beyond its graphs, counted on the simulated device:
    a step whose draft the host made (n-gram lookup) sends its inputs in one copy (the block,
    draft included, with the step's lengths and draft lengths; the draft stays on the host, as
    only an eager verifier needs it on the device), replays one graph, which verifies the draft
    too, and copies the verdict back: three launches. A plain step queued behind the last takes
    its token from that step's verdict on the device: four. The eager verifier alone launched a
    dozen per step, the inputs as many again."""
    from cuda_sim import device_launches
    from specpipe.decode.loop import Decoder, Request

    target = tiny_target(seed=0)
    with simulated_cuda() as refused:
        pipe = Pipeline(target, NgramProposer(), GreedyVerifier(), FixedGamma(3),
                        runner=make_runner(target.model, device="cuda", graphs="on"))
        decoder = Decoder(pipe, 1)
        steps, launch, settle = [], decoder._launch, decoder._settle

        def launched(*args):
            with device_launches() as seen:
                step = launch(*args)
            steps.append((step, seen))
            return step

        def settled(step):
            with device_launches() as seen:
                out = settle(step)
            next(count for made, count in steps if made is step).extend(seen)
            return out

        decoder._launch, decoder._settle = launched, settled
        tokens = [t for event in decoder.run([Request(REPEATING, 24), Request(PROMPT, 12)]) for t in event.tokens]
    assert refused == [] and len(tokens) == 36
    speculative = [seen for step, seen in steps[1:] if not step.plain]
    plain = [seen for step, seen in steps[1:] if step.plain]
    assert speculative and plain
    assert max(map(len, speculative)) <= 3 and all(seen.count("graph") == 1 for seen in speculative), speculative
    assert max(map(len, plain)) <= 4, plain


def test_device_chains_spread_into_the_batch_in_one_launch_a_part():
    """A head's chains on the device, drafted together for every row, are the batch as they are
    (no launch); drafted for some rows, they spread into the batch in one launch a part, the
    other rows without a draft (the rows' index copied once). A lookup's host rows merged with them land on the device, the
    head's rows in place and the lookup's as drafted, counts only where the host knows them all."""
    from cuda_sim import device_launches
    from specpipe.drafts import DraftBatch

    with simulated_cuda() as refused:
        tokens = torch.tensor([[5, 6, 7], [5, 6, 7]], device="cuda")
        confidence = torch.tensor([[0.9, 0.5, 0.2]] * 2, device="cuda")
        count = torch.tensor([3, 1], device="cuda")
        with device_launches() as launched:
            whole = DraftBatch.of_rows([0, 1], 2, tokens, count, [3, 3], None, confidence)
        assert launched == [] and whole.tokens is tokens and whole.counts is None
        with device_launches() as launched:
            spread = DraftBatch.of_rows([0, 2], 3, tokens, count, [3, 0, 3], None, confidence)
        assert on_device(spread.tokens) and on_device(spread.num_draft) and on_device(spread.confidence)
        merged = DraftBatch.of_lists([3, 2, 3], [None, [8, 9], None]).merged([0, 2], whole)
        assert on_device(merged.tokens) and on_device(merged.confidence) and merged.counts is None
    assert refused == [] and launched == ["to"] + ["new_full", "index_copy_"] * 3, launched  # the index, then a part
    assert spread.tokens.tolist() == [[5, 6, 7], [0, 0, 0], [5, 6, 7]] and spread.num_draft.tolist() == [3, 0, 1]
    assert torch.equal(spread.confidence[1], torch.zeros(3)) and torch.equal(spread.confidence[2], confidence[1])
    assert merged.tokens.tolist() == [[5, 6, 7], [8, 9, 0], [5, 6, 7]] and merged.num_draft.tolist() == [3, 2, 1]
    assert merged.confidence.tolist()[1] == [0.0, 0.0, 0.0]
