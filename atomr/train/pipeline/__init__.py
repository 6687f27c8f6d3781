"""Pipeline parallel: the model cut into stages, micro-batches scheduled
GPipe or 1F1B (see docs/pipeline_parallel.md).

- `PipelineParallelTrainer` (trainer.py) and its `PipelineOptions`
  (options.py);
- messages.py: `GetGradients`, `GetTimeline`, and `PipelineStageProtocol`
  with its messages, what a stage answers;
- `StageActor` (stage.py): the built-in stage; `StageGroup` (group.py): the
  fan-out of a step's phases over the stages;
- schedule.py: the schedules as data; split.py: layers per stage;
  timeline.py: who was busy when.
"""

from atomr.train.pipeline.messages import GetGradients, GetTimeline, PipelineStageProtocol
from atomr.train.pipeline.options import PipelineOptions
from atomr.train.pipeline.schedule import Schedule
from atomr.train.pipeline.stage import StageActor
from atomr.train.pipeline.timeline import Timeline
from atomr.train.pipeline.trainer import PipelineParallelTrainer

__all__ = [
    "GetGradients",
    "GetTimeline",
    "PipelineOptions",
    "PipelineParallelTrainer",
    "PipelineStageProtocol",
    "Schedule",
    "StageActor",
    "Timeline",
]
