"""The scorecard's advisor line: the top action of the advice kept for this run, this kvscope
and this vLLM (collector/advisor/stored.py), with its predicted gain; grey where none is kept.
The scorecard never works the advice out itself: that replays the run (15-30 s)."""

from __future__ import annotations

from typing import Any

from collector.advisor.stored import current_result
from collector.health.line import HealthLine
from collector.queries.summary import RunSummary
from collector.safe_text import shown
from collector.store.run_file import RunFile

NAME, PAGE = "Advisor's top action", "advisor"


def advisor_line(run: RunFile, summary: RunSummary, limits: dict[str, Any]) -> HealthLine:
    """Green with nothing to suggest or a top gain under `amber_gain_share` of the prompt
    tokens; amber from it (the advisor's actions are tuning, never an outage: no red)."""
    kept = current_result(run)
    if kept is None:
        path = run.path.with_name(run.path.name.removesuffix(".live"))  # a live copy's run
        return HealthLine(
            NAME,
            "grey",
            "No advice is kept for this run as it is now: `kvscope advise "
            f"{shown(path)}` works it out (it replays the run, so the scorecard does not) "
            "and keeps it in the run file; the Advisor page does too, for this app.",
            PAGE,
        )
    suggestions = kept["document"]["suggestions"]
    if not suggestions:
        return HealthLine(
            NAME, "green", "The advisor found nothing to change: no rule fired on this run.", PAGE
        )
    top = suggestions[0]
    prompt_tokens = summary["prompt_tokens"]
    share = top["gain_tokens"] / prompt_tokens if prompt_tokens else 0.0
    others = len(suggestions) - 1
    more = f"; {others} more on the Advisor page" if others else ""
    return HealthLine(
        NAME,
        "amber" if share >= limits["amber_gain_share"] else "green",
        f"{top['title']}: predicted {top['gain_tokens']:,.0f} more prompt tokens hit "
        f"({share:.1%} of the run's {prompt_tokens:,}). Do this: {top['action']}{more}.",
        PAGE,
    )
