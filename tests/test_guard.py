"""The guard (controllers/guard.py): γ = 0 for a request whose speculation measures slower than
plain steps, back when probes say it pays, nothing changed where it pays; output unchanged.

Decisions are tested on scripted step costs (no models), driven the way the decode loop drives
a controller: `gamma(batch)`, `row_gamma(slot, γ)` per row, then `update`. Exactness is
tested on tiny float64 models with a scripted clock (so the guard really pauses), and on the
real SmolLM2 with the wall clock.
"""

from __future__ import annotations

import pytest

from conftest import PROMPT, tiny_model, tiny_target
from specpipe.controllers.cost import CostModelGamma
from specpipe.controllers.fixed import FixedGamma
from specpipe.controllers.guard import Guard, guarded
from specpipe.decode.loop import Request
from specpipe.pipeline import Pipeline
from specpipe.proposers.model_drafter import ModelDrafter
from specpipe.proposers.ngram import NgramProposer
from specpipe.sampling import SamplingParams
from specpipe.types import RowVerdict, StepTiming
from specpipe.verifiers.greedy import GreedyVerifier
from specpipe.verifiers.rejection import RejectionVerifier
from stepping import stepped

PLAIN_S = 0.010  # a plain step


def run(guard: Guard, steps: int, accepted, cost, slots=(0,)) -> list[list[int]]:
    """`steps` steps of rows `slots`; accepted(slot, γ) draft tokens kept, cost(width) the
    step's seconds for a verify block of `width` tokens. Returns each step's γ per row."""
    trace = []
    for _ in range(steps):
        gamma = guard.gamma(len(slots))
        given = [guard.row_gamma(slot, gamma) for slot in slots]
        verdicts = [RowVerdict(min(accepted(slot, g), g), 0, g) for slot, g in zip(slots, given)]
        stepped(guard, list(slots), verdicts, StepTiming(0.0, cost(1 + max(given))), len(slots))
        trace.append(given)
    return trace


def dear(width: int) -> float:
    return PLAIN_S * (1 + 0.5 * (width - 1))  # a draft token costs half a plain step


def cheap(width: int) -> float:
    return PLAIN_S * (1 + 0.05 * (width - 1))  # verifying several tokens costs little more than one


def test_drops_to_zero_where_speculation_is_slower_and_comes_back_when_it_pays():
    guard = Guard(FixedGamma(4))
    guard.admit(0)
    bad = [g for g, in run(guard, 200, lambda slot, g: 0, dear)]
    assert bad[0] == 0  # the request's first step measures a plain step
    assert sum(g > 0 for g in bad) <= 28  # a window to judge, then trials of 4 steps ever further apart
    assert bad[-60:].count(4) <= 4
    assert guard.paused(0)
    good = [g for g, in run(guard, 100, lambda slot, g: g, cheap)]  # every draft accepted now
    assert not guard.paused(0)
    assert good[-20:].count(4) >= 19  # back within one probe interval, and it stays
    assert good.index(4) <= guard.probe_max


def test_steps_that_drafted_nothing_are_not_judged_and_measure_the_plain_cost():
    """A lookup that finds no match spends a plain step (plus its lookup): judging it would pause
    a request whose drafts pay whenever there is one."""
    guard = Guard(FixedGamma(4))
    guard.admit(0)
    for step in range(60):  # drafts on one step in three, one token of each accepted; the others find nothing
        gamma = guard.row_gamma(0, guard.gamma(1))
        drafted = gamma if step % 3 == 0 else 0
        slow = 1.5 if gamma > drafted == 0 else 1.0  # a miss costs its lookup on top of a plain step
        stepped(guard, [0], [RowVerdict(min(drafted, 1), 0, drafted)],
                StepTiming(0.0, slow * cheap(1 + drafted)), 1)
        assert not guard.paused(0)  # judged with the misses, the request would yield 4 tokens in 4.2 plain steps
    assert guard.plain_cost(1) == pytest.approx(1.5 * PLAIN_S)  # the misses are the plain samples


def test_where_plain_steps_are_queued_ahead_a_plain_step_costs_its_own_time():
    """With plain steps queued ahead of the host (`overlap`, a GPU's default), the host's time
    between steps runs beside the device's, so what a pause buys is a plain step's own time; a
    speculative step still pays its host time (its draft needs the verdict first)."""
    for overlapped, plain_s in ((False, 1.5 * PLAIN_S), (True, PLAIN_S)):
        guard = Guard(FixedGamma(4))
        guard.overlapped = overlapped
        guard.admit(0)
        for _ in range(3):
            stepped(guard, [0], [RowVerdict(0, 0, 0)], StepTiming(0.0, PLAIN_S, host_s=0.5 * PLAIN_S), 1)
        assert guard.plain_cost(1) == pytest.approx(plain_s)


def lookups(guard: Guard, steps: int, hit, host: float) -> list[int]:
    """`steps` steps of one row under a lookup proposer: a step where hit(step) drafts its γ and
    keeps two tokens, else finds nothing; a step not queued ahead (one that drafted, or could
    have) costs `host` plain steps of the host's time on top of its device time. Returns each
    step's γ and whether the guard holds the next step whatever this one shows."""
    trace = []
    for step in range(steps):
        gamma = guard.row_gamma(0, guard.gamma(1))
        drafted = gamma if gamma and hit(step) else 0
        host_s = host * PLAIN_S if gamma else 0.0  # a held step is queued before the last is read
        stepped(guard, [0], [RowVerdict(min(drafted, 2), 0, drafted)],
                StepTiming(0.0, cheap(1 + drafted), host_s=host_s), 1)
        trace.append((gamma, guard.holds([0], 1)))
    return trace


def test_where_plain_steps_are_queued_ahead_lookups_that_keep_missing_pause_the_request():
    """A miss is read before the next step is queued, so where plain steps are queued ahead it
    costs the host's time on top (here 0.3 of a plain step): a request whose lookups never find
    anything is paused, and its held steps are then queued ahead; read step by step, a miss
    costs what a plain step costs there and nothing is paused."""
    guard = Guard(FixedGamma(4))
    guard.overlapped = True
    guard.admit(0)
    trace = lookups(guard, 200, lambda step: False, host=0.3)
    assert guard.plain_cost(1) == pytest.approx(PLAIN_S)  # the device's time: the host's runs beside it
    first = next(step for step, (gamma, _) in enumerate(trace) if step and gamma == 0)
    assert first <= 12  # lost 3 plain steps' worth (10 misses at 0.3), then paused
    assert sum(gamma > 0 for gamma, _ in trace) <= 30  # trials ever further apart
    assert sum(holds for _, holds in trace) >= 150  # those steps are queued ahead
    guard = Guard(FixedGamma(4))
    guard.admit(0)
    trace = lookups(guard, 200, lambda step: False, host=0.3)
    assert sum(gamma == 0 for gamma, _ in trace) <= 1 + 200 // guard.refresh  # the plain probes only
    assert not guard.paused(0)


def test_where_plain_steps_are_queued_ahead_misses_do_not_pause_lookups_that_pay():
    """Misses cost their host time, but drafts on one step in three that keep two tokens at 1.2
    plain steps' cost still pay for them: 6 tokens in 4.5 plain steps' time."""
    guard = Guard(FixedGamma(4))
    guard.overlapped = True
    guard.admit(0)
    trace = lookups(guard, 200, lambda step: step % 3 == 0, host=0.3)
    assert not guard.paused(0)
    assert sum(gamma == 0 for gamma, _ in trace) <= 1 + 200 // guard.refresh  # the plain probes only


def test_a_step_that_captured_a_graph_is_not_judged_and_its_probe_is_repeated():
    """A step that captured a CUDA graph (`setup_s`: tens of plain steps' worth, once) says
    nothing about what steps cost: a plain probe that captured is no sample and is made again
    at the next step, and a speculative step that captured is not judged (judged, its cost
    alone would pause a request whose drafts pay)."""
    guard = Guard(FixedGamma(4))
    guard.admit(0)
    setup = 0.3  # 30 plain steps
    trace = []
    for step in range(40):
        gamma = guard.row_gamma(0, guard.gamma(1))
        captured = step in (0, 5)  # the first probe's shapes, a draft's first γ
        timing = StepTiming(0.0, cheap(1 + gamma) + (setup if captured else 0.0), setup_s=setup if captured else 0.0)
        stepped(guard, [0], [RowVerdict(min(2, gamma), 0, gamma)], timing, 1)
        trace.append(gamma)
    assert trace[:2] == [0, 0]  # the first probe captured: probed again
    assert guard.plain_cost(1) == pytest.approx(PLAIN_S)
    assert not guard.paused(0) and trace[2:].count(0) == 0


def test_costs_nothing_where_speculation_pays():
    guard = Guard(FixedGamma(4))
    guard.admit(0)
    trace = [g for g, in run(guard, 200, lambda slot, g: 2, cheap)]  # 3 tokens a step at 1.15 plain steps
    assert trace.count(0) <= 1 + 200 // guard.refresh  # the plain probes only
    assert not guard.paused(0)


def test_noise_around_paying_speculation_does_not_pause_it():
    import random

    rng = random.Random(0)
    guard = Guard(FixedGamma(4))
    guard.admit(0)
    trace = [g for g, in run(guard, 300, lambda slot, g: 1, lambda w: cheap(w) * rng.uniform(0.8, 1.25))]
    assert trace.count(0) <= 1 + 300 // guard.refresh  # 2 tokens a step ~ 1.8x: never judged slower


def test_a_request_that_pays_as_a_whole_is_not_paused_in_a_bad_phase():
    guard = Guard(FixedGamma(4))
    guard.admit(0)
    phase = iter([g for _ in range(10) for g in [4] * 8 + [0] * 24])  # 8 good steps, then 24 that gain nothing
    trace = [g for g, in run(guard, 300, lambda slot, g: next(phase) if g else 0, cheap)]  # 1.7x as a whole
    assert trace.count(0) <= 1 + 300 // guard.refresh  # the plain probes only


def test_each_row_is_judged_alone_and_a_whole_plain_step_measures_the_batch():
    guard = Guard(FixedGamma(4))
    for slot in (0, 1):
        guard.admit(slot)
    trace = run(guard, 120, lambda slot, g: g if slot == 0 else 0, lambda w: PLAIN_S * 2 * (1 + 0.2 * (w - 1)),
                slots=(0, 1))
    assert trace[0] == [0, 0]  # a plain probe of the whole batch
    assert guard.plain_cost(2) == pytest.approx(PLAIN_S * 2)
    assert not guard.paused(0) and guard.paused(1)
    assert [row[0] for row in trace[-20:]] == [4] * 20


def test_a_batch_whose_rows_together_yield_less_than_plain_steps_steps_plain():
    """One row's drafts pay, three rows' do not: the paying row keeps the verify block wide, so the
    held rows emit one token each in a step that costs three plain ones. Per batch size, the
    batch as a whole is judged, and it steps plain (vLLM's disable_by_batch_size, learned)."""
    slots = (0, 1, 2, 3)
    guard = Guard(FixedGamma(4))
    for slot in slots:
        guard.admit(slot)
    compute_bound = lambda w: 4 * PLAIN_S * (1 + 0.5 * (w - 1))  # noqa: E731 - a draft token costs half a plain step
    trace = run(guard, 200, lambda slot, g: g if slot == 0 else 0, compute_bound, slots=slots)
    assert [4, 0, 0, 0] in trace  # row 0 alone pays (5 tokens in 3 plain steps' time): rows 1-3 held first
    plain_steps = sum(not any(row) for row in trace[-100:])
    assert plain_steps >= 90  # trials of 4 steps, ever further apart
    assert sum(any(row) for row in trace[:20]) <= 6  # a plain step's worth lost a step: judged within a few


def test_as_a_load_drains_a_smaller_batch_starts_where_the_larger_one_stood():
    guard = Guard(FixedGamma(4))
    slots = tuple(range(8))
    for slot in slots:
        guard.admit(slot)
    compute_bound = lambda w: 8 * PLAIN_S * (1 + 0.5 * (w - 1))  # noqa: E731
    run(guard, 100, lambda slot, g: 1, compute_bound, slots=slots)  # 2 tokens a row at 3 plain steps' cost
    assert guard.paused(0)
    drained = run(guard, 6, lambda slot, g: 1, lambda w: 7 / 8 * compute_bound(w), slots=slots[:7])
    assert drained == [[0] * 7] * 6  # 7 rows: paused from its first step


def test_a_paused_batch_size_speculates_again_when_it_pays():
    slots = (0, 1)
    guard = Guard(FixedGamma(4))
    for slot in slots:
        guard.admit(slot)
    run(guard, 100, lambda slot, g: 0, lambda w: 2 * dear(w), slots=slots)
    assert all(not any(row) for row in run(guard, 5, lambda slot, g: 0, lambda w: 2 * dear(w), slots=slots))
    good = run(guard, 150, lambda slot, g: g, lambda w: 2 * cheap(w), slots=slots)
    assert [row for row in good[-20:]].count([4, 4]) >= 19
    assert guard.plain_cost(1) is None  # batch sizes keep their own plain cost


def twin_like(width: int) -> float:
    return PLAIN_S * (1 + 0.8 * (width - 1))  # each draft token costs most of a target step


def test_a_dear_proposer_is_paused_within_a_few_steps_and_its_trials_stay_cheap():
    """A twin that accepts half its tokens still loses ~1.5 plain steps a step: judged on time
    lost, not on a count of steps, and its trials are spaced so they cost a few percent."""
    guard = Guard(FixedGamma(4))
    guard.admit(0)
    trace = [g for g, in run(guard, 300, lambda slot, g: 2, twin_like)]
    assert trace[1:4] == [4, 4, 4] and trace[4] == 0  # 1.2 plain steps lost a step: over loss_max after three
    trial_steps = sum(g > 0 for g in trace[4:])
    assert 0 < trial_steps * 1.2 <= 300 * guard.explore + guard.loss_max  # trials cost about `explore` of the time


def test_after_requests_whose_speculation_did_not_pay_a_new_one_starts_paused():
    guard = Guard(FixedGamma(4))
    guard.admit(0)
    run(guard, 60, lambda slot, g: 0, dear)
    guard.admit(0)  # the next request
    assert guard.paused(0)
    trace = [g for g, in run(guard, 400, lambda slot, g: g, cheap)]  # this one's drafts pay
    first = trace.index(4)
    assert first >= guard.probe_max // 2 and trace[-4:] == [4] * 4
    assert trace[first:first + 20].count(4) >= 19  # its trial paid: it goes on
    guard.admit(0)
    assert not guard.paused(0)  # the recent requests' speculation pays again


def test_trials_follow_one_schedule_across_requests():
    """Where speculation does not pay, each new request waits for the pipeline's next trial
    (doubling while trials fail) instead of making one of its own: a draft model's trial fills
    its cache, as dear as a prefill, and one in every short request would cost more than the
    `explore` share."""
    guard = Guard(FixedGamma(4))
    trials = 0
    for _ in range(30):  # 30 requests of 40 steps: 1,200 steps
        guard.admit(0)
        trace = [g for g, in run(guard, 40, lambda slot, g: 1, twin_like)]
        trials += any(trace)
    assert trials <= 6  # the first request, then ever further apart (the schedule doubles)
    guard.admit(0)
    assert guard.paused(0)


def out_of_reach(width: int) -> float:
    return PLAIN_S * (1 + 1.05 * (width - 1))  # a draft token costs a target step: 5 tokens at best in 5.2


def test_a_proposer_that_cannot_pay_even_with_every_draft_accepted_is_rechecked_rarely():
    """Steps that would not pay even had they kept `reach` of their tokens are no matter of
    what text comes next: trials wait `recheck` steps, where a proposer that is cheap enough but
    drafts poorly keeps the usual, denser schedule."""
    def trials(cost, accepted, requests=40, steps=40) -> list[int]:
        guard = Guard(FixedGamma(4))
        tried = []
        for request in range(requests):  # 40 requests of 40 steps: 1,600 steps
            guard.admit(0)
            if any(g for g, in run(guard, steps, accepted, cost)):
                tried.append(request)
        return tried

    assert trials(out_of_reach, lambda slot, g: g) == [0]  # every draft kept, still no faster: the first request alone
    poor = trials(dear, lambda slot, g: 0)  # 3 plain steps for 5 tokens at best, none kept
    assert poor[0] == 0 and 1 < len(poor) <= 6  # trials on the usual schedule
    guard = Guard(FixedGamma(4))
    guard.admit(0)
    trace = [g for g, in run(guard, guard.recheck + 200, lambda slot, g: g, out_of_reach)]
    late = [i for i, g in enumerate(trace) if g and i > 20]
    assert late and guard.recheck <= late[0] <= 1.1 * guard.recheck  # costs change with the machine's load: rechecked


def test_a_busy_moment_is_no_verdict_of_out_of_reach():
    """Out of reach is judged on every request's speculative steps at a batch size, after
    `window // 2` of them: a step or two while the machine is busy pauses a row, not its trials."""
    def busy(width: int) -> float:
        return 20 * cheap(width) if width > 1 else cheap(width)  # speculative steps 20x dearer for a moment

    for history in (40, 0):  # after paying steps, and with none
        guard = Guard(FixedGamma(4))
        guard.admit(0)
        run(guard, history, lambda slot, g: g, cheap)  # an earlier request: 5 tokens in 1.2 plain steps
        guard.admit(0)
        run(guard, 3, lambda slot, g: 0, busy)
        assert guard.paused(0) and guard._rows[0].wait < guard.recheck


def test_a_draft_caches_fill_is_the_trials_price_not_each_steps():
    """A draft model's first draft of a request fills its cache with the prompt (`fill_s`):
    judged as a step, one long prompt would pause a draft that pays; it is charged to the
    wait after a trial that fails instead."""
    guard = Guard(FixedGamma(4))
    guard.admit(0)
    first = True
    for _ in range(40):
        gamma = guard.row_gamma(0, guard.gamma(1))
        fill = 20 * PLAIN_S if gamma and first else 0.0  # a prompt's fill: 20 plain steps' worth
        first = first and not gamma
        stepped(guard, [0], [RowVerdict(min(2, gamma), 0, gamma)], StepTiming(0.0, cheap(1 + gamma), fill), 1)
    assert not guard.paused(0)  # 3 tokens a step at 1.2 plain steps: it pays, the fill apart
    bad = Guard(FixedGamma(4))
    bad.admit(0)
    run(bad, 3, lambda slot, g: 0, dear)  # paused by the loss rule after its first steps
    for _ in range(40):
        gamma = bad.row_gamma(0, bad.gamma(1))
        stepped(bad, [0], [RowVerdict(0, 0, gamma)], StepTiming(0.0, dear(1 + gamma), 20 * PLAIN_S if gamma else 0.0), 1)
        if gamma:
            break
    assert bad.paused(0) and bad._rows[0].wait >= 20 / bad.explore  # the trial's fill sets its wait


def test_where_recent_requests_paid_a_poor_opening_is_not_judged_alone():
    """A request starts with the recent requests' gain as `prior` steps of evidence: a small
    model's free text often turns repetitive after a few dozen tokens, where drafts pay."""
    def request(guard: Guard, opening: int) -> list[int]:
        guard.admit(0)
        return [g for g, in run(guard, opening, lambda slot, g: 0, cheap)]

    paid = Guard(FixedGamma(4))
    paid.admit(0)
    run(paid, 100, lambda slot, g: g, cheap)  # a request whose drafts pay: 5 tokens a step
    assert all(request(paid, 12)[1:])  # 11 poor steps (1 token in 1.2 plain steps): not paused yet
    fresh = Guard(FixedGamma(4))
    assert not all(request(fresh, 12)[1:])  # without that history: paused after `window`


def test_a_new_request_starts_afresh_but_keeps_the_plain_cost():
    guard = Guard(FixedGamma(4))
    guard.admit(0)
    run(guard, 50, lambda slot, g: 1 if slot else 0, dear)
    assert guard.paused(0)
    guard.admit(0)
    assert guard.plain_cost(1) == pytest.approx(PLAIN_S)


def test_the_guard_passes_the_inner_controllers_choices_and_schedule_through():
    inner = CostModelGamma(3, gamma_min=0, gamma_max=6)
    guard = guarded(inner)
    assert isinstance(guard, Guard) and guarded(inner, enabled=False) is inner and guarded(guard) is guard
    guard.schedule = {1: 2}
    assert inner.schedule == {1: 2} and guard.gamma(1) == 2
    assert guard.row_gamma(0, 0) == 0  # the inner's γ = 0 is not the guard's to change


def test_the_guard_is_on_by_default_and_a_recipe_or_flag_may_pin_gamma():
    from specpipe.config import compose
    from specpipe.recipe import TOP_KEYS

    assert compose([]).guard is True and compose(["guard=false"]).guard is False
    assert "guard" in TOP_KEYS


class ScriptedClock:
    """Step timings as a function of the verify block's width (set by the runner's forward):
    draft tokens cost half a plain step, so speculation pays only where most are accepted."""

    width = 1
    end = None  # no host time between steps

    def __init__(self, device, since=None):
        pass

    def mark(self) -> None:
        pass

    def timing(self) -> StepTiming:
        return StepTiming(0.0, dear(ScriptedClock.width))


@pytest.fixture
def scripted(monkeypatch):
    def install(pipe: Pipeline) -> Pipeline:
        forward = pipe.runner.forward

        def measured(block, **kwargs):
            ScriptedClock.width = block.shape[1]  # [B, width]
            return forward(block, **kwargs)

        monkeypatch.setattr(pipe.runner, "forward", measured)
        return pipe

    monkeypatch.setattr("specpipe.decode.step.Clock", ScriptedClock)
    return install


EOS = 1
GREEDY = SamplingParams()


@pytest.mark.parametrize("draft", ["unrelated", "ngram"])
def test_a_guarded_run_equals_plain_greedy_token_for_token(scripted, draft):
    """Steps held at γ = 0 and drafted steps in one run: plain greedy's output either way. An
    unrelated draft at this cost is paused much of the run (its drafts rejected); the n-gram
    lookup's drafts are kept often, and each request still measures plain steps."""
    target = tiny_target(seed=0, eos=EOS)
    proposer = ModelDrafter(tiny_model(seed=7, layers=1), GREEDY) if draft == "unrelated" else NgramProposer(4, 1)
    pipe = scripted(Pipeline(target, proposer, GreedyVerifier(), Guard(FixedGamma(4))))
    held = steps = drafted = accepted = 0
    for prompt in (PROMPT, [3, 60, 22], [9, 9, 30, 2, 61], [12, 40]):
        got = pipe.run(prompt, max_new_tokens=60)
        assert got.token_ids == pipe.run(prompt, max_new_tokens=60, speculative=False).token_ids
        assert got.stats.held > 0
        held, steps, drafted = held + got.stats.held, steps + got.stats.steps, drafted + got.stats.drafted
        accepted += got.stats.accepted
    assert drafted > 0, drafted
    if draft == "unrelated":
        assert 3 * held >= steps, (held, steps)  # paused much of the run
    else:
        assert accepted > drafted / 2, (drafted, accepted)  # drafts verified and kept


def test_guarded_batches_equal_plain_greedy(scripted):
    target = tiny_target(seed=0, eos=EOS)
    pipe = scripted(Pipeline(target, NgramProposer(4, 1), GreedyVerifier(), Guard(FixedGamma(3))))
    prompts = [PROMPT, [7, 8, 9, 10, 7, 8, 9, 10, 7, 8], [44], [5, 5, 5, 5], [12, 40]]
    alone = [pipe.run(p, max_new_tokens=30, speculative=False).token_ids for p in prompts]
    batched = {i: [] for i in range(len(prompts))}
    held = drafted = accepted = 0
    for event in pipe.serve([Request(p, 30) for p in prompts], concurrency=3):
        batched[event.index].extend(event.tokens)
        held += event.held
        if event.finish_reason is not None:  # the request's totals
            drafted, accepted = drafted + event.stats.drafted, accepted + event.stats.accepted
    assert [batched[i] for i in range(len(prompts))] == alone
    assert held > 0 and drafted > 0 and accepted > 0, (held, drafted, accepted)  # both kinds of step ran


def test_a_sampled_guarded_run_is_reproducible_given_the_same_timings(scripted):
    """The guard decides from step timings and from what the pipeline's earlier requests
    measured; given both, a seeded sample is the same on every run."""
    sampling = SamplingParams(temperature=1.0)
    target = tiny_target(seed=0, eos=EOS)

    def samples() -> list:
        pipe = scripted(Pipeline(target, ModelDrafter(tiny_model(seed=7, layers=1), sampling),
                                 RejectionVerifier(sampling), Guard(FixedGamma(3)), sampling=sampling))
        return [pipe.run(PROMPT, max_new_tokens=40, seed=s) for s in range(4)]

    first, again = samples(), samples()
    assert [g.token_ids for g in first] == [g.token_ids for g in again]
    assert len({tuple(g.token_ids) for g in first}) > 2  # different seeds, different samples
    assert all(g.stats.held > 0 for g in first)  # the guard really changed γ


@pytest.mark.slow  # the real SmolLM2 (zoo)
def test_smollm2_guarded_greedy_equals_plain(scripted):
    """The guard on the real model, its step costs scripted (draft tokens at half a plain step,
    as on a loaded machine the wall clock would say anything): steps held at γ = 0 and drafted
    steps alternate, and the output is plain greedy's, token for token."""
    from specpipe.config import compose
    from specpipe.prompts import load_prompts

    pipeline = scripted(Pipeline.from_config(compose(["proposer=ngram", "gamma=4", "guard=true"])))
    assert isinstance(pipeline.controller, Guard)
    held = drafted = accepted = 0
    for prompt in [p for p in load_prompts("held-aside") if p["category"] in ("creative", "structured")][:2]:
        ids = pipeline.encode(prompt["messages"])
        spec = pipeline.run(ids, max_new_tokens=48)
        plain = pipeline.run(ids, max_new_tokens=48, speculative=False)
        assert spec.token_ids == plain.token_ids, prompt["id"]
        held, drafted, accepted = held + spec.stats.held, drafted + spec.stats.drafted, accepted + spec.stats.accepted
    assert held >= 2  # each request measured plain steps at least once
    assert drafted > 0 and accepted > 0, (drafted, accepted)  # and drafted steps, some of whose tokens were kept


def test_bench_reports_the_worst_prompt_and_the_guards_steps_per_category():
    from specpipe.bench.records import Measured, PromptResult
    from specpipe.bench.summary import summarize
    from specpipe.bench.table import guard_cell, worst_cell
    from specpipe.metrics import Stats

    def result(id_: str, category: str, speedup: float, held: int) -> PromptResult:
        stats = Stats(steps=10, emitted=20, held=held).to_dict()
        return PromptResult(id_, category, 5, Measured([1], 10.0, stats=stats), Measured([1], 10.0 * speedup, stats=stats))

    summary = summarize([result("a", "creative", 0.98, 7), result("b", "creative", 1.3, 0), result("c", "code", 2.0, 1)])
    assert summary["creative"]["worst"] == {"id": "a", "speedup": pytest.approx(0.98)}
    assert summary["overall"]["worst"]["id"] == "a"
    assert summary["creative"]["guard"] == {"held": 7, "steps": 20} and summary["overall"]["guard"]["held"] == 8
    assert "0.98x" in worst_cell(summary["overall"]["worst"]) and guard_cell(summary["overall"]["guard"]) == "8/30 (27%)"


def test_the_live_view_says_when_speculation_is_paused():
    from specpipe.ui.live import gamma_text

    assert "paused" in gamma_text(0, held=True) and gamma_text(4, held=False) == "4"
