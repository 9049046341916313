"""hybridflow: a single-controller hybrid-engine library for RL post-training."""
