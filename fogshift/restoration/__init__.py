"""Restoration of PEs whose node is gone, from central checkpoints (thesis ch. 4.2.2, 5.3.2)."""
