"""Prometheus metrics and health probes of one controller replica, on a port of their own."""
