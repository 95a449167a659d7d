"""Whether this machine differs from the one a recipe was tuned on in a way that changes the
choice (`measured.tuned_on`): another device, or a CPU without the instruction sets the recipe's
precision was fastest with. A warning, never a refusal: the output stays lossless, only the
speed the recipe promises may not hold."""

from __future__ import annotations

from omegaconf import DictConfig

from specpipe import machine
from specpipe.checks.result import Check
from specpipe.errors import SpecpipeError
from specpipe.recipe import load_recipe
from specpipe.settings import Settings

NAME = "tuned on"
AMX_PRECISIONS = ("bf16",)  # target precisions whose speed rests on AMX (bf16 tiles)


def check_tuned_on(cfg: DictConfig, s: Settings) -> Check:
    """cfg: for the recipe it names."""
    tuned = _tuned_on(cfg)
    if tuned is None:
        return Check(NAME, "n/a", "no recipe, or one that names no machine it was tuned on")
    where = describe(tuned)
    changed = differences(tuned, s.device, str(s.precision), machine.cpu_features())
    if not changed:
        return Check(NAME, "ok", f"the recipe was tuned on {where}; this machine has what its choice rests on")
    command = f"specpipe tune model={s.model} device={s.device}"
    return Check(NAME, "warn", f"the recipe was tuned on {where}; {changed[0]}, so another strategy may win here: "
                 f"run `{command}` for a recipe for this machine", command)


def differences(tuned: dict, device: str, precision: str, features: tuple[str, ...]) -> list[str]:
    """What changes the recipe's choice here, worst first (empty: nothing)."""
    if tuned.get("device", "cpu") != device:
        return [f"this run is on device={device}"]
    if device != "cpu":
        return []
    had = set(tuned.get("cpu_features") or ())
    found = []
    if "amx" in had and "amx" not in features and precision in AMX_PRECISIONS:
        found.append(f"this CPU has no AMX, without which {precision} runs at a fraction of that speed")
    if "avx512" in had and "avx512" not in features:
        found.append("this CPU has no AVX-512, on which its kernels were timed")
    return found


def describe(tuned: dict) -> str:
    """'a CPU (Intel Xeon; avx2, avx512, amx), bf16, 2026-12-04' or 'cuda (NVIDIA H200), bf16, ...'."""
    device = tuned.get("device", "cpu")
    if device == "cpu":
        features = ", ".join(tuned.get("cpu_features") or ()) or "no AVX2"
        what = f"a CPU ({tuned.get('cpu') or 'unnamed'}; {features})"
    else:
        what = f"{device} ({tuned.get('gpu') or 'a GPU'})"
    return ", ".join(str(part) for part in (what, tuned.get("precision"), tuned.get("date")) if part)


def _tuned_on(cfg: DictConfig) -> dict | None:
    if not cfg.get("recipe"):
        return None
    try:
        tuned = load_recipe(cfg.recipe).measured.get("tuned_on")
    except SpecpipeError:  # an unreadable recipe is refused where it is applied, not here
        return None
    return tuned if isinstance(tuned, dict) else None
