"""Workloads Muster queues by their pods: LeaderWorkerSet groups, Deployments, StatefulSets
and pods of any owner no integration knows (docs/integrations.md, "Queued by their pods").

These kinds have no `spec.suspend` to hold them: their pods are held instead. Muster's pod
admission gates every pod that carries the queue label (the owner kinds' admission copies
the label into their pod templates) and names Muster's scheduler;
`controllers.state.ownergroups` says which group a pod belongs to, `intake` makes one
Workload per group (`workload`) and lifts the gates of the pods its admission grants, in
slices as the group grows.
"""
