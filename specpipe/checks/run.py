"""The one list of checks that `specpipe check`, `generate`, `bench` and `export` share."""

from __future__ import annotations

from omegaconf import DictConfig

from specpipe.checks.llamacpp import check_llamacpp
from specpipe.checks.machine import check_tuned_on
from specpipe.checks.proposer import check_batch, check_early_stop, check_heads, check_proposer, check_sampling
from specpipe.checks.result import Check
from specpipe.checks.target import check_early_exit, check_engine, check_lora, check_memory, check_precision
from specpipe.checks.tokenizers import check_tokenizer
from specpipe.checks.validate import check_options, check_settings


def run_checks(cfg: DictConfig, target_tokenizer_loader, draft_tokenizer_loader,
               target_config_loader=lambda: None, draft_config_loader=lambda: None) -> list[Check]:
    settings = check_settings(cfg)  # first: the options check builds the controller, sized by these
    options = check_options(cfg) if settings.status != "refuse" else Check("options", "n/a", "not checked: fix the settings first")
    if "refuse" in (settings.status, options.status):  # later checks read these values
        return [settings, options]
    target_config = target_config_loader()
    tokenizer = check_tokenizer(cfg, target_tokenizer_loader, draft_tokenizer_loader)
    if cfg.engine == "llamacpp":  # the GGUF runs as it is: its own rules for precision, engine and memory
        target = check_llamacpp(cfg)
    else:
        target = [check_early_exit(cfg, target_config), check_lora(cfg), *check_precision(cfg),
                  *check_engine(cfg, target_config), check_memory(cfg, target_config, draft_config_loader)]
    return [
        settings,
        options,
        check_proposer(cfg),
        *target,
        check_sampling(cfg),
        tokenizer,
        check_heads(cfg, lambda: target_config),
        check_batch(cfg, target_config, draft_config_loader, tokenizer.translated),
        check_early_stop(cfg),
        check_tuned_on(cfg),
    ]
