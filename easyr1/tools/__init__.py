"""User commands: the tiny model and demo data builders (``python -m easyr1.tools.<name>``)."""
