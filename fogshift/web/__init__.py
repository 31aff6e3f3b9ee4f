"""The web dashboard (`fogshift dashboard`): see and steer a running cluster from a browser.

A process of its own beside the CLI: it speaks to the orchestrator's REST API with the
operator token, exactly as the CLI does (the same typed contracts, no second API), and serves
server-rendered pages (Jinja2, htmx for the live parts, uPlot for the charts; every asset from
this package, nothing from the internet). Login is by a one-time URL the command prints, then a
session cookie.
"""
