"""`specpipe train proposer=dflash`: the block loss falls, training's blocks draft what the proposer
drafts, a run resumes and writes a drafter that proposer=dflash runs losslessly, bad input is refused."""

from __future__ import annotations

import json
import random

import pytest
import torch

from conftest import PINNED, tiny_model, tiny_tokenizer
from specpipe.commands import train as train_command
from specpipe.config import compose
from specpipe.engine import TargetOutput, make_runner
from specpipe.heads.dflash import DFlashDrafter, DFlashShape
from specpipe.heads.eagle import EagleShape
from specpipe.pipeline import Pipeline
from specpipe.proposers.dflash import DFlashProposer
from specpipe.recipe import load_recipe
from specpipe.sampling import RowRandom, SamplingParams
from specpipe.train import data, dflash, features
from specpipe.train.drafting import FrozenTarget
from specpipe.types import Rows
from zygote import specpipe


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A tiny target saved to disk, a corpus of learnable repeats, and prompts drawn from it."""
    root = tmp_path_factory.mktemp("train_dflash")
    model = tiny_model(0, dtype=torch.float32)
    model.save_pretrained(root / "target")
    tiny_tokenizer().save_pretrained(root / "target")
    rng = random.Random(0)
    phrases = [" ".join(f"w{rng.randrange(2, 63)}" for _ in range(6)) for _ in range(8)]
    (root / "corpus.txt").write_text(" ".join(rng.choice(phrases) for _ in range(700)))
    prompts = [{"id": str(i), "category": "c", "messages": [{"role": "user", "content": rng.choice(phrases)}]}
               for i in range(40)]
    (root / "prompts.jsonl").write_text("\n".join(json.dumps(p) for p in prompts))
    return root


def args(setup, tmp_path, *extra):
    """The target's own answers to 40 prompts, blocks of 4 drafts."""
    return compose([f"model={setup / 'target'}", "proposer=dflash", "tokens=0", "batch=64", "lr=0.003", "distill=40",
                    "distill_tokens=48", f"distill_prompts={setup / 'prompts.jsonl'}", f"out={tmp_path / 'recipes'}",
                    *extra], "train")


def corpus_blocks(setup, tmp_path, layers=(0, 1), block_size: int = 5) -> tuple[dflash.Blocks, torch.nn.Module]:
    target = tiny_model(0, dtype=torch.float32)
    seqs = data.sequences(tiny_tokenizer(), [str(setup / "corpus.txt")], 48, 1536)
    folder = features.compute(make_runner(target), seqs, tmp_path / "features", layers=layers)
    return dflash.Blocks(features.load(folder), block_size), target


def drafter(block_size: int = 5, layers=(0, 1), seed: int = 0) -> DFlashDrafter:
    torch.manual_seed(seed)
    shape = DFlashShape(EagleShape.of_target(tiny_model(0).config), 1, layers, block_size, mask_token_id=63)
    return DFlashDrafter(shape)


def test_a_few_steps_lower_the_block_loss(setup, tmp_path):
    blocks, target = corpus_blocks(setup, tmp_path)
    trainer = dflash.DFlashTrainer(drafter(), target.get_input_embeddings().weight.detach(),
                                   target.get_output_embeddings().weight.detach(), torch.arange(64), lr=0.003)
    before = trainer.accuracy(blocks)
    gen = torch.Generator().manual_seed(0)
    losses = [trainer.step(blocks, batch) for _ in range(4) for batch in blocks.batches(64, gen)][:30]
    assert len(losses) == 30 and all(torch.isfinite(torch.tensor(losses)))
    assert sum(losses[-5:]) / 5 < 0.8 * sum(losses[:5]) / 5
    after = trainer.accuracy(blocks)
    assert len(after) == 4 and after == sorted(after, reverse=True)  # P(first k all right) cannot grow with k
    assert after[0] > before[0]


def test_a_training_block_drafts_what_proposer_dflash_drafts(setup, tmp_path):
    """The training forward (every block of a batch at once, under the block mask) is the drafting
    forward: the proposer, prefilled with the same context, drafts the same tokens, and the
    other blocks of the batch change nothing."""
    blocks, target = corpus_blocks(setup, tmp_path)
    block = 5
    model = drafter(block, seed=1)
    with torch.no_grad():  # sharper random scores: no near-ties between the two forwards' sums
        for p in model.parameters():
            p.mul_(2.0)
    embed, lm = (w.weight.detach().float() for w in (target.get_input_embeddings(), target.get_output_embeddings()))
    anchors = torch.tensor([3, 9, 17, 30])
    t = blocks.tensors([(0, anchors), (1, anchors[:2])])
    with torch.no_grad():
        hidden, labels = dflash.block_outputs(model, embed, t)
    trained = (hidden @ lm.T).argmax(-1)  # [2, 4, W - 1]
    assert bool((labels[1, 2:] == -100).all())  # the padded blocks count for nothing
    proposer = DFlashProposer(model, SamplingParams())
    proposer.bind(FrozenTarget(embed, lm))
    s = blocks.seqs[0]
    for j, a in enumerate(anchors.tolist()):
        tokens = s["tokens"][: a + 1].tolist()
        parts = s["features"][:a].float().split(32, -1)  # the prefill saw every token but the last
        proposer.prefill(0, tokens, TargetOutput(torch.empty(0), {k: p[None] for k, p in zip((0, 1), parts)}))
        rows = Rows([tokens], [RowRandom(0)], lambda position: 0.0, torch.device("cpu"), trees=False)
        drafted = proposer.propose(rows, [block - 1]).tokens[0]
        assert drafted.tolist() == trained[0, j].tolist(), a
        proposer.release(0, tokens)  # the next anchor's context is written over this one's slots


def test_train_resumes_and_writes_a_drafter_that_proposer_dflash_runs_losslessly(setup, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECPIPE_CACHE", str(tmp_path / "cache"))
    checkpoint = tmp_path / "recipes" / "target" / ".dflash-checkpoint"
    real_step = dflash.DFlashTrainer.step
    seen = {"epoch_one": 0, "after": 0}

    def dies_in_epoch_two(self, blocks, batch):
        if not (checkpoint / "trainer.pt").exists():
            seen["epoch_one"] += 1
        else:
            seen["after"] += 1
            if seen["after"] == 2:
                raise KeyboardInterrupt  # killed in the middle of the second epoch
        return real_step(self, blocks, batch)

    monkeypatch.setattr(dflash.DFlashTrainer, "step", dies_in_epoch_two)
    with pytest.raises(KeyboardInterrupt):
        train_command.run(args(setup, tmp_path, "epochs=8"))
    assert torch.load(checkpoint / "trainer.pt")["epoch"] == 0 and seen["epoch_one"] > 2

    steps = {"n": 0}
    monkeypatch.setattr(dflash.DFlashTrainer, "step",
                        lambda self, b, batch: steps.__setitem__("n", steps["n"] + 1) or real_step(self, b, batch))
    assert train_command.run(args(setup, tmp_path, "epochs=8")) == 0
    assert steps["n"] == 7 * seen["epoch_one"]  # resumed: epochs 2 to 8 only
    assert not checkpoint.exists()

    recipe = load_recipe(tmp_path / "recipes" / "target" / "dflash.yaml")
    assert recipe.strategy["proposer"] == "dflash" and recipe.artifacts == {"heads": "dflash"}
    assert (recipe.strategy["controller"], recipe.strategy["gamma"]) == ("fixed", 4)  # the block's drafts
    accuracy = recipe.measured["held_out_top1_per_position"]
    assert len(accuracy) == 4 and accuracy[0] > 0.2  # chance is 1/64
    written = json.loads((recipe.path.parent / "dflash" / "config.json").read_text())
    assert written["architectures"] == ["DFlashDraftModel"] and written["block_size"] == 5
    assert written["dflash_config"]["target_layer_ids"] == [0, 1]  # both of the tiny target's layers
    assert written["specpipe"]["target"] == str(setup / "target")
    prompt = json.loads((setup / "prompts.jsonl").read_text().splitlines()[0])["messages"]
    for lookup in ("true", "false"):  # false: every draft is the drafter's
        pipeline = Pipeline.from_config(compose([f"recipe={recipe.path}", f"model={setup / 'target'}", *PINNED,
                                                 f"proposer.lookup={lookup}"]))
        spec = pipeline.run(prompt, max_new_tokens=40)
        assert spec.token_ids == pipeline.run(prompt, max_new_tokens=40, speculative=False).token_ids
        assert spec.stats.drafted > 0 and spec.stats.accepted > 0  # trained on the target's answers, it guesses right


def test_the_written_drafter_loads_by_its_folder(setup, tmp_path, monkeypatch):
    """`proposer=dflash proposer.heads=DIR` runs what train wrote, as any DFlash checkpoint."""
    monkeypatch.setenv("SPECPIPE_CACHE", str(tmp_path / "cache"))
    assert train_command.run(args(setup, tmp_path, "epochs=2", "dtype=float16")) == 0
    folder = tmp_path / "recipes" / "target" / "dflash"
    assert not any("embed" in name or "lm_head" in name for name in dflash.load(folder).state_dict())  # the target's
    pipeline = Pipeline.from_config(compose([f"model={setup / 'target'}", "proposer=dflash",
                                             f"proposer.heads={folder}", "gamma=4", *PINNED], "generate"))
    prompt = json.loads((setup / "prompts.jsonl").read_text().splitlines()[1])["messages"]
    spec = pipeline.run(prompt, max_new_tokens=32)
    assert spec.token_ids == pipeline.run(prompt, max_new_tokens=32, speculative=False).token_ids
    assert spec.stats.drafted > 0


@pytest.mark.parametrize("extra, words", [
    (["target_layers=[0,5]"], ["target_layers=[0, 5]", "numbered 0 to 1", "2-layer target"]),
    (["target_layers=[1,1]"], ["target_layers=[1, 1]", "distinct"]),
    (["num_heads=0"], ["num_heads=0", "at least 1"]),
])
def test_bad_settings_are_refused_in_one_paragraph(setup, tmp_path, extra, words):
    result = specpipe("train", f"model={setup / 'target'}", "proposer=dflash", "tokens=0", "distill=4",
                      f"distill_prompts={setup / 'prompts.jsonl'}", f"out={tmp_path / 'recipes'}", *extra,
                      env={"SPECPIPE_CACHE": str(tmp_path / "cache")})
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    message = " ".join(result.stderr.split())
    assert all(word in message for word in words), message
    assert not (tmp_path / "cache" / "distill").exists()  # refused before anything was decoded
