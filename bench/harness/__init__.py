"""What the benchmarks share, one concept a module; each script under bench/ keeps only its
scenarios and its report.

- `cluster`: the local cluster a benchmark runs against (fresh or given), with Muster's CRDs.
- `controller`: the controller under test, in this process (a Manager) or as `muster
  controller` processes.
- `process`: a child process with its log, stopped politely.
- `meter`: CPU seconds and resident memory read from /proc (a process tree, this process's
  threads, the kubectl children), and a `CpuMeter` around a scenario.
- `objects`: the objects benchmarks create (namespaces, queues, one-pod Jobs).
- `create`: objects created as a user would (`kubectl create` in parallel) or applied.
- `waits`: polling until something holds.
- `audit`: the apiserver's audit log of writes, and client identities it tells apart.
- `metrics`: Prometheus metrics of the apiserver and kube-scheduler: read, diffed, histograms.
- `timing`: repeated timings and percentiles.
- `tables`: figures as tables, rendered with rich.
"""
