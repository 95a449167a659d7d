"""An interrupted per-prompt bench keeps what it measured, and the same command resumes it.

After each prompt the results so far go to `results.partial.json` in the output folder
(atomically, with the run's `measured_with`). A rerun with the same settings and prompts reads
them back and measures only the prompts left; other settings, and it starts over (the stale file
is replaced as the new run measures). Once results.json is written the partial file goes.
A request load and a sweep keep theirs already (a sweep's finished jobs; a load is one measurement).
"""

from __future__ import annotations

import json
from pathlib import Path

from specpipe.bench.records import PromptResult
from specpipe.bench.results import write_json

PARTIAL_FILE = "results.partial.json"


class KeptResults:
    """{prompt index: result} of this run and of an interrupted earlier one with the same settings."""

    def __init__(self, folder: Path, measured: dict):
        self.path, self.measured = Path(folder) / PARTIAL_FILE, measured
        self.done: dict[int, PromptResult] = self._earlier()
        self.resumed = len(self.done)

    def _earlier(self) -> dict[int, PromptResult]:
        try:
            data = json.loads(self.path.read_text())
            if data.get("measured_with") != self.measured:
                return {}
            return {int(i): PromptResult.from_dict(r) for i, r in data["prompts"].items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return {}  # none, or not one this run can use: measured again

    def keep(self, _result: PromptResult) -> None:
        """Called after each prompt (bench_prompts has put it in `done`): everything so far, on disk."""
        try:
            write_json(self.path, {"measured_with": self.measured,
                                   "prompts": {str(i): r.to_dict() for i, r in sorted(self.done.items())}})
        except OSError:
            pass  # keeping only makes a rerun resume: a folder gone bad stops no measurement (results.json will say)

    def finish(self) -> None:
        self.path.unlink(missing_ok=True)
