"""Putting models into the warehouse: layers read and analysed by an executor, committed in order, then each
model's summaries; progress for `status`; behaviour rows. Uses `storing/`; never draws or exports."""

EXECUTORS = ("local", "ray")  # where a run's layers go (executors.py); here, so that naming them imports no analysis
