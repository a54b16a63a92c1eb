"""`recycle bench`: throughput under failures, this planner against the alternatives users have.

strategies.py models each strategy on one job spec with the planner's own simulator; scale.py sweeps
job sizes and failure patterns; trace.py replays a day of failures and rejoins; report.py writes the
markdown tables, JSON and PNG plots; cli.py defines the command. Nothing here imports torch, the API
or the executor.
"""
