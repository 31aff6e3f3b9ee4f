"""Live migration of running PEs between nodes (thesis ch. 4.2.2, 5.3)."""
