"""Sweeps across a Ray cluster: each quant's turn of a round is a Ray task on some node, the
driver keeps the rounds and the decisions (pipeline/sweep.py), and the files are the record.

``ray_session`` connects (or starts a local cluster), ``node_checks`` makes sure every node
sees the paths the tasks will open, ``ray_task`` is what a worker runs, ``ray_players`` submits
a round's turns and gathers their outcomes, and ``live`` shows them as they go.
"""
