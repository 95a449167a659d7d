"""An interrupted per-prompt bench keeps what it measured, and the same command resumes it.

After each prompt the results so far go to `results.partial.json` in the output folder
(atomically, with the run's `measured_with`). A rerun with the same settings and prompts reads
them back and measures only the prompts left; other settings (or a file it cannot read), and it
starts over, the earlier file kept renamed with its date (outputs.keep_aside: nothing measured is
lost silently). Once results.json is written the partial file goes.
A request load and a sweep keep theirs already (a sweep's finished jobs; a load is one measurement).
"""

from __future__ import annotations

import json
from pathlib import Path

from specpipe.bench.records import PromptResult
from specpipe.bench.results import changes, write_json
from specpipe.outputs import keep_aside

PARTIAL_FILE = "results.partial.json"


class KeptResults:
    """{prompt index: result} of this run and of an interrupted earlier one with the same settings."""

    def __init__(self, folder: Path, measured: dict):
        self.path, self.measured = Path(folder) / PARTIAL_FILE, measured
        self.set_aside: Path | None = None  # an earlier run's file this one cannot use, renamed
        self.why_aside = ""
        self.done: dict[int, PromptResult] = self._earlier()
        self.resumed = len(self.done)

    def _earlier(self) -> dict[int, PromptResult]:
        if not self.path.is_file():
            return {}
        try:
            data = json.loads(self.path.read_text())
            then = data.get("measured_with")
            if then == self.measured:
                return {int(i): PromptResult.from_dict(r) for i, r in data["prompts"].items()}
            changed = changes(then, self.measured) or ["other settings"]
            self.why_aside = "; ".join(changed[:3]) + (f"; {len(changed) - 3} more" if len(changed) > 3 else "")
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
            self.why_aside = f"it cannot be read back: {type(err).__name__}"
        try:  # not one this run can use: kept, and measured again
            self.set_aside = keep_aside(self.path)
        except OSError:
            pass  # cannot be renamed: then it cannot be replaced either (keep() writes beside it, and fails quietly)
        return {}

    def keep(self, _result: PromptResult) -> None:
        """Called after each prompt (bench_prompts has put it in `done`): everything so far, on disk."""
        try:
            write_json(self.path, {"measured_with": self.measured,
                                   "prompts": {str(i): r.to_dict() for i, r in sorted(self.done.items())}})
        except OSError:
            pass  # keeping only makes a rerun resume: a folder gone bad stops no measurement (results.json will say)

    def finish(self) -> None:
        self.path.unlink(missing_ok=True)
