"""Training: state and optimizer, the jitted step, and the loop."""
