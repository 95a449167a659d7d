"""Mutation checks: each entry plants one realistic bug in a copy of the package and runs the
tests that guard against it; every such run must fail. A test that still passes with the bug in
place cannot catch it.

    python tests/mutants.py              # every mutation
    python tests/mutants.py NAME ...     # some of them (python tests/mutants.py --list)

The copy lives in a temporary folder (the working tree is never edited); large folders the
tests only read are linked, not copied. Exit status 0 when every mutation was caught. A mutation
whose tests read a released wheel (`needs`: its folder's variable, as `.ci/run` sets it) is not
run without it, and then the run does not pass either. The comment above an entry says what the
earlier form of its test did with the bug, where that form was weaker.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COPIED = ("specpipe", "tests", "conf", "strategies", "pyproject.toml")
LINKED = ("recipes", "benchmarks", "docs", "README.md")


@dataclass(frozen=True)
class Mutation:
    name: str
    path: str  # relative to the repository root
    old: str  # must occur exactly once
    new: str
    tests: tuple[str, ...]  # pytest arguments (a node id, with `-k EXPR` where it names a subset), each must fail
    also: tuple[tuple[str, str, str], ...] = ()  # more (path, old, new) of the same bug, in other places
    needs: str | None = None  # an environment variable the tests need (a wheel folder): not run without it


MUTATIONS = (
    # the sampling oracle is transformers' own warpers; the old one was SamplingParams.probs of
    # sampling.py itself, so each of these three bugs moved the expected distribution with the sampled
    Mutation("temperature ignored", "specpipe/sampling.py",
             "logits = logits / self.temperature", "logits = logits",
             ("tests/test_rejection.py::test_sampling_distributions_equal_transformers_warpers",
              "tests/test_rejection.py::test_temperature_top_k_and_top_p_shape_target_and_draft")),
    Mutation("top-k keeps one token more", "specpipe/sampling.py",
             "torch.topk(logits, self.top_k, dim=-1)", "torch.topk(logits, self.top_k + 1, dim=-1)",
             ("tests/test_rejection.py::test_sampling_distributions_equal_transformers_warpers",
              "tests/test_rejection.py::test_temperature_top_k_and_top_p_shape_target_and_draft")),
    Mutation("top-p drops the token that crosses it", "specpipe/sampling.py",
             "sorted_probs.masked_fill(mass_before >= top_p, 0.0)",
             "sorted_probs.masked_fill(mass_before + sorted_probs >= top_p, 0.0)",
             ("tests/test_rejection.py::test_sampling_distributions_equal_transformers_warpers",
              "tests/test_rejection.py::test_temperature_top_k_and_top_p_shape_target_and_draft")),
    Mutation("recovered token from the target, not the residual", "specpipe/verifiers/rejection.py",
             "residual = (final - torch.where(rejected, draft_dist(tokens, probs, num_accepted, final), 0.0))",
             "residual = (final - torch.where(rejected, 0.0 * final, 0.0))",
             ("tests/test_rejection.py::test_emitted_tokens_follow_the_target",
              "tests/test_rejection.py::test_temperature_top_k_and_top_p_shape_target_and_draft")),
    Mutation("recovered token from the residual one column early", "specpipe/verifiers/rejection.py",
             "draft_dist(tokens, probs, num_accepted, final)", "draft_dist(tokens, probs, num_accepted - 1, final)",
             ("tests/test_rejection.py::test_emitted_tokens_follow_the_target",)),
    Mutation("argmax instead of a draw", "specpipe/verifiers/rejection.py",
             "return num_accepted, race(residual, draws)", "return num_accepted, residual.argmax(-1)",
             ("tests/test_rejection.py::test_emitted_tokens_follow_the_target",
              "tests/test_rejection.py::test_one_hot_draft_is_lossless",
              "tests/test_suffix.py::test_sampling_keeps_the_target_distribution",
              "tests/test_eagle.py::test_sampling_with_a_suffix_lookup_keeps_the_target_distribution")),
    Mutation("acceptance ignores the draft's probability", "specpipe/verifiers/rejection.py",
             "num_accepted = leading((uniform * draft_p < target_p) & drafted)",
             "num_accepted = leading((uniform < target_p) & drafted)",
             ("tests/test_rejection.py::test_emitted_tokens_follow_the_target",)),
    # the old rejection-sampling distribution tests verified one row at a time (verify_row): no other
    # row to read
    Mutation("a row verified against another row's logits", "specpipe/verifiers/rejection.py",
             "(rule or decide)(sampling.probs(logits), tokens,",
             "(rule or decide)(sampling.probs(logits.roll(1, 0)), tokens,",
             ("tests/test_rejection.py::test_every_row_is_verified_against_its_own_logits",
              "tests/test_batch.py::test_a_batched_step_samples_the_target_distribution")),
    # the old form (token 0 in 180 to 200 of 200 draws, at p 0.97) passed the argmax
    Mutation("typical acceptance takes the argmax", "specpipe/verifiers/typical.py",
             "picks = race(final, StepRandom.of(rngs).exponential(RESAMPLE, final.shape[1:], final.device))",
             "picks = final.argmax(-1)",
             ("tests/test_typical.py::test_accepts_the_plausible_prefix_and_samples_the_next_token",)),
    # exactness that asserts drafts ran: plain decoding equals plain decoding, so the old form
    # (the tokens alone) passed a proposer that never drafts
    Mutation("the n-gram lookup never drafts from its index", "specpipe/proposers/ngram.py",
             "return None if start is None else (committed[start + n : start + n + gamma], None)",
             "return None",
             ("tests/test_lossless.py::test_greedy_equals_plain -k 'ngram and greedy and native and 3-'",
              "tests/test_guard.py::test_a_guarded_run_equals_plain_greedy_token_for_token")),
    # the simulated-GPU EAGLE-3 tree compares tokens; its old form (drafts kept, equal lengths) passed
    Mutation("a tree's next token from its deepest node's parent row", "specpipe/verifiers/base.py",
             "next_token = top.gather(1, end[:, None])[:, 0] if pick is None else pick(end)",
             "next_token = top.gather(1, (end - 1).clamp_min(0)[:, None])[:, 0] if pick is None else pick(end)",
             ("tests/test_simulated_cuda.py::test_the_shipped_recipes_run_on_a_simulated_gpu_without_mixing_host_and_device"
              " -k fast",)),
    Mutation("a tree row's padding nodes may be accepted", "specpipe/verifiers/base.py",
             "whole = ~(self.lineage & ~(ok & self.real)[:, None, :]).any(2)",
             "whole = ~(self.lineage & ~ok[:, None, :]).any(2)",
             ("tests/test_step.py::test_a_padded_tree_batchs_verdict_is_the_hand_computed_one",)),
    Mutation("a draft model's cache is filled inside its drafts", "specpipe/proposers/model_drafter.py",
             "if gamma and len(rows.tokens[row]) - start > FEED:", "if False:",
             ("tests/test_step.py::test_a_proposers_cache_fill_is_timed_apart_from_its_drafts -k draft",)),
    Mutation("every feature shard rewritten", "specpipe/train/features.py",
             "if not _holds(path, shard):", "if True:",
             ("tests/test_train.py::test_a_growing_sequence_list_reuses_its_feature_shards",)),
    # exactness that asserts drafts were kept: a greedy verifier that keeps no draft is still lossless
    # (every token the target's argmax), so the old form (the tokens alone) passed it
    Mutation("the greedy verifier keeps no draft", "specpipe/verifiers/greedy.py",
             "num_accepted = leading(right)  # [R]",
             "num_accepted = 0 * leading(right)  # [R]",
             ("tests/test_lossless.py::test_greedy_equals_plain -k 'draft-perfect and greedy and native and 3-'",)),
    # save/load compares every tensor by name and dtype: heads written in float64 load as float64 with
    # the same values, and the old form (torch.equal, which promotes, over zipped state dicts) passed
    Mutation("heads saved and loaded in float64", "specpipe/heads/io.py",
             "save_file(tensors, str(folder / WEIGHTS))",
             "save_file({name: t.double() for name, t in tensors.items()}, str(folder / WEIGHTS))",
             ("tests/test_medusa.py::test_save_then_load_is_bit_exact",
              "tests/test_eagle.py::test_save_then_load_is_bit_exact_in_vllms_layout")),
    # SGLang's flags read from the 0.5.23 wheel itself. The old form compared exported flags with a
    # hand copy and never the exporter's own list: a typo there, in a flag no case writes, passed
    Mutation("the SGLang exporter's list misspells a flag", "specpipe/export/sglang.py",
             '"--speculative-draft-model-revision"', '"--speculative-draft-model-revison"',
             ("tests/test_export.py::test_the_sglang_exporters_lists_are_the_wheels",),
             needs="SPECPIPE_SGLANG_WHEELS"),
    # an exported flag misspelled in the proposer and in the exporter's list alike (its own check
    # passes); the old form caught this one only as long as its hand copy had been copied right
    Mutation("an exported SGLang flag misspelled", "specpipe/proposers/ngram.py",
             '"--speculative-ngram-max-bfs-breadth": 1}', '"--speculative-ngram-max-bfs-breath": 1}',
             ("tests/test_export.py::test_sglang_flags_exist_in_v0_5_23 -k ngram",),
             also=(("specpipe/export/sglang.py", '"--speculative-ngram-max-bfs-breadth"',
                    '"--speculative-ngram-max-bfs-breath"'),),
             needs="SPECPIPE_SGLANG_WHEELS"),
    # a value SGLang's parser refuses: the old form checked flag names only, and passed both
    Mutation("the suffix export's match type is not one of SGLang's", "specpipe/proposers/suffix.py",
             '"--speculative-ngram-match-type": "PROB"', '"--speculative-ngram-match-type": "PROBABILITY"',
             ("tests/test_export.py::test_sglang_flags_exist_in_v0_5_23 -k suffix",),
             needs="SPECPIPE_SGLANG_WHEELS"),
    Mutation("SGLang's block-verification switch written with a value", "specpipe/verifiers/block.py",
             'flags["--speculative-use-block-verification"] = True',
             'flags["--speculative-use-block-verification"] = "true"',
             ("tests/test_export.py::test_sglang_flags_exist_in_v0_5_23 -k block",),
             needs="SPECPIPE_SGLANG_WHEELS"),
    Mutation("a seeded row draws from the batch's shared stream", "specpipe/sampling.py",
             "return row is not None and row.seed is not None", "return False",
             ("tests/test_batch_random.py::test_a_seeded_row_samples_what_it_samples_alone_beside_unseeded_rows",)),
    Mutation("a shallower row keeps the deeper nodes of a batched tree search", "specpipe/proposers/eagle_tree.py",
             'scores = scores.masked_fill(depths > cut[:, None], float("-inf"))', "scores = scores",
             ("tests/test_eagle_batch.py::test_each_rows_tree_is_the_one_its_search_alone_makes -k eagle3",)),
    Mutation("the step does not record its cost in the meter", "specpipe/decode/step.py",
             "record(parts.controller.meter, verdicts, timing, len(launched.busy))", "pass",
             ("tests/test_step.py::test_the_step_records_each_step_in_the_meter_its_controllers_read",)),
)


def copy_tree(into: Path) -> None:
    for name in COPIED:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, into / name, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
        else:
            shutil.copy2(source, into / name)
    for name in LINKED:
        if (ROOT / name).exists():
            (into / name).symlink_to(ROOT / name)


def check(mutation: Mutation) -> bool | None:
    """True when the tests fail with the mutation in place (the bug is caught), None when they
    cannot run here (`needs` unset)."""
    if mutation.needs and not os.environ.get(mutation.needs):
        print(f"  NOT RUN: its tests need ${mutation.needs} (see .ci/run)")
        return None
    with tempfile.TemporaryDirectory(prefix="specpipe-mutant-") as folder:
        into = Path(folder)
        copy_tree(into)
        for where, old, new in ((mutation.path, mutation.old, mutation.new), *mutation.also):
            path = into / where
            text = path.read_text()
            if text.count(old) != 1:
                raise SystemExit(f"{mutation.name}: the text to mutate occurs {text.count(old)} times "
                                 f"in {where}; update the mutation")
            path.write_text(text.replace(old, new))
        env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
        caught = True
        for test in mutation.tests:
            run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                                  "-m", "full or not full", *shlex.split(test)], cwd=into, env=env,
                                 capture_output=True, text=True)
            if run.returncode == 0:
                print(f"  NOT CAUGHT by {test}")
                caught = False
            elif run.returncode != 1:  # 1: tests failed; anything else is a broken run, not a catch
                print(run.stdout[-2000:], run.stderr[-2000:])
                raise SystemExit(f"{mutation.name}: pytest exited {run.returncode} on {test}")
        return caught


def main(argv: list[str]) -> int:
    if argv == ["--list"]:
        print("\n".join(m.name for m in MUTATIONS))
        return 0
    chosen = [m for m in MUTATIONS if not argv or m.name in argv]
    missed = []
    unknown = set(argv) - {m.name for m in MUTATIONS}
    if unknown:
        raise SystemExit(f"no such mutation: {sorted(unknown)} (python tests/mutants.py --list)")
    for mutation in chosen:
        caught = check(mutation)
        print(f"{ {True: 'caught', False: 'MISSED', None: 'NOT RUN'}[caught]}: {mutation.name}", flush=True)
        if not caught:
            missed.append(mutation.name)
    print(f"{len(chosen) - len(missed)} of {len(chosen)} mutations caught")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
