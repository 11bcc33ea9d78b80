"""Muster's scheduler loop: binds the pods of admitted Workloads to nodes, whole groups at a
time, through the same placement core (`quota.placement`) the admission cycle plans with.

- `pods.py`: what the loop reads off a Pod (bound, gated, its shape).
- `groups.py`: the admitted Workloads whose pods Muster places, as groups with their pods.
- `nodeview.py`: the free room on every node, from the caches, with the room of binds not
  yet seen by the watch and of plans not yet bound held back.
- `decide.py`: where one group goes (its planned nodes while they still fit, else anywhere).
- `binder.py`: the pods/binding calls, bounded and leader-checked.
- `status.py`: the PodGroup per Workload, its condition, Events and history records.
- `loop.py`: when to run a pass, and one pass.

The scheduler's default name is `quota.api.names.SCHEDULER_NAME`.
"""
