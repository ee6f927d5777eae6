"""The paper's claims C1-C11 judged from the run records of a results tree.

Each claim names the runs it needs (one per seed) and the differences the paper says are
positive; the verdict follows one rule (``cpcfl_tf.evidence.judge.RULE``, printed at the top of
``claims.md``). Runs are found by their config wherever a script wrote them under
``--results`` (default ``results/<preset>``); ``--run`` first makes the missing ones
(into ``<results>/claims/``, linear evaluations into ``<results>/claims/linear_eval/``),
each seed pre-training its own encoders. Writes ``claims.md`` and ``claims.json`` at the
top of the results tree.
"""
from __future__ import annotations

import dataclasses
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from cpcfl_tf.errors import UserError, run_cli
from cpcfl_tf.evidence.claims import CLAIM_IDS, Claim, base_name, claims, with_fix
from cpcfl_tf.evidence.claims_report import groups_found, headroom, report
from cpcfl_tf.evidence.judge import CLAIMS_RULE
from cpcfl_tf.evidence.judging import Judged, judge
from cpcfl_tf.evidence.provenance import encoder_notes, machine_notes, seed_list
from cpcfl_tf.evidence.readme_table import verdict_table
from cpcfl_tf.evidence.tree import Evidence
from cpcfl_tf.methods.federated import PRETRAIN_METHODS
from cpcfl_tf.plan.identity import config_key
from cpcfl_tf.running.cli import resolve_config
from cpcfl_tf.running.report import markdown_table, replace_block
from cpcfl_tf.running.runner import RunSpec
from cpcfl_tf.running.script import Script, run_context

SCRIPT = Script(__file__, __doc__)
ROOT = Path(__file__).resolve().parents[1]


# -- making the missing runs ---------------------------------------------------------
def needed(claim: Claim) -> list[tuple[str, bool]]:
    """(evidence name, is a linear evaluation) of a claim, in order, each once."""
    out: list[tuple[str, bool]] = []
    for link in claim.links:
        for name in (link.a, link.b, link.c, link.d):
            if name is not None and (name, link.linear_eval) not in out:
                out.append((name, link.linear_eval))
    return out


@dataclasses.dataclass(frozen=True)
class LinearEval:
    """One seed's linear evaluation of its encoders (``experiments/linear_eval.py``), a
    step of the evidence beside the runs."""

    seed: int


def make_missing(session, evidence_: Evidence, chosen: list[Claim]) -> None:
    """Make every run of ``chosen`` (claim by claim, seed by seed) that the tree lacks into
    the script's folder. A record elsewhere in the tree is used where this machine would
    make it bit for bit (:attr:`~cpcfl_tf.records.store.RecordStore.reuse`), so one seed's
    evidence comes from one kind of machine. The second verdict's claims (CP-CFL's merges fixed,
    :func:`fixed_claims`) make only the fixed runs the tree lacks: where the rule never
    fires, the base run is the fixed run, so only runs in which it fires are made, and
    they pair with the first verdict's records. With ``--dry-run``, list them with what
    each would do and stop."""
    session.runner.store.reuse = evidence_.index
    todo: list[RunSpec | LinearEval] = []  # in the order they run: claim, seed, step
    done: set[str] = set()
    complete: list[str] = []
    for claim in [*chosen, *fixed_claims(chosen, evidence_)]:
        if claim.cannot:
            continue
        whole = [seed for seed in evidence_.seeds if _complete(session, evidence_, claim, seed)]
        if whole:
            complete.append(f"{claim.id}{' with the restart rule' if claim not in chosen else ''}: "
                            f"{seed_list(whole)} complete in the tree")
        for seed in evidence_.seeds:
            if seed in whole:  # its links pair the records there; none is made again
                continue
            for name, is_eval in needed(claim):
                if claim not in chosen and (base_name(name) is None
                                            or evidence_.every(name, seed)):
                    continue  # a second verdict makes only the fixed runs it lacks
                if is_eval:
                    linear = LinearEval(seed)
                    if linear not in todo and not _linear_eval_out(session, seed).exists():
                        todo.append(linear)
                    continue
                key = config_key(evidence_.config_of(name, seed))
                if key not in done:
                    done.add(key)
                    todo.append(evidence_.spec(name, seed))
    session.kept([t for t in todo if isinstance(t, RunSpec)],
                 also=[f"seed{t.seed}-linear-eval: to run" for t in todo
                       if isinstance(t, LinearEval)] + complete)
    for step in todo:
        if isinstance(step, LinearEval):
            _linear_eval(session, step.seed)
        else:
            session.runner.run(step)


def fixed_claims(chosen: list[Claim], evidence_: Evidence) -> list[Claim]:
    """The claims of ``chosen`` that name a CP-CFL run, each with CP-CFL's merges fixed
    (:func:`~cpcfl_tf.evidence.claims.with_fix`): the second verdict, beyond the paper."""
    return [fixed for claim in chosen
            if (fixed := with_fix(claim, evidence_.specs)) != claim]


def _complete(session, evidence_: Evidence, claim: Claim, seed: int) -> bool:
    """Whether the tree holds a record of every run ``claim`` needs for ``seed`` (and its
    linear evaluation). Such a seed is left alone: on another kind of machine, or from
    another encoder, remaking one of its runs would only add a record no link pairs."""
    def present(name: str, is_eval: bool) -> bool:
        if is_eval:
            return (_linear_eval_out(session, seed).exists()
                    or seed in evidence_.linear_eval(name))
        return bool(evidence_.every(name, seed))

    return all(present(name, is_eval) for name, is_eval in needed(claim))


def _linear_eval_out(session, seed: int) -> Path:
    return session.out / "linear_eval" / f"seed{seed}" / "linear_eval.json"


def _linear_eval(session, seed: int) -> None:
    out = _linear_eval_out(session, seed).parent
    scored = sorted({name for claim in claims(session.config) for link in claim.links
                     if link.linear_eval for name in (link.a, link.b) if name},
                    key=list(PRETRAIN_METHODS).index)  # the encoders the claims compare
    command = [sys.executable, str(ROOT / "experiments" / "linear_eval.py"), "--preset",
               session.config.preset, "--seed", str(seed), "--out", str(out),
               "--methods", ",".join(scored)]
    command += [a for item in session.args.set for a in ("--set", item)]
    print("$ " + " ".join(command[1:]), flush=True)
    if subprocess.run(command).returncode != 0:
        raise UserError(f"linear evaluation of seed {seed} failed (see above)")


# -- the report ----------------------------------------------------------------------
def _seeds(text: str) -> list[int]:
    import argparse

    try:
        if "-" in text:
            first, last = (int(v) for v in text.split("-"))
            seeds = list(range(first, last + 1))
        else:
            seeds = [int(v) for v in text.split(",") if v]
    except ValueError:
        seeds = []
    if not seeds or min(seeds) < 0:
        raise argparse.ArgumentTypeError(f"takes FIRST-LAST or a comma-separated list of "
                                         f"seeds >= 0, got {text!r}")
    return seeds


def _options(parser) -> None:
    parser.add_argument("--results", help="the results tree to judge (default: results/<preset>)")
    parser.add_argument("--seeds", type=_seeds, default=list(range(5)),
                        help="the seeds whose runs are paired (default 0-4)")
    parser.add_argument("--claims", default=",".join(CLAIM_IDS),
                        help="which claims, in this order (default: all, C1-C11)")
    parser.add_argument("--run", action="store_true",
                        help="first make the runs the claims need that the tree lacks "
                             "(into --out, default results/<preset>/claims)")


def main(argv: Sequence[str] | None = None) -> None:
    parser = SCRIPT.parser()
    _options(parser)
    args = parser.parse_args(argv)
    # Everything is checked before any folder is touched; the output folder (where --run
    # makes runs) is prepared only when runs are made: judging a tree writes only into it.
    context = run_context(args)  # what --run's runner takes, read and checked once
    config = resolve_config(args)
    wanted = [c.strip() for c in args.claims.split(",") if c.strip()]
    unknown = [c for c in wanted if c not in CLAIM_IDS]
    if unknown or not wanted:
        raise UserError(f"unknown claim(s) {', '.join(unknown) or '(none)'}; choose from "
                        f"{','.join(CLAIM_IDS)}")
    results = Path(args.results or Path("results") / config.preset)
    if not results.is_dir():
        raise UserError(f"no results tree at {results}; pass --results DIR (a folder the "
                        "scripts wrote), or --run to make the runs")
    by_id = {c.id: c for c in claims(config)}
    chosen = [by_id[c] for c in wanted]
    out = Path(args.out or Path("results") / config.preset / SCRIPT.name)
    ev = Evidence(config, results, args.seeds, out)
    if args.run:
        session = SCRIPT.session(args, context)
        make_missing(session, ev, chosen)
        ev = Evidence(config, results, args.seeds, session.out)
    judged = [judge(ev, c) for c in chosen]
    fixed = [judge(ev, with_fix(c, ev.specs)) for c in chosen]
    from cpcfl_tf.records.files import write_json, write_text

    note = machine_notes(ev) + encoder_notes(ev)
    seeds = (f"{args.seeds[0]}-{args.seeds[-1]}"
             if args.seeds == list(range(args.seeds[0], args.seeds[-1] + 1))
             else ",".join(map(str, args.seeds)))
    command = f"python experiments/claims.py --preset {config.preset} --seeds {seeds}"
    text = report(config, results, args.seeds, judged, headroom(ev), groups_found(ev), command,
                  fixed)
    if note:
        text = text.rstrip("\n") + "\n\n" + "\n\n".join(note) + "\n"
    write_json(results / "claims.json", {
        "preset": config.preset, "results": str(results), "seeds": args.seeds,
        "rule": CLAIMS_RULE, "claims": [
            {"id": j.claim.id, "claim": j.claim.text, "source": j.claim.source,
             "verdict": j.verdict, "cannot": j.claim.cannot,
             "with_restart_rule": f.verdict,
             "links": [{"link": link.label, "paper": link.paper, **summary.claim_json(),
                        "missing": missing,
                        "with_restart_rule": None if flink == link else
                        {**fsummary.claim_json(), "missing": fmissing}}
                       for (link, summary, missing), (flink, fsummary, fmissing)
                       in zip(j.links, f.links)]}
            for j, f in zip(judged, fixed)],
        "records": ev.used})
    write_text(results / "claims.md", text)
    print(text)
    print(f"wrote {results / 'claims.md'}")
    if len(judged) == len(CLAIM_IDS):
        _update_readmes(results, config.preset, judged, fixed)


def _update_readmes(results: Path, preset: str, judged: list[Judged],
                    fixed: list[Judged]) -> None:
    """The generated tables of ``results/README.md`` (per link) and, for a tree at
    ``<repository>/results/<preset>``, of the repository's README (per claim)."""
    readme = results.parent / "README.md"
    if readme.exists() and replace_block(readme, "claims", preset, verdict_table(judged, fixed)):
        print(f"updated the {preset} claims table in {readme}")
    top = results.resolve().parent
    front = top.parent / "README.md"
    if (top.name == "results" and front.exists()
            and replace_block(front, "verdicts", preset, markdown_table(
                ["claim", "verdict", "with the restart rule (beyond the paper)"],
                [[f"{j.claim.id} {j.claim.text}", j.verdict, f.verdict]
                 for j, f in zip(judged, fixed)]))):
        print(f"updated the {preset} verdicts in {front}")


if __name__ == "__main__":
    run_cli(main)
