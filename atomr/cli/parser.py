"""The argument parser of the `atomr` command.

Bad arguments never print a traceback nor argparse's two-line usage dump:
`_Parser.error` raises `CliError`, which `atomr.cli.app.main` reports as one
line with exit status 2.
"""

from __future__ import annotations

import argparse
from typing import NoReturn

from atomr.cli.device_option import MAX_CPU_DEVICES
from atomr.cli.errors import CliError
from atomr.cli.model_options import add_model_arguments
from atomr.cli.strategies import STRATEGIES

__all__ = [
    "BENCH_SUITES",
    "DATASETS",
    "LOSSES",
    "OPTIMIZERS",
    "SCHEDULES",
    "asks_for_distributed_training",
    "build_parser",
]

OPTIMIZERS = ("sgd", "adam", "adamw")
LOSSES = ("cross_entropy", "mse")
SCHEDULES = ("gpipe", "1f1b")
LR_SCHEDULES = ("constant", "cosine", "step")
POLICIES = ("sync", "cadence", "async")
DATASETS = ("digits", "synthetic", "pydoc")
BENCH_SUITES = ("messaging", "kernels", "train", "all")


class _Parser(argparse.ArgumentParser):
    """An `ArgumentParser` whose errors raise `CliError` (one line, exit 2)."""

    def error(self, message: str) -> NoReturn:
        """Raise `CliError` naming the command, instead of printing usage and exiting."""
        raise CliError(f"{message} (see '{self.prog} --help')")


def asks_for_distributed_training(argv: list[str]) -> bool:
    """Whether `argv` (the arguments before any "--") is `train` with
    `--distributed` (or a prefix of it, as argparse takes), read even when
    the rest of it cannot be parsed: such a rank still tells the others."""
    if argv[:1] != ["train"]:
        return False
    sniff = _Parser(add_help=False)
    sniff.add_argument("--distributed", action="store_true")
    try:
        return bool(sniff.parse_known_args(argv[1:])[0].distributed)
    except CliError:
        return False


def _add_train(sub: argparse._SubParsersAction[_Parser]) -> None:
    """`atomr train` and its options, in four groups: model and strategy,
    optimisation, data, checkpoints and output (the order of `--help`)."""
    p = sub.add_parser(
        "train",
        help="train an Mlp (digits by default) or a GPT (--model gpt) with a progress bar, "
        "a plot and a JSON history",
        description=(
            "Train an Mlp on scikit-learn's bundled digits (no download) or a synthetic "
            "data set, or a character-level GPT on the Python documentation (--model gpt), "
            "with one of atomr's trainers. Writes curves.png and history.json "
            "into ./atomr-runs/<name>/ unless --plot/--history/--run-dir say otherwise."
        ),
    )
    _add_model_and_strategy_group(p)
    _add_optimisation_group(p)
    _add_data_group(p)
    _add_output_group(p)


def _add_model_and_strategy_group(p: _Parser) -> None:
    """The "model and strategy" group: the model and its shape (model_options.py),
    the strategy and its devices, then the options of each parallel strategy."""
    model = p.add_argument_group("model and strategy")
    add_model_arguments(model)
    _add_strategy_and_devices(model)
    _add_pipeline_and_ps_options(model)
    _add_data_parallel_options(model)


def _add_strategy_and_devices(model: argparse._ArgumentGroup) -> None:
    """`--strategy` and `--devices`."""
    model.add_argument(
        "--strategy",
        choices=list(STRATEGIES),
        default="data",
        help="; ".join(f"{s.name}: {s.help}" for s in STRATEGIES.values()) + " (default: data)",
    )
    model.add_argument(
        "--devices",
        default=None,
        metavar="SPEC",
        help="N (the first N devices: CUDA when present, else logical CPUs, at most "
        f"{MAX_CPU_DEVICES}) or a "
        "comma list such as cpu:0,cpu:1 (default: every GPU, else 2 logical CPUs; "
        "1 device for --strategy "
        + ", ".join(s.name for s in STRATEGIES.values() if s.one_device)
        + ")",
    )


def _add_pipeline_and_ps_options(model: argparse._ArgumentGroup) -> None:
    """`--schedule` and `--micro-batch-size` (--strategy pipeline) and `--workers`
    (--strategy ps)."""
    model.add_argument(
        "--schedule",
        choices=SCHEDULES,
        default=None,
        help="pipeline schedule (--strategy pipeline; default: 1f1b)",
    )
    model.add_argument(
        "--micro-batch-size",
        type=int,
        default=None,
        metavar="M",
        help="samples per micro-batch (--strategy pipeline; default: a quarter of the batch)",
    )
    model.add_argument(
        "--workers",
        type=int,
        default=None,
        metavar="N",
        help="parameter-server workers (--strategy ps; default: one per device)",
    )


def _add_data_parallel_options(model: argparse._ArgumentGroup) -> None:
    """`--policy` and `--average-every` (--strategy data; the latter with
    --policy async), `--zero-stage` (--strategy zero) and `--distributed` (MPI
    ranks, for the strategies that can run across them)."""
    model.add_argument(
        "--policy",
        choices=POLICIES,
        default=None,
        help="--strategy data: sync (default: reduce every step), cadence (El Che: faster "
        "devices take more batches per round) or async (local SGD: each batch goes whole "
        "to one replica, which steps alone; weights averaged every --average-every batches)",
    )
    model.add_argument(
        "--average-every",
        type=int,
        default=None,
        metavar="K",
        help="--policy async: batches between two averaging rounds (default: 4)",
    )
    model.add_argument(
        "--zero-stage",
        type=int,
        choices=(1, 2, 3),
        default=None,
        metavar="K",
        help="--strategy zero: shard the optimizer state (1), and the gradients (2), and "
        "the parameters, gathered layer by layer (3) (default: 1)",
    )
    model.add_argument(
        "--distributed",
        action="store_true",
        help="one process of an MPI job (started by 'atomr launch' or mpiexec): "
        "data parallel across ranks, all-reduce by MPI (--strategy "
        + ", ".join(s.name for s in STRATEGIES.values() if s.job is not None)
        + "). Before training the ranks agree on their options, on the data set each "
        "loaded and on the --resume checkpoint (which save, and where it resumes); a "
        "mismatch, or an error on any "
        "rank before that, stops every rank at once with one line naming the rank",
    )


def _add_optimisation_group(p: _Parser) -> None:
    """The "optimisation" group: the optimizer and loss, then the run's length
    and learning-rate schedule."""
    opt = p.add_argument_group("optimisation")
    _add_optimizer_options(opt)
    _add_length_and_schedule(opt)


def _add_optimizer_options(opt: argparse._ArgumentGroup) -> None:
    """`--epochs`, `--batch-size`, the optimizer and its `--lr` and `--momentum`,
    `--loss`, `--clip` and `--seed`."""
    opt.add_argument(
        "--epochs", type=int, default=None, help="total epochs (default: 20; 2 for --model gpt)"
    )
    opt.add_argument("--batch-size", type=int, default=32, help="samples per step (default: 32)")
    opt.add_argument("--optimizer", choices=OPTIMIZERS, default="adam", help="(default: adam)")
    opt.add_argument(
        "--lr",
        type=float,
        default=None,
        help="learning rate (default: 0.005 for adam/adamw, 0.05 for sgd)",
    )
    opt.add_argument(
        "--momentum", type=float, default=None, help="SGD momentum (--optimizer sgd; default: 0.9)"
    )
    opt.add_argument(
        "--loss",
        choices=LOSSES,
        default="cross_entropy",
        help="cross_entropy on class labels (default), or mse on one-hot targets",
    )
    opt.add_argument(
        "--clip",
        type=float,
        default=None,
        metavar="NORM",
        help="clip the gradient to this global L2 norm",
    )
    opt.add_argument(
        "--seed", type=int, default=0, help="model init, split and shuffle seed (>= 0; default: 0)"
    )


def _add_length_and_schedule(opt: argparse._ArgumentGroup) -> None:
    """`--max-steps`, `--lr-schedule` and `--warmup-epochs`."""
    opt.add_argument(
        "--max-steps",
        type=int,
        default=None,
        metavar="N",
        help="stop after N optimizer steps in all (the checkpoint keeps the position)",
    )
    opt.add_argument(
        "--lr-schedule",
        choices=LR_SCHEDULES,
        default="constant",
        help="learning-rate schedule over the run, stepped every update, as torch's: cosine "
        "(reaching 0 one update after the last), step (x0.1 every ceil(n/3) of the n updates "
        "after warm-up: two cuts, fewer when n is 1, 2 or 4), constant (default)",
    )
    opt.add_argument(
        "--warmup-epochs",
        type=int,
        default=0,
        metavar="K",
        help="linear warm-up from 0.1 x --lr over the first K epochs (default: 0)",
    )


def _add_data_group(p: _Parser) -> None:
    """The "data" group: `--dataset` and the synthetic data set's sizes."""
    data = p.add_argument_group("data")
    data.add_argument(
        "--dataset",
        choices=DATASETS,
        default=None,
        help="(default: digits; pydoc, the Python documentation as text, for --model gpt)",
    )
    data.add_argument(
        "--samples", type=int, default=None, help="synthetic: number of samples (default: 20000)"
    )
    data.add_argument(
        "--features", type=int, default=None, help="synthetic: features (default: 64)"
    )
    data.add_argument("--classes", type=int, default=None, help="synthetic: classes (default: 10)")


def _add_output_group(p: _Parser) -> None:
    """The "checkpoints and output" group: checkpoint and resume, then where the
    run's plot, history, metrics and TensorBoard files go."""
    out = p.add_argument_group("checkpoints and output")
    _add_checkpoint_options(out)
    _add_report_options(out)


def _add_checkpoint_options(out: argparse._ArgumentGroup) -> None:
    """`--checkpoint` and `--resume`."""
    out.add_argument(
        "--checkpoint",
        default=None,
        metavar="PATH",
        help="save a checkpoint here after every epoch, at the end and on Ctrl-C or SIGTERM",
    )
    out.add_argument(
        "--resume",
        default=None,
        metavar="PATH",
        help="continue from this checkpoint (epochs and steps continue; --epochs is the total)",
    )


def _add_report_options(out: argparse._ArgumentGroup) -> None:
    """`--run-dir`, `--name`, `--plot`, `--history`, `--metrics`, `--tensorboard`
    and `--quiet`: where the run's results go and how much it prints."""
    out.add_argument(
        "--run-dir",
        default=None,
        metavar="DIR",
        help="where curves.png and history.json go (default: ./atomr-runs/<name>); a folder "
        "holding a run's outputs is refused, unless --resume continues that run",
    )
    out.add_argument(
        "--name",
        default=None,
        help="run name (default: <timestamp>-<strategy>); a name whose folder holds a run's "
        "outputs is refused, unless --resume continues that run",
    )
    out.add_argument("--plot", default=None, metavar="PATH", help="write the curves PNG here")
    out.add_argument("--history", default=None, metavar="PATH", help="write the JSON history here")
    out.add_argument(
        "--metrics",
        default=None,
        metavar="PATH",
        help="append every step, evaluation and epoch here as JSON Lines",
    )
    out.add_argument(
        "--tensorboard",
        default=None,
        metavar="DIR",
        help="write TensorBoard event files here (needs the tensorboard extra: "
        "pip install -e '.[tensorboard]')",
    )
    out.add_argument(
        "--quiet",
        action="store_true",
        help="no progress bar and no table: one result line",
    )


def _add_bench(sub: argparse._SubParsersAction[_Parser]) -> None:
    p = sub.add_parser(
        "bench",
        help="run the benchmark scripts of the checkout's benchmarks/ folder",
        description=(
            "Run benchmarks/*.py as subprocesses and print their results as tables. "
            "Arguments after '--' are passed to every script: "
            "atomr bench messaging -- --tells 10000"
        ),
    )
    p.add_argument("suite", choices=BENCH_SUITES, help="which benchmarks")
    p.add_argument(
        "--benchmarks-dir",
        default=None,
        metavar="DIR",
        help="folder of the scripts (default: ./benchmarks, else the checkout's)",
    )
    p.add_argument("--json", action="store_true", help="print the raw JSON reports")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per script (default: 600)")


def _add_launch(sub: argparse._SubParsersAction[_Parser]) -> None:
    p = sub.add_parser(
        "launch",
        help="run 'atomr train --distributed' as N MPI processes (mpiexec)",
        description="atomr launch -n N [--timeout S] -- <train arguments>",
    )
    p.add_argument("-n", "--nprocs", type=int, required=True, metavar="N", help="processes")
    p.add_argument("--timeout", type=float, default=None, help="seconds before the job is killed")


def build_parser(version: str) -> argparse.ArgumentParser:
    """The parser of the whole command (subcommands train, devices, warmup, bench, launch).

    Args:
        version: what `atomr --version` prints after "atomr ".

    Returns:
        The parser; its `error` raises `CliError` instead of exiting.
    """
    parser = _Parser(
        prog="atomr",
        description="atomr: an asyncio actor runtime hosting distributed-training actors.",
    )
    parser.add_argument("--version", action="version", version=f"atomr {version}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    _add_train(sub)
    devices = sub.add_parser("devices", help="list the devices atomr can use")
    devices.add_argument("--json", action="store_true", help="print JSON instead of a table")
    sub.add_parser(
        "warmup",
        help="compile and cache every kernel now (the first run then starts at once)",
        description="Compile and cache every training kernel of the installed backends.",
    )
    _add_bench(sub)
    _add_launch(sub)
    return parser
