"""specpipe: declarative speculative decoding for Hugging Face causal LMs.

    from specpipe import Pipeline, compose
    pipeline = Pipeline.from_config(compose(["model=qwen2.5-coder-1.5b", "proposer=draft"]))
    for event in pipeline.generate("Write a quicksort in Python", max_new_tokens=64):
        print(event.text, end="", flush=True)
"""

__all__ = ["Pipeline", "compose"]


def __getattr__(name: str):
    # lazy, so `specpipe --help` does not pay for importing torch and transformers
    if name == "Pipeline":
        from specpipe.pipeline import Pipeline

        return Pipeline
    if name == "compose":
        from specpipe.config import compose

        return compose
    raise AttributeError(name)
