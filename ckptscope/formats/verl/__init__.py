"""verl actor/critic checkpoint dirs (FSDP and Megatron backends)."""
