"""Checkpoints: sharded training state written by the workers, committed atomically by the driver."""
