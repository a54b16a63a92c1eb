"""recycle plan service: jobs, plans, precomputation and the worker coordinator over HTTP.

Importing `api` is light (no FastAPI): the solve worker processes import `api.solve_worker`, which
needs only the planner. The web app lives in `api.main`.
"""
