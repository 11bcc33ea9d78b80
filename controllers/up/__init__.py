"""`muster up` and `muster down`: Muster for real on a local cluster, playing a scenario."""
