"""`muster bench preemption` runs the KEP-5710 shape end to end at a small size: each
high-priority group evicts exactly one low-priority group."""

from __future__ import annotations

from click.testing import CliRunner

from controllers.main import main


def test_the_preemption_benchmark_evicts_one_group_per_preemptor() -> None:
    args = ["bench", "preemption", "--nodes", "40", "--preemptors", "5", "--repeat", "1"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "1 preemptor (everything)" in result.output and "victims 1\n" in result.output
    assert "victims 5 (5 distinct)" in result.output


def test_the_topology_preemption_benchmark_evicts_in_one_rack_only() -> None:
    args = ["bench", "preemption", "--topology", "--blocks", "1", "--racks", "3"]
    args += ["--rack-nodes", "4", "--low-nodes", "2", "--repeat", "1"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "requiring one rack (by domain)" in result.output
    assert "victims 2 in 1 rack(s)" in result.output
