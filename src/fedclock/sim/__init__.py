"""The virtual-clock simulator: events, tasks, contributions and the main loop."""

from fedclock.sim.simulator import Context, Simulator, StopReason
from fedclock.sim.types import Contribution, ModelVersion, Task, TaskPlan

__all__ = ["Context", "Contribution", "ModelVersion", "Simulator", "StopReason", "Task", "TaskPlan"]
