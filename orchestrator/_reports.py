"""The report a sweep writes at its end (``write_report``): its files, or why it failed. Private:
``orchestrator.api`` is the public surface."""

from __future__ import annotations


def write_report(out: dict, folder: str | None, data=None, uri: str | None = None) -> dict:
    """The sweep's HTML report (``dashboards.report``), logged on its parent run: ``report``, ``report_pngs``,
    ``report_artifact``. A report that cannot be written is noted (``report: None``, ``report_error``), not
    raised: the sweep's results are in MLflow either way (``report`` again, or ``fractune report``)."""
    from dashboards.report import build_report

    if out["parent_run_id"] is None:
        return {"report": None, "report_error": "the sweep has no parent run"}
    try:
        rep = build_report(uri or out["tracking_uri"], out["sweep"], out["sweep_id"], folder, data=data)
    except Exception as exc:  # noqa: BLE001  any failure here must not hide the sweep's own outcome
        return {"report": None, "report_error": f"{type(exc).__name__}: {exc}"}
    return {"report": rep["report"], "report_pngs": rep["pngs"], "report_artifact": rep["artifact"]}
