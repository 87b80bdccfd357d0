"""What the DAG is built from, checked when it is built (never imported by a job).

:mod:`~vlsens.dag.plan` (the plan: config, checkpoint facts and towers), :mod:`~vlsens.dag.targets`
(the default target, graph by graph) and :mod:`~vlsens.dag.resources` (what a job asks a cluster
for).
"""
