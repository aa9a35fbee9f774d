"""Training on megatron-core: forward/backward over micro-batches, optimizer, DAPO update."""
