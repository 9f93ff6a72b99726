"""The networks behind the workloads, one architecture family per module."""
