"""γ controllers on scripted acceptance and timing sequences (no models)."""

from __future__ import annotations

import pytest

from specpipe.controllers.band import BandGamma
from specpipe.controllers.confidence import ConfidenceGamma
from specpipe.controllers.cost import CostModelGamma
from specpipe.controllers.fixed import FixedGamma
from specpipe.controllers.heuristic import HeuristicGamma
from specpipe.errors import SpecpipeError
from specpipe.types import RowVerdict, StepTiming
from stepping import stepped


def step(controller, accepted: int, propose_s: float = 0.01, verify_s: float = 0.1, confidence=()):
    """Feed one verdict of the controller's own γ with `accepted` tokens kept."""
    gamma = controller.gamma()
    verdict = RowVerdict(min(accepted, gamma), 0, gamma, confidence=tuple(confidence))
    stepped(controller, [0], [verdict], StepTiming(propose_s * gamma, verify_s), 1)
    return controller.gamma()


def test_fixed_stays_and_respects_bounds():
    c = FixedGamma(4, gamma_min=1, gamma_max=3)
    assert [step(c, 0) for _ in range(3)] == [3, 3, 3]


def test_heuristic_plus_two_minus_one():
    c = HeuristicGamma(3, gamma_min=1, gamma_max=8)
    assert step(c, 3) == 5
    assert step(c, 5) == 7
    assert step(c, 7) == 8  # bounded by gamma_max
    assert step(c, 2) == 7
    assert [step(c, 0) for _ in range(8)][-1] == 1  # bounded by gamma_min


def test_band_moves_toward_its_targets():
    c = BandGamma(4, gamma_min=1, gamma_max=8, low=0.4, high=0.6, gamma_low=2, gamma_high=6, window=4)
    trace = [step(c, 10) for _ in range(5)]  # everything accepted
    assert trace[-1] == 6 and max(trace) == 6
    trace = [step(c, 0) for _ in range(10)]  # nothing accepted
    assert trace[-1] == 2 and min(trace) == 2


def test_confidence_stops_early_and_retunes():
    c = ConfidenceGamma(6, gamma_min=1, gamma_max=6, threshold=0.5, rate=0.5)
    assert 0.3 < c.stop_below(0) < 0.9  # stop after a token drafted at 0.3, not at 0.9
    # confident tokens rejected: the threshold rises
    before = c.threshold
    step(c, 0, confidence=[0.9, 0.9])
    assert c.threshold > before
    # doubtful tokens accepted anyway: it falls
    before = c.threshold
    step(c, 2, confidence=[0.2, 0.2, 0.2])
    assert c.threshold < before


def test_cost_picks_zero_when_drafting_costs_as_much_as_verifying():
    c = CostModelGamma(4, gamma_min=0, gamma_max=8, probe_every=1000)
    trace = [step(c, accepted=1, propose_s=0.1, verify_s=0.1) for _ in range(20)]
    assert trace[-1] == 0


def test_cost_picks_a_large_gamma_when_acceptance_is_high_and_drafting_free():
    c = CostModelGamma(2, gamma_min=0, gamma_max=8)
    trace = [step(c, accepted=100, propose_s=0.0001, verify_s=0.1) for _ in range(20)]
    assert trace[-1] >= 7


def test_cost_comes_back_from_zero_when_conditions_improve():
    c = CostModelGamma(4, gamma_min=0, gamma_max=8, probe_every=4)
    bad = [step(c, accepted=0, propose_s=0.1, verify_s=0.1) for _ in range(20)]
    assert max(bad) <= 1 and bad.count(0) >= 10  # switched off, with a γ=1 probe now and then
    good = [step(c, accepted=100, propose_s=0.001, verify_s=0.1) for _ in range(60)]
    assert good[-1] >= 4


def test_cost_learns_no_cost_from_a_step_that_captured_a_graph():
    """A CUDA graph's capture (`setup_s`) makes one step of each new block size dear, once: its
    time is not a block's cost, so it is no sample (one would be the only sample of its size)."""
    c = CostModelGamma(4, gamma_min=0, gamma_max=8)
    stepped(c, [0], [RowVerdict(4, 0, 4)], StepTiming(0.0004, 2.1, setup_s=2.0), 1)  # the 5-token block's capture
    assert c.verify_at() == {} and c.propose_per_token() is None
    stepped(c, [0], [RowVerdict(4, 0, 4)], StepTiming(0.0004, 0.1), 1)
    assert c.verify_at() == {5: pytest.approx(0.1)}


def test_bad_bounds_are_refused():
    with pytest.raises(SpecpipeError, match="gamma_min"):
        FixedGamma(4, gamma_min=5, gamma_max=3)
    with pytest.raises(SpecpipeError, match="gamma=0"):
        HeuristicGamma(0)


def test_cost_forgets_stale_verify_costs_of_block_sizes_it_stopped_trying():
    """A block size measured slow once (a machine hiccup) and not tried since must not pin γ."""
    def history(c: CostModelGamma) -> CostModelGamma:
        for gamma, verify_s, steps in ((5, 0.5, 10), (1, 0.1, 20), (2, 0.11, 20)):  # slow 6-token blocks, then short ones
            for _ in range(steps):
                stepped(c, [0], [RowVerdict(gamma, 0, gamma)], StepTiming(0.0001 * gamma, verify_s), 1)
        return c

    c = history(CostModelGamma(4, gamma_min=0, gamma_max=8, memory=32))
    assert set(c.verify_at()) == {2, 3}  # the 6-token samples are older than `memory` steps
    assert c.best_gamma() >= 6  # everything accepted, verifying barely grows: long drafts
    assert history(CostModelGamma(4, gamma_min=0, gamma_max=8, memory=1000)).best_gamma() <= 2  # never forgetting


def test_the_guard_and_the_cost_model_read_one_record_of_the_steps():
    """One step meter for the chain: the guard wraps the cost model and shares its meter, each
    step is recorded once (not once a controller), and both read their costs from it."""
    from specpipe.controllers.guard import Guard

    inner = CostModelGamma(3, gamma_min=0, gamma_max=6, probe_every=1000)
    guard = Guard(inner)
    assert guard.meter is inner.meter
    stepped(guard, [0], [RowVerdict(0, 0, 0)], StepTiming(0.0, 0.05), 1)  # a plain step
    stepped(guard, [0], [RowVerdict(2, 0, 3)], StepTiming(0.03, 0.1), 1)
    assert guard.meter.steps == 2
    assert guard.plain_cost(1) == pytest.approx(0.05) and inner.verify_at() == pytest.approx({1: 0.05, 4: 0.1})
    assert inner.propose_per_token() == pytest.approx(0.01)
    assert guard.meter.reach(1).possible == 4 and guard.meter.reach(1).cost == pytest.approx(0.13 / 0.05)


def test_a_built_controller_has_its_schedule_and_overlap_from_construction(tmp_path):
    """The build hands the controller the batch schedule and whether plain steps are queued
    ahead (`overlap`) when it makes it: the guard over it reads both through its inner controller."""
    import torch

    from conftest import tiny_model, tiny_tokenizer
    from specpipe.build import build_parts
    from specpipe.config import compose
    from specpipe.controllers.guard import Guard

    model, tokenizer = tiny_model(0, dtype=torch.float32), tiny_tokenizer()
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(tmp_path / "target")
    tokenizer.save_pretrained(tmp_path / "target")
    for overlap, queued in (("on", True), ("off", False)):
        cfg = compose([f"model={tmp_path / 'target'}", "proposer=ngram", "controller=cost",
                       "batch_schedule={1: 3, 4: 0}", f"overlap={overlap}"])
        controller = build_parts(cfg)["controller"]
        assert isinstance(controller, Guard) and isinstance(controller.inner, CostModelGamma)
        assert controller.schedule == controller.inner.schedule == {1: 3, 4: 0}
        assert controller.overlapped is queued and controller.meter is controller.inner.meter
        assert (controller.gamma(1), controller.gamma(8)) == (3, 0)
