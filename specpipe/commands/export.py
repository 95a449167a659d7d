"""`specpipe export vllm|sglang recipe=... [out=FILE]`: serving-engine settings for a composition.

Takes the same settings as `generate` (usually just `recipe=`); loads no weights, except the
target's LM head for a Medusa export (vLLM reads it from the heads' folder). vLLM: writes
the speculative_config JSON (default speculative_config.json) and prints the `vllm serve`
command. SGLang: prints the launch command (and writes it to `out=` when given). What has no
equivalent is exported as the nearest setting, with a warning naming what is lost.
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from specpipe.bench.results import write_json
from specpipe.config import compose
from specpipe.errors import SpecpipeError
from specpipe.export import sglang, vllm
from specpipe.export.plan import plan_of

ENGINES = {"vllm": vllm, "sglang": sglang}
USAGE = "usage: specpipe export vllm|sglang recipe=PATH [other generate settings] [out=FILE]"


def run(args: list[str]) -> int:
    if not args or args[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    if args[0] not in ENGINES:
        raise SpecpipeError(f"`specpipe export {args[0]}`: the engines are {', '.join(ENGINES)}. {USAGE}")
    out = next((a.partition("=")[2] for a in args[1:] if a.startswith("out=")), None)
    overrides = [a for a in args[1:] if not a.startswith("out=")]
    cfg = compose(overrides, "generate")
    plan = plan_of(cfg)
    medusa_dir = Path(out or "speculative_config.json").parent / "medusa-vllm"
    result = vllm.export(plan, medusa_dir) if args[0] == "vllm" else sglang.export(plan)
    err = Console(stderr=True)
    for warning in result.warnings:
        err.print(f"[yellow]warning:[/yellow] {warning}", highlight=False)
    if result.settings.get("method") == "medusa":
        _write_medusa(cfg, plan, medusa_dir, err)
    if result.engine == "vllm" and result.settings:
        path = write_json(Path(out or "speculative_config.json"), result.settings)
        err.print(f"speculative_config ({result.engine} {result.version}): {path}")
    elif out:
        _write_text(Path(out), result.command + "\n")
        err.print(f"command: {out}")
    print(result.command)
    return 0


def _write_medusa(cfg, plan, folder: Path, err: Console) -> None:
    from specpipe.heads.io import save_medusa_for_vllm
    from specpipe.models.loader import load_model, resolve

    with err.status("writing the heads with the target's LM head for vLLM…"):
        lm_weight = load_model(resolve(cfg.model.name)).get_output_embeddings().weight
        save_medusa_for_vllm(Path(plan.heads), lm_weight, folder)
    err.print(f"medusa heads for vLLM: {folder}")


def _write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.replace(path)
