"""`Kind`: what differs between trained proposers; everything else in `specpipe train` is
shared. A trainable proposer declares `trainer=<module>` (specpipe/declaration.py),
and that module holds its `KIND`."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

from specpipe.engine import FINAL


@dataclass(frozen=True)
class Kind:
    fresh: Callable  # (cfg, target config, lm weight, training sequences) -> a new untrained module
    load: Callable  # folder -> module (a checkpoint)
    save: Callable  # (module, folder, target=, extra=) -> folder
    data: Callable  # (cached sequences, cfg) -> training data with .batches(size, generator)
    trainer: Callable  # (module, target weights, training data, cfg) -> trainer with .step, .accuracy
    figure: str  # the recipe's name for what .accuracy measures
    # (cfg, target config) -> the runner's hidden-state keys whose features it trains on, side by side
    layers: Callable = lambda cfg, config: (FINAL,)
    # cfg -> keyword arguments of `save` that come from the run's settings
    save_options: Callable = lambda cfg: {}
    # (module from init=, cfg, lm weight, training sequences) -> the module to train further: as it
    # is, or (EAGLE-3) with its draft vocabulary grown to the run's vocab_subset
    grow: Callable = lambda module, cfg, lm, seqs: module


def kind_in(module: str) -> Kind:
    return importlib.import_module(module).KIND
