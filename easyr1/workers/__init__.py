"""Workers: the FSDP actor and reference, rollout engines, reward scoring and the hybrid worker holding them."""
