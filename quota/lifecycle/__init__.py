"""The rules of a workload's life that the controller and the simulator both follow."""
