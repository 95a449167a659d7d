"""`specpipe bench`'s parts: run prompts against the plain target (runner, peers), summarize,
store (results), and render (table, plots). The command itself is commands/bench.py."""
