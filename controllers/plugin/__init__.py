"""`kubectl muster ...`: the kubectl plugin (a console script named kubectl-muster)."""
