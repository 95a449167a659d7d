"""A lookup tried before a drafter each step (`proposer.lookup=`: ngram or suffix), as the head
recipes run it (EAGLE, EAGLE-3, Medusa's peers, DFlash): `make_lookup` builds it from the
options, `lookup_warning` says what an export to a serving engine leaves out.
"""

from __future__ import annotations

from specpipe.errors import SpecpipeError
from specpipe.proposers.ngram import NgramProposer
from specpipe.proposers.suffix import SuffixProposer, as_lookup

LOOKUPS = ("ngram", "suffix")  # proposer.lookup's methods (true: ngram)


def make_lookup(lookup: bool | str, lookup_min: int, lookup_max: int,
                lookup_score: float | None = None) -> NgramProposer | SuffixProposer | None:
    """proposer.lookup=ngram (or true): prompt lookup over matches of lookup_min..lookup_max
    tokens (proposer=ngram's ngram_min / ngram_max; vLLM's prompt_lookup_min / _max), whose
    every match drafts; suffix: suffix decoding with proposer=suffix's defaults, whose draft is
    taken where its score (expected accepted tokens) reaches lookup_score (null: the step's γ,
    Arctic Inference's rule beside its speculator, which leaves a weak head most steps; the
    default, 1, drafted as often as ngram on a first pass beside the shipped heads, and it
    also matches earlier requests' answers); false: none."""
    method = ("ngram" if lookup else None) if type(lookup) is bool else lookup
    if method is not None and method not in LOOKUPS:
        raise SpecpipeError(f"proposer.lookup={lookup!r} is not a lookup: use ngram (or true), suffix, or false.")
    if not (type(lookup_min) is int and type(lookup_max) is int and 1 <= lookup_min <= lookup_max):
        raise SpecpipeError(f"proposer.lookup_min={lookup_min!r} and proposer.lookup_max={lookup_max!r} must be "
                            "integers with 1 <= lookup_min <= lookup_max (e.g. lookup_min=3 lookup_max=4).")
    if lookup_score is not None and (type(lookup_score) not in (int, float) or lookup_score < 0):
        raise SpecpipeError(f"proposer.lookup_score={lookup_score!r} must be a number of tokens >= 0 (e.g. 2.5), "
                            "or null for the step's γ.")
    if method == "suffix":
        return as_lookup(lookup_score, lookup_min)
    return NgramProposer(ngram_max=lookup_max, ngram_min=lookup_min) if method == "ngram" else None


def lookup_warning(plan, engine: str, drafter: str = "an EAGLE head", alone: str = "the head") -> None:
    """The lookup runs in specpipe only: neither serving engine pairs a lookup with a drafter."""
    if plan.options.get("lookup"):
        kind = "suffix decoding" if plan.options["lookup"] == "suffix" else "prompt lookup"
        plan.warnings.append(f"proposer.lookup: {engine} has no {kind} beside {drafter} (one method per "
                             f"server); exported as {alone} alone.")
