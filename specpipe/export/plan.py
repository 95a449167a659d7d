"""What a composition asks of a serving engine, in engine-neutral terms (`ExportPlan`).

Serving engines take a fixed number of draft tokens, so an adaptive controller becomes the
nearest fixed γ: the mean γ its recipe measured (rounded), else its starting γ, with a warning
naming what is lost. Models are named as the engine loads them: a zoo model by the hub id of
its original checkpoint (the zoo's GGUF is a 4-bit copy of it), anything else as given.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from specpipe.checks.identity import kind_of
from specpipe.components import module_of
from specpipe.controllers.base import check_schedule
from specpipe.declaration import Declaration
from specpipe.declaration import engine_model
from specpipe.errors import SpecpipeError
from specpipe.models import zoo
from specpipe.recipe import load_recipe
from specpipe.settings import Settings, resolve


@dataclass
class ExportPlan:
    target: str  # what the engine loads as the target
    proposer: Declaration  # what the proposer declares, its export mappings included
    gamma: int  # fixed draft tokens per step
    options: dict = field(default_factory=dict)  # the proposer's options as configured
    draft: str | None = None  # a second model as the engine loads it (twin: the target itself)
    heads: str | None = None  # trained heads: the folder, absolute
    tree: list | dict | None = None  # the proposer's tree option; None: a chain
    batch_schedule: dict[int, int] = field(default_factory=dict)  # batch size -> γ (0: speculation off there)
    translated: bool = False  # the draft model has another tokenizer than the target
    warnings: list[str] = field(default_factory=list)
    version: str = ""  # the engine version a mapping writes for (set by settings_for)
    methods: tuple[str, ...] = ()  # that version's method / algorithm names
    keys: tuple[str, ...] = ()  # that version's keys (vLLM) or flags (SGLang): what a mapping may write
    model: str = ""  # the target as configured (a zoo name stays a zoo name here)
    # engine -> (settings, version) -> warnings: what the verifier adds to the engine's settings, in
    # place (its module's EXPORT); none: the engine's default verification (rejection sampling)
    verification: Mapping[str, Callable] = field(default_factory=dict)

    @property
    def off_from(self) -> int | None:
        """The smallest batch size at which the schedule switches speculation off, if any."""
        return min((size for size, gamma in self.batch_schedule.items() if gamma == 0), default=None)

    def settings_for(self, engine: str, version: str, methods: tuple[str, ...] = (),
                     keys: tuple[str, ...] = ()) -> tuple[dict | None, list[str]]:
        """The proposer's own mapping to `engine` (None: nothing to speculate with), and the
        warnings: the plan's and what the mapping says it loses (on a copy: the plan is reusable).
        The mapping reads the engine's version, methods and keys from the plan, so proposers never
        import the exporters, and ask whether a key exists rather than which version it is."""
        mapping = self.proposer.export.get(engine)
        if mapping is None:
            raise SpecpipeError(f"proposer={self.proposer.name} has no {engine} {version} export (its module declares "
                                "none).")
        own = dataclasses.replace(self, warnings=list(self.warnings), version=version, methods=tuple(methods),
                                  keys=tuple(keys))
        return mapping(own), own.warnings

    def verifier_settings(self, engine: str, version: str, settings: dict | None) -> list[str]:
        """The verifier's own keys added to `settings` (in place; nothing without speculation),
        and what the engine loses of it."""
        mapping = self.verification.get(engine)
        return [] if mapping is None or not settings else mapping(settings, version)


def plan_of(cfg: DictConfig, settings: Settings | None = None, checks: list | None = None) -> ExportPlan:
    """settings: the config resolved (here, without fetching models, when None); checks: its
    `config_checks` (run here when None). The plan reads the settings' choices (the proposer's
    declaration, the schedule, the sampling, the adapters), the components' own options from cfg."""
    from specpipe.build import config_checks  # the build sits above the export's plan

    settings = settings or resolve(cfg, fetch=False)
    checks = config_checks(cfg, settings) if checks is None else checks
    declaration = settings.declaration
    gamma, lost = _fixed_gamma(cfg, declaration.name)
    options = OmegaConf.to_container(cfg.proposer, resolve=True)
    options.pop("_target_", None)
    plan = ExportPlan(engine_model(settings.model), declaration, gamma, options, warnings=[lost] if lost else [],
                      batch_schedule=check_schedule(settings.batch_schedule), model=settings.model,
                      verification=getattr(module_of(cfg.verifier.get("_target_")), "EXPORT", {}))
    if plan.batch_schedule.get(1):  # what runs at batch 1 is the schedule's γ
        plan.gamma = plan.batch_schedule[1]
    if settings.model in zoo.ZOO:
        plan.warnings.append(f"{settings.model} is exported as {plan.target}, the original checkpoint of the "
                             "zoo's 4-bit GGUF: the engine serves the original weights.")
    plan.translated = any(check.translated for check in checks)
    if declaration.draft_model == "target":
        plan.draft = plan.target
    elif declaration.draft_model:
        plan.draft = engine_model(str(options[declaration.draft_model]))
    if declaration.heads:
        if OmegaConf.is_missing(cfg.proposer, "heads"):
            raise SpecpipeError(f"proposer={declaration.name} needs proposer.heads=DIR to export (or a recipe that "
                                f"ships heads, e.g. recipe=recipes/smollm2-135m/{declaration.name}.yaml).")
        plan.heads = str(Path(cfg.proposer.heads).resolve())
    if declaration.tree != "never":
        plan.tree = options.get("tree") or None
    if settings.lora:
        plan.warnings.append("model.lora is not exported: merge the adapter into the target (peft "
                             "merge_and_unload, save_pretrained) and serve the merged folder.")
    if cfg.get("guard", True) and declaration.name != "none":
        plan.warnings.append("the guard (γ = 0 for a request whose drafts do not pay) has no equivalent in serving "
                             "engines: there every request speculates at the exported γ, and a batch schedule that "
                             "switches speculation off at large batches is the nearest setting (guard=false "
                             "exports without this note).")
    if settings.temperature > 0:
        plan.warnings.append("temperature, top_k and top_p are per-request settings in serving engines: send "
                             "them with each request (their rejection sampling keeps the distribution).")
    return plan


def _fixed_gamma(cfg: DictConfig, kind: str) -> tuple[int, str | None]:
    """(γ for the engine, the warning when an adaptive controller had to be fixed)."""
    controller = kind_of(cfg.controller)
    if kind == "none" or controller == "fixed":
        return int(cfg.gamma), None
    measured = load_recipe(cfg.recipe).measured.get("gamma_mean") if cfg.recipe else None
    known = isinstance(measured, (int, float)) and measured > 0
    gamma = max(1, round(measured)) if known else max(1, int(cfg.gamma))
    source = "the mean γ its recipe measured" if known else "its starting γ"
    return gamma, (f"controller={controller} has no equivalent (the engine drafts a fixed number of tokens): "
                   f"exported as γ={gamma}, {source}. Lost: {LOST.get(controller, 'its adaptive γ.')}")


LOST = {
    "cost": "γ chosen per step from measured costs, including switching speculation off when it cannot pay.",
    "heuristic": "γ growing after fully accepted drafts and shrinking after rejections.",
    "band": "γ moving with the acceptance rate of a recent window.",
    "confidence": "drafts stopping early when the proposer's confidence drops.",
}
