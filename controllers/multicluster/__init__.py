"""Many clusters: the management cluster's Muster sends admitted workloads to worker
clusters (docs/multicluster.md)."""
