"""Simulated devices: profiles, populations built from scenarios, and the cost model."""

from fedclock.devices.cost import TaskCost, TaskTiming, task_timing
from fedclock.devices.population import Population, build_population

__all__ = ["Population", "TaskCost", "TaskTiming", "build_population", "task_timing"]
