"""HF <-> Megatron-Core name tables and reversible transforms (filled by the convert/diff issues)."""
