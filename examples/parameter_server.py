"""A parameter server training an MLP on scikit-learn's digits with 4 workers.

One server shard holds the weights and the optimizer (SGD with momentum);
four worker actors on two logical CPU devices pull the weights, compute the
gradient of their own part of each batch on their device's thread and push
it back asynchronously. Then the same model is trained synchronously with
the weights split across 2 server shards.

`AsyncParameterServer.spawn` returns the trainer's `ActorRef`: it answers
`Step`, `Evaluate`, `GetWeights`, `SaveCheckpoint`, `LoadCheckpoint` like
every trainer, so `fit`, the library's one epoch loop, trains it as it
trains the others: one `Step` per global batch of 128, split among the
workers, and the test set evaluated after every epoch. A `Step` waits for
every worker's part, so the asynchronous workers drift apart only within
one batch; the trainer's own `TrainEpochs` message lets each worker run
through its parts of a whole epoch at its own pace (docs/parameter_server.md).

Run: python examples/parameter_server.py
Prints one line per mode, e.g.
    async: epochs=15 applied=660 avg_staleness=0.75 test_accuracy=0.962
    sync (2 shards): epochs=15 applied=660 versions=[165, 165] test_accuracy=0.958
"""

from __future__ import annotations

import argparse

import atomr
from atomr import ActorSystem
from atomr.train import LossKind, Mlp, OptimizerKind, TrainerConfig, fit
from atomr.train.core import load_digits_split
from atomr.train.parameter_server import (
    AsyncParameterServer,
    Consistency,
    GetServerStats,
    ParameterServerOptions,
)


async def main() -> None:
    x_train, y_train, x_test, y_test = load_digits_split(seed=0)
    config = TrainerConfig(OptimizerKind.sgd(0.05, momentum=0.9), LossKind.CROSS_ENTROPY)
    async with ActorSystem("ps-example") as system:
        # asynchronous pushes refused when more than 2 versions stale: with
        # momentum, unbounded staleness makes the last epoch's accuracy a matter
        # of thread scheduling
        for label, consistency, shards, max_staleness in [
            ("async", Consistency.asynchronous(), 1, 2),
            ("sync (2 shards)", Consistency.synchronous(), 2, None),
        ]:
            options = ParameterServerOptions(
                workers=4, consistency=consistency, shards=shards, max_staleness=max_staleness
            )
            ps = await AsyncParameterServer.spawn(
                system, Mlp([64, 64, 10], seed=0), ["cpu:0", "cpu:1"], config, options
            )
            result = await fit(
                ps, (x_train, y_train), epochs=15, batch_size=128, validation=(x_test, y_test)
            )
            stats = await ps.ask(GetServerStats())  # one ParameterServerStats per shard
            last = result.epochs[-1]
            detail = (
                f"avg_staleness={stats[0].avg_staleness:.2f}"
                if shards == 1
                else f"versions={[s.version for s in stats]}"
            )
            print(
                f"{label}: epochs={len(result.epochs)} applied={stats[0].gradients_applied} "
                f"{detail} test_accuracy={last.test_accuracy:.3f}"
            )
            await ps.stop()


if __name__ == "__main__":
    argparse.ArgumentParser(  # --help prints the docstring; it takes no options
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    ).parse_args()
    atomr.run(main())
