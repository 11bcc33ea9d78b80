"""The controller runtime: caches fed by list+watch, work queues, leader election and
optimistic-concurrency writes. Nothing here knows about Muster's domain."""
