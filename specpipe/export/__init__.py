"""Export a composition to the serving engines users outgrow one machine with.

`plan.py` reads what a config (usually a recipe) asks for in engine-neutral terms; `vllm.py`
and `sglang.py` each map that to one pinned engine version's settings, naming what is lost.
"""
