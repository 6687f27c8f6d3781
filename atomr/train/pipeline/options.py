"""`PipelineOptions`: the settings only the pipeline-parallel trainer has."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from atomr._arguments import int_at_least, sequence_entries
from atomr.train.pipeline.schedule import Schedule, split_micro_batches
from atomr.train.pipeline.stage import StageActor

__all__ = ["PipelineOptions"]


@dataclass(frozen=True, slots=True)
class PipelineOptions:
    """What `PipelineParallelTrainer` needs besides its `TrainerConfig`.

    Optimizer, loss, clipping and the stages' reply deadline come from the
    `TrainerConfig`; the number of stages is the number of devices given to
    `spawn` (or of stages given to `props`).

    Attributes:
        micro_batch_size: samples per micro-batch (an int >= 1; the last
            micro-batch takes the remainder), or None for a quarter of each
            batch, at least 1 (so a batch makes about 4 micro-batches).
        schedule: `Schedule.ONE_F_ONE_B` (the default) or `Schedule.GPIPE`;
            their names ("1f1b", "gpipe") are accepted too, and stored as the
            `Schedule`.
        split: layers per stage for `spawn` (e.g. `(2, 1)`, a list or a 1-D
            integer array alike, stored as a tuple of ints), or None for the
            split that balances the stages' parameter counts.
        stage_class: the stage actor `spawn` starts on each device:
            `StageActor` or a subclass of it.

    `split` and `stage_class` say how `spawn` builds the stages; `props`
    takes stages already built, so there they must keep their defaults.

    Raises:
        TypeError: a field of the wrong type (a `stage_class` that is not a
            `StageActor` subclass included; NumPy's integers are ints,
            `_arguments.int_at_least`).
        ValueError: `micro_batch_size < 1`, an unknown schedule name, an
            empty split or a split entry below 1.
    """

    micro_batch_size: int | None = None
    schedule: Schedule = Schedule.ONE_F_ONE_B
    split: Sequence[int] | None = None
    stage_class: type[StageActor] = StageActor

    def __post_init__(self) -> None:
        size = self.micro_batch_size
        if size is not None:
            object.__setattr__(self, "micro_batch_size", int_at_least("micro_batch_size", size, 1))
        if not isinstance(self.schedule, str):  # a Schedule is a str too
            raise TypeError(f"schedule must be a Schedule or its name, got {self.schedule!r}")
        object.__setattr__(self, "schedule", Schedule.parse(self.schedule))
        if self.split is not None:
            object.__setattr__(self, "split", _checked_split(self.split))
        cls = self.stage_class
        if not (isinstance(cls, type) and issubclass(cls, StageActor)):
            raise TypeError(f"stage_class must be a StageActor subclass, got {cls!r}")

    def micro_batch_sizes(self, batch: int) -> list[int]:
        """The sizes of the micro-batches a batch is cut into, in order.

        Args:
            batch: the batch's number of samples (>= 1).

        Returns:
            Sizes summing to `batch`: `micro_batch_size` each (the last one
            the remainder), or with None, a quarter of `batch`, at least 1.

        Raises:
            ValueError: `batch < 1`.
        """
        size = self.micro_batch_size
        return split_micro_batches(batch, max(1, batch // 4) if size is None else size)


def _checked_split(split: object) -> tuple[int, ...]:
    """`split` (a list, tuple or 1-D integer array) as a tuple of ints >= 1
    (NumPy's integers as ints).

    Raises:
        TypeError: not a list, tuple or 1-D array (`sequence_entries`), or
            an entry that is not an int (a float or a bool included).
        ValueError: no entry, or an entry below 1.
    """
    split = sequence_entries("split", split, "ints, or None")
    if not split:
        raise ValueError("split must give at least one stage its layers, got an empty split")
    return tuple(int_at_least("every split entry (layers of a stage)", c, 1) for c in split)
