"""The one list of checks that `specpipe check`, `generate`, `bench` and `export` share, over
the config's resolved `Settings` (specpipe/settings.py): the run builds from the same value."""

from __future__ import annotations

from omegaconf import DictConfig

from specpipe.checks.llamacpp import check_llamacpp
from specpipe.checks.machine import check_tuned_on
from specpipe.checks.proposer import check_batch, check_early_stop, check_heads, check_proposer, check_sampling
from specpipe.checks.result import Check
from specpipe.checks.target import check_early_exit, check_engine, check_lora, check_memory, check_precision
from specpipe.checks.tokenizers import check_tokenizer
from specpipe.checks.validate import check_options, check_settings
from specpipe.settings import Settings


def run_checks(cfg: DictConfig, settings: Settings, target_tokenizer_loader, draft_tokenizer_loader) -> list[Check]:
    """cfg: for the raw values the settings check judges and the components' options; every
    choice the other checks judge is read from `settings`."""
    checked = check_settings(cfg)  # first: the options check builds the controller, sized by these
    options = check_options(cfg) if checked.status != "refuse" else Check("options", "n/a", "not checked: fix the settings first")
    if "refuse" in (checked.status, options.status):  # later checks read these values
        return [checked, options]
    tokenizer = check_tokenizer(settings, target_tokenizer_loader, draft_tokenizer_loader)
    if settings.engine == "llamacpp":  # the GGUF runs as it is: its own rules for precision, engine and memory
        target = check_llamacpp(cfg, settings)
    else:
        target = [check_early_exit(settings), check_lora(settings), *check_precision(settings),
                  *check_engine(settings), check_memory(settings)]
    return [
        checked,
        options,
        check_proposer(settings),
        *target,
        check_sampling(cfg, settings),
        tokenizer,
        check_heads(cfg, settings),
        check_batch(settings, tokenizer.translated),
        check_early_stop(cfg, settings),
        check_tuned_on(cfg, settings),
    ]
