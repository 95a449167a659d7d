"""The `speculators` half of tests/test_speculators.py, run by an interpreter that has the
package (it may live in a side environment without specpipe: this file imports neither
specpipe nor its dependencies). Tensors travel in safetensors files.

    python speculators_side.py read HEAD_DIR INPUTS OUT      speculators' classes read a head specpipe saved
    python speculators_side.py write HEAD_DIR INPUTS OUT     speculators saves a tiny head of its own
    python speculators_side.py load HEAD_DIR INPUTS OUT      speculators' from_pretrained loads a head
                                                             specpipe saved (sharded too; its verifier
                                                             entry: a local folder)

INPUTS holds `embed` [V, H] (the target's embeddings), `hidden` [1, T, 3H] (the fused layers'
input) and `ids` [1, T]; OUT gets `step0`, `step1`: the draft ids of speculators' own forward
over two training-time-test steps, and OUT.json what the package made of the checkpoint.
"""

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from speculators import SpeculatorModelConfig
from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig


def read(head_dir: str, inputs: dict) -> tuple[Eagle3DraftModel, dict]:
    config = SpeculatorModelConfig.from_pretrained(head_dir)
    config.transformer_layer_config._attn_implementation = "eager"  # noqa: SLF001 (no flex attention on CPU)
    model = Eagle3DraftModel(config)
    result = model.load_state_dict(load_file(str(Path(head_dir) / "model.safetensors")), strict=False)
    return model, {"config_class": type(config).__name__, "draft_vocab_size": config.draft_vocab_size,
                   "aux_ids": config.eagle_aux_hidden_state_layer_ids,
                   "norm_before_residual": config.norm_before_residual,
                   "speculative_tokens": config.speculators_config.proposal_methods[0].speculative_tokens,
                   "verifier": config.speculators_config.verifier.name_or_path,
                   "missing": sorted(result.missing_keys), "unexpected": sorted(result.unexpected_keys)}


def load(head_dir: str, inputs: dict) -> tuple[Eagle3DraftModel, dict]:
    """The way a user loads a head: from_pretrained, which reads transformers' shards and index."""
    config = SpeculatorModelConfig.from_pretrained(head_dir)
    config.transformer_layer_config._attn_implementation = "eager"  # noqa: SLF001
    model = Eagle3DraftModel.from_pretrained(head_dir, config=config, local_files_only=True)
    state = {name: t.detach().clone() for name, t in model.state_dict().items()}
    save_file({k: v.contiguous() for k, v in state.items() if not k.startswith(("embed_tokens", "verifier_"))},
              str(Path(head_dir).parent / "loaded.safetensors"))
    return model, {"config_class": type(config).__name__, "draft_vocab_size": config.draft_vocab_size}


def write(head_dir: str, inputs: dict) -> tuple[Eagle3DraftModel, dict]:
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig
    from transformers import LlamaConfig

    vocab, hidden = inputs["embed"].shape
    layer = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=48, num_hidden_layers=1,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=8, rms_norm_eps=1e-6,
                        tie_word_embeddings=False)
    layer._attn_implementation = "eager"  # noqa: SLF001
    config = Eagle3SpeculatorConfig(
        transformer_layer_config=layer, draft_vocab_size=vocab // 2, norm_before_residual=False,
        eagle_aux_hidden_state_layer_ids=[1, 2, 3],
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3", proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=3)],
            default_proposal_method="greedy",
            verifier=VerifierConfig(name_or_path="tiny-target", architectures=["LlamaForCausalLM"])))
    torch.manual_seed(0)
    model = Eagle3DraftModel(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(1.0 if "norm" in name else 0.0, 0.3)
    draft = torch.arange(0, vocab, 2)  # even target ids
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[draft] = True
    model.load_vocab_mappings(t2d, draft - torch.arange(len(draft)))
    model.save_pretrained(head_dir)
    return model, {"files": sorted(p.name for p in Path(head_dir).iterdir())}


def main(mode: str, head_dir: str, inputs_path: str, out: str) -> None:
    inputs = load_file(inputs_path)
    model, report = {"read": read, "write": write, "load": load}[mode](head_dir, inputs)
    model = model.float().eval()
    with torch.no_grad():
        model.embed_tokens.weight.copy_(inputs["embed"])
        steps = model(hidden_states=inputs["hidden"], input_ids=inputs["ids"],
                      document_ids=torch.zeros_like(inputs["ids"]), ttt_steps=2)
    save_file({"step0": steps[0].contiguous(), "step1": steps[1].contiguous()}, out)
    Path(out + ".json").write_text(json.dumps(report))


if __name__ == "__main__":
    main(*sys.argv[1:5])
