"""``max_cost``: a run that would pass its budget is stopped before it does.

Every poll of a wait (the blocking loop's and the trigger's, one run or a gang) asks ``BudgetWatch``
whether the run's cost by the *next* poll would pass the budget: what the earlier attempts cost (the
resume loop's ledger) plus this attempt's instances at their hourly price (every node, with its root
volume) for the time they will have been billed by then. When it would, the wait ends with the outcome
``over_budget``; the caller releases everything as for any end (each agent gets SIGTERM, stops its job
and uploads its checkpoint and logs within the grace) and the task fails naming the budget.

The projection uses the launch's price: an EC2 spot price that moves during the attempt is caught
after the fact, when the attempt is priced from the zone's history (``lifecycle.run.cost``), so a run
can end a few cents past a budget whose spot price rose; the poll interval bounds the rest.
"""

from __future__ import annotations

from dataclasses import dataclass

from airflow_cloudtrain.core.billing import INSTANCE_MINIMUM_S, VERTEX_MINIMUM_S, billed_usd
from airflow_cloudtrain.core.records import ERROR, Outcome

OVER_BUDGET = "over_budget"


@dataclass(frozen=True)
class BudgetWatch:
    """One attempt's budget check: ``hourly_usd`` is every instance of the attempt together."""

    max_usd: float
    spent_usd: float  # before this attempt
    hourly_usd: float
    launched_at: float
    lookahead_s: float  # the poll interval: the check must come before the budget is passed
    minimum_s: float = INSTANCE_MINIMUM_S  # what every instance bills at least (Vertex replicas: none)

    def projected_usd(self, now: float) -> float:
        """The run's cost by the next poll (this attempt billed per second, 60 s minimum)."""
        seconds = now - self.launched_at + self.lookahead_s
        return self.spent_usd + billed_usd(self.hourly_usd, seconds, minimum_s=self.minimum_s)

    def check(self, now: float) -> Outcome | None:
        """None while the next poll stays within the budget, else the ``over_budget`` outcome."""
        projected = self.projected_usd(now)
        if projected < self.max_usd:
            return None
        spent = self.spent_usd + billed_usd(self.hourly_usd, now - self.launched_at, minimum_s=self.minimum_s)
        earlier = f", ${self.spent_usd:.4f} of it before this attempt" if self.spent_usd else ""
        return Outcome(
            status=ERROR,
            state=OVER_BUDGET,
            message=(
                f"max_cost=${self.max_usd:g} reached: ${spent:.4f} spent{earlier}, at ${self.hourly_usd:g}/h the "
                f"next poll would pass it (${projected:.4f}); the job was stopped and everything released"
            ),
        )


def budget_watch(
    max_usd: float | None,
    spent_usd: float,
    hourly_usd: float | None,
    launched_at: float | None,
    lookahead_s: float,
) -> BudgetWatch | None:
    """The check for a wait, or None without a budget (or a price to project with)."""
    if max_usd is None or hourly_usd is None or launched_at is None:
        return None
    return BudgetWatch(
        float(max_usd), float(spent_usd), float(hourly_usd), float(launched_at), float(lookahead_s)
    )


def replicas_over_budget(
    max_usd: float | None, hourly_usd: float | None, started_at: float | None, now: float, lookahead_s: float
) -> str | None:
    """A Vertex AI job's check (every replica at ``hourly_usd`` together, from the job's start, no
    minimum): the ``over_budget`` message once its cost by the next poll would pass ``max_usd``."""
    if max_usd is None or hourly_usd is None or started_at is None:
        return None
    watch = BudgetWatch(
        float(max_usd), 0.0, float(hourly_usd), float(started_at), lookahead_s, VERTEX_MINIMUM_S
    )
    over = watch.check(now)
    return (
        None
        if over is None
        else over.message.replace("the job was stopped and everything released", "the job was cancelled")
    )
