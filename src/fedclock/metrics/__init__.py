"""Run outputs: the recorder (run directory), summaries and plots."""

from fedclock.metrics.recorder import METRIC_COLUMNS, RunRecorder, summarize

__all__ = ["METRIC_COLUMNS", "RunRecorder", "summarize"]
