"""A/B a benchmark script between two checkouts of atomr, interleaved.

Runs `benchmarks/<script>` of checkout A, then of checkout B, `--rounds`
times in alternation (A B A B ...), each with its own tree first on
`PYTHONPATH`, and prints one JSON object: for every numeric figure the
scripts print (flattened to dotted keys), the min and median over the rounds
for A and for B, and B/A of the medians. Interleaving keeps the machine's
noise (it is shared) from favouring either side.

    git worktree add --detach /tmp/before <commit>
    python benchmarks/compare_trees.py /tmp/before . train_step.py --rounds 3 -- --repeat 10
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from _args import count, positive_real


def flatten(value: Any, prefix: str = "") -> dict[str, float]:
    """Numeric leaves of a JSON value, keyed by their dotted path."""
    out: dict[str, float] = {}
    if isinstance(value, dict):
        for key, item in value.items():
            out.update(flatten(item, f"{prefix}{key}."))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            out.update(flatten(item, f"{prefix}{index}."))
    elif isinstance(value, int | float) and not isinstance(value, bool):
        out[prefix[:-1]] = float(value)
    return out


def run_once(tree: Path, script: str, args: list[str], timeout: float) -> dict[str, float]:
    """Run `tree/benchmarks/script` with `tree` first on the path; its last
    JSON object, flattened.

    Raises:
        RuntimeError: the script failed or printed no JSON object.
    """
    env = dict(os.environ, PYTHONPATH=str(tree))
    done = subprocess.run(
        [sys.executable, str(tree / "benchmarks" / script), *args],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{tree}: {script} failed:\n{done.stderr[-2000:]}")
    text = done.stdout
    start = text.find("{")
    if start < 0:
        raise RuntimeError(f"{tree}: {script} printed no JSON")
    return flatten(json.loads(text[start:]))


def summarise(rounds: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    """Per key: min and median over the rounds."""
    keys = set.intersection(*(set(r) for r in rounds)) if rounds else set()
    return {
        k: {"min": min(r[k] for r in rounds), "median": statistics.median(r[k] for r in rounds)}
        for k in sorted(keys)
    }


def main() -> None:
    """Parse the arguments, run the rounds, print the comparison."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tree_a", type=Path)
    parser.add_argument("tree_b", type=Path)
    parser.add_argument("script")
    parser.add_argument("--rounds", type=count, default=3)
    parser.add_argument("--timeout", type=positive_real, default=900.0)
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    ns = parser.parse_args(argv[:cut])
    args = argv[cut + 1 :]  # the benchmark script's own arguments
    a_runs, b_runs = [], []
    for _ in range(ns.rounds):
        a_runs.append(run_once(ns.tree_a.resolve(), ns.script, args, ns.timeout))
        b_runs.append(run_once(ns.tree_b.resolve(), ns.script, args, ns.timeout))
    a, b = summarise(a_runs), summarise(b_runs)
    both = sorted(set(a) & set(b))
    report = {
        "script": ns.script,
        "rounds": ns.rounds,
        "figures": {
            k: {
                "a": a[k],
                "b": b[k],
                "b_over_a_median": b[k]["median"] / a[k]["median"] if a[k]["median"] else None,
            }
            for k in both
        },
        "only_in_a": sorted(set(a) - set(b)),
        "only_in_b": sorted(set(b) - set(a)),
    }
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
