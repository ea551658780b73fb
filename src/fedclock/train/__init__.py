"""Local training and executors."""

from fedclock.train.evaluate import Evaluator
from fedclock.train.executor import ClientData, SerialExecutor, batch_schedule
from fedclock.train.factory import make_executor

__all__ = ["ClientData", "Evaluator", "SerialExecutor", "batch_schedule", "make_executor"]
