"""PodGroup intake: Volcano's and the native scheduling.k8s.io PodGroups whose pods name
Muster's scheduler, admitted as one Workload each and placed whole (docs/podgroups.md)."""
