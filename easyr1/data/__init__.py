"""Dataset loading (jsonl / json / parquet / folder / hub), Jinja format prompts, vision inputs and collation."""

from easyr1.data.collate import collate_fn
from easyr1.data.dataset import RLDataset, Row, load_rows


__all__ = ["RLDataset", "Row", "collate_fn", "load_rows"]
